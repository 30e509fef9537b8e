//! The `Retry-After` of a 409 is a hint a client can trust: once the route has
//! run, the duplicate of a 3 s operation is told about 3 s (at most 5, at least
//! 1), not the ~29 s left on a 30 s lease. Before any history, the lease left is
//! all the layer knows. Through `serve` and through the proxy.

use std::time::Duration;

use reqwest::StatusCode;

use crate::support::client::{Answer, Client, ORDER, new_key};
use crate::support::proxy::{Proxy, ProxyOptions, Upstream};
use crate::support::server::{Options, Server, sqlite_url};

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
    let key = new_key();
    let first = {
        let (client, url, key) = (client.clone(), url.to_owned(), key.clone());
        tokio::spawn(async move { client.post(&url, Some(&key), ORDER).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let duplicate = client.post(url, Some(&key), ORDER).await;
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
    let proxy = Proxy::start(ProxyOptions::new(upstream.url()).store("memory")).await;
    let client = Client::with_timeout(Duration::from_secs(20));
    the_hint_follows_the_routes_executions(&client, &proxy.url("/v1/charges")).await;
    assert_eq!(
        upstream.executions(),
        2,
        "the duplicates were not forwarded"
    );
}
