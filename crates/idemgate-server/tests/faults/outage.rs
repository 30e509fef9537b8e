//! A store process of the test's own killed (`kill -9`, then restarted on its data)
//! or frozen (SIGSTOP, then SIGCONT) while bounded concurrent load runs: clients see
//! only successes or 503 problem+json with `Retry-After` — no other 5xx, no dropped
//! connection — and afterwards retries of every key reach a final answer with
//! exactly one order and one distinct charge per key.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;

use super::budget::{Rng, count, report};
use super::effects::{OrdersTable, Probe, assert_exactly_once, assert_retryable_problem};
use super::own_stores::{Fault, OwnPostgres, OwnRedis, OwnStore, outages};
use crate::support::client::Answer;
use crate::support::gateway::MockGateway;
use crate::support::server::{Options, Server, sqlite_url};

/// Each request's bound. Generous: a frozen PostgreSQL holds a request until a pool
/// acquire times out (about 5 s today) or the store is thawed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long every key may take to reach its final answer once the store is back:
/// a holder that lost its store keeps the key until its lease (2 s) lapses.
const PATIENCE: Duration = Duration::from_secs(90);

/// What the load clients saw: each key's first answer.
#[derive(Default)]
struct Seen {
    /// Every key sent, with the body of its 201 when it got one.
    keys: Vec<(Probe, Option<bytes::Bytes>)>,
    created: usize,
    unavailable: usize,
    violations: Vec<String>,
    /// The longest a request took: how long the outage held clients (reported,
    /// not asserted).
    slowest: Duration,
}

impl Seen {
    fn record(&mut self, probe: Probe, answer: reqwest::Result<Answer>, took: Duration) {
        self.slowest = self.slowest.max(took);
        let mut created = None;
        match answer {
            Ok(answer) if answer.status == StatusCode::CREATED => {
                self.created += 1;
                created = Some(answer.body);
            }
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
        self.keys.push((probe, created));
    }
}

/// `clients` tasks post fresh keys back to back until `stop`; a 503 makes a client
/// pause as its `Retry-After` asks (a tenth of it), so the load stays bounded.
fn start_load(
    clients: usize,
    base: String,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..clients)
        .map(|_| {
            let (base, stop, seen) = (base.clone(), Arc::clone(&stop), Arc::clone(&seen));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let probe = Probe::new(REQUEST_TIMEOUT);
                    let started = std::time::Instant::now();
                    let answer = probe.post(&base).await;
                    let took = started.elapsed();
                    let unavailable = answer
                        .as_ref()
                        .is_ok_and(|a| a.status == StatusCode::SERVICE_UNAVAILABLE);
                    seen.lock().unwrap().record(probe, answer, took);
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
    let cycles = count(1, 4);
    let clients = count(6, 16);
    let gateway = MockGateway::start().await;
    // A short hold at the gateway keeps requests between their claim and their
    // completion when the store goes.
    gateway.set_delay(Duration::from_millis(30));
    let mut server_options = options(&store, &gateway).arg("--store-timeout-ms", 1_000);
    server_options.lease_seconds = 2;
    let server = Server::start(server_options).await;
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let load_started = std::time::Instant::now();
    let load = start_load(
        clients,
        server.url(""),
        Arc::clone(&stop),
        Arc::clone(&seen),
    );
    let outages = outages(&mut store, fault, cycles, &mut rng).await;
    tokio::time::sleep(rng.millis(1_000, 2_000)).await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.expect("load task");
    }
    let load_ran = load_started.elapsed();
    let mut seen = std::mem::take(&mut *seen.lock().unwrap());
    let (probes, first_bodies): (Vec<Probe>, Vec<_>) =
        std::mem::take(&mut seen.keys).into_iter().unzip();
    assert!(
        seen.violations.is_empty(),
        "{} of {} requests got neither a success nor a 503 problem:\n{}",
        seen.violations.len(),
        probes.len(),
        seen.violations.join("\n")
    );
    // The fault must have been felt (a freeze that missed the store's worker
    // processes once went unnoticed), and answered: a dead or frozen store is 503
    // within the store timeout, not a request held until the store comes back.
    assert!(
        seen.unavailable > 0,
        "the {fault:?} was not answered with 503 (slowest request {:?})",
        seen.slowest
    );
    let mut retried = 0;
    for (probe, first) in probes.iter().zip(first_bodies) {
        // Every key is retried: a 503 must now complete, a 201 must come again.
        let last = probe.settle(&server.url(""), PATIENCE).await;
        retried += usize::from(!last.replayed());
        if let Some(first) = first {
            assert_eq!(
                last.body, first,
                "key {}: a 201 must stay the outcome",
                probe.key
            );
        }
    }
    let totals = assert_exactly_once(&probes, &orders, &gateway).await;
    report(
        test,
        format_args!(
            "{cycles} × {fault:?} ({outages:?}) under {clients} clients for {load_ran:.1?} ({:.0} keys/s): {} keys, {} answered 201 and {} 503 during the run (slowest {:?}), {retried} executed on retry (not a replay); {} orders, {} distinct charges, {} gateway calls",
            totals.keys as f64 / load_ran.as_secs_f64(),
            totals.keys,
            seen.created,
            seen.unavailable,
            seen.slowest,
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
