//! `idemgate-client` against the real `idemgate serve` binary, over real HTTP,
//! through the fault relay (`idemgate_testkit::relay`): lost responses, resets,
//! delays and deadlines, with the orders (through the API) and the charges (the
//! counting mock gateway) asserted after each.
//!
//! The scenarios one request and the relay's faults make are the cases of
//! `clients/scenarios.json`, which clients/js and clients/python run too
//! (`every_scenario_of_clients_scenarios_json`); the tests written here are the
//! ones that need more than that file says (a second request, in flight or after
//! the first, a locked store, a stream body, the middleware, a proxy in front of
//! an upstream).
//!
//! The harness (server process, mock gateway, orders client) is `tests/support`,
//! shared by every test binary of the crate.

#![allow(dead_code, unreachable_pub)]

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemgate_client::case_files::PolicySettings;
use idemgate_client::{Client, Error, Operation, RetryMiddleware, RetryPolicy};
use idemgate_testkit::relay::{Fault, Relay};
use reqwest::StatusCode;
use serde::Deserialize;
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

/// The fault scenarios every client's suite runs: one case a scenario. The file's
/// `$comment` says what a case holds.
const SCENARIOS: &str = include_str!("../../../clients/scenarios.json");

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    #[serde(rename = "$comment")]
    _comment: Vec<String>,
    base_policy: PolicySettings,
    scenarios: Vec<Scenario>,
}

/// One case. A field this suite does not know fails the file's loading, so a
/// new expectation cannot be skipped here unnoticed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    name: String,
    /// `[words, count]`: the next `count` requests get the relay's fault `words`.
    #[serde(default)]
    faults: Vec<(String, usize)>,
    /// The statuses the mock gateway answers after charging, in turn.
    #[serde(default)]
    gateway_failures: Vec<u16>,
    /// Laid over the file's `base_policy`.
    #[serde(default)]
    policy: PolicySettings,
    /// `false`: the POST goes without a key.
    #[serde(default = "keyed")]
    operation: bool,
    /// The order; `ORDER` when absent.
    body: Option<serde_json::Value>,
    /// The wait before the server's orders and the gateway's calls are counted.
    settle_ms: Option<u64>,
    expect: Expect,
}

fn keyed() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    status: Option<u16>,
    replayed: Option<bool>,
    attempts: Option<u32>,
    error: Option<Failure>,
    may_have_run: Option<bool>,
    problem_type: Option<String>,
    /// Each attempt's status as reported; `None`: no answer.
    statuses: Option<Vec<Option<u16>>>,
    relay_requests: Option<usize>,
    relay_requests_between: Option<(usize, usize)>,
    /// The send, every attempt and wait, ended sooner than this.
    elapsed_below_ms: Option<u64>,
    orders: Option<usize>,
    gateway_calls: Option<usize>,
    distinct_charges: Option<usize>,
}

/// The error a scenario ends in.
#[derive(Debug, Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Failure {
    /// `Error::Transport`: no answer.
    Transport,
    /// `Error::Rejected`: a final answer that is not a success.
    Rejected,
}

/// Notes each attempt's status as the client hears it, with the body read whole,
/// so a body cut off halfway is no answer (`None`), as the other clients report
/// it. It runs inside the client's retries: once per attempt.
#[derive(Debug, Clone, Default)]
struct Statuses(Arc<Mutex<Vec<Option<u16>>>>);

impl Statuses {
    fn noted(&self) -> Vec<Option<u16>> {
        self.0.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Statuses {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut axum::http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let answer = match next.run(request, extensions).await {
            Ok(response) => read_whole(response).await,
            Err(error) => Err(error),
        };
        let status = answer
            .as_ref()
            .ok()
            .map(|response| response.status().as_u16());
        self.0.lock().unwrap().push(status);
        answer
    }
}

/// `response` with its body read: the same answer, or the error reading it.
async fn read_whole(response: reqwest::Response) -> reqwest_middleware::Result<reqwest::Response> {
    let mut head = axum::http::Response::builder()
        .status(response.status())
        .version(response.version());
    *head.headers_mut().unwrap() = response.headers().clone();
    let body = response.bytes().await?;
    Ok(head.body(body).unwrap().into())
}

/// Runs one scenario on its own server, gateway and relay, asserting what it
/// expects as clients/js `test/scenarios.test.ts` and clients/python
/// `tests/test_scenarios.py` do; a failed expectation panics.
async fn run_scenario(base: &PolicySettings, scenario: &Scenario) {
    let setup = Setup::start().await;
    for (words, count) in &scenario.faults {
        let fault: Fault = words
            .parse()
            .unwrap_or_else(|error| panic!("the fault {words:?}: {error}"));
        for _ in 0..*count {
            setup.relay.inject_request(fault, None);
        }
    }
    for &status in &scenario.gateway_failures {
        setup
            .gateway
            .inject(GatewayFault::FailAfterCharging(status));
    }
    let settings = base.overlaid(&scenario.policy);
    let policy = settings
        .policy()
        .unwrap_or_else(|| panic!("settings a RetryPolicy cannot hold: {settings:?}"));
    let statuses = Statuses::default();
    let http = reqwest_middleware::ClientBuilder::new(no_reuse())
        .with(statuses.clone())
        .build();
    let body = match &scenario.body {
        Some(body) => body.clone(),
        None => serde_json::from_str(ORDER).unwrap(),
    };
    let mut request = Client::new(http)
        .with_policy(policy)
        .post(setup.orders_url())
        .bearer_auth(&setup.orders.token)
        .json(&body);
    if scenario.operation {
        request = request.operation(&Operation::new());
    }
    let started = Instant::now();
    let sent = request.send().await;
    let took = started.elapsed();
    let expect = &scenario.expect;
    match (expect.error, sent) {
        (None, Ok(reply)) => {
            assert_eq!(Some(reply.status().as_u16()), expect.status, "status");
            if let Some(replayed) = expect.replayed {
                assert_eq!(reply.replayed(), replayed, "replayed");
            }
            if let Some(attempts) = expect.attempts {
                assert_eq!(reply.attempts(), attempts, "attempts");
            }
        }
        (None, Err(error)) => panic!("expected a reply, got {error:?}"),
        (Some(failure), Ok(reply)) => {
            panic!(
                "expected a {failure:?} error, got {} {:?}",
                reply.status(),
                reply.body()
            )
        }
        (Some(Failure::Transport), Err(error)) => {
            assert!(matches!(error, Error::Transport { .. }), "{error:?}");
            assert_eq!(
                Some(error.may_have_run()),
                expect.may_have_run,
                "may_have_run"
            );
        }
        (Some(Failure::Rejected), Err(error)) => {
            let (problem, replayed) = rejected(&error);
            assert_eq!(Some(problem.status.as_u16()), expect.status, "status");
            assert_eq!(
                Some(&problem.type_uri),
                expect.problem_type.as_ref(),
                "problem type"
            );
            assert!(
                problem.title.is_some() && problem.detail.is_some(),
                "{problem:?}"
            );
            assert_eq!(Some(replayed), expect.replayed, "replayed");
            assert_eq!(
                Some(error.may_have_run()),
                expect.may_have_run,
                "may_have_run"
            );
        }
    }
    if let Some(expected) = &expect.statuses {
        assert_eq!(&statuses.noted(), expected, "each attempt's status");
    }
    let requests = setup.relay.requests();
    if let Some(expected) = expect.relay_requests {
        assert_eq!(requests, expected, "attempts that reached the relay");
    }
    if let Some((low, high)) = expect.relay_requests_between {
        assert!(
            (low..=high).contains(&requests),
            "attempts that reached the relay: {requests}"
        );
    }
    if let Some(below) = expect.elapsed_below_ms {
        assert!(
            took < Duration::from_millis(below),
            "the send took {took:?}"
        );
    }
    if let Some(settle) = scenario.settle_ms {
        tokio::time::sleep(Duration::from_millis(settle)).await;
    }
    if let Some(expected) = expect.orders {
        assert_eq!(setup.orders().await.len(), expected, "orders");
    }
    if let Some(expected) = expect.gateway_calls {
        assert_eq!(setup.gateway.calls().len(), expected, "gateway calls");
    }
    if let Some(expected) = expect.distinct_charges {
        assert_eq!(setup.gateway.distinct_charges(), expected, "charges");
    }
}

/// Every case of `clients/scenarios.json`, all at once (each on its own server,
/// gateway and relay); a failure names its scenario.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_scenario_of_clients_scenarios_json() {
    let file: ScenarioFile = serde_json::from_str(SCENARIOS).expect("clients/scenarios.json");
    assert!(
        !file.scenarios.is_empty(),
        "clients/scenarios.json has no scenario"
    );
    let base = Arc::new(file.base_policy);
    let runs: Vec<_> = file
        .scenarios
        .into_iter()
        .map(|scenario| {
            let base = Arc::clone(&base);
            let name = scenario.name.clone();
            let run = async move { run_scenario(&base, &scenario).await };
            (
                name,
                tokio::spawn(tokio::time::timeout(Duration::from_secs(60), run)),
            )
        })
        .collect();
    let total = runs.len();
    let mut failures = Vec::new();
    for (name, run) in runs {
        match run.await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => failures.push(format!("{name}: no outcome within 60 s")),
            Err(error) => {
                let panic = error.into_panic();
                let message = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(a panic without a message)");
                failures.push(format!("{name}: {message}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {total} scenarios of clients/scenarios.json failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
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

/// A streamed answer read with `send_events` through `idemgate proxy`, its
/// connection cut by the relay in the middle of the third event: the client
/// asks again with the same key (and, when the events carry ids,
/// `Last-Event-ID: 2`), joins the stream the upstream is still producing, and
/// hands on events 1 to 5 once each, in order. The upstream ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_event_stream_is_resumed_and_each_event_handed_on_once() {
    use support::proxy::{Proxy, ProxyOptions, Upstream};
    for with_ids in [true, false] {
        let event = |n: usize| {
            let id = if with_ids {
                format!("id: {n}\n")
            } else {
                String::new()
            };
            bytes::Bytes::from(format!("{id}data: {{\"token\":{n}}}\n\n"))
        };
        let upstream = Upstream::start().await;
        let proxy = Proxy::start(ProxyOptions::new(upstream.url())).await;
        let relay = Relay::start(proxy.addr).await;
        let produced = upstream.stream_next();
        for n in 1..=2 {
            produced.send(Ok(event(n))).await.unwrap();
        }
        // Each event one chunk: its size line, the event, CRLF. The cut falls
        // 8 bytes into the third.
        let chunk = |n: usize| format!("{:x}\r\n", event(n).len()).len() + event(n).len() + 2;
        relay.inject_request(Fault::CutAfter(chunk(1) + chunk(2) + 8), Some("POST"));
        let client = Client::new(reqwest::Client::new()).with_policy(
            RetryPolicy::default().backoff(Duration::from_millis(10), Duration::from_millis(50)),
        );
        let token = support::client::Client::new().token;
        let mut events = client
            .post(relay.url("/v1/chat/completions"))
            .bearer_auth(&token)
            .json(&serde_json::json!({"model": "m", "stream": true}))
            .operation(&Operation::new())
            .send_events()
            .await
            .unwrap();
        let mut received = Vec::new();
        for _ in 1..=2 {
            received.push(next_event(&mut events).await.unwrap().unwrap());
        }
        // The third event is cut on its way; the retry joins the stream.
        produced.send(Ok(event(3))).await.unwrap();
        received.push(next_event(&mut events).await.unwrap().unwrap());
        for n in 4..=5 {
            produced.send(Ok(event(n))).await.unwrap();
        }
        drop(produced);
        while let Some(event) = next_event(&mut events).await {
            received.push(event.unwrap());
        }
        let data: Vec<_> = received.iter().map(|e| e.data().to_owned()).collect();
        let expected: Vec<_> = (1..=5).map(|n| format!("{{\"token\":{n}}}")).collect();
        assert_eq!(data, expected, "ids: {with_ids}");
        if with_ids {
            assert_eq!(received[4].last_event_id(), Some("5"));
        }
        assert_eq!(events.attempts(), 2, "the cut and the resumption");
        assert_eq!(upstream.executions(), 1, "the upstream ran once");
        assert_eq!(relay.requests(), 2);
    }
}

async fn next_event(
    events: &mut idemgate_client::Events,
) -> Option<Result<idemgate_client::Event, Error>> {
    tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("an event within 10 s")
}

/// A stream the upstream cuts after two events is never handed on as
/// complete. Kept failed (the default): the client's resumption gets the
/// stored failure, replayed, and the upstream ran once. Released (a route's
/// `server_errors = "release"`): the resumption runs the operation again, and
/// the client says so rather than splice a new run onto the first one's events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_upstream_cut_is_never_handed_on_as_complete() {
    use support::proxy::{Proxy, ProxyOptions, Upstream};
    for released in [false, true] {
        let dir = support::server::TempDir::new("idemgate-client-stream");
        let upstream = Upstream::start().await;
        let mut options = ProxyOptions::new(upstream.url());
        if released {
            let routes = dir.path().join("routes.toml");
            std::fs::write(
                &routes,
                "[[route]]\nmethod = \"POST\"\npath = \"/v1/chat/completions\"\nserver_errors = \"release\"\n",
            )
            .unwrap();
            options = options.arg("--config", routes.display());
        }
        let proxy = Proxy::start(options).await;
        let produced = upstream.stream_next();
        for n in 1..=2 {
            let event = format!("id: {n}\ndata: {n}\n\n");
            produced.send(Ok(bytes::Bytes::from(event))).await.unwrap();
        }
        let client = Client::new(reqwest::Client::new()).with_policy(
            RetryPolicy::default().backoff(Duration::from_millis(10), Duration::from_millis(50)),
        );
        let mut events = client
            .post(proxy.url("/v1/chat/completions"))
            .bearer_auth(support::client::Client::new().token)
            .json(&serde_json::json!({"stream": true}))
            .operation(&Operation::new())
            .send_events()
            .await
            .unwrap();
        for n in 1..=2 {
            let event = next_event(&mut events).await.unwrap().unwrap();
            assert_eq!(event.data(), n.to_string());
        }
        produced
            .send(Err(std::io::Error::other("upstream reset")))
            .await
            .unwrap();
        let error = next_event(&mut events)
            .await
            .expect("an error, not a clean end")
            .expect_err("the cut is not an event");
        assert!(error.may_have_run(), "{error:?}");
        if released {
            assert!(matches!(error, Error::StreamRestarted), "{error:?}");
            assert_eq!(upstream.executions(), 2, "released: it ran again");
        } else {
            assert!(
                matches!(error, Error::Rejected { replayed: true, .. }),
                "the stored failure: {error:?}"
            );
            assert_eq!(upstream.executions(), 1, "kept failed: not run again");
        }
        assert!(next_event(&mut events).await.is_none(), "nothing after it");
    }
}
