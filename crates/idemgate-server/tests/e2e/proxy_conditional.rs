//! `conditional = "enforce"` (PROTOCOL §17): the proxy enforces `If-Match` for an
//! upstream that ignores it — concurrent writers through two proxy instances on
//! one PostgreSQL (and one Redis): one write reaches the upstream, the rest are
//! 412 locally with the current ETag, nothing forwarded; 428 without `If-Match`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use reqwest::Method;
use tokio::sync::{Barrier, Mutex};

use crate::support::client::{Answer, Client, new_key};
use crate::support::proxy::{Proxy, ProxyOptions};
use crate::support::server::{TempDir, postgres_url, redis_url};

/// One document; its ETag is its version, strong. PUT replaces it whatever the
/// request's `If-Match` says, and counts.
#[derive(Default)]
struct Document {
    body: Mutex<(u64, String)>,
    puts: AtomicUsize,
}

fn tag(version: u64) -> String {
    format!("\"v{version}\"")
}

async fn read(State(doc): State<Arc<Document>>) -> impl IntoResponse {
    let (version, body) = doc.body.lock().await.clone();
    ([(header::ETAG, tag(version))], body)
}

async fn replace(State(doc): State<Arc<Document>>, body: String) -> impl IntoResponse {
    doc.puts.fetch_add(1, Ordering::SeqCst);
    // Widens the window in which an unserialised second writer would slip in.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut current = doc.body.lock().await;
    *current = (current.0 + 1, body);
    ([(header::ETAG, tag(current.0))], current.1.clone())
}

async fn upstream() -> (String, Arc<Document>) {
    let doc = Arc::new(Document {
        body: Mutex::new((1, "original".to_owned())),
        ..Document::default()
    });
    let app = axum::Router::new()
        .route("/docs/1", axum::routing::get(read).put(replace))
        .with_state(Arc::clone(&doc));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), doc)
}

const ROUTES: &str = r#"
[[route]]
method = "PUT"
path = "/docs/*"
conditional = "enforce"
require_if_match = true
"#;

async fn put(client: &Client, url: &str, if_match: Option<&str>, body: &str) -> Answer {
    put_keyed(client, url, &new_key(), if_match, body).await
}

async fn put_keyed(
    client: &Client,
    url: &str,
    key: &str,
    if_match: Option<&str>,
    body: &str,
) -> Answer {
    let headers: Vec<(&str, &str)> = if_match.iter().map(|tag| ("if-match", *tag)).collect();
    client
        .send(Method::PUT, url, Some(key), &headers, Some(body))
        .await
}

async fn two_proxies_enforce_if_match(store: &str) {
    let (upstream_url, doc) = upstream().await;
    let dir = TempDir::new("idemgate-proxy-conditional");
    let config = dir.path().join("routes.toml");
    std::fs::write(&config, ROUTES).unwrap();
    let start = || {
        Proxy::start(
            ProxyOptions::new(upstream_url.clone())
                .store(store)
                .arg("--config", config.display()),
        )
    };
    let proxies = [start().await, start().await];
    let client = Client::new();
    let current = client.get(&proxies[0].url("/docs/1")).await;
    let etag = current.headers["etag"].to_str().unwrap().to_owned();
    assert_eq!(etag, tag(1), "the upstream's ETag passes through unaltered");

    let missing = put(&client, &proxies[0].url("/docs/1"), None, "no precondition").await;
    assert_eq!(
        missing.status,
        StatusCode::PRECONDITION_REQUIRED,
        "{missing:?}"
    );
    assert_eq!(doc.puts.load(Ordering::SeqCst), 0, "a 428 forwards nothing");

    let writers = 16;
    let barrier = Arc::new(Barrier::new(writers));
    let tasks: Vec<_> = (0..writers)
        .map(|writer| {
            let url = proxies[writer % 2].url("/docs/1");
            let (client, barrier, etag) = (client.clone(), barrier.clone(), etag.clone());
            tokio::spawn(async move {
                let key = new_key();
                barrier.wait().await;
                let body = format!("writer {writer}");
                (
                    writer,
                    key.clone(),
                    put_keyed(&client, &url, &key, Some(&etag), &body).await,
                )
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let won: Vec<_> = answers
        .iter()
        .filter(|(_, _, a)| a.status.is_success())
        .collect();
    assert_eq!(won.len(), 1, "exactly one write applies: {answers:?}");
    assert_eq!(
        doc.puts.load(Ordering::SeqCst),
        1,
        "the losers were not forwarded"
    );
    let (winner, winner_key, won_answer) = won[0];
    for (_, _, lost) in answers.iter().filter(|(_, _, a)| !a.status.is_success()) {
        assert_eq!(lost.status, StatusCode::PRECONDITION_FAILED, "{lost:?}");
        assert_eq!(
            lost.headers["etag"],
            tag(2).as_str(),
            "the current ETag, as the upstream sent it"
        );
    }
    assert_eq!(doc.body.lock().await.1, format!("writer {winner}"));

    // The winner retries (its answer lost, say) with its key and its now stale
    // If-Match, through the other proxy: the stored 200 is replayed, not a 412.
    let retry = put_keyed(
        &client,
        &proxies[(winner + 1) % 2].url("/docs/1"),
        winner_key,
        Some(&etag),
        &format!("writer {winner}"),
    )
    .await;
    assert_eq!(retry.status, StatusCode::OK, "{retry:?}");
    assert!(retry.replayed());
    assert_eq!(retry.body, won_answer.body);
    assert_eq!(
        doc.puts.load(Ordering::SeqCst),
        1,
        "the replay forwards nothing"
    );

    // The current ETag through the other proxy applies.
    let next = put(&client, &proxies[1].url("/docs/1"), Some(&tag(2)), "next").await;
    assert_eq!(next.status, StatusCode::OK, "{next:?}");
    assert_eq!(doc.puts.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_proxies_on_postgres_enforce_if_match_for_an_upstream_that_ignores_it() {
    two_proxies_enforce_if_match(&postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_proxies_on_redis_enforce_if_match_for_an_upstream_that_ignores_it() {
    two_proxies_enforce_if_match(&redis_url()).await;
}
