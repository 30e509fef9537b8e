//! `kill -9` of the server while SQLite's writer has a batch in flight. Many clients
//! post fresh keys back to back, so claims and completions are always queued and
//! committing; the kill lands at a random moment. After it, before anything is
//! retried, the file must hold a claim for every charge the gateway received, under
//! the operation id the charge carried: a handler only runs on an acknowledged claim,
//! and an acknowledged claim is committed, so no acknowledged claim was lost and no
//! unacknowledged one executed. Then a restart, and every key settles exactly once
//! (one order, one distinct charge).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::StatusCode;
use sqlx::Row;

use super::budget::{Rng, count, report};
use super::effects::{OrdersTable, Probe, assert_exactly_once};
use super::setups::{Setup, Shared};
use crate::support::client::{Answer, Client};
use crate::support::gateway::MockGateway;
use crate::support::server::Server;

/// Clients posting at once: enough that the writer always has a queue.
const CLIENTS: usize = 32;

/// After the restart the dead process's leases (1 s) must lapse before a retry can
/// take its claim over.
const PATIENCE: Duration = Duration::from_secs(30);

/// What one trial's clients sent, and the 201s they saw before the kill.
#[derive(Default)]
struct Sent {
    probes: Vec<Probe>,
    created: HashMap<String, Answer>,
    lost: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_batch_loses_no_acknowledged_claim_sqlite() {
    let test = "kill_9_mid_batch_sqlite";
    let mut rng = Rng::for_test(test);
    let gateway = MockGateway::start().await;
    let setup = Setup::new(Shared::Sqlite);
    let OrdersTable::Sqlite(file) = setup.orders() else {
        unreachable!("the SQLite setup keeps records and orders in one file")
    };
    let mut options = setup.options(gateway.url());
    options.lease_seconds = 1;
    let mut server = Server::start(options.clone()).await;
    let (mut all, mut charged_at_kill, mut acknowledged, mut lost) = (Vec::new(), 0, 0, 0);
    let mut claimed_unanswered = 0;
    for _ in 0..count(2, 10) {
        gateway.set_delay(rng.millis(0, 5));
        let sent = Arc::new(Mutex::new(Sent::default()));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| tokio::spawn(post_until_dead(server.url(""), Arc::clone(&sent))))
            .collect();
        // Let the load build up (a loaded machine may take a while to answer the
        // first requests), then kill at a random moment of it.
        let built_up = tokio::time::Instant::now() + Duration::from_secs(30);
        while sent.lock().expect("no client panicked").created.len() < 8 {
            assert!(
                tokio::time::Instant::now() < built_up,
                "the server answered fewer than 8 orders in 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(rng.millis(50, 500)).await;
        server.kill9().await;
        for client in clients {
            client.await.expect("client task");
        }
        let sent = Arc::try_unwrap(sent)
            .unwrap_or_else(|_| unreachable!("every client task has ended"))
            .into_inner()
            .expect("no client panicked holding the lock");

        // Every charge so far must be backed by a committed claim with its operation.
        let claims = committed_claims(&file).await;
        claimed_unanswered += sent
            .probes
            .iter()
            .filter(|p| claims.contains_key(&p.key) && !sent.created.contains_key(&p.key))
            .count();
        let by_amount: HashMap<i64, &Probe> = sent.probes.iter().map(|p| (p.amount, p)).collect();
        let mut failures = Vec::new();
        let calls = gateway.calls();
        for call in &calls {
            let amount = call.body["amount"].as_i64().expect("an amount");
            let Some(probe) = by_amount.get(&amount) else {
                continue; // an earlier trial's key, checked then
            };
            let operation = call.idempotency_key.as_deref().expect("the downstream key");
            match claims.get(&probe.key) {
                Some(claimed) if claimed == operation => {}
                other => failures.push(format!(
                    "key {}: charged under operation {operation}, the file holds {other:?}",
                    probe.key
                )),
            }
        }
        assert!(
            failures.is_empty(),
            "charges without a committed claim after kill -9:\n{}",
            failures.join("\n")
        );
        charged_at_kill += calls
            .iter()
            .filter(|c| by_amount.contains_key(&c.body["amount"].as_i64().unwrap_or(-1)))
            .count();
        acknowledged += sent.created.len();
        lost += sent.lost;

        server = Server::start(options.clone()).await;
        let base = server.url("");
        let settled: Vec<(String, Answer)> = futures_util::stream::iter(sent.probes.iter())
            .map(|probe| {
                let base = base.clone();
                async move { (probe.key.clone(), probe.settle(&base, PATIENCE).await) }
            })
            .buffer_unordered(CLIENTS)
            .collect()
            .await;
        for (key, last) in settled {
            if let Some(seen) = sent.created.get(&key) {
                assert_eq!(
                    last.body, seen.body,
                    "key {key}: the 201 seen before the kill must be the outcome"
                );
            }
        }
        all.extend(sent.probes);
    }
    // Every client ends on a lost request, so `lost` proves nothing; a key claimed
    // in the file but never answered shows a kill landed mid-way.
    assert!(
        claimed_unanswered > 0,
        "no kill landed on a claimed, unanswered request: the test proved nothing"
    );
    let totals = assert_exactly_once(&all, &setup.orders(), &gateway).await;
    report(
        test,
        format_args!(
            "{} keys, {acknowledged} answered 201 before a kill, {lost} in flight at a kill ({claimed_unanswered} of them claimed), {charged_at_kill} charges at the kills, all backed by committed claims; {} orders, {} distinct charges",
            totals.keys, totals.orders, totals.charges
        ),
    );
    server.stop().await;
}

/// One client: fresh keys back to back until the server stops answering. A key is
/// recorded before it is sent, so a request the kill cut off is checked too.
async fn post_until_dead(base: String, sent: Arc<Mutex<Sent>>) {
    let client = Client::with_timeout(Duration::from_secs(30));
    loop {
        let probe = Probe::on(&client);
        sent.lock().expect("lock").probes.push(probe.clone());
        match probe.post(&base).await {
            Ok(answer) => {
                assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
                sent.lock().expect("lock").created.insert(probe.key, answer);
            }
            Err(_) => {
                sent.lock().expect("lock").lost += 1;
                return;
            }
        }
    }
}

/// The claims the SQLite file holds (any status): key → operation id.
async fn committed_claims(file: &str) -> HashMap<String, String> {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(file)
        .read_only(true);
    let pool = sqlx::SqlitePool::connect_with(options)
        .await
        .expect("open the SQLite file");
    let rows = sqlx::query("SELECT idempotency_key, operation_id FROM idemgate_records")
        .fetch_all(&pool)
        .await
        .expect("read the records");
    pool.close().await;
    rows.iter()
        .map(|row| {
            let operation: Vec<u8> = row.get(1);
            let operation = uuid::Uuid::from_slice(&operation).expect("a 16-byte operation id");
            (row.get::<String, _>(0), operation.to_string())
        })
        .collect()
}
