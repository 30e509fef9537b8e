//! `idemgate-client` against the real `idemgate serve` binary, over real HTTP,
//! through the fault relay (`idemgate_testkit::relay`): lost responses, resets,
//! delays and deadlines, with the orders (through the API) and the charges (the
//! counting mock gateway) asserted after each.
//!
//! The harness (server process, mock gateway, orders client) is `tests/support`,
//! shared by every test binary of the crate.

#![allow(dead_code, unreachable_pub)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idemgate_client::{Client, Error, Operation, RetryMiddleware, RetryPolicy};
use idemgate_testkit::relay::{Fault, Relay};
use reqwest::StatusCode;
use support::gateway::{Fault as GatewayFault, MockGateway};
use support::server::{Options, Server, sqlite_url};

const ORDER: &str = support::client::ORDER;

/// The server (SQLite, with the mock gateway), a relay in front of it, and the
/// token the orders are made under.
struct Setup {
    gateway: MockGateway,
    server: Server,
    relay: Relay,
    orders: support::client::Client,
    database: String,
    _db: support::server::TempDir,
}

impl Setup {
    async fn start() -> Self {
        Self::with(|options| options).await
    }

    async fn with(configure: impl FnOnce(Options) -> Options) -> Self {
        let gateway = MockGateway::start().await;
        let (db, dir) = sqlite_url();
        let server = Server::start(configure(Options::new(&db).gateway(gateway.url()))).await;
        let relay = Relay::start(server.addr).await;
        Self {
            gateway,
            server,
            relay,
            orders: support::client::Client::new(),
            database: db,
            _db: dir,
        }
    }

    /// The client under test: through the relay, one connection per attempt so
    /// the relay counts attempts.
    fn client(&self, policy: RetryPolicy) -> Client {
        Client::new(no_reuse()).with_policy(policy)
    }

    fn orders_url(&self) -> String {
        self.relay.url("/api/v1/orders")
    }

    fn post(&self, client: &Client, body: &'static str) -> idemgate_client::RequestBuilder {
        client
            .post(self.orders_url())
            .bearer_auth(&self.orders.token)
            .header("content-type", "application/json")
            .body(body)
    }

    /// The orders of this token, straight from the server (not through the relay).
    async fn orders(&self) -> Vec<serde_json::Value> {
        self.orders.orders(&self.server.url("")).await
    }
}

fn no_reuse() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// The problem and the replay mark of a `Rejected`; a panic for any other error.
fn rejected(error: &Error) -> (&idemgate_client::Problem, bool) {
    match error {
        Error::Rejected {
            problem, replayed, ..
        } => (problem, *replayed),
        other => panic!("not Rejected: {other:?}"),
    }
}

/// Short waits, so the suite stays fast; the rules are the defaults'.
fn quick() -> RetryPolicy {
    RetryPolicy::default().backoff(Duration::from_millis(20), Duration::from_millis(200))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_response_is_retried_and_replayed_with_one_order_and_one_charge() {
    let setup = Setup::start().await;
    setup.relay.inject(Fault::LoseResponse);
    let pay = Operation::new();
    let response = setup
        .post(&setup.client(quick()), ORDER)
        .operation(&pay)
        .send()
        .await
        .expect("the retry gets the outcome");
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(
        response.replayed(),
        "the second attempt is the first's replay"
    );
    assert_eq!(response.attempts(), 2);
    assert_eq!(setup.relay.connections(), 2);
    assert_eq!(
        setup.relay.forwarded(),
        2,
        "both attempts reached the server"
    );
    let orders = setup.orders().await;
    assert_eq!(orders.len(), 1, "one order for two attempts: {orders:?}");
    let order: serde_json::Value = response.json().unwrap();
    assert_eq!(
        order["order_id"], orders[0]["order_id"],
        "the replay names the first attempt's order"
    );
    assert_eq!(setup.gateway.calls().len(), 1);
    assert_eq!(setup.gateway.distinct_charges(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resets_and_slow_answers_are_retried_to_one_order() {
    let setup = Setup::start().await;
    setup.relay.inject(Fault::Reset);
    setup
        .relay
        .inject(Fault::DelayResponse(Duration::from_millis(1_500)));
    setup.relay.inject(Fault::LoseResponse);
    let policy = quick().attempt_timeout(Duration::from_millis(500));
    let response = setup
        .post(&setup.client(policy), ORDER)
        .operation(&Operation::new())
        .send()
        .await
        .expect("the fourth attempt is answered");
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(response.replayed());
    assert_eq!(response.attempts(), 4);
    assert_eq!(setup.relay.connections(), 4);
    assert_eq!(
        setup.relay.forwarded(),
        3,
        "the reset one never reached the server"
    );
    assert_eq!(setup.orders().await.len(), 1);
    assert_eq!(setup.gateway.distinct_charges(), 1);
    assert_eq!(setup.gateway.calls().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_while_the_first_runs_waits_out_the_409_and_gets_the_replay() {
    // The simulated gateway takes 1.5 s; a 2 s lease makes the 409's Retry-After
    // short enough to honour in a test.
    let setup = Setup::with(|mut options| {
        options.gateway_url = None;
        options.simulated_delay_ms = 1_500;
        options.lease_seconds = 2;
        options
    })
    .await;
    let pay = Operation::new();
    let first = {
        let (orders, url, key) = (
            setup.orders.clone(),
            setup.server.url("/api/v1/orders"),
            pay.key().to_owned(),
        );
        tokio::spawn(async move { orders.post(&url, Some(&key), ORDER).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let duplicate = setup
        .post(&setup.client(quick()), ORDER)
        .operation(&Operation::resume(pay.key()).unwrap())
        .send()
        .await
        .expect("the duplicate waits for the outcome");
    let waited = started.elapsed();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(duplicate.status(), StatusCode::CREATED);
    assert!(duplicate.replayed());
    assert_eq!(
        duplicate.body(),
        &first.body,
        "the replay is the first's answer"
    );
    assert!(duplicate.attempts() >= 2, "a 409 first, then the replay");
    assert_eq!(setup.relay.connections() as u32, duplicate.attempts());
    assert!(
        waited >= Duration::from_millis(900),
        "Retry-After (at least 1 s) was honoured, not hammered: {waited:?}"
    );
    assert_eq!(setup.orders().await.len(), 1);
    let metrics = reqwest::get(setup.server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("idemgate_requests_total{outcome=\"executed\"} 1\n"),
        "one execution: {metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_409_past_the_deadline_is_still_in_progress_without_waiting() {
    let setup = Setup::with(|mut options| {
        options.gateway_url = None;
        options.simulated_delay_ms = 3_000;
        options
    })
    .await;
    let pay = Operation::new();
    let first = {
        let (orders, url, key) = (
            setup.orders.clone(),
            setup.server.url("/api/v1/orders"),
            pay.key().to_owned(),
        );
        tokio::spawn(async move { orders.post(&url, Some(&key), ORDER).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let error = setup
        .post(
            &setup.client(quick().deadline(Duration::from_millis(800))),
            ORDER,
        )
        .operation(&pay)
        .send()
        .await
        .expect_err("the first attempt is still running");
    let Error::StillInProgress {
        retry_after,
        ref problem,
    } = error
    else {
        panic!("{error:?}");
    };
    assert!(
        retry_after.unwrap() >= Duration::from_secs(1),
        "{retry_after:?}"
    );
    assert_eq!(problem.type_uri, "/problems/in-progress");
    assert!(error.may_have_run());
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "a Retry-After past the deadline is not waited for: {:?}",
        started.elapsed()
    );
    assert_eq!(setup.relay.connections(), 1);
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(setup.orders().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_changed_body_under_the_same_key_is_key_reused_and_never_retried() {
    let setup = Setup::start().await;
    let client = setup.client(quick());
    let pay = Operation::new();
    let first = setup
        .post(&client, ORDER)
        .operation(&pay)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    const TAMPERED: &str = r#"{"items":[{"id":42,"quantity":2}],"currency":"RUB","amount":3000}"#;
    let error = setup
        .post(&client, TAMPERED)
        .operation(&pay)
        .send()
        .await
        .expect_err("same key, other body");
    let Error::KeyReused { ref problem } = error else {
        panic!("{error:?}");
    };
    assert_eq!(problem.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem.type_uri, "/problems/key-reused");
    assert!(problem.title.is_some() && problem.detail.is_some());
    assert!(!error.may_have_run(), "this request was not run");
    assert_eq!(
        setup.relay.connections(),
        2,
        "one attempt each: a 422 is final"
    );
    assert_eq!(setup.orders().await.len(), 1);
    assert_eq!(setup.gateway.calls().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_retries_zero_is_exactly_one_attempt_and_the_operation_resumes_later() {
    let setup = Setup::start().await;
    setup.relay.inject(Fault::LoseResponse);
    let pay = Operation::new();
    let error = setup
        .post(&setup.client(quick().max_retries(0)), ORDER)
        .operation(&pay)
        .send()
        .await
        .expect_err("one attempt, and its answer was lost");
    assert!(matches!(error, Error::Transport { .. }), "{error:?}");
    assert!(
        error.may_have_run(),
        "it was sent: it may have run (it did)"
    );
    assert_eq!(
        setup.relay.connections(),
        1,
        "max_retries(0) is one attempt"
    );
    // The app stored the key; after its own restart it resumes the operation.
    let resumed = Operation::resume(pay.key()).unwrap();
    let response = setup
        .post(&setup.client(quick()), ORDER)
        .operation(&resumed)
        .send()
        .await
        .unwrap();
    assert!(
        response.replayed(),
        "the resumed operation gets the first outcome"
    );
    assert_eq!(setup.orders().await.len(), 1);
    assert_eq!(setup.gateway.distinct_charges(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unkeyed_post_is_sent_once_whatever_the_policy() {
    let setup = Setup::start().await;
    setup.relay.inject_n(Fault::LoseResponse, 3);
    let error = setup
        .post(&setup.client(quick().max_retries(10)), ORDER)
        .send()
        .await
        .expect_err("its answer was lost, and it must not be retried");
    assert!(
        matches!(error, Error::Transport { .. }) && error.may_have_run(),
        "{error:?}"
    );
    assert_eq!(setup.relay.connections(), 1, "no key, no retry");
    assert_eq!(
        setup.orders().await.len(),
        1,
        "it ran: a retry would have been a second order"
    );
    assert_eq!(setup.gateway.distinct_charges(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_deadline_bounds_all_attempts_and_waits() {
    let setup = Setup::start().await;
    setup
        .relay
        .inject_n(Fault::DelayResponse(Duration::from_secs(3)), 20);
    let policy = quick()
        .attempt_timeout(Duration::from_millis(300))
        .deadline(Duration::from_millis(1_000))
        .max_retries(100);
    let started = Instant::now();
    let error = setup
        .post(&setup.client(policy), ORDER)
        .operation(&Operation::new())
        .send()
        .await
        .expect_err("every answer comes too late");
    let took = started.elapsed();
    assert!(
        matches!(error, Error::Transport { .. }) && error.may_have_run(),
        "{error:?}"
    );
    assert!(
        took < Duration::from_millis(1_300),
        "the deadline held: {took:?}"
    );
    let attempts = setup.relay.connections();
    assert!(
        (2..=6).contains(&attempts),
        "retried within the deadline: {attempts}"
    );
    // Every attempt reached the server, which ran one of them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(setup.orders().await.len(), 1);
    assert_eq!(setup.gateway.distinct_charges(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateway_failure_5xx_is_retried_to_one_order_and_one_charge() {
    let setup = Setup::start().await;
    setup.gateway.inject(GatewayFault::FailAfterCharging(503));
    let response = setup
        .post(&setup.client(quick()), ORDER)
        .operation(&Operation::new())
        .send()
        .await
        .expect("the 502 was not a replay, so it was retried");
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.attempts(), 2);
    assert_eq!(setup.orders().await.len(), 1);
    assert_eq!(setup.gateway.calls().len(), 2);
    assert_eq!(setup.gateway.distinct_charges(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_order_is_rejected_with_its_problem_and_not_retried() {
    let setup = Setup::start().await;
    let error = setup
        .post(
            &setup.client(quick()),
            r#"{"items":[],"currency":"RUB","amount":1500}"#,
        )
        .operation(&Operation::new())
        .send()
        .await
        .expect_err("an empty order is refused");
    let (problem, replayed) = rejected(&error);
    assert_eq!(problem.status, StatusCode::BAD_REQUEST);
    assert_eq!(problem.type_uri, "/problems/invalid-order");
    assert!(problem.title.is_some() && problem.detail.is_some());
    assert!(!replayed);
    assert!(!error.may_have_run());
    assert_eq!(setup.relay.connections(), 1);
    assert!(setup.gateway.calls().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_body_is_refused_before_anything_is_sent() {
    let setup = Setup::start().await;
    let stream = reqwest::Body::wrap(http_body_util::StreamBody::new(futures_util::stream::iter(
        [Ok::<_, std::io::Error>(http_body::Frame::data(
            bytes::Bytes::from_static(ORDER.as_bytes()),
        ))],
    )));
    let error = setup
        .client(quick())
        .post(setup.orders_url())
        .bearer_auth(&setup.orders.token)
        .body(stream)
        .operation(&Operation::new())
        .send()
        .await
        .expect_err("a stream cannot be replayed");
    assert!(matches!(error, Error::BodyNotReplayable), "{error:?}");
    assert!(!error.may_have_run());
    assert_eq!(
        setup.relay.connections(),
        0,
        "refused before the first attempt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_middleware_retries_keyed_requests_and_passes_unkeyed_ones_once() {
    let setup = Setup::start().await;
    let http = reqwest_middleware::ClientBuilder::new(no_reuse())
        .with(RetryMiddleware::new(quick()))
        .build();
    let send = |key: Option<String>| {
        let mut request = http
            .post(setup.orders_url())
            .bearer_auth(&setup.orders.token)
            .header("content-type", "application/json")
            .body(ORDER);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request.send()
    };
    setup.relay.inject(Fault::LoseResponse);
    let keyed = send(Some(Operation::new().key().to_owned())).await.unwrap();
    assert_eq!(keyed.status(), StatusCode::CREATED);
    assert_eq!(keyed.headers()["idempotent-replayed"], "true");
    assert_eq!(setup.relay.connections(), 2);
    setup.relay.inject(Fault::LoseResponse);
    assert!(
        send(None).await.is_err(),
        "unkeyed: one attempt, answer lost"
    );
    assert_eq!(setup.relay.connections(), 3);
    assert_eq!(setup.orders().await.len(), 2, "one per request, none twice");
    assert_eq!(setup.gateway.distinct_charges(), 2);
}

/// A replayed `5xx` is the operation's stored outcome, so it is final. The orders
/// service releases its failures, so `idemgate proxy` stores one: an upstream
/// `500` is kept as `FAILED` and replayed (PROTOCOL §8, §13).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replayed_5xx_is_the_outcome_and_is_not_retried() {
    let executions = Arc::new(AtomicUsize::new(0));
    let upstream = {
        let executions = Arc::clone(&executions);
        let app = axum::Router::new().fallback(move || async move {
            executions.fetch_add(1, Ordering::SeqCst);
            (StatusCode::INTERNAL_SERVER_ERROR, "upstream broke")
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    };
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemgate"));
    command
        .arg("proxy")
        .args(["--upstream", &format!("http://{upstream}")])
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--idempotency-store", "memory"])
        .env("IDEMGATE_PRINCIPAL_SECRET", "client-suite-secret")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let (_proxy, addrs) = support::server::spawn_listening(
        &mut command,
        &["proxy listening on http://", "admin listening on http://"],
    )
    .await;
    let relay = Relay::start(addrs[0]).await;
    let error = Client::new(no_reuse())
        .with_policy(quick())
        .post(relay.url("/jobs"))
        .bearer_auth("alice")
        .body("{}")
        .operation(&Operation::new())
        .send()
        .await
        .expect_err("the upstream failed");
    let (problem, replayed) = rejected(&error);
    assert_eq!(problem.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        replayed,
        "the first 500 was retried once, and its replay is final"
    );
    assert!(error.may_have_run());
    assert_eq!(
        relay.connections(),
        2,
        "a fresh 500, then its replay: no third"
    );
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_503_with_retry_after_is_waited_out_then_retried() {
    // Another process's write lock on the SQLite file: the claim outlasts the
    // store timeout, so the server answers 503 `store-unavailable`, Retry-After: 1,
    // and runs nothing.
    use sqlx::Connection;
    let setup = Setup::with(|options| options.arg("--store-timeout-ms", 300)).await;
    let mut lock = sqlx::SqliteConnection::connect(&setup.database)
        .await
        .unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut lock)
        .await
        .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        sqlx::query("COMMIT").execute(&mut lock).await.unwrap();
    });
    let started = Instant::now();
    let response = setup
        .post(&setup.client(quick()), ORDER)
        .operation(&Operation::new())
        .send()
        .await
        .expect("the retry after the 503 gets through");
    let waited = started.elapsed();
    release.await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(
        !response.replayed(),
        "the 503 ran nothing; the retry ran it"
    );
    assert_eq!(
        response.attempts(),
        2,
        "one 503, waited out, then the order"
    );
    assert_eq!(setup.relay.connections(), 2);
    assert!(
        waited >= Duration::from_millis(1_250),
        "the store timeout, then Retry-After: 1 honoured: {waited:?}"
    );
    assert_eq!(setup.orders().await.len(), 1);
    assert_eq!(setup.gateway.distinct_charges(), 1);
}
