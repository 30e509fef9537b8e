//! Compression on the wire (issue 36 item 5): every attempt of one keyed
//! operation — the first run and each replay — gets the answer in a coding it
//! accepts (gzip, br, zstd or identity), byte-identical once decoded, and a
//! retry with a narrower `Accept-Encoding` than the first request gets a replay
//! it can read (PROTOCOL §7, RFC 9110 §12.5.3), through `serve` and through the
//! proxy, on every store (memory, SQLite, PostgreSQL, Redis). The proxy asks its
//! upstream for identity on covered requests, so what it stores is the
//! representation itself — here in front of an upstream that gzips whenever it
//! may, as json-server does — encodes it per attempt, and the upstream runs
//! once; what it does not cover streams through as the upstream encoded it.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::e2e::keys::{ADMIN_TOKEN, admin_call, keys_query};
use crate::support::client::{Answer, ORDER, new_key};
use crate::support::proxy::{Proxy, ProxyOptions, SECRET};
use crate::support::server::{Options, Server, TempDir, postgres_url, redis_url, sqlite_url};

/// What the gzipping upstream saw: each request's `Accept-Encoding`.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Option<String>>>>);

/// An upstream that answers a 100 KiB JSON, gzipped whenever the request
/// accepts gzip.
async fn gzipping_upstream() -> (SocketAddr, Seen) {
    async fn answer(State(seen): State<Seen>, request: Request) -> Response {
        let accept = request
            .headers()
            .get(header::ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let run = {
            let mut seen = seen.0.lock().unwrap();
            seen.push(accept.clone());
            seen.len()
        };
        let json = big_json(run);
        let mut response = if accept.is_some_and(|a| a.contains("gzip")) {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(json.as_bytes()).unwrap();
            let mut response = (StatusCode::CREATED, encoder.finish().unwrap()).into_response();
            response
                .headers_mut()
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            response
        } else {
            (StatusCode::CREATED, json).into_response()
        };
        // What such an API sends besides the body: the outcome's headers, its
        // own, and per-response ones a replay must not repeat.
        for (name, value) in [
            ("location", format!("/v1/orders/{run}")),
            ("etag", format!("\"run-{run}\"")),
            ("x-order-ref", format!("ref-{run}")),
            ("x-request-id", format!("req-{run}")),
            ("request-id", format!("req_stripe_{run}")),
            ("x-ratelimit-remaining", format!("{}", 100 - run)),
            ("server", "json-server".to_owned()),
            ("set-cookie", format!("session=run-{run}; HttpOnly")),
        ] {
            response
                .headers_mut()
                .append(name, HeaderValue::from_str(&value).unwrap());
        }
        response
    }
    let seen = Seen::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().fallback(answer).with_state(seen.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, seen)
}

/// About 100 KiB of JSON, unique to its run.
fn big_json(run: usize) -> String {
    let items: Vec<_> = (0..2650)
        .map(|i| serde_json::json!({"id": i, "sku": format!("SKU-{i:06}"), "qty": i % 7}))
        .collect();
    serde_json::json!({"run": run, "items": items}).to_string()
}

async fn post(url: &str, token: &str, key: &str, accept: &str) -> Answer {
    let response = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .header("accept-encoding", accept)
        .body(ORDER)
        .send()
        .await
        .expect("POST");
    Answer {
        status: response.status(),
        headers: response.headers().clone(),
        body: response.bytes().await.expect("body"),
    }
}

/// The body as the client reads it: decoded by its `Content-Encoding`.
fn readable(answer: &Answer) -> Vec<u8> {
    let body = &answer.body[..];
    let mut plain = Vec::new();
    match answer
        .headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap())
    {
        None => return body.to_vec(),
        Some("gzip") => flate2::read::GzDecoder::new(body)
            .read_to_end(&mut plain)
            .map(drop),
        Some("br") => brotli_decompressor::Decompressor::new(body, 4096)
            .read_to_end(&mut plain)
            .map(drop),
        Some("zstd") => zstd::stream::read::Decoder::new(body)
            .and_then(|mut d| d.read_to_end(&mut plain))
            .map(drop),
        Some(other) => panic!("unexpected coding {other:?}"),
    }
    .unwrap_or_else(|e| panic!("a body its Content-Encoding cannot decode: {e}"));
    plain
}

/// Each `(Accept-Encoding, coding on the wire)` an attempt of one operation
/// makes in turn: the first run accepts gzip, then retries that accept only
/// identity, only br, only zstd, and gzip again.
const ATTEMPTS: [(&str, Option<&str>); 5] = [
    ("gzip", Some("gzip")),
    ("identity", None),
    ("br", Some("br")),
    ("zstd", Some("zstd")),
    ("gzip;q=1, identity;q=0.5", Some("gzip")),
];

/// Every attempt of one operation, each with its `Accept-Encoding`: all get
/// the one representation, each in a coding it accepts; the first is the run,
/// the rest replays. Returns the decoded body and the first answer.
async fn every_coding(url: &str, token: &str, key: &str, what: &str) -> (Vec<u8>, Answer) {
    let mut first: Option<(Vec<u8>, Answer)> = None;
    for (accept, coding) in ATTEMPTS {
        let answer = post(url, token, key, accept).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{what}: {answer:?}");
        assert_eq!(
            answer
                .headers
                .get(header::CONTENT_ENCODING)
                .map(|v| v.to_str().unwrap()),
            coding,
            "{what}: Accept-Encoding {accept:?} gets {coding:?}: {:?}",
            answer.headers
        );
        let plain = readable(&answer);
        if coding.is_some() {
            assert!(
                answer.body.len() < plain.len(),
                "{what}: {coding:?} on the wire: {} bytes for {}",
                answer.body.len(),
                plain.len()
            );
            assert_eq!(
                answer
                    .headers
                    .get(header::VARY)
                    .map(|v| v.to_str().unwrap()),
                Some("accept-encoding"),
                "{what}: {coding:?}: caches must key by Accept-Encoding"
            );
        }
        match &first {
            None => {
                assert!(!answer.replayed(), "{what}: the first run: {answer:?}");
                first = Some((plain, answer));
            }
            Some((body, _)) => {
                assert!(answer.replayed(), "{what} ({accept}): {answer:?}");
                assert_eq!(
                    &plain, body,
                    "{what}: {accept:?} decodes to the first run's bytes"
                );
            }
        }
    }
    first.expect("attempts were made")
}

async fn through_the_proxy(store: &str) {
    let (upstream, seen) = gzipping_upstream().await;
    let proxy = Proxy::start(
        ProxyOptions::new(format!("http://{upstream}"))
            .store(store)
            .env("IDEMGATE_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("IDEMGATE_REPLAY_HEADERS", "X-Order-Ref"),
    )
    .await;
    let url = proxy.url("/v1/orders");
    let token = format!("token-{}", new_key());
    let key = new_key();
    let (plain, first) = every_coding(&url, &token, &key, store).await;
    let json: serde_json::Value = serde_json::from_slice(&plain).unwrap();
    assert_eq!(json["run"], 1);
    // A narrower retry: identity only, after a first run that took gzip.
    let retry = post(&url, &token, &key, "identity").await;
    assert!(retry.replayed(), "{store}: {retry:?}");
    assert!(retry.headers.get(header::CONTENT_ENCODING).is_none());
    assert_eq!(
        retry.body.to_vec(),
        plain,
        "{store}: the same representation"
    );
    // Only what a replay needs (PROTOCOL §7): the outcome's headers, the
    // original request's id and the one the operator added, the first
    // response's values; no per-response header, and no session cookie.
    for name in [
        "location",
        "etag",
        "x-order-ref",
        "content-type",
        "request-id",
        "x-request-id",
    ] {
        assert_eq!(
            retry.headers.get(name),
            first.headers.get(name),
            "{store}: {name} replayed: {:?}",
            retry.headers
        );
    }
    assert_eq!(retry.headers["x-order-ref"], "ref-1", "{store}");
    // The first answer's request ids, as Stripe replays them.
    assert_eq!(retry.headers["request-id"], "req_stripe_1", "{store}");
    assert_eq!(retry.headers["x-request-id"], "req-1", "{store}");
    for name in ["x-ratelimit-remaining", "server", "set-cookie"] {
        assert!(
            !retry.headers.contains_key(name),
            "{store}: {name} is per response, not replayed: {:?}",
            retry.headers
        );
    }
    assert_eq!(
        *seen.0.lock().unwrap(),
        [Some("identity".to_owned())],
        "{store}: one execution, asked for identity"
    );
    // What the proxy does not cover streams through as the upstream encoded it
    // for the client: gzip by the upstream itself, and no coding the proxy
    // would add (br, which this upstream does not speak).
    let http = reqwest::Client::new();
    for (accept, coding) in [("gzip", Some("gzip")), ("br", None)] {
        let get = http
            .get(proxy.url("/v1/orders/1"))
            .header("accept-encoding", accept)
            .send()
            .await
            .unwrap();
        assert_eq!(
            get.headers()
                .get(header::CONTENT_ENCODING)
                .map(|v| v.to_str().unwrap()),
            coding,
            "{store}: an uncovered GET accepting {accept}"
        );
    }
    assert_eq!(
        seen.0.lock().unwrap()[1..],
        [Some("gzip".to_owned()), Some("br".to_owned())],
        "{store}: uncovered, the client's own Accept-Encoding"
    );
    // Stored small: the store keeps the body compressed (the one codec of
    // idemgate_core::compression), and the replay above was the whole JSON.
    let principal = idemgate_server::principal::principal_of(
        &idemgate_server::principal::PrincipalSpec::Authorization {
            value: format!("Bearer {token}"),
            secret: SECRET.as_bytes().to_vec(),
        },
    )
    .unwrap();
    let query = format!(
        "http://{}{}",
        proxy.admin,
        keys_query(principal.as_str(), &key, "/v1/orders")
    );
    let (status, _, view) = admin_call(reqwest::Method::GET, &query, Some(ADMIN_TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    let body_bytes = view["response"]["body_bytes"].as_u64().unwrap();
    let stored = view["response"]["stored_body_bytes"].as_u64().unwrap();
    assert_eq!(body_bytes, retry.body.len() as u64, "{store}: {view}");
    assert!(
        stored * 5 < body_bytes,
        "{store}: a {body_bytes}-byte JSON kept in {stored} bytes"
    );
    println!("{store}: a {body_bytes}-byte JSON body stored in {stored} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_narrower_retry_reads_the_proxys_replay_memory() {
    through_the_proxy("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_narrower_retry_reads_the_proxys_replay_sqlite() {
    let dir = TempDir::new("idemgate-encodings");
    through_the_proxy(&format!(
        "sqlite://{}",
        dir.path().join("proxy.db").display()
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_narrower_retry_reads_the_proxys_replay_postgres() {
    through_the_proxy(&postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_narrower_retry_reads_the_proxys_replay_redis() {
    through_the_proxy(&redis_url()).await;
}

/// `serve`: the orders handler answers identity, the idempotency layer keeps
/// that, and the compression outside it encodes each attempt — the first run
/// and every replay — by the attempt's own `Accept-Encoding`.
async fn through_serve(database: &str, store: &str) {
    let server = Server::start(Options::new(database).store(store)).await;
    let url = server.url("/api/v1/orders");
    let token = format!("token-{}", new_key());
    let key = new_key();
    let what = format!("serve on {store}");
    let (plain, _) = every_coding(&url, &token, &key, &what).await;
    let order: serde_json::Value = serde_json::from_slice(&plain).unwrap();
    assert!(order["order_id"].is_number(), "{what}: {order}");
    // One order for the six attempts.
    let listed = post(&url, &token, &new_key(), "identity").await;
    assert_eq!(listed.status, StatusCode::CREATED);
    let orders = crate::support::client::Client::new()
        .with_token(&token)
        .orders(&server.url(""))
        .await;
    assert_eq!(orders.len(), 2, "{what}: one order per key: {orders:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_narrower_retry_reads_serves_replay_on_every_store() {
    let (sqlite, _dir) = sqlite_url();
    through_serve(&sqlite, "database").await;
    through_serve(&postgres_url(), "database").await;
    through_serve(&sqlite, "memory").await;
    through_serve(&sqlite, &redis_url()).await;
}
