//! A key reused with another JSON body answers 422 naming the differing JSON
//! pointers (PROTOCOL §6.3, docs/problems.md): for every key source, while the
//! first request runs and after it completed, in the Stripe shape too; a body
//! that is not JSON, and a record an older build wrote (no digests), keep the
//! bare 422. Counted by the charges the handler makes.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::{post, put};
use idemgate::fingerprint::{BodySelection, Fingerprint, FingerprintInput};
use idemgate::key::{IdempotencyKey, KeySource};
use idemgate::problem::ProblemShape;
use idemgate::scope::{Identity, Principal as ScopePrincipal, Scope};
use idemgate::{ClaimRequest, IdempotencyLayer, MemoryStore, Principal, Store};
use support::{Answer, send};

#[derive(Default)]
struct Charges(AtomicUsize);

async fn charge(State(charges): State<Arc<Charges>>, body: Bytes) -> impl IntoResponse {
    let run = charges.0.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        format!("{{\"run\":{run},\"bytes\":{}}}", body.len()),
    )
}

fn app(layer: IdempotencyLayer) -> (Router, Arc<Charges>) {
    let charges = Arc::new(Charges::default());
    let layer = layer.with_methods([http::Method::POST, http::Method::PUT]);
    let router = Router::new()
        .route("/transfers", post(charge))
        .route("/products/{product_id}", put(charge))
        .route_layer(layer)
        .layer(middleware::from_fn(
            |mut request: axum::extract::Request, next: middleware::Next| async move {
                request
                    .extensions_mut()
                    .insert(Principal::new("user:alice"));
                next.run(request).await
            },
        ))
        .with_state(Arc::clone(&charges));
    (router, charges)
}

fn request(
    method: &str,
    uri: &str,
    content_type: &str,
    key: Option<&str>,
    body: &str,
) -> http::Request<Body> {
    let mut builder = http::Request::builder()
        .method(method)
        .uri(uri)
        .header(header::CONTENT_TYPE, content_type);
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(Body::from(body.to_owned())).unwrap()
}

fn json(method: &str, uri: &str, key: Option<&str>, body: &str) -> http::Request<Body> {
    request(method, uri, "application/json", key, body)
}

fn problem(answer: &Answer) -> serde_json::Value {
    assert_eq!(
        answer.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{answer:?}"
    );
    serde_json::from_slice(&answer.body).expect("a JSON problem")
}

fn assert_names(answer: &Answer, pointers: &[&str], complete: bool) {
    let problem = problem(answer);
    assert_eq!(problem["type"], "/problems/key-reused", "{problem}");
    assert_eq!(
        problem["differing"],
        serde_json::json!(pointers),
        "{problem}"
    );
    assert_eq!(problem["differing_complete"], complete, "{problem}");
}

fn assert_bare(answer: &Answer) {
    let problem = problem(answer);
    assert_eq!(problem["type"], "/problems/key-reused", "{problem}");
    assert!(problem.get("differing").is_none(), "{problem}");
    assert!(problem.get("differing_complete").is_none(), "{problem}");
}

#[tokio::test]
async fn every_key_source_names_the_changed_amount() {
    let cases: [(&str, &str, &str, Option<&str>); 5] = [
        ("header:idempotency-key", "POST", "/transfers", Some("k-1")),
        ("header:x-request-id", "POST", "/transfers", None),
        ("json:/reference_id", "POST", "/transfers", None),
        ("path:product_id", "PUT", "/products/p-1", None),
        (
            "query:request_id",
            "POST",
            "/transfers?request_id=q-1",
            None,
        ),
    ];
    for (source, method, uri, key) in cases {
        let layer = IdempotencyLayer::new(MemoryStore::new())
            .with_key_source(source.parse::<KeySource>().unwrap());
        let (app, charges) = app(layer);
        let body =
            |amount: u32| format!(r#"{{"reference_id":"r-1","amount":{amount},"to":"bob"}}"#);
        let send_with = |amount: u32| {
            let mut request = json(method, uri, key, &body(amount));
            if source.starts_with("header:") {
                request
                    .headers_mut()
                    .insert("x-request-id", "x-1".parse().unwrap());
            }
            request
        };
        let first = send(&app, send_with(5)).await;
        assert_eq!(first.status, StatusCode::CREATED, "{source}: {first:?}");
        let reused = send(&app, send_with(6)).await;
        assert_names(&reused, &["/amount"], true);
        assert_eq!(charges.0.load(Ordering::SeqCst), 1, "{source}: ran twice");
    }
}

#[tokio::test]
async fn added_removed_and_nested_fields_are_named_in_order() {
    let (app, charges) = app(IdempotencyLayer::new(MemoryStore::new()));
    let first = r#"{"amount":5,"currency":"EUR","items":[{"id":1,"quantity":1}]}"#;
    assert_eq!(
        send(&app, json("POST", "/transfers", Some("k"), first))
            .await
            .status,
        StatusCode::CREATED
    );
    let changed = r#"{"amount":5,"items":[{"id":1,"quantity":3}],"note":"gift"}"#;
    let answer = send(&app, json("POST", "/transfers", Some("k"), changed)).await;
    assert_names(&answer, &["/currency", "/items/0/quantity", "/note"], true);
    let detail = problem(&answer)["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("differs at /currency, /items/0/quantity, /note;"),
        "{detail}"
    );
    // The same body under another query string: no field differs, and the
    // answer says the difference lies elsewhere.
    let elsewhere = send(&app, json("POST", "/transfers?x=1", Some("k"), first)).await;
    assert_names(&elsewhere, &[], true);
    assert!(
        problem(&elsewhere)["detail"]
            .as_str()
            .unwrap()
            .contains("the same body")
    );
    assert_eq!(charges.0.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_reuse_while_the_first_runs_names_the_fields_too() {
    let slow = Router::new()
        .route(
            "/transfers",
            post(|| async {
                tokio::time::sleep(Duration::from_millis(400)).await;
                StatusCode::CREATED
            }),
        )
        .route_layer(IdempotencyLayer::new(MemoryStore::new()))
        .layer(middleware::from_fn(
            |mut request: axum::extract::Request, next: middleware::Next| async move {
                request
                    .extensions_mut()
                    .insert(Principal::new("user:alice"));
                next.run(request).await
            },
        ));
    let first = {
        let slow = slow.clone();
        tokio::spawn(async move {
            send(
                &slow,
                json("POST", "/transfers", Some("k"), r#"{"amount":5}"#),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let reused = send(
        &slow,
        json("POST", "/transfers", Some("k"), r#"{"amount":6}"#),
    )
    .await;
    assert_names(&reused, &["/amount"], true);
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
}

#[tokio::test]
async fn fields_the_fingerprint_leaves_out_are_neither_compared_nor_named() {
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .with_fingerprint_body(BodySelection::Except(vec!["/sent_at".parse().unwrap()]));
    let (app, charges) = app(layer);
    let first = send(
        &app,
        json(
            "POST",
            "/transfers",
            Some("k"),
            r#"{"amount":5,"sent_at":"12:00:01"}"#,
        ),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let reused = send(
        &app,
        json(
            "POST",
            "/transfers",
            Some("k"),
            r#"{"amount":6,"sent_at":"12:00:09"}"#,
        ),
    )
    .await;
    assert_names(&reused, &["/amount"], true);
    assert_eq!(charges.0.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_body_that_is_not_json_keeps_the_bare_422() {
    let (app, charges) = app(IdempotencyLayer::new(MemoryStore::new()));
    let text = |body: &str| request("POST", "/transfers", "text/plain", Some("k"), body);
    assert_eq!(
        send(&app, text("amount=5")).await.status,
        StatusCode::CREATED
    );
    assert_bare(&send(&app, text("amount=6")).await);
    // JSON after text under the same key: one side has no fields to compare.
    assert_bare(
        &send(
            &app,
            json("POST", "/transfers", Some("k"), r#"{"amount":5}"#),
        )
        .await,
    );
    assert_eq!(charges.0.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_record_an_older_build_wrote_still_answers_422_naming_nothing() {
    let store = Arc::new(MemoryStore::new());
    let (app, charges) = app(IdempotencyLayer::from_arc(store.clone()));
    // The record as a build before field digests claimed it: the same identity
    // and fingerprint the layer computes, no digests.
    let body = r#"{"amount":5}"#;
    let scope = Scope {
        principal: ScopePrincipal::new("user:alice"),
        method: "POST".into(),
        path: "/transfers".into(),
    };
    let old = ClaimRequest {
        identity: Identity::new(scope, IdempotencyKey::parse(b"k", 255).unwrap()),
        fingerprint: Fingerprint::of(FingerprintInput {
            method: "POST",
            path: "/transfers",
            query: "",
            content_type: Some("application/json"),
            headers: &[],
            body: body.as_bytes(),
        }),
        field_digests: None,
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(3600),
        route_template: None,
    };
    assert!(matches!(
        store.try_claim(&old).await.unwrap(),
        idemgate::Claim::Acquired(_)
    ));
    assert_bare(
        &send(
            &app,
            json("POST", "/transfers", Some("k"), r#"{"amount":6}"#),
        )
        .await,
    );
    assert_eq!(charges.0.load(Ordering::SeqCst), 0, "nothing ran");
}

#[tokio::test]
async fn the_stripe_shape_carries_the_list_in_its_message() {
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_problem_shape(ProblemShape::Stripe);
    let (app, _) = app(layer);
    send(
        &app,
        json("POST", "/transfers", Some("k"), r#"{"amount":5}"#),
    )
    .await;
    let reused = send(
        &app,
        json("POST", "/transfers", Some("k"), r#"{"amount":6}"#),
    )
    .await;
    assert_eq!(reused.status, StatusCode::BAD_REQUEST, "{reused:?}");
    let error: serde_json::Value = serde_json::from_slice(&reused.body).unwrap();
    assert_eq!(error["error"]["code"], "key-reused");
    assert_eq!(
        error["error"]["message"],
        "this Idempotency-Key was already used on this endpoint with another body: it differs at /amount; use a new key for a new request"
    );
}
