//! Ledger transfers — the one-transaction mode (PROTOCOL §23): claim, debit,
//! credit and record in one PostgreSQL transaction — while a PostgreSQL of the
//! test's own is killed (`kill -9`, then restarted on its data) or frozen
//! (SIGSTOP, then SIGCONT) under concurrent load. Clients see only 201s or 503
//! problems with `Retry-After`; afterwards every reference settles to exactly
//! one transfer row, each account's balance is exactly what its settled
//! transfers made it, and no money appeared or vanished.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use sqlx::Connection;

use super::budget::{Rng, count, report};
use super::effects::{assert_retryable_problem, settle};
use super::own_stores::{Fault, OwnPostgres, OwnStore, outages};
use crate::support::client::{Answer, Client, new_key};
use crate::support::server::{Options, Server};

const ACCOUNTS: usize = 8;
const OPENING_BALANCE: i64 = 1_000_000;
/// How long every reference may take to settle once the store is back.
const PATIENCE: Duration = Duration::from_secs(90);
const JSON: (&str, &str) = ("content-type", "application/json");

/// One transfer of 1 between two accounts, under its own reference.
#[derive(Debug, Clone)]
struct Transfer {
    from: i64,
    to: i64,
    reference: String,
}

impl Transfer {
    fn body(&self) -> String {
        format!(
            r#"{{"to":{},"amount":1,"reference_id":"{}"}}"#,
            self.to, self.reference
        )
    }

    async fn send(&self, client: &Client, base: &str) -> reqwest::Result<Answer> {
        let url = format!("{base}/api/v1/accounts/{}/transfers", self.from);
        client
            .try_send(Method::POST, &url, None, &[JSON], Some(&self.body()))
            .await
    }

    /// Sent again until it is a 201 (a 409 or 503 is retried as it asks).
    async fn settle(&self, client: &Client, base: &str) -> Answer {
        settle(&self.reference, PATIENCE, || self.send(client, base)).await
    }
}

#[derive(Default)]
struct Seen {
    sent: Vec<Transfer>,
    created: usize,
    unavailable: usize,
    violations: Vec<String>,
}

async fn open_accounts(client: &Client, base: &str) -> Vec<i64> {
    let mut ids = Vec::with_capacity(ACCOUNTS);
    for _ in 0..ACCOUNTS {
        let body = format!(r#"{{"balance":{OPENING_BALANCE},"currency":"RUB"}}"#);
        let opened = client
            .post(&format!("{base}/api/v1/accounts"), Some(&new_key()), &body)
            .await;
        assert_eq!(opened.status, StatusCode::CREATED, "{opened:?}");
        ids.push(opened.json()["account_id"].as_i64().unwrap());
    }
    ids
}

async fn transfers_under_store_outage(test: &str, fault: Fault) {
    let mut rng = Rng::for_test(test);
    let mut store = OwnPostgres::start().await;
    let cycles = count(1, 4);
    let clients = count(6, 16);
    let mut options = Options::new(&store.url()).arg("--store-timeout-ms", 1_000);
    options.wait_ms = 2_000;
    let server = Server::start(options).await;
    let client = Client::with_timeout(Duration::from_secs(60));
    let base = server.url("");
    let accounts = Arc::new(open_accounts(&client, &base).await);

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let load: Vec<_> = (0..clients)
        .map(|c| {
            let test = test.to_owned();
            let (client, base, accounts, stop, seen) = (
                client.clone(),
                base.clone(),
                Arc::clone(&accounts),
                Arc::clone(&stop),
                Arc::clone(&seen),
            );
            tokio::spawn(async move {
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let from = accounts[(c + n) % ACCOUNTS];
                    let to = accounts[(c + 3 * n + 1) % ACCOUNTS];
                    if from == to {
                        continue;
                    }
                    let transfer = Transfer {
                        from,
                        to,
                        reference: format!("{test}-{c}-{n}-{}", uuid::Uuid::new_v4().simple()),
                    };
                    let answer = transfer.send(&client, &base).await;
                    let pause = {
                        let mut seen = seen.lock().unwrap();
                        let pause = match answer {
                            Ok(a) if a.status == StatusCode::CREATED => {
                                seen.created += 1;
                                false
                            }
                            Ok(a) if a.status == StatusCode::SERVICE_UNAVAILABLE => {
                                assert_retryable_problem(&a);
                                seen.unavailable += 1;
                                true
                            }
                            Ok(a) => {
                                seen.violations
                                    .push(format!("{}: {a:?}", transfer.reference));
                                false
                            }
                            Err(e) => {
                                seen.violations
                                    .push(format!("{}: no answer: {e}", transfer.reference));
                                false
                            }
                        };
                        seen.sent.push(transfer);
                        pause
                    };
                    if pause {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            })
        })
        .collect();
    let outages = outages(&mut store, fault, cycles, &mut rng).await;
    tokio::time::sleep(rng.millis(1_000, 2_000)).await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.expect("load task");
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        seen.violations.is_empty(),
        "{} of {} transfers got neither a 201 nor a 503 problem:\n{}",
        seen.violations.len(),
        seen.sent.len(),
        seen.violations.join("\n")
    );
    assert!(
        seen.unavailable > 0,
        "the {fault:?} was not answered with 503"
    );

    // Every reference settles; each moved 1 exactly once.
    let mut expected: BTreeMap<i64, i64> =
        accounts.iter().map(|id| (*id, OPENING_BALANCE)).collect();
    for transfer in &seen.sent {
        let settled = transfer.settle(&client, &base).await;
        assert_eq!(settled.json()["amount"], 1, "{settled:?}");
        *expected.get_mut(&transfer.from).unwrap() -= 1;
        *expected.get_mut(&transfer.to).unwrap() += 1;
    }
    let mut db = sqlx::PgConnection::connect(&store.url()).await.unwrap();
    for transfer in &seen.sent {
        let rows: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM transfers WHERE from_account = $1 AND reference_id = $2",
        )
        .bind(transfer.from)
        .bind(&transfer.reference)
        .fetch_one(&mut db)
        .await
        .unwrap();
        assert_eq!(rows, 1, "{}: {rows} transfer rows", transfer.reference);
    }
    for (account, balance) in &expected {
        let stored: i64 = sqlx::query_scalar("SELECT balance FROM accounts WHERE id = $1")
            .bind(account)
            .fetch_one(&mut db)
            .await
            .unwrap();
        assert_eq!(stored, *balance, "account {account}");
    }
    let total: i64 = expected.values().sum();
    assert_eq!(
        total,
        OPENING_BALANCE * ACCOUNTS as i64,
        "money appeared or vanished"
    );
    report(
        test,
        format_args!(
            "{cycles} × {fault:?} ({outages:?}) under {clients} clients: {} transfers, {} answered 201 and {} 503 during the run; every reference one transfer row, every balance as its settled transfers made it",
            seen.sent.len(),
            seen.created,
            seen.unavailable,
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn own_postgres_killed_under_transfer_load() {
    transfers_under_store_outage("transfers_postgres_killed", Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn own_postgres_frozen_under_transfer_load() {
    transfers_under_store_outage("transfers_postgres_frozen", Fault::Freeze).await;
}
