//! The counters of PROTOCOL §12, read back from a recorder installed for this test
//! binary alone (a global recorder cannot be shared with other tests).

mod support;

use std::sync::Arc;

use idemgate::{IdempotencyLayer, MemoryStore};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use support::*;

fn counter(
    snapshot: &[(CompositeKey, DebugValue)],
    name: &str,
    label: Option<(&str, &str)>,
) -> u64 {
    snapshot
        .iter()
        .filter(|(key, _)| key.kind() == MetricKind::Counter && key.key().name() == name)
        .filter(|(key, _)| {
            label.is_none_or(|(k, v)| key.key().labels().any(|l| l.key() == k && l.value() == v))
        })
        .map(|(_, value)| match value {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

fn duplicates(snapshot: &[(CompositeKey, DebugValue)], strategy: &str, action: &str) -> u64 {
    snapshot
        .iter()
        .filter(|(key, _)| key.key().name() == "idemgate_duplicates_total")
        .filter(|(key, _)| {
            let labels: Vec<_> = key.key().labels().map(|l| (l.key(), l.value())).collect();
            labels.contains(&("strategy", strategy)) && labels.contains(&("action", action))
        })
        .map(|(_, value)| match value {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

#[tokio::test]
async fn outcomes_and_store_latencies_are_recorded() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");
    idemgate::telemetry::describe();

    let gateway = Arc::new(Gateway::default());
    let app = app(IdempotencyLayer::new(MemoryStore::new()), gateway);
    let key = new_key();
    send(&app, post_json("/orders", Some("a"), Some(&key), ORDER)).await;
    send(&app, post_json("/orders", Some("a"), Some(&key), ORDER)).await;
    send(&app, post_json("/orders", Some("a"), Some(&key), "{}")).await;
    send(&app, post_json("/orders", Some("a"), Some("a,b"), ORDER)).await;
    send(&app, post_json("/orders", None, Some(&key), ORDER)).await;
    send(&app, post_json("/orders", Some("a"), None, ORDER)).await;
    // A method the layer does not cover passes through, key or not: counted
    // and timed all the same.
    let mut read = post_json("/orders", Some("a"), Some(&key), "");
    *read.method_mut() = http::Method::GET;
    send(&app, read).await;
    let snapshot: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| (key, value))
        .collect();
    let outcome = |o: &str| counter(&snapshot, "idemgate_requests_total", Some(("outcome", o)));
    assert_eq!(outcome("executed"), 1);
    assert_eq!(outcome("replayed"), 1);
    assert_eq!(outcome("mismatch"), 1);
    assert_eq!(outcome("invalid_key"), 1);
    assert_eq!(outcome("unauthenticated"), 1);
    assert_eq!(outcome("passed_through"), 2);
    let claims = snapshot
        .iter()
        .find(|(key, _)| {
            key.key().name() == "idemgate_store_seconds"
                && key.key().labels().any(|l| l.value() == "claim")
        })
        .map(|(_, value)| match value {
            DebugValue::Histogram(samples) => samples.len(),
            _ => 0,
        });
    assert_eq!(claims, Some(3), "one claim latency per claim");
    let durations = |o: &str| {
        snapshot
            .iter()
            .find(|(key, _)| {
                key.key().name() == "idemgate_request_duration_seconds"
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == "outcome" && l.value() == o)
            })
            .map_or(0, |(_, value)| match value {
                DebugValue::Histogram(samples) => samples.len(),
                _ => 0,
            })
    };
    for o in [
        "executed",
        "replayed",
        "mismatch",
        "invalid_key",
        "unauthenticated",
    ] {
        assert_eq!(durations(o), 1, "one request duration for {o}");
    }
    assert_eq!(
        durations("passed_through"),
        2,
        "the keyless POST and the GET"
    );
    assert_eq!(durations("conflict"), 0);
    assert_eq!(
        duplicates(&snapshot, "header", "replayed"),
        1,
        "enforced, by strategy"
    );
    assert_eq!(duplicates(&snapshot, "header", "mismatch"), 1);
    assert_eq!(duplicates(&snapshot, "header", "observed"), 0);
    assert!(
        snapshot.iter().any(|(key, _)| {
            key.key().name() == "idemgate_duplicates_total"
                && key.key().labels().any(|l| l.value() == "query")
        }),
        "every strategy exported at 0"
    );
    // A body-field key in observe mode: answers as without it, counted by strategy.
    let observed_gateway = Arc::new(Gateway::default());
    let observing = support::app(
        IdempotencyLayer::new(MemoryStore::new())
            .with_key_source("json:/reference_id".parse().unwrap())
            .with_mode(idemgate::StrategyMode::Observe),
        Arc::clone(&observed_gateway),
    );
    let referenced = r#"{"reference_id":"r-1","amount":5}"#;
    for body in [
        referenced,
        referenced,
        r#"{"reference_id":"r-1","amount":6}"#,
    ] {
        let answer = send(&observing, post_json("/orders", Some("a"), None, body)).await;
        assert_eq!(answer.status, axum::http::StatusCode::CREATED);
        assert!(!answer.replayed(), "observe mode replayed");
    }
    assert_eq!(
        observed_gateway.charges(),
        3,
        "observe mode ran every request"
    );

    let snapshot: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| (key, value))
        .collect();
    assert_eq!(duplicates(&snapshot, "json", "observed"), 1);
    assert_eq!(duplicates(&snapshot, "json", "replayed"), 1);
    assert_eq!(duplicates(&snapshot, "json", "mismatch"), 1);
    // `describe()` registered what has not happened yet, at zero.
    assert_eq!(
        counter(&snapshot, "idemgate_fenced_completions_total", None),
        0
    );
    assert!(snapshot.iter().any(|(key, _)| {
        key.key().name() == "idemgate_store_errors_total"
            && key.key().labels().any(|l| l.value() == "commit")
    }));
    assert!(snapshot.iter().any(|(key, _)| {
        key.key().name() == "idemgate_requests_total"
            && key.key().labels().any(|l| l.value() == "overloaded")
    }));
}
