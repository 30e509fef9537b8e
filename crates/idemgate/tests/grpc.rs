//! gRPC calls through the layer in-process (PROTOCOL §22), with a handler that
//! answers as a gRPC server does: HTTP 200, one length-prefixed message, the
//! outcome in trailers (`grpc-status`, `grpc-message`, trailing metadata).
//!
//! A retry replays the message and the trailers byte for byte, custom
//! metadata included; another message under the key is `FAILED_PRECONDITION`;
//! a call in flight is `ABORTED` with `grpc-retry-pushback-ms`; `UNAVAILABLE`
//! releases the claim, `INTERNAL` is stored; a streaming call with a key is
//! `INVALID_ARGUMENT`; a store outage is `UNAVAILABLE`. Every answer the layer
//! gives is HTTP 200 with a `grpc-status`, never an HTTP error.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use http_body_util::BodyExt;
use idemgate::{IdempotencyLayer, MemoryStore, Store};
use support::{FaultyStore, new_key};
use tower::ServiceExt;

const METHOD: &str = "/shop.Orders/CreateOrder";

/// The handler's runs, and how long each one takes.
#[derive(Default)]
struct Server {
    runs: AtomicUsize,
    pause: std::sync::Mutex<Duration>,
}

/// `bytes` as one gRPC message (not compressed).
fn message(bytes: &[u8]) -> Vec<u8> {
    let mut framed = vec![0];
    framed.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    framed.extend_from_slice(bytes);
    framed
}

/// Answers the status the request's `x-answer` metadata names (`0` unless
/// told), with a reply naming the run and a trailing `x-receipt-bin` — or,
/// told `at-once:CODE`, Trailers-Only: the status and an `x-error-id` in the
/// headers, no reply (as gRPC servers send an error).
async fn create_order(State(server): State<Arc<Server>>, request: Request<Body>) -> Response {
    let run = server.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let pause = *server.pause.lock().unwrap();
    tokio::time::sleep(pause).await;
    let status = request
        .headers()
        .get("x-answer")
        .map_or("0", |value| value.to_str().unwrap())
        .to_owned();
    if let Some(code) = status.strip_prefix("at-once:") {
        return Response::builder()
            .header(header::CONTENT_TYPE, "application/grpc")
            .header("grpc-status", code)
            .header("grpc-message", "refused")
            .header("x-error-id", format!("err-{run}"))
            .body(Body::empty())
            .unwrap();
    }
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_str(&status).unwrap());
    trailers.insert("grpc-message", HeaderValue::from_static("run%20done"));
    trailers.append(
        "x-receipt-bin",
        HeaderValue::from_str(&format!("cnVu{run}")).unwrap(),
    );
    trailers.append("x-receipt-bin", HeaderValue::from_static("dHdv"));
    let frames = [
        Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from(message(
            format!("order {run}").as_bytes(),
        )))),
        Ok(http_body::Frame::trailers(trailers)),
    ];
    Response::builder()
        .header(header::CONTENT_TYPE, "application/grpc")
        .header("grpc-encoding", "identity")
        .body(Body::new(http_body_util::StreamBody::new(
            futures_util::stream::iter(frames),
        )))
        .unwrap()
}

fn app(store: impl Store + 'static, server: Arc<Server>) -> Router {
    app_with(IdempotencyLayer::new(store), server)
}

fn app_with(layer: IdempotencyLayer, server: Arc<Server>) -> Router {
    Router::new()
        .route(METHOD, post(create_order))
        .route_layer(layer)
        .layer(axum::middleware::from_fn(support::authenticate))
        .with_state(server)
}

/// One call's answer, read whole: status, headers, body bytes and trailers.
struct Call {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    trailers: HeaderMap,
}

impl Call {
    /// `grpc-status`: from the trailers, or the headers (Trailers-Only).
    fn grpc_status(&self) -> &str {
        self.trailers
            .get("grpc-status")
            .or_else(|| self.headers.get("grpc-status"))
            .expect("every answer has a grpc-status")
            .to_str()
            .unwrap()
    }

    fn replayed(&self) -> bool {
        self.headers.get("idempotent-replayed").is_some()
    }
}

async fn call(app: &Router, key: &str, body: Vec<u8>, answer: &str) -> Call {
    call_keyed(app, Some(key), body, answer).await
}

/// A call with the `idempotency-key` metadata when `key` is given.
async fn call_keyed(app: &Router, key: Option<&str>, body: Vec<u8>, answer: &str) -> Call {
    let mut request = Request::post(METHOD)
        .header(header::CONTENT_TYPE, "application/grpc")
        .header("te", "trailers")
        .header("x-user", "alice")
        .header("x-answer", answer);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let request = request.body(Body::from(body)).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    Call {
        status: parts.status,
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
    }
}

fn order() -> Vec<u8> {
    message(b"\x0a\x05pizza")
}

#[tokio::test]
async fn a_retry_replays_the_reply_and_its_trailers_byte_for_byte() {
    let server = Arc::new(Server::default());
    let app = app(MemoryStore::new(), Arc::clone(&server));
    let key = new_key();
    let first = call(&app, &key, order(), "0").await;
    let retry = call(&app, &key, order(), "0").await;
    assert_eq!(server.runs.load(Ordering::SeqCst), 1);
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.grpc_status(), "0");
    assert!(!first.replayed() && retry.replayed());
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.body, Bytes::from(message(b"order 1")));
    assert_eq!(retry.trailers, first.trailers);
    let receipts: Vec<_> = retry.trailers.get_all("x-receipt-bin").iter().collect();
    assert_eq!(receipts, ["cnVu1", "dHdv"]);
    assert_eq!(retry.headers["grpc-encoding"], "identity");
    assert_eq!(retry.headers[header::CONTENT_TYPE], "application/grpc");
}

#[tokio::test]
async fn another_message_under_the_key_is_failed_precondition() {
    let server = Arc::new(Server::default());
    let app = app(MemoryStore::new(), Arc::clone(&server));
    let key = new_key();
    call(&app, &key, order(), "0").await;
    let other = call(&app, &key, message(b"\x0a\x05sushi"), "0").await;
    assert_eq!(other.status, StatusCode::OK);
    assert_eq!(other.grpc_status(), "9");
    assert!(other.body.is_empty());
    assert!(other.headers.get("grpc-message").is_some());
    assert_eq!(server.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_call_in_flight_is_aborted_with_pushback_and_runs_once() {
    let server = Arc::new(Server::default());
    *server.pause.lock().unwrap() = Duration::from_millis(400);
    let app = app(MemoryStore::new(), Arc::clone(&server));
    let key = new_key();
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let calls: Vec<_> = (0..2)
        .map(|i| {
            let (app, key, barrier) = (app.clone(), key.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                if i == 1 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                call(&app, &key, order(), "0").await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in calls {
        answers.push(task.await.unwrap());
    }
    assert_eq!(server.runs.load(Ordering::SeqCst), 1);
    assert_eq!(answers[0].grpc_status(), "0");
    let busy = &answers[1];
    assert_eq!(busy.status, StatusCode::OK);
    assert_eq!(busy.grpc_status(), "10");
    let pushback: u64 = busy.headers["grpc-retry-pushback-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(pushback > 0);
}

#[tokio::test]
async fn unavailable_releases_the_call_and_internal_is_stored() {
    let server = Arc::new(Server::default());
    let app = app(MemoryStore::new(), Arc::clone(&server));
    let key = new_key();
    assert_eq!(call(&app, &key, order(), "14").await.grpc_status(), "14");
    let retried = call(&app, &key, order(), "0").await;
    assert_eq!(retried.grpc_status(), "0");
    assert!(!retried.replayed());
    assert_eq!(server.runs.load(Ordering::SeqCst), 2);

    let key = new_key();
    let failed = call(&app, &key, order(), "13").await;
    let replayed = call(&app, &key, order(), "0").await;
    assert_eq!(server.runs.load(Ordering::SeqCst), 3);
    assert!(replayed.replayed());
    assert_eq!(replayed.grpc_status(), "13");
    assert_eq!(replayed.trailers, failed.trailers);
}

#[tokio::test]
async fn a_keyed_streaming_call_is_invalid_argument_and_does_not_run() {
    let server = Arc::new(Server::default());
    let app = app(MemoryStore::new(), Arc::clone(&server));
    let two = [order(), order()].concat();
    let refused = call(&app, &new_key(), two, "0").await;
    assert_eq!(refused.status, StatusCode::OK);
    assert_eq!(refused.grpc_status(), "3");
    assert_eq!(server.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_store_outage_is_unavailable() {
    let server = Arc::new(Server::default());
    let store = FaultyStore::default();
    store.claims_fail.store(true, Ordering::SeqCst);
    let app = app(store, Arc::clone(&server));
    let answer = call(&app, &new_key(), order(), "0").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.grpc_status(), "14");
    assert_eq!(server.runs.load(Ordering::SeqCst), 0);
}

/// AIP-155: the key is the message's `request_id` (field 1), read without the
/// schema; the metadata key, when also sent, must agree.
#[tokio::test]
async fn the_key_can_be_a_field_of_the_message() {
    let server = Arc::new(Server::default());
    let layer =
        IdempotencyLayer::new(MemoryStore::new()).with_key_source("protobuf:1".parse().unwrap());
    let app = app_with(layer, Arc::clone(&server));
    // field 2 (item) before field 1 (request_id): order does not matter.
    let request = |id: &str| {
        let mut fields = b"\x12\x05pizza".to_vec();
        fields.push(0x0a);
        fields.push(id.len() as u8);
        fields.extend_from_slice(id.as_bytes());
        message(&fields)
    };
    let first = call_keyed(&app, None, request("req-1"), "0").await;
    let retry = call_keyed(&app, None, request("req-1"), "0").await;
    assert!(!first.replayed() && retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(server.runs.load(Ordering::SeqCst), 1);
    call_keyed(&app, None, request("req-2"), "0").await;
    assert_eq!(server.runs.load(Ordering::SeqCst), 2);
    // Metadata naming another key than the message's: refused, not run.
    let ambiguous = call_keyed(&app, Some("other"), request("req-1"), "0").await;
    assert_eq!(ambiguous.grpc_status(), "3");
    // A compressed message cannot be read for its key.
    let mut compressed = request("req-3");
    compressed[0] = 1;
    assert_eq!(
        call_keyed(&app, None, compressed, "0").await.grpc_status(),
        "3"
    );
    assert_eq!(server.runs.load(Ordering::SeqCst), 2);
}

/// `DEADLINE_EXCEEDED` may come after the work was done (gRPC's status-code
/// guide): stored, as a 5xx, not released — the retry replays it.
#[tokio::test]
async fn deadline_exceeded_is_stored_not_released() {
    let server = Arc::new(Server::default());
    let app = app(MemoryStore::new(), Arc::clone(&server));
    let key = new_key();
    assert_eq!(call(&app, &key, order(), "4").await.grpc_status(), "4");
    let retry = call(&app, &key, order(), "0").await;
    assert!(retry.replayed());
    assert_eq!(retry.grpc_status(), "4");
    assert_eq!(server.runs.load(Ordering::SeqCst), 1);
}

/// An error answered Trailers-Only keeps all its headers — they are its
/// status and metadata — though `x-error-id` is on no replay list.
#[tokio::test]
async fn a_trailers_only_error_is_replayed_with_its_metadata() {
    let server = Arc::new(Server::default());
    let app = app(MemoryStore::new(), Arc::clone(&server));
    let key = new_key();
    let first = call(&app, &key, order(), "at-once:5").await;
    let retry = call(&app, &key, order(), "at-once:5").await;
    assert_eq!(server.runs.load(Ordering::SeqCst), 1);
    assert!(retry.replayed());
    assert_eq!(retry.grpc_status(), "5");
    assert_eq!(retry.headers["x-error-id"], first.headers["x-error-id"]);
    assert_eq!(retry.headers["grpc-message"], "refused");
}

/// A reply past the stored-response limit ran once; its replays say so as a
/// final status, never as a 200 without one.
#[tokio::test]
async fn a_reply_not_retained_replays_as_data_loss() {
    let server = Arc::new(Server::default());
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_response_limit(4);
    let app = app_with(layer, Arc::clone(&server));
    let key = new_key();
    let first = call(&app, &key, order(), "0").await;
    assert_eq!(first.grpc_status(), "0");
    assert_eq!(first.body, Bytes::from(message(b"order 1")));
    let retry = call(&app, &key, order(), "0").await;
    assert_eq!(server.runs.load(Ordering::SeqCst), 1);
    assert!(retry.replayed());
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(retry.grpc_status(), "15");
}

/// A replay names its trailers in `Trailer`, which HTTP/1.1 needs to send them.
#[tokio::test]
async fn a_replay_names_its_trailers() {
    let server = Arc::new(Server::default());
    let app = app(MemoryStore::new(), Arc::clone(&server));
    let key = new_key();
    call(&app, &key, order(), "0").await;
    let retry = call(&app, &key, order(), "0").await;
    assert_eq!(
        retry.headers[header::TRAILER],
        "grpc-status, grpc-message, x-receipt-bin"
    );
}

/// A streaming call on a route that reads its key from the message carries
/// no key there: it passes through unkeyed, and runs.
#[tokio::test]
async fn a_streaming_call_passes_a_protobuf_key_route_unkeyed() {
    let server = Arc::new(Server::default());
    let layer =
        IdempotencyLayer::new(MemoryStore::new()).with_key_source("protobuf:1".parse().unwrap());
    let app = app_with(layer, Arc::clone(&server));
    let two = [order(), order()].concat();
    let answer = call_keyed(&app, None, two, "0").await;
    assert_eq!(answer.grpc_status(), "0");
    assert!(!answer.replayed());
    assert_eq!(server.runs.load(Ordering::SeqCst), 1);
}
