//! `key = "json:/POINTER" | "path:PARAM" | "header:NAME"` on proxy routes
//! (PROTOCOL §15): the real binary in front of a counting upstream that keys
//! operations by a body field (Square/Stripe style) or by the path (json-server
//! style). A lost response is one upstream execution, whatever the source.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use tokio::sync::Barrier;

use crate::support::client::{Answer, Client};
use crate::support::proxy::{Proxy, ProxyOptions, Upstream};
use crate::support::server::TempDir;
use crate::support::wait::wait_until;

const ROUTES: &str = r#"
[[route]]
method = "POST"
path = "/v2/payments"
key = "json:/idempotency_key"
wait_ms = 10000

[[route]]
method = "PUT"
path = "/products/{product_id}"
key = "path:product_id"
wait_ms = 10000

[[route]]
method = "POST"
path = "/v1/transfers"
key = "header:PayPal-Request-Id"

[[route]]
method = "POST"
path = "/v1/messages/{queue}"
dedup = { window = "2s", fields = ["/to", "/text"] }
lease = 1
"#;

async fn proxy() -> (Upstream, Proxy, TempDir) {
    let upstream = Upstream::start().await;
    let dir = TempDir::new("idemgate-proxy-key-sources");
    let path = dir.path().join("routes.toml");
    std::fs::write(&path, ROUTES).unwrap();
    let proxy =
        Proxy::start(ProxyOptions::new(upstream.url()).arg("--config", path.display().to_string()))
            .await;
    (upstream, proxy, dir)
}

/// The first attempt's answer is lost (the client gives up while the upstream
/// runs); the retry, sent while it still runs, waits for it and replays it.
async fn lose_then_retry(
    upstream: &Upstream,
    client: &Client,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    first_body: &str,
    retry_body: &str,
) -> Answer {
    upstream.set_delay(Duration::from_millis(1500));
    let impatient = Client::with_timeout(Duration::from_millis(300)).with_token(&client.token);
    let lost = impatient.try_send(method, url, headers, first_body).await;
    assert!(
        lost.is_err(),
        "the first answer was meant to be lost: {lost:?}"
    );
    wait_until("the upstream ran", Duration::from_secs(10), || {
        upstream.started() == 1
    })
    .await;
    let retry = client.send(method, url, headers, retry_body).await;
    upstream.set_delay(Duration::ZERO);
    retry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_field_key_makes_a_lost_payment_one_upstream_execution() {
    let (upstream, proxy, _dir) = proxy().await;
    let client = Client::new();
    let url = proxy.url("/v2/payments");
    let reference = uuid::Uuid::new_v4().to_string();
    let body = format!(
        r#"{{"idempotency_key":"{reference}","amount_money":{{"amount":100,"currency":"USD"}}}}"#
    );
    // The retry spells the same JSON another way: members reordered, spaced.
    let respelled = format!(
        "{{ \"amount_money\": {{ \"currency\": \"USD\", \"amount\": 100 }},\n  \"idempotency_key\": \"{reference}\" }}"
    );
    let retry = lose_then_retry(&upstream, &client, "POST", &url, &[], &body, &respelled).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(upstream.executions(), 1, "the lost payment ran twice");
    assert_eq!(
        upstream.seen()[0].body,
        body.as_bytes(),
        "the first body went upstream"
    );
    // Another principal's same reference is its own operation.
    let other = Client::new().send("POST", &url, &[], &body).await;
    assert!(!other.replayed());
    assert_eq!(upstream.executions(), 2);
    // A reference that is not a string is refused before anything runs.
    let refused = client
        .send(
            "POST",
            &url,
            &[],
            r#"{"idempotency_key":7,"amount_money":{"amount":1}}"#,
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    assert_eq!(
        refused.problem_type(),
        "https://idemgate.dev/problems/invalid-key"
    );
    // The standard header saying otherwise is ambiguous: nothing runs.
    let ambiguous = client
        .send(
            "POST",
            &url,
            &[("idempotency-key", "something-else")],
            &body,
        )
        .await;
    assert_eq!(
        ambiguous.problem_type(),
        "https://idemgate.dev/problems/ambiguous-key"
    );
    assert_eq!(upstream.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_key_makes_a_lost_put_one_upstream_execution() {
    let (upstream, proxy, _dir) = proxy().await;
    let client = Client::new();
    let id = format!("PRD-{}", uuid::Uuid::new_v4().simple());
    let url = proxy.url(&format!("/products/{id}"));
    let body = r#"{"name":"Headphones","price":99}"#;
    let retry = lose_then_retry(&upstream, &client, "PUT", &url, &[], body, body).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(retry.replayed());
    assert_eq!(upstream.executions(), 1);
    assert_eq!(upstream.seen()[0].uri, format!("/products/{id}"));
    // The same id with another body is a reuse (422); another id runs.
    let changed = client
        .send("PUT", &url, &[], r#"{"name":"Headphones","price":1}"#)
        .await;
    assert_eq!(
        changed.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{changed:?}"
    );
    let other = client
        .send("PUT", &proxy.url("/products/PRD-OTHER"), &[], body)
        .await;
    assert!(!other.replayed());
    assert_eq!(upstream.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_path_key_raced_64_ways_through_the_proxy_runs_once() {
    let (upstream, proxy, _dir) = proxy().await;
    upstream.set_delay(Duration::from_millis(300));
    let client = Client::new();
    let url = proxy.url(&format!("/products/PRD-{}", uuid::Uuid::new_v4().simple()));
    let barrier = Arc::new(Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (client, url, barrier) = (client.clone(), url.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                client.send("PUT", &url, &[], r#"{"price":1}"#).await
            })
        })
        .collect();
    let mut bodies = Vec::new();
    for task in tasks {
        let answer = task.await.unwrap();
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
        bodies.push(answer.body);
    }
    assert!(bodies.iter().all(|body| *body == bodies[0]), "one outcome");
    assert_eq!(
        upstream.executions(),
        1,
        "{} executions",
        upstream.executions()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_header_is_the_key_of_its_route() {
    let (upstream, proxy, _dir) = proxy().await;
    let client = Client::new();
    let url = proxy.url("/v1/transfers");
    let headers = [("paypal-request-id", "pp-7f3a")];
    let first = client.send("POST", &url, &headers, r#"{"amount":5}"#).await;
    let retry = client.send("POST", &url, &headers, r#"{"amount":5}"#).await;
    assert!(!first.replayed());
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(upstream.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_dedup_folds_keyless_duplicates_inside_the_window_and_a_key_wins() {
    let (upstream, proxy, _dir) = proxy().await;
    let client = Client::new();
    let url = proxy.url("/v1/messages/q1");
    let body = r#"{"to":"bob","text":"hi","sent_at":1}"#;
    let first = client.send("POST", &url, &[], body).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.replayed());
    let duplicate = client
        .send(
            "POST",
            &url,
            &[],
            r#"{"sent_at":2, "text":"hi", "to":"bob"}"#,
        )
        .await;
    assert_eq!(duplicate.status, StatusCode::CREATED);
    assert!(duplicate.replayed(), "{duplicate:?}");
    assert_eq!(duplicate.headers["idempotency-dedup"], "content");
    assert_eq!(duplicate.body, first.body);
    assert_eq!(upstream.executions(), 1);
    // An explicit key is its own operation, never a content duplicate.
    let keyed = client
        .send("POST", &url, &[("idempotency-key", "m-1")], body)
        .await;
    assert!(!keyed.replayed());
    assert_eq!(upstream.executions(), 2);
    // After the window the same content is forwarded again.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let later = client.send("POST", &url, &[], body).await;
    assert!(!later.replayed(), "{later:?}");
    assert_eq!(upstream.executions(), 3);
}
