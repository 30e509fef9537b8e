//! `kill -9` of the server at random moments while the gateway holds charges, then a
//! restart on the same store and retries of every key until a final answer: one
//! order and one distinct charge per key, and every 201 a client saw before the kill
//! is the answer it gets again (never a 201 for an order that is not there).

use std::time::Duration;

use reqwest::StatusCode;

use super::budget::{Rng, count, report};
use super::effects::{Probe, assert_exactly_once};
use super::setups::{Setup, Shared};
use crate::support::gateway::MockGateway;
use crate::support::server::Server;

/// How long a retry may take to reach its final answer after the restart: the dead
/// holder's lease (1 s) must lapse first.
const PATIENCE: Duration = Duration::from_secs(30);

async fn kill_9_trials(test: &str, shared: Shared) {
    let mut rng = Rng::for_test(test);
    let trials = count(3, 30);
    let keys_per_trial = count(3, 4);
    let gateway = MockGateway::start().await;
    let setup = Setup::new(shared);
    let mut options = setup.options(gateway.url());
    options.lease_seconds = 1;
    let mut server = Server::start(options.clone()).await;
    let (mut probes, mut seen_created, mut lost, mut charged_unanswered) = (Vec::new(), 0, 0, 0);
    for _ in 0..trials {
        // The gateway charges at once and holds its answer for `hold`; requests
        // start staggered, so the kill finds some before, some at and some past
        // the gateway.
        let hold = rng.millis(150, 900);
        gateway.set_delay(hold);
        let trial: Vec<Probe> = (0..keys_per_trial)
            .map(|_| Probe::new(Duration::from_secs(30)))
            .collect();
        let arrival = gateway.next_arrival();
        let requests: Vec<_> = trial
            .iter()
            .map(|probe| {
                let (probe, url, stagger) = (
                    probe.clone(),
                    server.url(""),
                    rng.millis(0, hold.as_millis() as u64 / 2),
                );
                tokio::spawn(async move {
                    tokio::time::sleep(stagger).await;
                    probe.post(&url).await
                })
            })
            .collect();
        tokio::time::timeout(Duration::from_secs(20), arrival)
            .await
            .expect("a charge reached the gateway");
        tokio::time::sleep(rng.millis(0, hold.as_millis() as u64 + 300)).await;
        let charged = trial
            .iter()
            .filter(|p| gateway.calls().iter().any(|c| c.body["amount"] == p.amount))
            .count();
        server.kill9().await;
        let mut before_kill = Vec::new();
        for request in requests {
            match request.await.expect("request task") {
                Ok(answer) => {
                    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
                    seen_created += 1;
                    before_kill.push(Some(answer));
                }
                Err(_) => {
                    lost += 1;
                    before_kill.push(None);
                }
            }
        }
        // Charged at the kill, but no 201 reached the client: the gateway held the
        // answer, or the server died writing the order or sending the response.
        charged_unanswered += charged.saturating_sub(before_kill.iter().flatten().count());
        server = Server::start(options.clone()).await;
        for (probe, seen) in trial.iter().zip(before_kill) {
            let last = probe.settle(&server.url(""), PATIENCE).await;
            if let Some(seen) = seen {
                assert_eq!(
                    last.body, seen.body,
                    "key {}: the 201 seen before the kill must be the outcome",
                    probe.key
                );
            }
        }
        probes.extend(trial);
    }
    let totals = assert_exactly_once(&probes, &setup.orders(), &gateway).await;
    report(
        test,
        format_args!(
            "{trials} kill -9, {} keys ({seen_created} answered 201 before the kill, {lost} lost their response, {charged_unanswered} of those already charged): {} orders, {} distinct charges, {} gateway calls",
            totals.keys, totals.orders, totals.charges, totals.gateway_calls
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_while_the_gateway_holds_charges_sqlite() {
    kill_9_trials("kill_9_sqlite", Shared::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_while_the_gateway_holds_charges_postgres() {
    kill_9_trials("kill_9_postgres", Shared::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_while_the_gateway_holds_charges_redis() {
    kill_9_trials("kill_9_redis", Shared::Redis).await;
}
