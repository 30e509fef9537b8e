//! What zstd compression does to a stored ~64 KiB JSON response: encoded size, and
//! the time to encode (on `complete`) and decode (on every replay).
//!
//! `cargo bench -p idemgate-redis --bench compression` prints the sizes, then the
//! timings of the raw and compressed codecs.

#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http::{HeaderName, HeaderValue, StatusCode};
use idemgate_core::record::{StoredBody, StoredResponse};
use idemgate_redis::ResponseCodec;

/// An order-listing JSON body of about 64 KiB: realistic repetition (field names,
/// similar values), not a run of one byte.
fn json_response() -> StoredResponse {
    const STATUSES: [&str; 4] = ["pending", "paid", "shipped", "delivered"];
    let mut orders = Vec::new();
    let mut body = Vec::new();
    for i in 0u64.. {
        orders.push(serde_json::json!({
            "id": format!("ord_{:016x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            "customer": { "id": 1000 + i % 97, "email": format!("customer{}@example.com", i % 97) },
            "status": STATUSES[(i % 4) as usize],
            "currency": "EUR",
            "amount_cents": 1999 + (i * 7919) % 50_000,
            "items": [
                { "sku": format!("SKU-{:05}", (i * 31) % 10_000), "qty": 1 + i % 3, "unit_cents": 999 },
                { "sku": format!("SKU-{:05}", (i * 17) % 10_000), "qty": 1, "unit_cents": 1000 + i % 500 }
            ],
            "created_at": format!("2025-06-{:02}T{:02}:{:02}:00Z", 1 + i % 28, i % 24, i % 60),
        }));
        body = serde_json::to_vec(&serde_json::json!({ "data": orders, "has_more": true }))
            .expect("json");
        if body.len() >= 64 * 1024 {
            break;
        }
    }
    StoredResponse {
        trailers: Vec::new(),
        status: StatusCode::OK,
        headers: vec![
            (
                HeaderName::from_static("content-type"),
                HeaderValue::from_static("application/json"),
            ),
            (
                HeaderName::from_static("x-request-id"),
                HeaderValue::from_static("req_8f14e45fceea167a"),
            ),
        ],
        body: StoredBody::Retained(body.into()),
    }
}

fn compression(c: &mut Criterion) {
    let response = json_response();
    let raw = ResponseCodec::new(usize::MAX);
    let codecs = [
        ("raw", raw),
        ("zstd-1", ResponseCodec::new(1024)),
        ("zstd-3", ResponseCodec::new(1024).with_level(3)),
    ];

    let plain_len = raw.encode(&response).len();
    println!("stored response sizes for a {plain_len}-byte encoded JSON response:");
    for (name, codec) in &codecs {
        let len = codec.encode(&response).len();
        println!(
            "  {name:>7}: {len:>6} bytes ({:.1}% of raw)",
            100.0 * len as f64 / plain_len as f64
        );
    }

    let mut group = c.benchmark_group("stored_response_64k_json");
    group.throughput(Throughput::Bytes(plain_len as u64));
    for (name, codec) in &codecs {
        group.bench_function(format!("encode/{name}"), |b| {
            b.iter(|| codec.encode(black_box(&response)))
        });
        let stored = bytes::Bytes::from(codec.encode(&response));
        group.bench_function(format!("decode/{name}"), |b| {
            b.iter(|| codec.decode(black_box(stored.clone())).expect("decode"))
        });
    }
    group.finish();
}

criterion_group!(benches, compression);
criterion_main!(benches);
