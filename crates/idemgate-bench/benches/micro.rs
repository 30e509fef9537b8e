//! Micro-benchmarks of the hot path's pieces: key parsing, the canonical-JSON
//! fingerprint, `MemoryStore` claim + complete, the record codec, and the layer
//! itself in-process (no sockets, no database) against the same router without it,
//! and what encoding a replay for the client's `Accept-Encoding` costs.
//!
//! `cargo bench -p idemgate-bench --bench micro` (add `-- <filter>` for one group).

#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::routing::post;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use http::{HeaderMap, HeaderName, HeaderValue, Request};
use idemgate::{IdempotencyLayer, MemoryStore, Principal};
use idemgate_core::fingerprint::{Fingerprint, FingerprintInput};
use idemgate_core::key::{DEFAULT_MAX_KEY_LENGTH, IdempotencyKey};
use idemgate_core::record::{StoredBody, StoredResponse};
use idemgate_core::scope::{Identity, Scope};
use idemgate_core::{Claim, ClaimRequest, Completion, FencedWrite, FinalStatus, Store};
use tower::ServiceExt;

const ORDER: &[u8] = br#"{"items":[{"id":42,"quantity":1}],"currency":"RUB","amount":1500}"#;

fn key_parsing(c: &mut Criterion) {
    let mut group = c.benchmark_group("key");
    let uuid = b"8e03978e-40d5-43e8-bc93-6894a57f9324";
    let quoted = br#""8e03978e-40d5-43e8-bc93-6894a57f9324""#;
    group.bench_function("parse/bare-uuid", |b| {
        b.iter(|| IdempotencyKey::parse(black_box(uuid), DEFAULT_MAX_KEY_LENGTH))
    });
    group.bench_function("parse/sf-string-uuid", |b| {
        b.iter(|| IdempotencyKey::parse(black_box(quoted), DEFAULT_MAX_KEY_LENGTH))
    });
    let mut headers = HeaderMap::new();
    headers.insert(
        HeaderName::from_static("idempotency-key"),
        HeaderValue::from_static("8e03978e-40d5-43e8-bc93-6894a57f9324"),
    );
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::AUTHORIZATION,
        HeaderValue::from_static("Bearer alice"),
    );
    group.bench_function("from_headers", |b| {
        b.iter(|| IdempotencyKey::from_headers(black_box(&headers), DEFAULT_MAX_KEY_LENGTH))
    });
    group.finish();
}

/// A JSON document of about `size` bytes: an order list with nested objects,
/// strings with escapes and decimal numbers, as clients send them (spaces included).
fn json_body(size: usize) -> Vec<u8> {
    let mut out = String::from("{\"orders\": [");
    let mut i = 0u64;
    while out.len() < size.saturating_sub(80) {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&format!(
            "{{\"id\": {i}, \"sku\": \"SKU-{:05}\", \"note\": \"caf\\u00e9 \\\"{}\\\"\", \"price\": {}.{:02}, \"qty\": {}}}",
            (i * 31) % 100_000,
            i % 7,
            10 + i % 90,
            i % 100,
            1 + i % 3
        ));
        i += 1;
    }
    out.push_str("], \"currency\": \"RUB\"}");
    out.into_bytes()
}

fn fingerprint(c: &mut Criterion) {
    let mut group = c.benchmark_group("fingerprint");
    for (name, body) in [
        ("order-66B", ORDER.to_vec()),
        ("1KiB", json_body(1024)),
        ("64KiB", json_body(64 * 1024)),
    ] {
        group.throughput(Throughput::Bytes(body.len() as u64));
        for (kind, content_type) in [("json", "application/json"), ("raw", "text/plain")] {
            group.bench_function(format!("{kind}/{name}"), |b| {
                b.iter(|| {
                    Fingerprint::of(FingerprintInput {
                        method: "POST",
                        path: "/api/v1/orders",
                        query: "",
                        content_type: Some(content_type),
                        headers: &[],
                        body: black_box(&body),
                    })
                })
            });
        }
    }
    group.finish();
}

fn claim_request(n: u64) -> ClaimRequest {
    let scope = Scope {
        principal: Principal::new("bearer:0123456789abcdef"),
        method: "POST".into(),
        path: "/api/v1/orders".into(),
    };
    let key = IdempotencyKey::parse(format!("key-{n}").as_bytes(), DEFAULT_MAX_KEY_LENGTH)
        .expect("a valid key");
    ClaimRequest {
        identity: Identity::new(scope, key),
        fingerprint: Fingerprint::of(FingerprintInput {
            method: "POST",
            path: "/api/v1/orders",
            query: "",
            content_type: Some("application/json"),
            headers: &[],
            body: ORDER,
        }),
        field_digests: None,
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(86_400),
        route_template: None,
    }
}

fn created_response(body_len: usize) -> StoredResponse {
    let body = if body_len <= 100 {
        br#"{"amount":1500,"currency":"RUB","order_id":123456,"status":"paid"}"#.to_vec()
    } else {
        json_body(body_len)
    };
    StoredResponse {
        trailers: Vec::new(),
        status: StatusCode::CREATED,
        headers: vec![
            (
                HeaderName::from_static("content-type"),
                HeaderValue::from_static("application/json"),
            ),
            (
                HeaderName::from_static("location"),
                HeaderValue::from_static("/api/v1/orders/123456"),
            ),
        ],
        body: StoredBody::Retained(body.into()),
    }
}

fn memory_store(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let completion = Completion {
        status: FinalStatus::Completed,
        response: created_response(0),
        ttl: Duration::from_secs(86_400),
    };
    let mut group = c.benchmark_group("memory-store");
    // A fresh store per sample, and fresh identities made outside the timing: the
    // store only ever sees new keys, as under the new-key load.
    group.bench_function("claim+complete/new-key", |b| {
        b.iter_custom(|iters| {
            let store = MemoryStore::new();
            let requests: Vec<ClaimRequest> = (0..iters).map(claim_request).collect();
            runtime.block_on(async {
                let start = Instant::now();
                for request in &requests {
                    let Ok(Claim::Acquired(lease)) = store.try_claim(request).await else {
                        panic!("a new key is acquired");
                    };
                    let written = store.complete(&lease, &completion).await.expect("complete");
                    assert_eq!(black_box(written), FencedWrite::Applied);
                }
                start.elapsed()
            })
        })
    });
    let store = MemoryStore::new();
    let request = claim_request(u64::MAX);
    runtime.block_on(async {
        let Ok(Claim::Acquired(lease)) = store.try_claim(&request).await else {
            panic!("a new key is acquired");
        };
        let written = store.complete(&lease, &completion).await.expect("complete");
        assert_eq!(written, FencedWrite::Applied);
    });
    group.bench_function("claim/existing-completed (replay)", |b| {
        b.iter(|| runtime.block_on(store.try_claim(black_box(&request))))
    });
    group.finish();
}

fn record_codec(c: &mut Criterion) {
    let mut group = c.benchmark_group("stored-response");
    for (name, response) in [
        ("201-order", created_response(0)),
        ("64KiB", created_response(64 * 1024)),
    ] {
        let encoded = response.encode();
        group.throughput(Throughput::Bytes(encoded.len() as u64));
        group.bench_function(format!("encode/{name}"), |b| {
            b.iter(|| black_box(&response).encode())
        });
        group.bench_function(format!("decode/{name}"), |b| {
            b.iter(|| StoredResponse::decode(black_box(encoded.clone())).expect("decodes"))
        });
        group.bench_function(format!("encode_fields/{name}"), |b| {
            b.iter(|| black_box(&response).encode_fields())
        });
    }
    group.finish();
}

async fn create_order() -> (
    StatusCode,
    [(header::HeaderName, &'static str); 2],
    &'static str,
) {
    (
        StatusCode::CREATED,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::LOCATION, "/api/v1/orders/123456"),
        ],
        r#"{"amount":1500,"currency":"RUB","order_id":123456,"status":"paid"}"#,
    )
}

fn request(key: Option<&str>) -> Request<Body> {
    let mut builder = Request::post("/api/v1/orders")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, ORDER.len());
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    let mut request = builder.body(Body::from(ORDER)).expect("a valid request");
    request
        .extensions_mut()
        .insert(Principal::new("bearer:0123456789abcdef"));
    request
}

/// The layer in-process: the same router with and without it, a trivial handler,
/// `MemoryStore`. What is left is the layer's own CPU cost per request (on one
/// thread: the hand-off of the detached handler task between workers is not here;
/// the end-to-end runs of `idemgate-bench` include it).
fn layer(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let bare: Router = Router::new().route("/api/v1/orders", post(create_order));
    let layered: Router = Router::new()
        .route("/api/v1/orders", post(create_order))
        .route_layer(IdempotencyLayer::new(MemoryStore::new()));
    let mut group = c.benchmark_group("layer-in-process");
    group.bench_function("bare", |b| {
        b.to_async(&runtime)
            .iter(|| bare.clone().oneshot(request(None)))
    });
    group.bench_function("no-key", |b| {
        b.to_async(&runtime)
            .iter(|| layered.clone().oneshot(request(None)))
    });
    let counter = AtomicU64::new(0);
    group.bench_function("new-key", |b| {
        b.to_async(&runtime).iter_batched(
            || {
                request(Some(&format!(
                    "k-{}",
                    counter.fetch_add(1, Ordering::Relaxed)
                )))
            },
            |request| layered.clone().oneshot(request),
            BatchSize::SmallInput,
        )
    });
    runtime
        .block_on(layered.clone().oneshot(request(Some("replayed"))))
        .expect("first run");
    group.bench_function("replay", |b| {
        b.to_async(&runtime)
            .iter(|| layered.clone().oneshot(request(Some("replayed"))))
    });
    group.finish();
}

/// A replay of a 100 KiB JSON (the issue's example) and of a 1 KiB one, through
/// the layer with the compression `serve` and the proxy put outside it, for a
/// client that accepts each coding: the body read whole, so the encoding is in
/// the time. Identity is the baseline; the difference is the CPU one compressed
/// replay costs.
fn compressed_replay(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("compressed-replay");
    for size in [1024, 100 * 1024] {
        let body = bytes::Bytes::from(json_body(size));
        let handler = {
            let body = body.clone();
            move || {
                let body = body.clone();
                async move { ([(header::CONTENT_TYPE, "application/json")], body) }
            }
        };
        let app: Router = Router::new()
            .route("/api/v1/orders", post(handler))
            .route_layer(IdempotencyLayer::new(MemoryStore::new()))
            .layer(tower_http::compression::CompressionLayer::new());
        runtime
            .block_on(app.clone().oneshot(request(Some("replayed"))))
            .expect("first run");
        group.throughput(Throughput::Bytes(body.len() as u64));
        for coding in ["identity", "gzip", "br", "zstd"] {
            let replay = || {
                let mut request = request(Some("replayed"));
                request
                    .headers_mut()
                    .insert(header::ACCEPT_ENCODING, HeaderValue::from_static(coding));
                let app = app.clone();
                async move {
                    let response = app.oneshot(request).await.expect("infallible");
                    assert!(response.headers().contains_key("idempotent-replayed"));
                    let wire = http_body_util::BodyExt::collect(response.into_body())
                        .await
                        .expect("the replay's body")
                        .to_bytes();
                    black_box(wire.len())
                }
            };
            let on_wire = runtime.block_on(replay());
            println!(
                "compressed-replay/{coding}/{}KiB: {on_wire} bytes on the wire for {}",
                size / 1024,
                body.len()
            );
            group.bench_function(format!("{coding}/{}KiB", size / 1024), |b| {
                b.to_async(&runtime).iter(replay)
            });
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    key_parsing,
    fingerprint,
    memory_store,
    record_codec,
    layer,
    compressed_replay
);
criterion_main!(benches);
