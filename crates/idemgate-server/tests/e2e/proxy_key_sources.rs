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
use crate::support::server::{TempDir, postgres_url, redis_url};
use idemgate_testkit::wait::wait_until;

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
path = "/v3/payments"
key = "json:/reference_id"
mode = "observe"

[[route]]
method = "POST"
path = "/v3/messages"
dedup = { window = "5m" }
mode = "observe"

[[route]]
method = "POST"
path = "/v1/messages/{queue}"
dedup = { window = "2s", fields = ["/to", "/text"] }
lease = 1
"#;

async fn proxy() -> (Upstream, Proxy, TempDir) {
    proxy_on(None).await
}

/// The proxy with `ROUTES`, on `store` (else the default SQLite file).
async fn proxy_on(store: Option<&str>) -> (Upstream, Proxy, TempDir) {
    let upstream = Upstream::start().await;
    let dir = TempDir::new("idemgate-proxy-key-sources");
    let path = dir.path().join("routes.toml");
    std::fs::write(&path, ROUTES).unwrap();
    let mut options = ProxyOptions::new(upstream.url()).arg("--config", path.display().to_string());
    if let Some(store) = store {
        options = options.store(store);
    }
    let proxy = Proxy::start(options).await;
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
    let lost = impatient
        .try_send_json(method, url, headers, first_body)
        .await;
    assert!(
        lost.is_err(),
        "the first answer was meant to be lost: {lost:?}"
    );
    wait_until("the upstream ran", Duration::from_secs(10), || {
        upstream.started() == 1
    })
    .await;
    let retry = client.send_json(method, url, headers, retry_body).await;
    upstream.set_delay(Duration::ZERO);
    retry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_field_key_makes_a_lost_payment_one_upstream_execution() {
    lost_payment(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_field_key_makes_a_lost_payment_one_upstream_execution_on_postgres() {
    lost_payment(Some(&postgres_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_field_key_makes_a_lost_payment_one_upstream_execution_on_redis() {
    lost_payment(Some(&redis_url())).await;
}

async fn lost_payment(store: Option<&str>) {
    let (upstream, proxy, _dir) = proxy_on(store).await;
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
    let other = Client::new().send_json("POST", &url, &[], &body).await;
    assert!(!other.replayed());
    assert_eq!(upstream.executions(), 2);
    // A reference that is not a string is refused before anything runs.
    let refused = client
        .send_json(
            "POST",
            &url,
            &[],
            r#"{"idempotency_key":7,"amount_money":{"amount":1}}"#,
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    assert_eq!(refused.problem_type(), "/problems/invalid-key");
    // The standard header saying otherwise is ambiguous: nothing runs.
    let ambiguous = client
        .send_json(
            "POST",
            &url,
            &[("idempotency-key", "something-else")],
            &body,
        )
        .await;
    assert_eq!(ambiguous.problem_type(), "/problems/ambiguous-key");
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
        .send_json("PUT", &url, &[], r#"{"name":"Headphones","price":1}"#)
        .await;
    assert_eq!(
        changed.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{changed:?}"
    );
    let other = client
        .send_json("PUT", &proxy.url("/products/PRD-OTHER"), &[], body)
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
                client.send_json("PUT", &url, &[], r#"{"price":1}"#).await
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
    let first = client
        .send_json("POST", &url, &headers, r#"{"amount":5}"#)
        .await;
    let retry = client
        .send_json("POST", &url, &headers, r#"{"amount":5}"#)
        .await;
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
    let first = client.send_json("POST", &url, &[], body).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.replayed());
    let duplicate = client
        .send_json(
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
        .send_json("POST", &url, &[("idempotency-key", "m-1")], body)
        .await;
    assert!(!keyed.replayed());
    assert_eq!(upstream.executions(), 2);
    // After the window the same content is forwarded again.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let later = client.send_json("POST", &url, &[], body).await;
    assert!(!later.replayed(), "{later:?}");
    assert_eq!(upstream.executions(), 3);
}

/// `idemgate_duplicates_total{strategy, action}` from the proxy's `/metrics`.
async fn duplicates(proxy: &Proxy, strategy: &str, action: &str) -> u64 {
    let text = reqwest::get(format!("http://{}/metrics", proxy.admin))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .unwrap();
    let wanted = [
        format!("strategy=\"{strategy}\""),
        format!("action=\"{action}\""),
    ];
    let line = text
        .lines()
        .find(|line| {
            line.starts_with("idemgate_duplicates_total{")
                && wanted.iter().all(|label| line.contains(label.as_str()))
        })
        .unwrap_or_else(|| panic!("no duplicates series {strategy}/{action}:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_mode_changes_no_answer_and_counts_what_it_would_have_done() {
    let (upstream, proxy, _dir) = proxy().await;
    for strategy in ["header", "path", "json", "query", "content"] {
        for action in ["replayed", "conflict", "mismatch", "observed"] {
            assert_eq!(
                duplicates(&proxy, strategy, action).await,
                0,
                "exported at 0"
            );
        }
    }
    let client = Client::new();
    let url = proxy.url("/v3/payments");
    let body = r#"{"reference_id":"r-1","amount":5}"#;
    let answers = [
        client.send_json("POST", &url, &[], body).await,
        client
            .send_json(
                "POST",
                &url,
                &[],
                r#"{ "amount": 5, "reference_id": "r-1" }"#,
            )
            .await,
        client
            .send_json("POST", &url, &[], r#"{"reference_id":"r-1","amount":6}"#)
            .await,
    ];
    // A duplicate of a request still running.
    upstream.set_delay(Duration::from_millis(1500));
    let running = {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move {
            client
                .send_json("POST", &url, &[], r#"{"reference_id":"r-2","amount":5}"#)
                .await
        })
    };
    wait_until("the upstream runs r-2", Duration::from_secs(10), || {
        upstream.started() == 4
    })
    .await;
    let during = client
        .send_json("POST", &url, &[], r#"{"reference_id":"r-2","amount":5}"#)
        .await;
    let first_of_r2 = running.await.unwrap();
    upstream.set_delay(Duration::ZERO);
    for answer in answers.iter().chain([&during, &first_of_r2]) {
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
        assert!(!answer.replayed(), "observe mode replayed: {answer:?}");
    }
    assert_eq!(upstream.executions(), 5, "every request ran");
    assert_eq!(duplicates(&proxy, "json", "observed").await, 2);
    assert_eq!(duplicates(&proxy, "json", "replayed").await, 1);
    assert_eq!(duplicates(&proxy, "json", "mismatch").await, 1);
    assert_eq!(duplicates(&proxy, "json", "conflict").await, 1);
    // Content dedup, observed.
    let messages = proxy.url("/v3/messages");
    let one = client
        .send_json("POST", &messages, &[], r#"{"text":"hi"}"#)
        .await;
    let two = client
        .send_json("POST", &messages, &[], r#"{"text":"hi"}"#)
        .await;
    assert!(!one.replayed() && !two.replayed());
    assert_ne!(one.body, two.body, "both ran");
    assert_eq!(upstream.executions(), 7);
    assert_eq!(duplicates(&proxy, "content", "observed").await, 1);
    assert_eq!(duplicates(&proxy, "content", "replayed").await, 1);
    assert_eq!(duplicates(&proxy, "content", "mismatch").await, 0);
    assert_eq!(duplicates(&proxy, "header", "replayed").await, 0);
}
