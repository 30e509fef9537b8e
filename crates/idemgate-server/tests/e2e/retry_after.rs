//! The `Retry-After` of a 409 is a hint a client can trust: once the route has
//! run, the duplicate of a 3 s operation is told about 3 s (at most 5, at least
//! 1), not the ~29 s left on a 30 s lease. Before any history, the lease left is
//! all the layer knows (clamped to [1, 60] s). Through `serve` and through the
//! proxy. The history is the store's: two proxy instances on one PostgreSQL or
//! Redis share it, and a restarted instance still has it.

use std::time::Duration;

use reqwest::StatusCode;

use crate::support::client::{Answer, Client, ORDER, new_key};
use crate::support::proxy::{Proxy, ProxyOptions, Upstream};
use crate::support::server::{Options, Server, TempDir, postgres_url, redis_url, sqlite_url};

fn retry_after(answer: &Answer) -> u64 {
    answer.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("Retry-After is whole seconds: {answer:?}"))
}

/// Starts a slow operation under a fresh key, sends its duplicate while it runs
/// and returns the duplicate's answer; the operation itself is awaited.
async fn duplicate_while_running(client: &Client, url: &str) -> Answer {
    duplicate_elsewhere_while_running(client, url, url).await
}

/// [`duplicate_while_running`] with the duplicate sent to `duplicate_url` (the
/// same path on another instance).
async fn duplicate_elsewhere_while_running(
    client: &Client,
    url: &str,
    duplicate_url: &str,
) -> Answer {
    let key = new_key();
    let first = {
        let (client, url, key) = (client.clone(), url.to_owned(), key.clone());
        tokio::spawn(async move { client.post(&url, Some(&key), ORDER).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let duplicate = client.post(duplicate_url, Some(&key), ORDER).await;
    let first = first.await.unwrap();
    assert!(first.status.is_success(), "{first:?}");
    assert_eq!(duplicate.status, StatusCode::CONFLICT, "{duplicate:?}");
    duplicate
}

async fn the_hint_follows_the_routes_executions(client: &Client, url: &str) {
    let before = retry_after(&duplicate_while_running(client, url).await);
    assert!(
        before > 5,
        "without history the hint is the lease left, got {before}"
    );
    // The first operation took ~3 s; the next duplicate hears about that.
    let after = retry_after(&duplicate_while_running(client, url).await);
    assert!(
        (1..=5).contains(&after),
        "a 3 s operation must give a hint of about 3 s, not the lease: {after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_hints_the_time_a_3_s_order_takes_not_the_lease() {
    let (db, _dir) = sqlite_url();
    let mut options = Options::new(&db);
    options.simulated_delay_ms = 3_000;
    let server = Server::start(options).await;
    let client = Client::with_timeout(Duration::from_secs(20));
    the_hint_follows_the_routes_executions(&client, &server.url("/api/v1/orders")).await;
    assert_eq!(
        client.orders(&server.url("")).await.len(),
        2,
        "two keys, two orders"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_proxy_hints_the_time_a_3_s_upstream_takes_not_the_lease() {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_secs(3));
    // The 409 path itself: a duplicate answered at once, not after waiting.
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .store("memory")
            .arg("--wait-ms", 0),
    )
    .await;
    let client = Client::with_timeout(Duration::from_secs(20));
    the_hint_follows_the_routes_executions(&client, &proxy.url("/v1/charges")).await;
    assert_eq!(
        upstream.executions(),
        2,
        "the duplicates were not forwarded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_history_the_lease_left_is_clamped_to_a_minute() {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_secs(2));
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .store("memory")
            .arg("--wait-ms", 0)
            .arg("--lease", 90),
    )
    .await;
    let client = Client::with_timeout(Duration::from_secs(20));
    let hint = retry_after(&duplicate_while_running(&client, &proxy.url("/v1/charges")).await);
    assert_eq!(hint, 60, "a 90 s lease's ~89 s left is told as 60 s");
}

/// Instance `a` builds the route's history with fast runs; a duplicate of a
/// long run on `a` sent to `b` (`--wait-ms 0`) is told what the history says
/// (about 1 s), not the ~29 s left on the lease; `b` restarted still hears it.
/// A route nobody ran yet still gets the lease left. The route is fresh, so
/// history from earlier runs on the shared store does not count.
async fn instances_on_one_store_share_the_history(store: &str) {
    let upstream = Upstream::start().await;
    let options = || {
        ProxyOptions::new(upstream.url())
            .store(store)
            .arg("--wait-ms", 0)
    };
    let a = Proxy::start(options()).await;
    let b = Proxy::start(options()).await;
    let client = Client::with_timeout(Duration::from_secs(20));
    let path = format!("/v1/charges-{}", new_key());
    let fresh = format!("/v1/refunds-{}", new_key());

    upstream.set_delay(Duration::from_secs(3));
    let no_history = retry_after(
        &duplicate_elsewhere_while_running(&client, &a.url(&fresh), &b.url(&fresh)).await,
    );
    assert!(
        (20..=30).contains(&no_history),
        "no history anywhere: the lease left, got {no_history}"
    );

    upstream.set_delay(Duration::ZERO);
    for _ in 0..5 {
        let answer = client.post(&a.url(&path), Some(&new_key()), ORDER).await;
        assert!(answer.status.is_success(), "{answer:?}");
        // Past the layer's per-route recording interval (100 ms), so each run
        // is recorded.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Recorded on a task of its own after the answer: give it a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    upstream.set_delay(Duration::from_secs(3));
    let shared = retry_after(
        &duplicate_elsewhere_while_running(&client, &a.url(&path), &b.url(&path)).await,
    );
    assert_eq!(
        shared, 1,
        "fast runs on a: b's duplicate is told 1 s, not the lease left"
    );

    b.terminate();
    assert!(b.wait_exit().await.success());
    let b = Proxy::start(options()).await;
    // The history now holds five fast runs and one of 3 s: its p90 is the
    // 3 s run, less the ~0.5 s the running one has run.
    let restarted = retry_after(
        &duplicate_elsewhere_while_running(&client, &a.url(&path), &b.url(&path)).await,
    );
    assert!(
        (1..=3).contains(&restarted),
        "a restarted b still has a's history: {restarted}"
    );
    assert_eq!(
        upstream.executions(),
        8,
        "one run per key: the duplicates were not forwarded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_proxies_on_one_postgres_share_the_routes_history() {
    instances_on_one_store_share_the_history(&postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_proxies_on_one_redis_share_the_routes_history() {
    instances_on_one_store_share_the_history(&redis_url()).await;
}

/// The history is the route's, not each path's: on a declared route
/// `/v1/payments/{id}/capture` keyed by the client's header (so each payment is
/// its own scope), runs of payment 1 tell the duplicate of payment 2 how long a
/// capture takes — not the lease left, as a path nobody ran would.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_id_of_a_declared_route_shares_its_history() {
    let upstream = Upstream::start().await;
    let dir = TempDir::new("idemgate-route-history");
    let routes = dir.path().join("routes.toml");
    std::fs::write(
        &routes,
        "[[route]]\nmethod = \"POST\"\npath = \"/v1/payments/{id}/capture\"\n",
    )
    .unwrap();
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .store("memory")
            .arg("--wait-ms", 0)
            .arg("--config", routes.display().to_string()),
    )
    .await;
    let client = Client::with_timeout(Duration::from_secs(20));
    upstream.set_delay(Duration::from_secs(3));
    let first =
        retry_after(&duplicate_while_running(&client, &proxy.url("/v1/payments/1/capture")).await);
    assert!(first > 5, "no history yet: the lease left, got {first}");
    let second =
        retry_after(&duplicate_while_running(&client, &proxy.url("/v1/payments/2/capture")).await);
    assert!(
        (1..=5).contains(&second),
        "payment 1's 3 s capture is the route's history, so payment 2's duplicate \
         hears about 3 s, not the lease left: {second}"
    );
    assert_eq!(upstream.executions(), 2, "one run per payment");
}
