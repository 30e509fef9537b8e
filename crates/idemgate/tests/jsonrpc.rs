//! JSON-RPC routes (PROTOCOL §20, `with_jsonrpc`): an MCP-style tool call keyed
//! by `params._meta.idempotency_key`, retried with a new envelope `id` as every
//! client numbers its requests: one run, and each answer carries the `id` of
//! the request it answers — in a JSON body and in an event stream.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idemgate::{IdempotencyLayer, MemoryStore};
use support::{authenticate, send};

/// The MCP server's stand-in: counts tool runs, answers the request's `id`.
#[derive(Default)]
struct Tools {
    runs: AtomicUsize,
}

fn request_id(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice::<serde_json::Value>(body).unwrap()["id"].clone()
}

async fn call_json(State(tools): State<Arc<Tools>>, body: Bytes) -> Response {
    let run = tools.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let answer = serde_json::json!({
        "jsonrpc": "2.0",
        "id": request_id(&body),
        "result": {"content": [{"type": "text", "text": format!("charged, run {run}")}]},
    });
    axum::Json(answer).into_response()
}

/// As MCP's Streamable HTTP answers when it streams: a progress notification,
/// then the response, as events.
async fn call_streamed(State(tools): State<Arc<Tools>>, body: Bytes) -> Response {
    let run = tools.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let id = request_id(&body);
    let stream = format!(
        "event: message\nid: {run}-1\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{{\"progress\":1}}}}\n\n\
         event: message\nid: {run}-2\ndata: {{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"run\":{run}}}}}\n\n"
    );
    let mut response = stream.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    response
}

fn app(tools: &Arc<Tools>) -> Router {
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .with_key_source("json:/params/_meta/idempotency_key".parse().unwrap())
        .with_jsonrpc(true);
    Router::new()
        .route("/mcp", post(call_json))
        .route("/mcp/streamed", post(call_streamed))
        .route_layer(layer)
        .layer(axum::middleware::from_fn(authenticate))
        .with_state(Arc::clone(tools))
}

fn call(
    path: &str,
    id: serde_json::Value,
    key: &str,
    amount: u32,
) -> axum::http::Request<axum::body::Body> {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "tools/call",
        "params": {"name": "charge", "arguments": {"amount": amount}, "_meta": {"idempotency_key": key}},
    });
    support::post_json(path, Some("agent"), None, &body.to_string())
}

#[tokio::test]
async fn a_retry_with_a_new_id_is_replayed_with_its_own_id() {
    let tools = Arc::new(Tools::default());
    let app = app(&tools);
    let key = support::new_key();
    let first = send(&app, call("/mcp", 1.into(), &key, 5)).await;
    assert_eq!(first.status, StatusCode::OK);
    let retry = send(&app, call("/mcp", "retry-2".into(), &key, 5)).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(tools.runs.load(Ordering::SeqCst), 1, "the tool ran once");
    let (first, retry): (serde_json::Value, serde_json::Value) = (
        serde_json::from_slice(&first.body).unwrap(),
        serde_json::from_slice(&retry.body).unwrap(),
    );
    assert_eq!(first["id"], 1);
    assert_eq!(retry["id"], "retry-2", "answered with the retry's own id");
    assert_eq!(retry["result"], first["result"], "the first run's result");

    // Another amount under the key: another operation's body, 422.
    let reused = send(&app, call("/mcp", 3.into(), &key, 6)).await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(tools.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_streamed_answer_is_replayed_with_the_retrys_id_in_its_response_event() {
    let tools = Arc::new(Tools::default());
    let app = app(&tools);
    let key = support::new_key();
    let first = send(&app, call("/mcp/streamed", 7.into(), &key, 5)).await;
    assert_eq!(first.status, StatusCode::OK);
    let retry = send(&app, call("/mcp/streamed", 8.into(), &key, 5)).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(tools.runs.load(Ordering::SeqCst), 1);
    let expected = String::from_utf8(first.body.to_vec())
        .unwrap()
        .replace("\"id\":7", "\"id\":8");
    assert_eq!(
        String::from_utf8(retry.body.to_vec()).unwrap(),
        expected,
        "the notification as it was, the response with the retry's id"
    );
}

#[tokio::test]
async fn a_batch_is_refused_before_anything_runs() {
    let tools = Arc::new(Tools::default());
    let app = app(&tools);
    let key = support::new_key();
    let one = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "charge", "_meta": {"idempotency_key": key}},
    });
    let batch = serde_json::json!([one.clone(), one]).to_string();
    let answer = send(
        &app,
        support::post_json("/mcp", Some("agent"), None, &batch),
    )
    .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    let problem: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    assert!(
        problem["type"].as_str().unwrap().ends_with("jsonrpc-batch"),
        "{problem}"
    );
    assert_eq!(tools.runs.load(Ordering::SeqCst), 0);
}
