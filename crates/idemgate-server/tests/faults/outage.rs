//! A store process of the test's own killed (`kill -9`, then restarted on its data)
//! or frozen (SIGSTOP, then SIGCONT) while bounded concurrent load runs: clients see
//! only successes or 503 problem+json with `Retry-After` — no other 5xx, no dropped
//! connection — and afterwards retries of every key reach a final answer with
//! exactly one order and one distinct charge per key.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;

use crate::budget::{Rng, count, report, span};
use crate::client::Answer;
use crate::effects::{OrdersTable, Probe, assert_exactly_once, assert_retryable_problem};
use crate::gateway::MockGateway;
use crate::own_stores::{OwnPostgres, OwnRedis, OwnStore};
use crate::server::{Options, Server, sqlite_url};

/// Each request's bound. Generous: a frozen PostgreSQL holds a request until a pool
/// acquire times out (about 5 s today) or the store is thawed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long every key may take to reach its final answer once the store is back:
/// a holder that lost its store keeps the key until its lease (2 s) lapses.
const PATIENCE: Duration = Duration::from_secs(90);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Kill,
    Freeze,
}

/// What one load client saw for one key's first request.
#[derive(Default)]
struct Seen {
    created: usize,
    unavailable: usize,
    violations: Vec<String>,
}

impl Seen {
    fn record(&mut self, probe: &Probe, answer: reqwest::Result<Answer>) {
        match answer {
            Ok(answer) if answer.status == StatusCode::CREATED => self.created += 1,
            Ok(answer) if answer.status == StatusCode::SERVICE_UNAVAILABLE => {
                assert_retryable_problem(&answer);
                self.unavailable += 1;
            }
            Ok(answer) => self
                .violations
                .push(format!("key {}: {answer:?}", probe.key)),
            Err(error) => self
                .violations
                .push(format!("key {}: no answer: {error}", probe.key)),
        }
    }
}

/// `clients` tasks post fresh keys back to back until `stop`; a 503 makes a client
/// pause as its `Retry-After` asks (a tenth of it), so the load stays bounded.
fn start_load(
    clients: usize,
    base: String,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<(Vec<Probe>, Seen)>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..clients)
        .map(|_| {
            let (base, stop, log) = (base.clone(), Arc::clone(&stop), Arc::clone(&log));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let probe = Probe::new(REQUEST_TIMEOUT);
                    let answer = probe.post(&base).await;
                    let unavailable = answer
                        .as_ref()
                        .is_ok_and(|a| a.status == StatusCode::SERVICE_UNAVAILABLE);
                    {
                        let mut log = log.lock().unwrap();
                        log.1.record(&probe, answer);
                        log.0.push(probe);
                    }
                    if unavailable {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            })
        })
        .collect()
}

async fn store_outage_under_load<S: OwnStore>(
    test: &str,
    mut store: S,
    fault: Fault,
    options: impl Fn(&S, &MockGateway) -> Options,
    orders: OrdersTable,
) {
    let mut rng = Rng::for_test(test);
    let cycles = count(1, 3);
    let clients = count(6, 16);
    let gateway = MockGateway::start().await;
    // A short hold at the gateway keeps requests between their claim and their
    // completion when the store goes.
    gateway.set_delay(Duration::from_millis(30));
    let mut server_options = options(&store, &gateway);
    server_options.lease_seconds = 2;
    let server = Server::start(server_options).await;
    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new((Vec::new(), Seen::default())));
    let load = start_load(clients, server.url(""), Arc::clone(&stop), Arc::clone(&log));
    let mut outages = Vec::new();
    for _ in 0..cycles {
        tokio::time::sleep(rng.millis(1_000, 2_000)).await;
        let outage = span(rng.millis(1_500, 2_500), rng.millis(2_000, 6_000));
        match fault {
            Fault::Kill => {
                store.kill9();
                tokio::time::sleep(outage).await;
                store.restart().await;
            }
            Fault::Freeze => {
                store.freeze();
                tokio::time::sleep(outage).await;
                store.thaw();
            }
        }
        outages.push(outage);
    }
    tokio::time::sleep(rng.millis(1_000, 2_000)).await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.expect("load task");
    }
    let (probes, seen) = std::mem::take(&mut *log.lock().unwrap());
    assert!(
        seen.violations.is_empty(),
        "{} of {} requests got neither a success nor a 503 problem:\n{}",
        seen.violations.len(),
        probes.len(),
        seen.violations.join("\n")
    );
    // A dead store refuses connections at once; a frozen one may only delay
    // requests (until a store timeout, if one is shorter than the freeze).
    if fault == Fault::Kill {
        assert!(seen.unavailable > 0, "the outage was not noticed: no 503");
    }
    let mut retried = 0;
    for probe in &probes {
        // Every key is retried: a 201 must replay, a 503 must now complete.
        let last = probe.settle(&server.url(""), PATIENCE).await;
        retried += usize::from(!last.replayed());
    }
    let totals = assert_exactly_once(&probes, &orders, &gateway).await;
    report(
        test,
        format_args!(
            "{cycles} × {fault:?} ({outages:?}) under {clients} clients: {} keys, {} answered 201 and {} 503 during the run, {retried} completed only on retry; {} orders, {} distinct charges, {} gateway calls",
            totals.keys,
            seen.created,
            seen.unavailable,
            totals.orders,
            totals.charges,
            totals.gateway_calls
        ),
    );
}

/// Records and orders in one PostgreSQL of the test's own.
async fn postgres(test: &str, fault: Fault) {
    let store = OwnPostgres::start().await;
    let orders = OrdersTable::of(&store.url());
    store_outage_under_load(
        test,
        store,
        fault,
        |store, gateway| Options::new(&store.url()).gateway(gateway.url()),
        orders,
    )
    .await;
}

/// Records in a Redis of the test's own, orders in SQLite.
async fn redis(test: &str, fault: Fault) {
    let store = OwnRedis::start().await;
    let (database, _dir) = sqlite_url();
    store_outage_under_load(
        test,
        store,
        fault,
        |store, gateway| {
            Options::new(&database)
                .store(&store.url())
                .gateway(gateway.url())
        },
        OrdersTable::of(&database),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn own_postgres_killed_under_load() {
    postgres("postgres_killed", Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn own_postgres_frozen_under_load() {
    postgres("postgres_frozen", Fault::Freeze).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn own_redis_killed_under_load() {
    redis("redis_killed", Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn own_redis_frozen_under_load() {
    redis("redis_frozen", Fault::Freeze).await;
}
