//! A replay is always in a content coding the retry accepts (PROTOCOL §7, RFC
//! 9110 §12.5.3): a handler that gzips (or zstd-compresses) its answer for a
//! first request that accepted it, then a retry that accepts only identity, gets
//! the decoded body without `Content-Encoding` — and a retry that accepts the
//! coding gets the stored bytes. The handler runs once.

mod support;

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idemgate::{IdempotencyLayer, MemoryStore, Principal};
use support::{new_key, post_json, send};

const JSON: &str =
    r#"{"order":1,"items":[{"id":42,"quantity":1}],"note":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}"#;

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// Answers `JSON` in the coding the path names, whatever the request accepts
/// (as a careless upstream might), with a strong ETag; counts its runs.
async fn encoded(
    State(runs): State<Arc<AtomicUsize>>,
    request: axum::extract::Request,
) -> Response {
    runs.fetch_add(1, Ordering::SeqCst);
    let (body, coding) = if request.uri().path() == "/zstd" {
        (zstd::encode_all(JSON.as_bytes(), 3).unwrap(), "zstd")
    } else {
        (gzip(JSON.as_bytes()), "gzip")
    };
    let mut response = (StatusCode::CREATED, Body::from(body)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static(coding));
    headers.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
    response
}

fn app(runs: Arc<AtomicUsize>) -> Router {
    Router::new()
        .route("/gzip", post(encoded))
        .route("/zstd", post(encoded))
        .route_layer(IdempotencyLayer::new(MemoryStore::new()))
        .layer(axum::middleware::from_fn(
            |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
                request
                    .extensions_mut()
                    .insert(Principal::new("user:alice"));
                next.run(request).await
            },
        ))
        .with_state(runs)
}

async fn send_accepting(
    app: &Router,
    path: &str,
    key: &str,
    accept: &str,
) -> idemgate_testkit::Answer {
    let mut request = post_json(path, None, Some(key), "{}");
    request.headers_mut().insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_str(accept).unwrap(),
    );
    send(app, request).await
}

#[tokio::test]
async fn a_retry_that_refuses_the_stored_coding_gets_it_decoded() {
    for (path, coding) in [("/gzip", "gzip"), ("/zstd", "zstd")] {
        let runs = Arc::new(AtomicUsize::new(0));
        let app = app(Arc::clone(&runs));
        let key = new_key();
        let first = send_accepting(&app, path, &key, &format!("{coding}, identity")).await;
        assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
        assert_eq!(first.headers[header::CONTENT_ENCODING], coding);

        let narrower = send_accepting(&app, path, &key, "identity").await;
        assert!(narrower.replayed(), "{narrower:?}");
        assert!(
            narrower.headers.get(header::CONTENT_ENCODING).is_none(),
            "a coding the retry refused: {narrower:?}"
        );
        assert_eq!(narrower.body, JSON.as_bytes(), "the decoded representation");
        assert_eq!(
            narrower.headers[header::ETAG],
            "W/\"v1\"",
            "other bytes: a weak tag"
        );
        assert_eq!(narrower.headers[header::CONTENT_TYPE], "application/json");

        let same = send_accepting(&app, path, &key, coding).await;
        assert!(same.replayed());
        assert_eq!(same.headers[header::CONTENT_ENCODING], coding);
        assert_eq!(
            same.body, first.body,
            "an accepted coding replays the stored bytes"
        );
        assert_eq!(same.headers[header::ETAG], "\"v1\"");

        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{path}: the handler ran once"
        );
    }
}
