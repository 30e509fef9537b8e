//! The layer in a real axum app, with a counting mock payment handler: every test
//! asserts effects (charges, bytes, records), not only status codes.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::StatusCode;
use idemgate::{IdempotencyLayer, MemoryStore, PathSource, ServerErrorPolicy};
use support::*;

fn memory_app() -> (axum::Router, Arc<Gateway>) {
    let gateway = Arc::new(Gateway::default());
    (
        app(
            // The handler's own `X-Tag` is replayed because it is listed
            // (PROTOCOL §7: only what a replay needs, plus what is named).
            IdempotencyLayer::new(MemoryStore::new())
                .with_replayed_header_names([http::HeaderName::from_static("x-tag")]),
            Arc::clone(&gateway),
        ),
        gateway,
    )
}

// --- The seed's three scenarios -------------------------------------------------

#[tokio::test]
async fn lost_response_is_replayed_byte_for_byte_without_a_second_charge() {
    let (app, gateway) = memory_app();
    let key = new_key();
    let first = send(&app, post_json("/orders", Some("alice"), Some(&key), ORDER)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    // The client never saw `first` (timeout) and retries with the same key.
    let retry = send(&app, post_json("/orders", Some("alice"), Some(&key), ORDER)).await;
    assert_eq!(gateway.charges(), 1, "the retry charged again");
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body, "replayed body differs");
    assert_eq!(retry.headers["location"], first.headers["location"]);
    assert_eq!(retry.headers["content-type"], first.headers["content-type"]);
    let tags: Vec<_> = retry.headers.get_all("x-tag").iter().collect();
    assert_eq!(
        tags,
        ["first", "second"],
        "repeated headers keep their order"
    );
    assert!(
        first.headers.contains_key("set-cookie"),
        "the first client gets its cookie"
    );
    assert!(
        !retry.headers.contains_key("set-cookie"),
        "cookies are not replayed by default"
    );
}

async fn race(concurrency: usize) {
    let (app, gateway) = memory_app();
    gateway.delay_ms.store(500, Ordering::SeqCst);
    let key = new_key();
    let answers = send_concurrently(&app, concurrency, "alice", &key).await;
    let created: Vec<_> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .collect();
    let conflicts = answers
        .iter()
        .filter(|a| a.status == StatusCode::CONFLICT)
        .count();
    assert_eq!(
        created.len() + conflicts,
        concurrency,
        "only 201s and 409s expected"
    );
    assert!(!created.is_empty());
    for answer in &created {
        assert_eq!(
            answer.body, created[0].body,
            "every 201 carries the one outcome"
        );
    }
    for conflict in answers.iter().filter(|a| a.status == StatusCode::CONFLICT) {
        assert_eq!(conflict.problem_type(), "/problems/in-progress");
        let retry_after: u64 = conflict.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(retry_after >= 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_of_two_charges_once() {
    race(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_of_fifty_charges_once() {
    race(50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_mode_turns_conflicts_into_replays() {
    let gateway = Arc::new(Gateway::default());
    gateway.delay_ms.store(300, Ordering::SeqCst);
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_wait(Duration::from_secs(5));
    let app = app(layer, Arc::clone(&gateway));
    let key = new_key();
    let answers = send_concurrently(&app, 20, "alice", &key).await;
    let mut bodies = Vec::new();
    for answer in answers {
        assert_eq!(
            answer.status,
            StatusCode::CREATED,
            "waiters get the outcome, not 409"
        );
        bodies.push(answer.body);
    }
    assert_eq!(gateway.charges(), 1);
    assert!(bodies.iter().all(|b| *b == bodies[0]));
}

#[tokio::test]
async fn wait_mode_gives_up_with_409_after_its_bound() {
    let gateway = Arc::new(Gateway::default());
    gateway.delay_ms.store(1_500, Ordering::SeqCst);
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_wait(Duration::from_millis(200));
    let app = app(layer, Arc::clone(&gateway));
    let key = new_key();
    let first = send_until_charging(
        &app,
        &gateway,
        post_json("/orders", Some("a"), Some(&key), ORDER),
    )
    .await;
    let start = std::time::Instant::now();
    let second = send(&app, post_json("/orders", Some("a"), Some(&key), ORDER)).await;
    assert_eq!(second.status, StatusCode::CONFLICT);
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn payload_tampering_is_422_and_never_runs() {
    let (app, gateway) = memory_app();
    let key = new_key();
    let first = send(&app, post_json("/orders", Some("alice"), Some(&key), ORDER)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let tampered = ORDER.replace("1500", "1");
    let second = send(
        &app,
        post_json("/orders", Some("alice"), Some(&key), &tampered),
    )
    .await;
    assert_eq!(second.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(second.problem_type(), "/problems/key-reused");
    assert_eq!(gateway.charges(), 1);
    // Tampering while the first request still runs is a 422 too, not a 409.
    gateway.delay_ms.store(400, Ordering::SeqCst);
    let key = new_key();
    let running = send_until_charging(
        &app,
        &gateway,
        post_json("/orders", Some("alice"), Some(&key), ORDER),
    )
    .await;
    let during = send(
        &app,
        post_json("/orders", Some("alice"), Some(&key), &tampered),
    )
    .await;
    assert_eq!(during.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(running.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(gateway.charges(), 2);
}

// --- Scope and fingerprint -------------------------------------------------------

#[tokio::test]
async fn an_excluded_body_field_may_change_between_retries_and_others_may_not() {
    use idemgate::fingerprint::BodySelection;
    let gateway = Arc::new(Gateway::default());
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .with_fingerprint_body(BodySelection::Except(vec!["/sent_at".parse().unwrap()]));
    let app = app(layer, Arc::clone(&gateway));
    let key = new_key();
    let body = |sent_at: &str, amount: u32| {
        format!(
            r#"{{"items":[{{"id":42,"quantity":1}}],"currency":"RUB","amount":{amount},"sent_at":"{sent_at}"}}"#
        )
    };
    let first = send(
        &app,
        post_json(
            "/orders",
            Some("alice"),
            Some(&key),
            &body("12:00:01", 1500),
        ),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let retry = send(
        &app,
        post_json(
            "/orders",
            Some("alice"),
            Some(&key),
            &body("12:00:09", 1500),
        ),
    )
    .await;
    assert!(
        retry.replayed(),
        "the excluded field changed: still the same request"
    );
    assert_eq!(retry.body, first.body);
    let tampered = send(
        &app,
        post_json("/orders", Some("alice"), Some(&key), &body("12:00:09", 1)),
    )
    .await;
    assert_eq!(tampered.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn the_same_key_from_another_principal_or_route_is_another_operation() {
    let (app, gateway) = memory_app();
    let key = new_key();
    let alice = send(&app, post_json("/orders", Some("alice"), Some(&key), ORDER)).await;
    let bob = send(&app, post_json("/orders", Some("bob"), Some(&key), ORDER)).await;
    assert_eq!(
        (alice.status, bob.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!bob.replayed(), "bob must never see alice's response");
    assert_ne!(alice.body, bob.body);
    let other_route = send(
        &app,
        post_json("/status/201", Some("alice"), Some(&key), ORDER),
    )
    .await;
    assert!(!other_route.replayed());
    assert_eq!(gateway.charges(), 3);
}

#[tokio::test]
async fn the_scope_is_the_full_path_even_under_a_nested_router() {
    let gateway = Arc::new(Gateway::default());
    let inner = app(
        IdempotencyLayer::new(MemoryStore::new()),
        Arc::clone(&gateway),
    );
    let nested = axum::Router::new()
        .nest("/v1", inner.clone())
        .nest("/v2", inner);
    let key = new_key();
    let v1 = send(
        &nested,
        post_json("/v1/orders", Some("a"), Some(&key), ORDER),
    )
    .await;
    let v2 = send(
        &nested,
        post_json("/v2/orders", Some("a"), Some(&key), ORDER),
    )
    .await;
    assert!(!v1.replayed() && !v2.replayed());
    assert_eq!(
        gateway.charges(),
        2,
        "/v1/orders and /v2/orders are different scopes"
    );
    let again = send(
        &nested,
        post_json("/v1/orders", Some("a"), Some(&key), ORDER),
    )
    .await;
    assert!(again.replayed());
    assert_eq!(gateway.charges(), 2);
}

#[tokio::test]
async fn spellings_of_one_path_share_one_scope() {
    let (app, gateway) = memory_app();
    let key = new_key();
    let first = send(&app, post_json("/orders", Some("a"), Some(&key), ORDER)).await;
    for spelling in [
        "/orders/",
        "//orders",
        "/./orders",
        "/x/../orders",
        "/%6Frders",
    ] {
        let again = send(&app, post_json(spelling, Some("a"), Some(&key), ORDER)).await;
        assert!(again.replayed(), "{spelling}: {:?}", again.status);
        assert_eq!(again.body, first.body, "{spelling}");
    }
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn a_path_fold_shares_the_scope_and_keeps_the_fingerprint_path() {
    use idemgate::path::PathFold;
    let gateway = Arc::new(Gateway::default());
    let fold = PathFold::NONE
        .with_case_insensitive(true)
        .with_format_suffix(true);
    let app = app_with(
        IdempotencyLayer::new(MemoryStore::new()).with_path_fold(fold),
        &gateway,
    );
    let key = new_key();
    let first = send(&app, post_json("/payments", Some("a"), Some(&key), ORDER)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    for spelling in ["/Payments", "/payments.json", "/PAYMENTS.xml"] {
        let other = send(&app, post_json(spelling, Some("a"), Some(&key), ORDER)).await;
        assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{spelling}");
    }
    let same = send(&app, post_json("/payments", Some("a"), Some(&key), ORDER)).await;
    assert!(same.replayed());
    assert_eq!(gateway.charges(), 1, "one scope: never a second run");

    // Without the fold each spelling is an operation of its own.
    let (app, gateway) = memory_app();
    for spelling in ["/payments", "/Payments", "/payments.json"] {
        let answer = send(&app, post_json(spelling, Some("a"), Some(&key), ORDER)).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{spelling}");
    }
    assert_eq!(gateway.charges(), 3);
}

#[tokio::test]
async fn route_templates_can_name_the_scope() {
    let gateway = Arc::new(Gateway::default());
    let layer =
        IdempotencyLayer::new(MemoryStore::new()).with_path_source(PathSource::RouteTemplate);
    let app = app(layer, Arc::clone(&gateway));
    let key = new_key();
    let a = send(&app, post_json("/status/201", Some("a"), Some(&key), ORDER)).await;
    // Another path under the same template and the same key: the fingerprint
    // (which includes the path) differs, so it is a 422, not a new operation.
    let b = send(&app, post_json("/status/202", Some("a"), Some(&key), ORDER)).await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(b.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn reordered_json_is_the_same_request() {
    let (app, gateway) = memory_app();
    let key = new_key();
    send(&app, post_json("/orders", Some("a"), Some(&key), ORDER)).await;
    let reordered = "{ \"amount\": 1500.0, \"currency\": \"RUB\",\n \"items\": [ {\"quantity\": 1, \"id\": 42} ] }";
    let retry = send(&app, post_json("/orders", Some("a"), Some(&key), reordered)).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn big_numbers_are_compared_exactly() {
    let (app, gateway) = memory_app();
    let key = new_key();
    send(
        &app,
        post_json(
            "/orders",
            Some("a"),
            Some(&key),
            r#"{"amount":9007199254740993}"#,
        ),
    )
    .await;
    let rounded = send(
        &app,
        post_json(
            "/orders",
            Some("a"),
            Some(&key),
            r#"{"amount":9007199254740992}"#,
        ),
    )
    .await;
    assert_eq!(
        rounded.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "f64 rounding must not merge these"
    );
    let same = send(
        &app,
        post_json(
            "/orders",
            Some("a"),
            Some(&key),
            r#"{"amount":9007199254740993.0}"#,
        ),
    )
    .await;
    assert!(same.replayed());
    assert_eq!(gateway.charges(), 1);
}

// --- Refusals before any claim ---------------------------------------------------

#[tokio::test]
async fn invalid_keys_are_400_and_nothing_runs_or_is_stored() {
    let store = Arc::new(FaultyStore::default());
    let gateway = Arc::new(Gateway::default());
    let app = app(
        IdempotencyLayer::from_arc(store.clone()),
        Arc::clone(&gateway),
    );
    let too_long = "k".repeat(256);
    for key in [
        "",
        "a,b",
        "\"a\";p=1",
        "a b",
        "\"unterminated",
        too_long.as_str(),
    ] {
        let answer = send(&app, post_json("/orders", Some("a"), Some(key), ORDER)).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "key {key:?}");
        assert_eq!(answer.problem_type(), "/problems/invalid-key");
    }
    let mut repeated = post_json("/orders", Some("a"), Some("k1"), ORDER);
    repeated
        .headers_mut()
        .append("idempotency-key", "k1".parse().unwrap());
    let answer = send(&app, repeated).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert!(
        answer.json()["detail"]
            .as_str()
            .unwrap()
            .contains("more than one")
    );
    assert_eq!(gateway.charges(), 0);
    assert_eq!(store.claims.load(Ordering::SeqCst), 0);
    assert!(store.memory.is_empty());
}

#[tokio::test]
async fn requests_without_a_key_pass_through_or_are_refused_when_required() {
    let (app, gateway) = memory_app();
    for _ in 0..2 {
        let answer = send(&app, post_json("/orders", Some("a"), None, ORDER)).await;
        assert_eq!(answer.status, StatusCode::CREATED);
        assert!(!answer.replayed());
    }
    assert_eq!(gateway.charges(), 2, "without a key every request runs");

    let gateway = Arc::new(Gateway::default());
    let strict = app_with(
        IdempotencyLayer::new(MemoryStore::new()).with_require_key(true),
        &gateway,
    );
    let answer = send(&strict, post_json("/orders", Some("a"), None, ORDER)).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.problem_type(), "/problems/missing-key");
    assert_eq!(gateway.charges(), 0);
}

fn app_with(layer: IdempotencyLayer, gateway: &Arc<Gateway>) -> axum::Router {
    app(layer, Arc::clone(gateway))
}

#[tokio::test]
async fn no_principal_is_401_before_any_claim() {
    let store = Arc::new(FaultyStore::default());
    let gateway = Arc::new(Gateway::default());
    let app = app(
        IdempotencyLayer::from_arc(store.clone()),
        Arc::clone(&gateway),
    );
    let answer = send(&app, post_json("/orders", None, Some(&new_key()), ORDER)).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    assert_eq!(answer.problem_type(), "/problems/unauthenticated");
    assert_eq!(store.claims.load(Ordering::SeqCst), 0);
    assert_eq!(gateway.charges(), 0);
}

#[tokio::test]
async fn oversized_bodies_are_413_before_any_claim() {
    let store = Arc::new(FaultyStore::default());
    let gateway = Arc::new(Gateway::default());
    let app = app(
        IdempotencyLayer::from_arc(store.clone()).with_body_limit(1_000),
        Arc::clone(&gateway),
    );
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(2_000));
    let answer = send(
        &app,
        post_json("/orders", Some("a"), Some(&new_key()), &big),
    )
    .await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(answer.problem_type(), "/problems/body-too-large");
    // Without Content-Length (a stream), the limit still holds.
    let stream =
        futures_util::stream::iter((0..10).map(|_| Ok::<_, std::io::Error>(vec![b'x'; 300])));
    let mut request = post_json("/orders", Some("a"), Some(&new_key()), "");
    *request.body_mut() = axum::body::Body::from_stream(stream);
    assert_eq!(
        send(&app, request).await.status,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    assert_eq!(store.claims.load(Ordering::SeqCst), 0);
    assert_eq!(gateway.charges(), 0);
}

#[tokio::test]
async fn methods_not_covered_pass_through_even_with_a_key() {
    let gateway = Arc::new(Gateway::default());
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_methods([axum::http::Method::PATCH]);
    let app = app(layer, Arc::clone(&gateway));
    let key = new_key();
    for _ in 0..2 {
        assert!(
            !send(&app, post_json("/orders", Some("a"), Some(&key), ORDER))
                .await
                .replayed()
        );
    }
    assert_eq!(gateway.charges(), 2);
}

// --- Finality ------------------------------------------------------------------------

async fn twice(app: &axum::Router, uri: &str) -> (Answer, Answer) {
    let key = new_key();
    let first = send(app, post_json(uri, Some("a"), Some(&key), ORDER)).await;
    let second = send(app, post_json(uri, Some("a"), Some(&key), ORDER)).await;
    (first, second)
}

#[tokio::test]
async fn client_errors_are_final_and_replayed() {
    let (app, gateway) = memory_app();
    let (first, second) = twice(&app, "/status/404").await;
    assert_eq!(
        (first.status, second.status),
        (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND)
    );
    assert!(second.replayed());
    assert_eq!(second.body, first.body);
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn timeouts_and_rate_limits_are_released_and_run_again() {
    for code in [408, 429] {
        let (app, gateway) = memory_app();
        let (first, second) = twice(&app, &format!("/status/{code}")).await;
        assert_eq!(first.status.as_u16(), code);
        assert!(!second.replayed(), "{code} must not be replayed");
        assert_eq!(gateway.charges(), 2);
    }
}

#[tokio::test]
async fn server_errors_are_stored_by_default_and_released_by_policy() {
    let (app, gateway) = memory_app();
    let (first, second) = twice(&app, "/status/502").await;
    assert_eq!(first.status, StatusCode::BAD_GATEWAY);
    assert!(second.replayed(), "an unmarked 5xx is FAILED and replayed");
    assert_eq!(gateway.charges(), 1);

    let gateway = Arc::new(Gateway::default());
    let release = app_with(
        IdempotencyLayer::new(MemoryStore::new())
            .with_server_error_policy(ServerErrorPolicy::Release),
        &gateway,
    );
    let (_, second) = twice(&release, "/status/502").await;
    assert!(!second.replayed());
    assert_eq!(gateway.charges(), 2);
}

#[tokio::test]
async fn handler_marks_override_the_status_rules() {
    // Retryable: released, runs again with the same operation id.
    let (app, gateway) = memory_app();
    let (first, second) = twice(&app, "/mark/retryable/502").await;
    assert!(!second.replayed());
    assert_eq!(gateway.charges(), 2);
    let op = |a: &Answer| {
        String::from_utf8(a.body.to_vec())
            .unwrap()
            .split(" op ")
            .nth(1)
            .unwrap()
            .to_owned()
    };
    assert_eq!(op(&first), op(&second), "a released operation keeps its id");

    // Final: even a 503 is stored.
    let (app, gateway) = memory_app();
    let (_, second) = twice(&app, "/mark/final/503").await;
    assert!(second.replayed());
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn a_rejected_request_frees_the_key_for_a_corrected_body() {
    let (app, gateway) = memory_app();
    let key = new_key();
    let bad = send(
        &app,
        post_json(
            "/mark/rejected/400",
            Some("a"),
            Some(&key),
            r#"{"items":[]}"#,
        ),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let corrected = send(
        &app,
        post_json("/mark/rejected/400", Some("a"), Some(&key), ORDER),
    )
    .await;
    assert_ne!(
        corrected.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "the key was freed"
    );
    assert!(!corrected.replayed());
    assert_eq!(gateway.charges(), 2);
}

#[tokio::test]
async fn a_panic_answers_500_and_is_stored_as_failed() {
    let (app, gateway) = memory_app();
    let (first, second) = twice(&app, "/panic").await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(first.problem_type(), "/problems/handler-failed");
    assert!(second.replayed());
    assert_eq!(second.body, first.body);
    assert_eq!(
        gateway.charges(),
        1,
        "a panic after the charge must not charge again"
    );

    let gateway = Arc::new(Gateway::default());
    let release = app_with(
        IdempotencyLayer::new(MemoryStore::new())
            .with_server_error_policy(ServerErrorPolicy::Release),
        &gateway,
    );
    let (_, second) = twice(&release, "/panic").await;
    assert_eq!(second.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!second.replayed());
    assert_eq!(gateway.charges(), 2);
}

#[tokio::test]
async fn a_101_is_never_stored_or_passed_on_for_a_covered_request() {
    let (app, gateway) = memory_app();
    let (first, second) = twice(&app, "/switch").await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(first.problem_type(), "/problems/handler-failed");
    assert!(!first.headers.contains_key("upgrade"));
    assert!(second.replayed(), "settled like a 5xx: FAILED by default");
    assert_eq!(second.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(second.body, first.body, "the replay is the 500, not a 101");
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn a_body_that_breaks_off_with_a_problem_is_answered_with_it() {
    let (app, gateway) = memory_app();
    let (first, second) = twice(&app, "/broken-body/10").await;
    assert_eq!(first.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(first.problem_type(), "/problems/upstream-timeout");
    assert!(
        second.replayed(),
        "a 504 is settled by the server-error policy"
    );
    assert_eq!(second.body, first.body);
    assert_eq!(gateway.charges(), 1);

    let gateway = Arc::new(Gateway::default());
    let release = app_with(
        IdempotencyLayer::new(MemoryStore::new())
            .with_server_error_policy(ServerErrorPolicy::Release),
        &gateway,
    );
    let (first, second) = twice(&release, "/broken-body/10").await;
    assert_eq!(first.status, StatusCode::GATEWAY_TIMEOUT);
    assert!(!second.replayed());
    assert_eq!(gateway.charges(), 2);
}

#[tokio::test]
async fn oversized_responses_stream_once_and_replay_as_not_retained() {
    let gateway = Arc::new(Gateway::default());
    let app = app_with(
        IdempotencyLayer::new(MemoryStore::new()).with_response_limit(10_000),
        &gateway,
    );
    let (first, second) = twice(&app, "/big/50000").await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        first.body.len(),
        50_000,
        "the first client gets the whole body"
    );
    assert!(
        first
            .body
            .iter()
            .enumerate()
            .all(|(i, b)| *b == (i % 251) as u8)
    );
    assert_eq!(second.status, StatusCode::OK);
    assert!(second.replayed());
    assert_eq!(second.headers["idempotency-response"], "not-retained");
    assert!(second.body.is_empty());
    assert_eq!(
        gateway.charges(),
        1,
        "a large response never runs the handler again"
    );
    // Within the limit, the body is kept.
    let (_, small) = twice(&app, "/big/9000").await;
    assert_eq!(small.body.len(), 9_000);
}

// --- Detached execution, fencing, store failures -------------------------------------

#[tokio::test]
async fn a_client_that_disconnects_mid_handler_gets_a_replay_on_retry() {
    let (app, gateway) = memory_app();
    gateway.delay_ms.store(300, Ordering::SeqCst);
    let key = new_key();
    let client = send_until_charging(
        &app,
        &gateway,
        post_json("/orders", Some("a"), Some(&key), ORDER),
    )
    .await;
    client.abort(); // the connection drops: axum drops the request future
    assert!(client.await.unwrap_err().is_cancelled());
    tokio::time::sleep(Duration::from_millis(500)).await;
    gateway.delay_ms.store(0, Ordering::SeqCst);
    let retry = send(&app, post_json("/orders", Some("a"), Some(&key), ORDER)).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed(), "the detached handler stored its response");
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn shutdown_waits_for_handlers_whose_clients_left() {
    let gateway = Arc::new(Gateway::default());
    gateway.delay_ms.store(300, Ordering::SeqCst);
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let tasks = layer.detached_tasks();
    let app = app(layer, Arc::clone(&gateway));
    let client = send_until_charging(
        &app,
        &gateway,
        post_json("/orders", Some("a"), Some(&new_key()), ORDER),
    )
    .await;
    client.abort();
    assert_eq!(tasks.running(), 1);
    assert!(tasks.shutdown(Duration::from_secs(5)).await);
    assert_eq!(
        gateway.charges(),
        1,
        "the handler finished before shutdown returned"
    );
    assert_eq!(tasks.running(), 0);
}

/// A handler that says when it started and runs until the test releases it.
#[derive(Default)]
struct HeldHandler {
    started: tokio::sync::Notify,
    release: tokio::sync::Notify,
    finished: std::sync::atomic::AtomicUsize,
}

#[tokio::test]
async fn a_tasks_handle_taken_before_the_in_flight_limit_still_waits_for_handlers() {
    use axum::extract::State;
    use idemgate::principal::{Principal, PrincipalError};

    let held = Arc::new(HeldHandler::default());
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_principal(
        |_: &http::request::Parts| -> Result<Principal, PrincipalError> {
            Ok(Principal::new("user:held"))
        },
    );
    // The handle first, the limit after: the order that used to leave the handle
    // on a tracker no handler ran on.
    let tasks = layer.detached_tasks();
    let layer = layer.with_max_in_flight(4);
    let app = axum::Router::new()
        .route(
            "/held",
            axum::routing::post(|State(held): State<Arc<HeldHandler>>| async move {
                held.started.notify_one();
                held.release.notified().await;
                held.finished.fetch_add(1, Ordering::SeqCst);
                (StatusCode::CREATED, "held and done")
            }),
        )
        .route_layer(layer)
        .with_state(Arc::clone(&held));
    let key = new_key();
    let client = send_in_background(&app, post_json("/held", None, Some(&key), ORDER));
    held.started.notified().await;
    client.abort(); // the client leaves; the handler runs on, detached
    assert!(client.await.unwrap_err().is_cancelled());

    assert_eq!(tasks.running(), 1, "the handle sees the detached handler");
    assert!(
        tasks.oldest_in_flight().is_some(),
        "the handle sees the operation in flight"
    );
    let shutdown = tokio::spawn({
        let tasks = tasks.clone();
        async move { tasks.shutdown(Duration::from_secs(30)).await }
    });
    // However long we leave it, shutdown must not return while the handler is held.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !shutdown.is_finished(),
        "shutdown returned while a detached handler was still running"
    );
    assert_eq!(held.finished.load(Ordering::SeqCst), 0);

    held.release.notify_one();
    assert!(
        shutdown.await.unwrap(),
        "shutdown reports every handler finished"
    );
    assert_eq!(
        held.finished.load(Ordering::SeqCst),
        1,
        "the handler finished before shutdown returned"
    );
    assert_eq!(tasks.running(), 0);
    assert!(tasks.oldest_in_flight().is_none());
    let retry = send(&app, post_json("/held", None, Some(&key), ORDER)).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(
        retry.replayed(),
        "the handler stored its response before shutdown returned"
    );
    assert_eq!(&retry.body[..], b"held and done");
    assert_eq!(
        held.finished.load(Ordering::SeqCst),
        1,
        "the retry did not run again"
    );
}

#[tokio::test]
async fn store_outage_is_503_and_nothing_runs() {
    let store = Arc::new(FaultyStore::default());
    store.claims_fail.store(true, Ordering::SeqCst);
    let gateway = Arc::new(Gateway::default());
    let app = app(
        IdempotencyLayer::from_arc(store.clone()),
        Arc::clone(&gateway),
    );
    let answer = send(
        &app,
        post_json("/orders", Some("a"), Some(&new_key()), ORDER),
    )
    .await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.problem_type(), "/problems/store-unavailable");
    assert_eq!(answer.headers["retry-after"], "1");
    assert_eq!(
        gateway.charges(),
        0,
        "fail closed: no execution while the store is down"
    );
}

#[tokio::test]
async fn a_store_that_does_not_answer_is_503_within_the_store_timeout() {
    let store = Arc::new(FaultyStore::default());
    store.frozen.store(true, Ordering::SeqCst);
    let gateway = Arc::new(Gateway::default());
    let layer = IdempotencyLayer::from_arc(store.clone())
        .with_store_timeout(Duration::from_millis(200))
        .with_unavailable_retry_after(Duration::from_secs(3));
    let app = app(layer, Arc::clone(&gateway));
    let key = new_key();
    let started = std::time::Instant::now();
    let answer = send(&app, post_json("/orders", Some("a"), Some(&key), ORDER)).await;
    let waited = started.elapsed();
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.problem_type(), "/problems/store-unavailable");
    assert_eq!(answer.headers["retry-after"], "3");
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(5),
        "answered after the store timeout, not never: {waited:?}"
    );
    assert_eq!(
        gateway.charges(),
        0,
        "nothing runs while the store is frozen"
    );
    // The store thaws: the same key runs, once.
    store.frozen.store(false, Ordering::SeqCst);
    let answer = send(&app, post_json("/orders", Some("a"), Some(&key), ORDER)).await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let replay = send(&app, post_json("/orders", Some("a"), Some(&key), ORDER)).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, answer.body);
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn a_full_store_is_503_and_nothing_runs() {
    let gateway = Arc::new(Gateway::default());
    let app = app_with(
        IdempotencyLayer::new(MemoryStore::new().with_capacity(1)),
        &gateway,
    );
    assert_eq!(
        send(
            &app,
            post_json("/orders", Some("a"), Some(&new_key()), ORDER)
        )
        .await
        .status,
        StatusCode::CREATED
    );
    let answer = send(
        &app,
        post_json("/orders", Some("a"), Some(&new_key()), ORDER),
    )
    .await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.problem_type(), "/problems/store-full");
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn a_failed_completion_still_answers_and_the_retry_takes_over_the_same_operation() {
    let store = Arc::new(FaultyStore::default());
    store.completes_fail.store(true, Ordering::SeqCst);
    let gateway = Arc::new(Gateway::default());
    let layer = IdempotencyLayer::from_arc(store.clone()).with_lease(Duration::from_millis(300));
    let app = app(layer, Arc::clone(&gateway));
    let key = new_key();
    let first = send(
        &app,
        post_json("/mark/final/201", Some("a"), Some(&key), ORDER),
    )
    .await;
    assert_eq!(
        first.status,
        StatusCode::CREATED,
        "the client gets the real response"
    );
    store.completes_fail.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let retry = send(
        &app,
        post_json("/mark/final/201", Some("a"), Some(&key), ORDER),
    )
    .await;
    let op = |a: &Answer| {
        String::from_utf8(a.body.to_vec())
            .unwrap()
            .split(" op ")
            .nth(1)
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        op(&first),
        op(&retry),
        "the takeover keeps the operation id, so downstream keys dedupe"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fenced_completion_gives_the_client_the_winners_outcome() {
    // The first holder cannot renew (a paused process, say): its lease lapses, a
    // retry takes the operation over and completes. The first holder's completion
    // is then refused, and its client gets the winner's stored response.
    let store = Arc::new(FaultyStore::default());
    store.renewals_refused.store(true, Ordering::SeqCst);
    let gateway = Arc::new(Gateway::default());
    gateway.delay_ms.store(700, Ordering::SeqCst);
    let layer = IdempotencyLayer::from_arc(store.clone()).with_lease(Duration::from_millis(200));
    let app = app(layer, Arc::clone(&gateway));
    let key = new_key();
    let slow = send_until_charging(
        &app,
        &gateway,
        post_json("/orders", Some("a"), Some(&key), ORDER),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // the first lease has lapsed
    gateway.delay_ms.store(0, Ordering::SeqCst);
    let winner = send(&app, post_json("/orders", Some("a"), Some(&key), ORDER)).await;
    assert_eq!(winner.status, StatusCode::CREATED);
    assert!(
        !winner.replayed(),
        "the retry took the lapsed operation over and ran it"
    );
    let loser = slow.await.unwrap();
    assert_eq!(loser.status, StatusCode::CREATED);
    assert_eq!(
        loser.body, winner.body,
        "both clients see the one stored outcome"
    );
    assert!(loser.replayed());
    assert_eq!(winner.json()["operation_id"], loser.json()["operation_id"]);
    let replay = send(&app, post_json("/orders", Some("a"), Some(&key), ORDER)).await;
    assert_eq!(replay.body, winner.body);
}

#[tokio::test]
async fn the_handler_sees_its_operation_and_renewal_keeps_a_slow_holder() {
    let gateway = Arc::new(Gateway::default());
    gateway.delay_ms.store(700, Ordering::SeqCst);
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_lease(Duration::from_millis(300));
    let app = app(layer, Arc::clone(&gateway));
    let key = new_key();
    let slow = send_until_charging(
        &app,
        &gateway,
        post_json("/orders", Some("a"), Some(&key), ORDER),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await; // past the first lease length
    let duplicate = send(&app, post_json("/orders", Some("a"), Some(&key), ORDER)).await;
    assert_eq!(
        duplicate.status,
        StatusCode::CONFLICT,
        "a renewed lease is not taken over"
    );
    let first = slow.await.unwrap();
    assert!(
        first.json()["operation_id"]
            .as_str()
            .is_some_and(|id| id.len() == 36)
    );
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn too_many_keyed_requests_in_flight_are_503() {
    let gateway = Arc::new(Gateway::default());
    gateway.delay_ms.store(300, Ordering::SeqCst);
    let app = app_with(
        IdempotencyLayer::new(MemoryStore::new()).with_max_in_flight(1),
        &gateway,
    );
    let first = send_until_charging(
        &app,
        &gateway,
        post_json("/orders", Some("a"), Some(&new_key()), ORDER),
    )
    .await;
    let second = send(
        &app,
        post_json("/orders", Some("a"), Some(&new_key()), ORDER),
    )
    .await;
    assert_eq!(second.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(second.problem_type(), "/problems/overloaded");
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn every_retry_after_comes_from_the_configuration() {
    // The overload 503: the busy Retry-After.
    let gateway = Arc::new(Gateway::default());
    gateway.delay_ms.store(300, Ordering::SeqCst);
    let busy_app = app_with(
        IdempotencyLayer::new(MemoryStore::new())
            .with_max_in_flight(1)
            .with_busy_retry_after(Duration::from_secs(7))
            .with_unavailable_retry_after(Duration::from_secs(9)),
        &gateway,
    );
    let first = send_until_charging(
        &busy_app,
        &gateway,
        post_json("/orders", Some("a"), Some(&new_key()), ORDER),
    )
    .await;
    let overloaded = send(
        &busy_app,
        post_json("/orders", Some("a"), Some(&new_key()), ORDER),
    )
    .await;
    assert_eq!(overloaded.problem_type(), "/problems/overloaded");
    assert_eq!(overloaded.headers[axum::http::header::RETRY_AFTER], "7");
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(gateway.charges(), 1, "the overloaded request did not run");

    // A keyless request whose transaction did not commit: the unavailable one.
    let gateway = Arc::new(Gateway::default());
    let store = Arc::new(FakeTransactionalStore::default());
    let app = app(
        IdempotencyLayer::from_arc(store.clone())
            .with_unavailable_retry_after(Duration::from_secs(9)),
        Arc::clone(&gateway),
    )
    .layer(axum::Extension(Arc::clone(&store)));
    store.commit_fails.store(true, Ordering::SeqCst);
    let failed = send(
        &app,
        post_json("/transactional/201", Some("a"), None, ORDER),
    )
    .await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(failed.problem_type(), "/problems/store-unavailable");
    assert_eq!(failed.headers[axum::http::header::RETRY_AFTER], "9");
    assert_eq!(store.commits.load(Ordering::SeqCst), 0);
    assert_eq!(store.rollbacks.load(Ordering::SeqCst), 1);
}

// --- The transactional hand-over ------------------------------------------------------

fn transactional_app() -> (axum::Router, Arc<Gateway>, Arc<FakeTransactionalStore>) {
    let gateway = Arc::new(Gateway::default());
    let store = Arc::new(FakeTransactionalStore::default());
    let app = app(
        IdempotencyLayer::from_arc(store.clone()),
        Arc::clone(&gateway),
    )
    .layer(axum::Extension(Arc::clone(&store)));
    (app, gateway, store)
}

#[tokio::test]
async fn a_handler_transaction_commits_with_the_completion() {
    let (app, gateway, store) = transactional_app();
    let (first, second) = twice(&app, "/transactional/201").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(second.replayed());
    assert_eq!(store.commits.load(Ordering::SeqCst), 1);
    assert_eq!(store.rollbacks.load(Ordering::SeqCst), 0);
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn a_handler_transaction_is_rolled_back_and_released_on_a_5xx() {
    let (app, gateway, store) = transactional_app();
    let (_, second) = twice(&app, "/transactional/500").await;
    assert!(
        !second.replayed(),
        "the rollback undid the effects, so the retry runs"
    );
    assert_eq!(store.commits.load(Ordering::SeqCst), 0);
    assert_eq!(store.rollbacks.load(Ordering::SeqCst), 2);
    assert_eq!(gateway.charges(), 2);
}

#[tokio::test]
async fn a_keyless_handler_transaction_commits_unless_5xx() {
    let (app, _, store) = transactional_app();
    send(
        &app,
        post_json("/transactional/201", Some("a"), None, ORDER),
    )
    .await;
    assert_eq!(store.commits.load(Ordering::SeqCst), 1);
    send(
        &app,
        post_json("/transactional/503", Some("a"), None, ORDER),
    )
    .await;
    assert_eq!(store.rollbacks.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_failed_commit_answers_503_and_the_retry_runs_again() {
    let (app, gateway, store) = transactional_app();
    store.commit_fails.store(true, Ordering::SeqCst);
    let key = new_key();
    let failed = send(
        &app,
        post_json("/transactional/201", Some("a"), Some(&key), ORDER),
    )
    .await;
    assert_eq!(
        failed.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "never a 201 for rolled-back writes"
    );
    assert_eq!(failed.problem_type(), "/problems/store-unavailable");
    let retry = send(
        &app,
        post_json("/transactional/201", Some("a"), Some(&key), ORDER),
    )
    .await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed(), "the released operation ran again");
    assert_eq!(store.commits.load(Ordering::SeqCst), 1);
    assert_eq!(gateway.charges(), 2);
}

// --- What a stored answer keeps alive -------------------------------------------

/// A handler's answer may be views into a larger buffer (a proxied upstream's
/// answer is slices of hyper's read buffer): the record keeps its own copy, not
/// the views, so the buffer is freed once the answer is sent. Kept as views,
/// a 3-byte answer through the proxy pinned 8.8 KiB per record.
#[tokio::test]
async fn a_stored_answer_pins_no_buffer_it_was_sliced_from() {
    use axum::body::Body;
    use axum::response::Response;
    use bytes::Bytes;

    let buffer = Bytes::from(vec![b'x'; 8192]);
    let handed = Arc::new(std::sync::Mutex::new(Some(buffer.clone())));
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handler = {
        let (handed, runs) = (Arc::clone(&handed), Arc::clone(&runs));
        move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let buffer = handed
                .lock()
                .unwrap()
                .take()
                .expect("the handler runs once");
            let tag = http::HeaderValue::from_maybe_shared(buffer.slice(100..108)).unwrap();
            Response::builder()
                .status(StatusCode::CREATED)
                .header("x-tag", tag)
                .body(Body::from(buffer.slice(0..3)))
                .unwrap()
        }
    };
    let app = axum::Router::new()
        .route("/orders", axum::routing::post(handler))
        .route_layer(
            IdempotencyLayer::new(MemoryStore::new())
                .with_replayed_header_names([http::HeaderName::from_static("x-tag")]),
        )
        .layer(axum::middleware::from_fn(authenticate));

    let key = new_key();
    let first = send(&app, post_json("/orders", Some("alice"), Some(&key), ORDER)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    // The client's copy of the answer is its own to keep; the record's is not.
    drop(first);
    assert!(
        buffer.is_unique(),
        "the stored record still holds views of the handler's buffer"
    );

    let retry = send(&app, post_json("/orders", Some("alice"), Some(&key), ORDER)).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(
        &retry.body[..],
        b"xxx",
        "the stored copy replays the same bytes"
    );
    assert_eq!(retry.headers["x-tag"], "xxxxxxxx");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}
