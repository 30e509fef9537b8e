//! The replay cache through the real binary: replays answered from memory are the
//! stored response byte for byte, a changed body still gets 422, and an admin
//! eviction drops the cached record at once.

use reqwest::StatusCode;

use super::keys::{ADMIN_TOKEN, admin_call, bearer_principal, keys_query};
use crate::support::client::{Client, ORDER, new_key};
use crate::support::gateway::MockGateway;
use crate::support::server::{Options, Server, redis_url, sqlite_url};

/// `idemgate_replay_cache_total{result="…"}` of `server`.
async fn cache_lookups(server: &Server, result: &str) -> f64 {
    let text = reqwest::get(server.url("/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    let series = format!("idemgate_replay_cache_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0.0, |value| value.trim().parse().expect("a number"))
}

async fn replays_from_the_cache_are_exact(store: Option<String>) {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let mut options = Options::new(&db)
        .gateway(gateway.url())
        .arg("--replay-cache-entries", 1_000);
    if let Some(store) = &store {
        options = options.store(store);
    }
    let server = Server::start(options).await;
    let client = Client::new();
    let url = server.url("/api/v1/orders");
    let key = new_key();
    let first = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let hits_before = cache_lookups(&server, "hit").await;
    let misses_before = cache_lookups(&server, "miss").await;
    for _ in 0..5 {
        let retry = client.post(&url, Some(&key), ORDER).await;
        assert_eq!(retry.status, StatusCode::CREATED);
        assert!(retry.replayed());
        assert_eq!(retry.body, first.body, "the replay must be byte-identical");
        assert_eq!(retry.headers["location"], first.headers["location"]);
    }
    let tampered = client
        .post(&url, Some(&key), &ORDER.replace("1500", "15"))
        .await;
    assert_eq!(tampered.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(tampered.problem_type(), "/problems/key-reused");
    let hits = cache_lookups(&server, "hit").await - hits_before;
    let misses = cache_lookups(&server, "miss").await - misses_before;
    // The completion filled the cache (on SQLite inside the handler's transaction,
    // on Redis through the store), so even the first replay is answered from it.
    assert_eq!(
        (hits, misses),
        (6.0, 0.0),
        "{store:?}: (hits, misses) for 6 repeats: the completion did not fill the cache"
    );
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
    assert_eq!(gateway.calls().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cached_replays_are_byte_identical_and_a_changed_body_is_422_sqlite() {
    replays_from_the_cache_are_exact(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cached_replays_are_byte_identical_and_a_changed_body_is_422_redis() {
    replays_from_the_cache_are_exact(Some(redis_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admin_eviction_drops_the_cached_record_at_once() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(
        Options::new(&db)
            .gateway(gateway.url())
            .admin(Some(ADMIN_TOKEN))
            .arg("--replay-cache-entries", 1_000)
            .arg("--replay-cache-max-age-ms", 600_000),
    )
    .await;
    let client = Client::new();
    let url = server.url("/api/v1/orders");
    let key = new_key();
    assert_eq!(
        client.post(&url, Some(&key), ORDER).await.status,
        StatusCode::CREATED
    );
    for _ in 0..2 {
        assert!(client.post(&url, Some(&key), ORDER).await.replayed());
    }
    assert!(cache_lookups(&server, "hit").await >= 1.0, "not cached");
    let query = server.admin_url(&keys_query(
        &bearer_principal(&client),
        &key,
        "/api/v1/orders",
    ));
    let (status, _, evicted) = admin_call(reqwest::Method::DELETE, &query, Some(ADMIN_TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{evicted}");
    let again = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(
        !again.replayed(),
        "the evicted key was answered from the cache"
    );
    assert_eq!(client.orders(&server.url("")).await.len(), 2);
    assert_eq!(gateway.calls().len(), 2);
}
