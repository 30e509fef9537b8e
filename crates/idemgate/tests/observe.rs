//! Observe mode with `ObservedResponses::Keep` (PROTOCOL §16): what an observed
//! run leaves under the enforced name is either the whole response or nothing,
//! so a switch to enforce never replays an empty answer — also when the
//! in-flight bound left no room to keep the response.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use idemgate::{IdempotencyLayer, MemoryStore, ObservedResponses, Store, StrategyMode};
use support::{Gateway, post_json, send, send_until_charging};

const ROUTE: &str = "/orders";

fn observing(store: &Arc<dyn Store>) -> IdempotencyLayer {
    IdempotencyLayer::from_arc(Arc::clone(store))
        .with_key_source("json:/reference_id".parse().unwrap())
        .with_mode(StrategyMode::Observe)
        .with_observed_responses(ObservedResponses::Keep)
        .with_max_in_flight(1)
}

fn enforcing(store: &Arc<dyn Store>) -> IdempotencyLayer {
    IdempotencyLayer::from_arc(Arc::clone(store))
        .with_key_source("json:/reference_id".parse().unwrap())
}

fn order(reference: &str) -> String {
    format!(r#"{{"reference_id":"{reference}","amount":5}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_observed_without_room_to_keep_it_runs_as_new_after_the_switch() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let gateway = Arc::new(Gateway::default());
    gateway.delay_ms.store(300, Ordering::SeqCst);
    let app = support::app(observing(&store), Arc::clone(&gateway));

    // The first observed run holds the only in-flight slot while the second
    // runs: the second's response cannot be kept.
    let first = send_until_charging(
        &app,
        &gateway,
        post_json(ROUTE, Some("a"), None, &order("kept")),
    )
    .await;
    let second = send(&app, post_json(ROUTE, Some("a"), None, &order("unkept"))).await;
    let first = first.await.unwrap();
    assert_eq!(first.status, axum::http::StatusCode::CREATED);
    assert_eq!(second.status, axum::http::StatusCode::CREATED);
    assert_eq!(gateway.charges(), 2);

    // Switched to enforce on the same store.
    gateway.delay_ms.store(0, Ordering::SeqCst);
    let app = support::app(enforcing(&store), Arc::clone(&gateway));
    let kept = send(&app, post_json(ROUTE, Some("a"), None, &order("kept"))).await;
    assert!(kept.replayed(), "the kept run is replayed whole");
    assert_eq!(kept.body, first.body, "byte for byte");
    assert_eq!(gateway.charges(), 2);

    let unkept = send(&app, post_json(ROUTE, Some("a"), None, &order("unkept"))).await;
    assert!(
        !unkept.replayed(),
        "a run whose response was not kept must not be replayed (an empty replay)"
    );
    assert_eq!(unkept.status, axum::http::StatusCode::CREATED);
    assert!(!unkept.body.is_empty());
    assert_eq!(gateway.charges(), 3, "it ran as new");
}
