//! Keys from where clients already put them (PROTOCOL §15): a body field, a path
//! parameter, a query parameter, another header — all through the same claim and
//! replay, counted by the charges a mock gateway makes.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::{post, put};
use idemgate::key::KeySource;
use idemgate::{IdempotencyLayer, MemoryStore, Principal};
use support::{Answer, send};

const PROBLEMS: &str = "/problems/";

#[derive(Default)]
struct Charges(AtomicUsize);

impl Charges {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Charges once per run and answers 201 with the run's number, so a replay is
/// told from a second run by its bytes.
async fn charge(State(charges): State<Arc<Charges>>, body: Bytes) -> impl IntoResponse {
    let run = charges.0.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::task::yield_now().await;
    (
        StatusCode::CREATED,
        format!("{{\"run\":{run},\"bytes\":{}}}", body.len()),
    )
}

/// `source` on every route: `POST /transfers`, `PUT /products/{product_id}`.
fn app_with(source: &str) -> (Router, Arc<Charges>) {
    let charges = Arc::new(Charges::default());
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .with_methods([http::Method::POST, http::Method::PUT])
        .with_key_source(source.parse::<KeySource>().unwrap());
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

fn request(method: &str, uri: &str, headers: &[(&str, &str)], body: &str) -> http::Request<Body> {
    let mut builder = http::Request::builder()
        .method(method)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Body::from(body.to_owned())).unwrap()
}

fn transfer(body: &str) -> http::Request<Body> {
    request("POST", "/transfers", &[], body)
}

fn assert_problem(answer: &Answer, status: StatusCode, slug: &str) {
    assert_eq!(answer.status, status, "{answer:?}");
    assert_eq!(answer.problem_type(), format!("{PROBLEMS}{slug}"));
}

#[tokio::test]
async fn a_body_field_key_replays_a_respelled_body_and_runs_once() {
    let (app, charges) = app_with("json:/reference_id");
    let first = send(
        &app,
        transfer(r#"{"reference_id":"tr-1","amount":5,"to":"bob"}"#),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let respelled = send(
        &app,
        transfer("{ \"to\" : \"bob\",\n \"amount\": 5.0, \"reference_id\": \"tr\\u002d1\" }"),
    )
    .await;
    assert_eq!(charges.count(), 1, "the re-spelled retry charged again");
    assert!(respelled.replayed());
    assert_eq!(respelled.body, first.body);
    // The same key with another amount is the 422 of any key reuse.
    let changed = send(
        &app,
        transfer(r#"{"reference_id":"tr-1","amount":6,"to":"bob"}"#),
    )
    .await;
    assert_problem(&changed, StatusCode::UNPROCESSABLE_ENTITY, "key-reused");
    // No field: plain processing, every time.
    send(&app, transfer(r#"{"amount":5}"#)).await;
    send(&app, transfer(r#"{"amount":5}"#)).await;
    assert_eq!(charges.count(), 3);
}

#[tokio::test]
async fn case_is_another_key_and_surrounding_spaces_or_non_strings_are_refused() {
    let (app, charges) = app_with("json:/reference_id");
    let lower = send(&app, transfer(r#"{"reference_id":"tr-1","amount":5}"#)).await;
    let upper = send(&app, transfer(r#"{"reference_id":"TR-1","amount":5}"#)).await;
    assert_eq!(
        (lower.status, upper.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!upper.replayed());
    assert_eq!(
        charges.count(),
        2,
        "keys differing in case are two operations"
    );
    for body in [
        r#"{"reference_id":" tr-1","amount":5}"#,
        r#"{"reference_id":"tr-1 ","amount":5}"#,
        r#"{"reference_id":42,"amount":5}"#,
        r#"{"reference_id":"tr-1","reference_id":"tr-2"}"#,
    ] {
        let answer = send(&app, transfer(body)).await;
        assert_problem(&answer, StatusCode::BAD_REQUEST, "invalid-key");
    }
    assert_eq!(charges.count(), 2, "a refused key runs nothing");
}

#[tokio::test]
async fn the_standard_header_and_the_field_must_agree_and_a_refusal_claims_nothing() {
    let (app, charges) = app_with("json:/reference_id");
    let body = r#"{"reference_id":"tr-9","amount":5}"#;
    let ambiguous = send(
        &app,
        request("POST", "/transfers", &[("idempotency-key", "other")], body),
    )
    .await;
    assert_problem(&ambiguous, StatusCode::BAD_REQUEST, "ambiguous-key");
    assert_eq!(charges.count(), 0);
    // Nothing was claimed under either key: both run as new operations.
    let by_field = send(&app, transfer(body)).await;
    assert!(!by_field.replayed());
    let by_header = send(
        &app,
        request(
            "POST",
            "/transfers",
            &[("idempotency-key", "other")],
            r#"{"amount":5}"#,
        ),
    )
    .await;
    assert!(!by_header.replayed());
    assert_eq!(charges.count(), 2);
    // Both places with the same key are one key.
    let agreeing = send(
        &app,
        request("POST", "/transfers", &[("idempotency-key", "tr-9")], body),
    )
    .await;
    assert!(agreeing.replayed());
    assert_eq!(charges.count(), 2);
}

#[tokio::test]
async fn a_path_key_names_the_operation_within_the_route_template() {
    let (app, charges) = app_with("path:product_id");
    let body = r#"{"name":"Headphones","price":99}"#;
    let put_product = |id: &str| request("PUT", &format!("/products/{id}"), &[], body);
    let first = send(&app, put_product("PRD-HDPHN-001")).await;
    let retry = send(&app, put_product("PRD-HDPHN-001")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(charges.count(), 1);
    let other = send(&app, put_product("PRD-HDPHN-002")).await;
    assert!(!other.replayed());
    assert_eq!(charges.count(), 2);
    let spaced = send(&app, put_product("%20PRD")).await;
    assert_problem(&spaced, StatusCode::BAD_REQUEST, "invalid-key");
    // The header's key must be the path's.
    let ambiguous = send(
        &app,
        request(
            "PUT",
            "/products/PRD-HDPHN-003",
            &[("idempotency-key", "PRD-HDPHN-004")],
            body,
        ),
    )
    .await;
    assert_problem(&ambiguous, StatusCode::BAD_REQUEST, "ambiguous-key");
    assert_eq!(charges.count(), 2);
}

#[tokio::test]
async fn the_same_path_key_raced_64_ways_runs_once() {
    let (app, charges) = app_with("path:product_id");
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (app, barrier) = (app.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                send(
                    &app,
                    request("PUT", "/products/PRD-RACE", &[], r#"{"price":1}"#),
                )
                .await
            })
        })
        .collect();
    let mut created = 0;
    for task in tasks {
        let answer = task.await.unwrap();
        match answer.status {
            StatusCode::CREATED => created += 1,
            StatusCode::CONFLICT => {}
            other => panic!("unexpected {other}: {answer:?}"),
        }
    }
    assert!(created >= 1);
    assert_eq!(
        charges.count(),
        1,
        "{} charges for one natural key",
        charges.count()
    );
}

#[tokio::test]
async fn a_query_parameter_or_another_header_is_a_key_like_any_other() {
    let (app, charges) = app_with("query:request_id");
    let body = r#"{"amount":5}"#;
    let first = send(
        &app,
        request("POST", "/transfers?request_id=r-1", &[], body),
    )
    .await;
    let retry = send(
        &app,
        request("POST", "/transfers?request_id=r-1", &[], body),
    )
    .await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    let twice = send(
        &app,
        request(
            "POST",
            "/transfers?request_id=r-1&request_id=r-1",
            &[],
            body,
        ),
    )
    .await;
    assert_problem(&twice, StatusCode::BAD_REQUEST, "invalid-key");
    assert_eq!(charges.count(), 1);

    let (header_app, charges) = app_with("header:PayPal-Request-Id");
    let headers = [("paypal-request-id", "pp-1")];
    send(&header_app, request("POST", "/transfers", &headers, body)).await;
    let retry = send(&header_app, request("POST", "/transfers", &headers, body)).await;
    assert!(retry.replayed());
    assert_eq!(charges.count(), 1);
}

#[tokio::test]
async fn a_required_key_names_its_source_when_missing() {
    let charges = Arc::new(Charges::default());
    let app = Router::new()
        .route("/transfers", post(charge))
        .route_layer(
            IdempotencyLayer::new(MemoryStore::new())
                .with_require_key(true)
                .with_key_source("json:/reference_id".parse().unwrap()),
        )
        .with_state(Arc::clone(&charges));
    let answer = send(&app, transfer(r#"{"amount":5}"#)).await;
    assert_problem(&answer, StatusCode::BAD_REQUEST, "missing-key");
    assert!(
        answer.json()["detail"]
            .as_str()
            .unwrap()
            .contains("json:/reference_id")
    );
    assert_eq!(charges.count(), 0);
}

// --- Content-based deduplication (PROTOCOL §16) ---------------------------------

fn dedup_app(dedup: idemgate::key::ContentDedup) -> (Router, Arc<Charges>) {
    let charges = Arc::new(Charges::default());
    let router = Router::new()
        .route("/transfers", post(charge))
        .route_layer(
            IdempotencyLayer::new(MemoryStore::new())
                .with_lease(std::time::Duration::from_millis(200))
                .with_content_dedup(dedup),
        )
        .layer(middleware::from_fn(
            |mut request: axum::extract::Request, next: middleware::Next| async move {
                let user = request
                    .headers()
                    .get("x-user")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("alice")
                    .to_owned();
                request
                    .extensions_mut()
                    .insert(Principal::new(format!("user:{user}")));
                next.run(request).await
            },
        ))
        .with_state(Arc::clone(&charges));
    (router, charges)
}

#[tokio::test]
async fn content_dedup_folds_a_keyless_duplicate_inside_the_window_only() {
    use idemgate::key::ContentDedup;
    let window = std::time::Duration::from_millis(600);
    let (app, charges) = dedup_app(ContentDedup::new(window));
    let body = r#"{"to":"bob","amount":5}"#;
    let first = send(&app, transfer(body)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert!(!first.headers.contains_key("idempotency-dedup"));
    let duplicate = send(&app, transfer(r#"{ "amount": 5, "to": "bob" }"#)).await;
    assert_eq!(duplicate.status, StatusCode::CREATED);
    assert!(duplicate.replayed());
    assert_eq!(duplicate.headers["idempotency-dedup"], "content");
    assert_eq!(duplicate.body, first.body);
    assert_eq!(charges.count(), 1, "the duplicate ran");
    // Other content, or another principal, is another operation.
    send(&app, transfer(r#"{"to":"bob","amount":6}"#)).await;
    let other_user = send(
        &app,
        request("POST", "/transfers", &[("x-user", "carol")], body),
    )
    .await;
    assert!(!other_user.replayed());
    assert_eq!(charges.count(), 3);
    // After the window the same content runs again.
    tokio::time::sleep(window + std::time::Duration::from_millis(400)).await;
    let later = send(&app, transfer(body)).await;
    assert!(!later.replayed(), "{later:?}");
    assert_eq!(charges.count(), 4);
}

#[tokio::test]
async fn an_explicit_key_beats_content_and_fields_choose_what_counts() {
    use idemgate::key::ContentDedup;
    let dedup = ContentDedup::new(std::time::Duration::from_secs(300))
        .with_fields(vec!["/to".parse().unwrap(), "/amount".parse().unwrap()]);
    let (app, charges) = dedup_app(dedup);
    let body = r#"{"to":"bob","amount":5,"sent_at":"12:00:01"}"#;
    send(&app, transfer(body)).await;
    let keyed = send(
        &app,
        request("POST", "/transfers", &[("idempotency-key", "k-1")], body),
    )
    .await;
    assert!(!keyed.replayed(), "an explicit key is its own operation");
    let keyed_again = send(
        &app,
        request("POST", "/transfers", &[("idempotency-key", "k-1")], body),
    )
    .await;
    assert!(keyed_again.replayed());
    assert!(
        !keyed_again.headers.contains_key("idempotency-dedup"),
        "a key's replay"
    );
    assert_eq!(charges.count(), 2);
    // Only `to` and `amount` count: another `sent_at` is the same content.
    let later = send(
        &app,
        transfer(r#"{"sent_at":"12:00:09","amount":5,"to":"bob"}"#),
    )
    .await;
    assert!(later.replayed());
    assert_eq!(later.headers["idempotency-dedup"], "content");
    assert_eq!(charges.count(), 2);
}
