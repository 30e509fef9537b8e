//! The key strategies an operator measures before enforcing them (PROTOCOL
//! §15–§16), through the real proxy on every store: observe mode switched to
//! enforce by `SIGHUP` (docs/operations.md's procedure), a client's own
//! `Idempotency-Key` on an observing route, content dedup across two queues, and
//! `query:` keys. Each finding of issue 32 is a step here, asserted by what the
//! counting upstream ran and the bytes each client got back.

use std::time::{Duration, Instant};

use axum::http::StatusCode;

use crate::support::client::{Answer, Client};
use crate::support::proxy::{Proxy, ProxyOptions, Upstream};
use crate::support::server::{TempDir, postgres_url, redis_url, send_signal};

/// Observing: a JSON-key route (outcomes discarded, the default), one that keeps
/// observed responses, a content dedup route and a query-key route.
const OBSERVING: &str = r#"
[[route]]
method = "POST"
path = "/v3/payments"
key = "json:/reference_id"
mode = "observe"

[[route]]
method = "POST"
path = "/v3/notes"
key = "json:/reference_id"
mode = "observe"
observe_responses = "keep"

[[route]]
method = "POST"
path = "/v1/messages/{queue}"
dedup = { window = "5m", fields = ["/to", "/text"] }
mode = "observe"

[[route]]
method = "POST"
path = "/v1/searches"
key = "query:request_id"
mode = "observe"
"#;

/// The same routes, enforced.
const ENFORCING: &str = r#"
[[route]]
method = "POST"
path = "/v3/payments"
key = "json:/reference_id"

[[route]]
method = "POST"
path = "/v3/notes"
key = "json:/reference_id"

[[route]]
method = "POST"
path = "/v1/messages/{queue}"
dedup = { window = "5m", fields = ["/to", "/text"] }

[[route]]
method = "POST"
path = "/v1/searches"
key = "query:request_id"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_then_enforce_on_sqlite() {
    observe_then_enforce(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_then_enforce_on_postgres() {
    observe_then_enforce(Some(&postgres_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_then_enforce_on_redis() {
    observe_then_enforce(Some(&redis_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_then_enforce_on_memory() {
    observe_then_enforce(Some("memory")).await;
}

/// docs/operations.md's procedure: observe for a while with duplicates, read
/// the counters, switch to enforce by SIGHUP, retry every observed operation.
async fn observe_then_enforce(store: Option<&str>) {
    let upstream = Upstream::start().await;
    let dir = TempDir::new("idemgate-strategies");
    let path = dir.path().join("routes.toml");
    std::fs::write(&path, OBSERVING).unwrap();
    let options = ProxyOptions::new(upstream.url())
        .arg("--config", path.display().to_string())
        .store_or_sqlite_in(store, dir.path());
    let proxy = Proxy::start(options).await;
    let client = Client::new();
    // Fresh names per run: the suites share PostgreSQL and Redis.
    let run = uuid::Uuid::new_v4().simple().to_string();
    let payment = format!(r#"{{"reference_id":"p-{run}","amount":5}}"#);
    let note = format!(r#"{{"reference_id":"n-{run}","text":"hello"}}"#);
    let message = format!(r#"{{"to":"bob-{run}","text":"hi"}}"#);
    let search = proxy.url(&format!("/v1/searches?request_id=s-{run}"));
    let header_key = format!("h-{run}");
    let dedup_header_key = format!("d-{run}");
    let header_body = r#"{"amount":7}"#;

    let send = |url: String, headers: Vec<(&'static str, String)>, body: String| {
        let client = client.clone();
        async move {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(name, value)| (*name, value.as_str()))
                .collect();
            client.send_json("POST", &url, &headers, &body).await
        }
    };
    let payments = proxy.url("/v3/payments");
    let notes = proxy.url("/v3/notes");
    let q1 = proxy.url("/v1/messages/q1");
    let q2 = proxy.url("/v1/messages/q2");
    let q3 = proxy.url("/v1/messages/q3");

    // --- Observing: every strategy's duplicates run; a client's own key does not.
    let mut observed = Vec::new();
    for _ in 0..2 {
        observed.push(send(payments.clone(), vec![], payment.clone()).await);
        observed.push(send(notes.clone(), vec![], note.clone()).await);
        observed.push(send(q1.clone(), vec![], message.clone()).await);
        observed.push(send(search.clone(), vec![], "{}".to_owned()).await);
    }
    // The same message to another queue: another operation, never a 422.
    let other_queue = send(q2.clone(), vec![], message.clone()).await;
    assert_eq!(other_queue.status, StatusCode::CREATED, "{other_queue:?}");
    observed.push(other_queue);
    for answer in &observed {
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
        assert!(!answer.replayed(), "observe mode replayed: {answer:?}");
    }
    assert_eq!(upstream.executions(), 9, "every observed request ran");
    let first_note = observed[1].clone();

    // A client's own Idempotency-Key on routes observing a JSON key and content
    // dedup: enforced, its retry replayed (finding 2).
    let keyed = [
        (payments.clone(), header_key.clone()),
        (q3.clone(), dedup_header_key.clone()),
    ];
    let mut header_firsts = Vec::new();
    for (url, key) in &keyed {
        let headers = vec![("idempotency-key", key.clone())];
        let first = send(url.clone(), headers.clone(), header_body.to_owned()).await;
        let retry = send(url.clone(), headers, header_body.to_owned()).await;
        assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
        assert!(!first.replayed());
        assert_same_answer(&retry, &first, "a header-keyed retry while observing");
        header_firsts.push(first);
    }
    assert_eq!(
        upstream.executions(),
        11,
        "one run per header-keyed operation"
    );

    // What the strategies would have done, counted by strategy.
    assert_eq!(duplicates(&proxy, "json", "observed").await, 2);
    assert_eq!(duplicates(&proxy, "json", "replayed").await, 2);
    assert_eq!(duplicates(&proxy, "content", "observed").await, 2);
    assert_eq!(duplicates(&proxy, "content", "replayed").await, 1);
    assert_eq!(duplicates(&proxy, "content", "mismatch").await, 0);
    assert_eq!(duplicates(&proxy, "query", "observed").await, 1);
    assert_eq!(duplicates(&proxy, "query", "replayed").await, 1);
    // The client's own keys, enforced: real replays.
    assert_eq!(duplicates(&proxy, "header", "replayed").await, 2);

    // --- Enforce, by SIGHUP.
    reload(&proxy, &dir, ENFORCING).await;

    // A retry of an operation observed with its outcome discarded runs as new
    // (never an empty replay, finding 1); the kept one is replayed whole.
    let retried = [
        send(payments.clone(), vec![], payment.clone()).await,
        send(q1.clone(), vec![], message.clone()).await,
        send(search.clone(), vec![], "{}".to_owned()).await,
    ];
    for answer in &retried {
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
        assert!(
            !answer.replayed(),
            "an observed record was replayed: {answer:?}"
        );
        assert!(!answer.body.is_empty(), "{answer:?}");
    }
    assert_eq!(upstream.executions(), 14, "the discarded ones ran as new");
    let kept = send(notes.clone(), vec![], note.clone()).await;
    assert_same_answer(
        &kept,
        &first_note,
        "a kept observed response, after the switch",
    );
    for ((url, key), first) in keyed.iter().zip(&header_firsts) {
        let headers = vec![("idempotency-key", key.clone())];
        let retry = send(url.clone(), headers, header_body.to_owned()).await;
        assert_same_answer(&retry, first, "a header-keyed retry after the switch");
    }
    // Enforced from now on: each operation's next retry is replayed.
    let again = [
        send(payments.clone(), vec![], payment.clone()).await,
        send(q1.clone(), vec![], message.clone()).await,
        send(search.clone(), vec![], "{}".to_owned()).await,
    ];
    for (answer, first) in again.iter().zip(&retried) {
        assert_same_answer(answer, first, "an enforced retry");
    }
    // The same message to the other queue is still its own operation (observed
    // with its outcome discarded, so it runs as new): never a 422.
    let other = send(q2.clone(), vec![], message.clone()).await;
    assert_eq!(other.status, StatusCode::CREATED, "{other:?}");
    assert!(!other.replayed(), "{other:?}");
    assert_eq!(
        upstream.executions(),
        15,
        "after the switch, one run per operation"
    );
    // The counters tell what happened after the switch: the kept note and each
    // enforced retry are real replays, by strategy; nothing was a 422.
    assert_eq!(duplicates(&proxy, "json", "replayed").await, 2 + 2);
    assert_eq!(duplicates(&proxy, "content", "replayed").await, 1 + 1);
    assert_eq!(duplicates(&proxy, "query", "replayed").await, 1 + 1);
    assert_eq!(duplicates(&proxy, "header", "replayed").await, 2 + 2);
    assert_eq!(duplicates(&proxy, "content", "mismatch").await, 0);
    assert_eq!(duplicates(&proxy, "json", "mismatch").await, 0);
}

/// A replay of `first`: the same status, body bytes and content type, marked.
fn assert_same_answer(answer: &Answer, first: &Answer, what: &str) {
    assert_eq!(answer.status, first.status, "{what}: {answer:?}");
    assert!(answer.replayed(), "{what} was not replayed: {answer:?}");
    assert!(!answer.body.is_empty(), "{what}: an empty replay");
    assert_eq!(answer.body, first.body, "{what}: other bytes");
    assert_eq!(
        answer.headers.get("content-type"),
        first.headers.get("content-type"),
        "{what}: {answer:?}"
    );
}

/// Rewrites the route file (write then rename), sends SIGHUP, and waits until
/// the admin API serves the new file.
async fn reload(proxy: &Proxy, dir: &TempDir, text: &str) {
    let path = dir.path().join("routes.toml");
    let staged = dir.path().join("routes.toml.new");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, &path).unwrap();
    let wanted = hex_sha256(text);
    send_signal(&proxy.pid().to_string(), "HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view: serde_json::Value = reqwest::get(proxy.admin_url("/v1/config"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if view["loaded"]["sha256"] == wanted.as_str() {
            return;
        }
        assert!(Instant::now() < deadline, "reload not seen: {view}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn hex_sha256(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// `idemgate_duplicates_total{strategy, action}` on the proxy's admin listener.
async fn duplicates(proxy: &Proxy, strategy: &str, action: &str) -> u64 {
    let text = reqwest::get(proxy.admin_url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (strategy, action) = (
        format!("strategy=\"{strategy}\""),
        format!("action=\"{action}\""),
    );
    let line = text
        .lines()
        .find(|line| {
            line.starts_with("idemgate_duplicates_total{")
                && line.contains(&strategy)
                && line.contains(&action)
        })
        .unwrap_or_else(|| panic!("no duplicates series {strategy}/{action}:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}
