//! Ambiguous input is refused before any claim: two lines of a header the layer
//! reads once (`Authorization` for the default principal, `Content-Type` for the
//! fingerprint, `Idempotency-Key`), and a "JSON" body that is not UTF-8 is hashed
//! as raw bytes, not canonicalized. Every test counts claims and charges.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use idemgate::{DefaultPrincipal, IdempotencyLayer};
use support::*;

const AMBIGUOUS: &str = "/problems/ambiguous-header";

fn counted_app(
    principal: Option<DefaultPrincipal>,
) -> (axum::Router, Arc<FaultyStore>, Arc<Gateway>) {
    let store = Arc::new(FaultyStore::default());
    let gateway = Arc::new(Gateway::default());
    let mut layer = IdempotencyLayer::from_arc(store.clone());
    if let Some(principal) = principal {
        layer = layer.with_principal(principal);
    }
    (app(layer, Arc::clone(&gateway)), store, gateway)
}

/// A keyed `POST /orders` with each `(name, value)` appended as its own line.
fn post_with_lines(key: &str, lines: &[(&str, &str)], body: &[u8]) -> Request<Body> {
    let mut builder = Request::post("/orders").header("idempotency-key", key);
    for (name, value) in lines {
        builder = builder.header(*name, *value);
    }
    builder.body(Body::from(body.to_vec())).unwrap()
}

#[tokio::test]
async fn two_authorization_lines_are_400_and_claim_nothing() {
    let (app, store, gateway) =
        counted_app(Some(DefaultPrincipal::with_authorization_secret("secret")));
    let key = new_key();
    let json = ("content-type", "application/json");
    let twice = post_with_lines(
        &key,
        &[
            json,
            ("authorization", "Bearer alice"),
            ("authorization", "Bearer mallory"),
        ],
        ORDER.as_bytes(),
    );
    let refused = send(&app, twice).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    assert_eq!(refused.problem_type(), AMBIGUOUS);
    assert_eq!(store.claims.load(Ordering::SeqCst), 0, "nothing claimed");
    assert_eq!(gateway.charges(), 0);

    // The same key with one Authorization line is a fresh operation, run once.
    let once = || {
        post_with_lines(
            &key,
            &[json, ("authorization", "Bearer alice")],
            ORDER.as_bytes(),
        )
    };
    let first = send(&app, once()).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.replayed());
    let retry = send(&app, once()).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn two_content_type_lines_are_400_and_claim_nothing() {
    let (app, store, gateway) = counted_app(None);
    let key = new_key();
    let twice = post_with_lines(
        &key,
        &[
            ("x-user", "alice"),
            ("content-type", "application/json"),
            ("content-type", "text/plain"),
        ],
        ORDER.as_bytes(),
    );
    let refused = send(&app, twice).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    assert_eq!(refused.problem_type(), AMBIGUOUS);
    assert_eq!(store.claims.load(Ordering::SeqCst), 0);
    assert_eq!(gateway.charges(), 0);
    let first = send(&app, post_json("/orders", Some("alice"), Some(&key), ORDER)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn two_idempotency_key_lines_are_400_and_claim_nothing() {
    let (app, store, gateway) = counted_app(None);
    let request = Request::post("/orders")
        .header("x-user", "alice")
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", new_key())
        .header("idempotency-key", new_key())
        .body(Body::from(ORDER))
        .unwrap();
    let refused = send(&app, request).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(refused.problem_type(), "/problems/invalid-key");
    assert_eq!(store.claims.load(Ordering::SeqCst), 0);
    assert_eq!(gateway.charges(), 0);
}

/// Invalid UTF-8 is not JSON (RFC 8259 §8.1): the fingerprint hashes the raw bytes,
/// so the same bytes replay but a whitespace change is another request (422), where
/// for valid JSON it would be the same one.
#[tokio::test]
async fn a_json_body_that_is_not_utf8_is_fingerprinted_as_raw_bytes() {
    let (app, _store, gateway) = counted_app(None);
    let key = new_key();
    let request = |body: &[u8]| {
        post_with_lines(
            &key,
            &[("x-user", "alice"), ("content-type", "application/json")],
            body,
        )
    };
    let invalid: &[u8] = b"{\"amount\":1500,\"x\":\"\xc3\x28\"}";
    let spaced: &[u8] = b"{ \"amount\": 1500, \"x\": \"\xc3\x28\" }";
    let first = send(&app, request(invalid)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let same = send(&app, request(invalid)).await;
    assert!(same.replayed(), "the same bytes are the same request");
    let other = send(&app, request(spaced)).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{other:?}");
    assert_eq!(gateway.charges(), 1);

    // The contrast: valid JSON with the same whitespace change replays.
    let key = new_key();
    let valid = |body: &str| post_json("/orders", Some("alice"), Some(&key), body);
    let first = send(&app, valid(r#"{"amount":1500,"x":"/"}"#)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let spaced = send(&app, valid(r#"{ "amount": 1500, "x": "/" }"#)).await;
    assert!(spaced.replayed(), "{spaced:?}");
    assert_eq!(gateway.charges(), 2);
}
