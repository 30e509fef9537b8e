//! What a SQL store's first setup must give a newcomer, behind the real layer: a
//! store that was never migrated answers every keyed request with a 500
//! `store-misconfigured` problem (never a 503 "unreachable", never running the
//! handler), and the same store serves once migrated.
//!
//! The store crate builds the app, so this crate needs no dependency on the layer:
//! [`counting_orders`] gives the route, the test adds
//! `.route_layer(IdempotencyLayer::new(store))`, and [`post_order`] sends keyed
//! requests to it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::header::CONTENT_TYPE;
use http::{Request, StatusCode};
use idemgate_core::scope::Principal;
use idemgate_core::{Claim, FencedWrite, Store, StoreError};
use tower::ServiceExt;

use crate::fixtures::{acquire, awkward_response, completion, fresh_request};
use crate::http::{Answer, PROBLEM_JSON};

/// The problem `type` of a misconfigured store (`docs/problems.md`).
pub const STORE_MISCONFIGURED: &str = "/problems/store-misconfigured";

/// A router whose `POST /orders` answers 201 and counts how often it ran.
pub fn counting_orders(executions: Arc<AtomicUsize>) -> Router {
    Router::new().route(
        "/orders",
        post(move || {
            let executions = Arc::clone(&executions);
            async move {
                executions.fetch_add(1, Ordering::SeqCst);
                (StatusCode::CREATED, "created")
            }
        }),
    )
}

/// Sends `POST /orders` with `key` as its `Idempotency-Key`, as one authenticated
/// user (the principal the layer scopes keys by).
pub async fn post_order(app: &Router, key: &str) -> Answer {
    let mut request = Request::post("/orders")
        .header("idempotency-key", key)
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from("{\"amount\":4200}"))
        .expect("a valid request");
    request
        .extensions_mut()
        .insert(Principal::new("user:setup-test"));
    Answer::read(app.clone().oneshot(request).await.expect("infallible")).await
}

/// Asserts that `app` (over a store that was never migrated) answers a keyed
/// request 500 `store-misconfigured` as problem+json, on a retry too, and that the
/// handler never ran.
pub async fn assert_misconfigured(app: &Router, executions: &AtomicUsize, key: &str) {
    for attempt in ["first", "retry"] {
        let answer = post_order(app, key).await;
        assert_eq!(
            answer.status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{attempt}: {answer:?}"
        );
        assert_eq!(
            answer.content_type(),
            Some(PROBLEM_JSON),
            "{attempt}: {answer:?}"
        );
        assert_eq!(
            answer.problem_type(),
            STORE_MISCONFIGURED,
            "{attempt}: {answer:?}"
        );
    }
    assert_eq!(
        executions.load(Ordering::SeqCst),
        0,
        "nothing may run without a store"
    );
}

/// Asserts that `app` runs a keyed request once (201) and replays it on a retry.
pub async fn assert_serves(app: &Router, executions: &AtomicUsize, key: &str) {
    let before = executions.load(Ordering::SeqCst);
    let first = post_order(app, key).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let retry = post_order(app, key).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert_eq!(retry.text(), "created");
    assert_eq!(
        executions.load(Ordering::SeqCst),
        before + 1,
        "the retry must be a replay"
    );
}

/// Claims a fresh key on `store`, which is not migrated, and returns the database's
/// code behind the [`StoreError::Misconfigured`] it must answer (a SQLSTATE, an
/// SQLite result code), after checking that the error names the fix.
pub async fn misconfiguration_code(store: &dyn Store) -> Option<String> {
    let err = store
        .try_claim(&fresh_request())
        .await
        .expect_err("a store without its table cannot claim");
    let StoreError::Misconfigured(source) = &err else {
        panic!("expected Misconfigured, got {err:?}");
    };
    assert!(
        err.to_string().contains("migrate()"),
        "the error names the fix: {err}"
    );
    source
        .downcast_ref::<idemgate_sqlx::Misconfiguration>()
        .and_then(|misconfiguration| misconfiguration.cause.as_database_error())
        .and_then(|database| database.code())
        .map(|code| code.into_owned())
}

/// Asserts [`assert_misconfigured`] on `app`, runs `migrate`, then asserts
/// [`assert_serves`] with the same key: nothing ran before, it runs once after.
pub async fn misconfigured_until_migrated(
    app: &Router,
    executions: &AtomicUsize,
    migrate: impl Future<Output = ()>,
) {
    let key = uuid::Uuid::new_v4().to_string();
    assert_misconfigured(app, executions, &key).await;
    migrate.await;
    assert_serves(app, executions, &key).await;
}

/// Asserts that `store`, as a connecting constructor returned it (no `migrate()`
/// call), claims a fresh key, completes it and replays the response.
pub async fn ready_to_use(store: &dyn Store) {
    let request = fresh_request();
    let lease = acquire(store, &request).await;
    let write = store
        .complete(&lease, &completion(awkward_response()))
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Applied);
    match store.try_claim(&request).await.expect("claim") {
        Claim::Existing(snapshot) => {
            assert_eq!(snapshot.record.response(), Some(&awkward_response()));
        }
        Claim::Acquired(_) => panic!("a completed record must replay"),
    }
}
