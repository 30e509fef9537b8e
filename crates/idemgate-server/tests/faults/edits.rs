//! Issue 32, finding 5: a keyed `PATCH` with `If-Match` commits, the instance is
//! killed before its record completes, the client retries with the same key and
//! its now stale `If-Match`. The retry takes the operation over once the dead
//! holder's lease lapses, and must answer the edit's original 200 — the order as
//! that edit left it, its `ETag` — not a 412 from evaluating the precondition
//! again (PROTOCOL §17: the journal comes first).
//!
//! The kill lands between the commit and the completion every time, not by
//! chance: the killed instance runs with the test-only
//! `IDEMGATE_TEST_FAULT_AFTER_EDIT=stall` (`src/orders/fault.rs`), which holds
//! each edit's answer forever once it has written; the test sees the edit in the
//! orders (a read through a second, fault-free instance on the same stores),
//! then sends `kill -9`. The retry goes to that second instance. On the Redis
//! store, orders in PostgreSQL and in SQLite; and on the `database` store,
//! where the record and the edit commit together (the kill rolls the edit back
//! and the retry runs it: the same 200).

use std::time::Duration;

use reqwest::{Method, StatusCode};

use super::budget::{count, report};
use crate::support::client::{Answer, Client, ORDER, new_key};
use crate::support::server::{Options, Server, TempDir, postgres_url, redis_url, sqlite_url};

const MERGE_PATCH: (&str, &str) = ("content-type", "application/merge-patch+json");
const FAULT: &str = "IDEMGATE_TEST_FAULT_AFTER_EDIT";
/// How long a retry may take to get past the dead holder's lease (1 s).
const PATIENCE: Duration = Duration::from_secs(30);

fn etag(answer: &Answer) -> String {
    answer
        .headers
        .get("etag")
        .unwrap_or_else(|| panic!("no ETag: {answer:?}"))
        .to_str()
        .unwrap()
        .to_owned()
}

/// Where the records and the orders live.
#[derive(Debug, Clone, Copy)]
enum Stores {
    /// Redis for the records, orders in the shared PostgreSQL.
    RedisPostgres,
    /// Redis for the records, orders in a SQLite file.
    RedisSqlite,
    /// Records and orders in one SQLite file, one transaction.
    DatabaseSqlite,
    /// Records and orders in the shared PostgreSQL, one transaction.
    DatabasePostgres,
}

impl Stores {
    fn options(self) -> (Options, Option<TempDir>) {
        let (database, store, dir) = match self {
            Self::RedisPostgres => (postgres_url(), redis_url(), None),
            Self::RedisSqlite => {
                let (url, dir) = sqlite_url();
                (url, redis_url(), Some(dir))
            }
            Self::DatabaseSqlite => {
                let (url, dir) = sqlite_url();
                (url, "database".to_owned(), Some(dir))
            }
            Self::DatabasePostgres => (postgres_url(), "database".to_owned(), None),
        };
        let mut options = Options::new(&database).store(&store);
        options.lease_seconds = 1;
        (options, dir)
    }

    /// Whether the edit commits before the record completes (a store of its
    /// own), rather than with it (the layer's transaction).
    fn commits_first(self) -> bool {
        matches!(self, Self::RedisPostgres | Self::RedisSqlite)
    }
}

/// Retries the edit until a final answer: 409 (the dead holder's lease still
/// runs) and 503 are retried, as a client following the protocol does.
async fn retry_until_final(client: &Client, url: &str, key: &str, tag: &str, body: &str) -> Answer {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let answer = client
            .send(
                Method::PATCH,
                url,
                Some(key),
                &[MERGE_PATCH, ("if-match", tag)],
                Some(body),
            )
            .await;
        if !matches!(
            answer.status,
            StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE
        ) {
            return answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no final answer within {PATIENCE:?}: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn kill_between_commit_and_completion(test: &str, stores: Stores, trials: usize) {
    let (options, _dir) = stores.options();
    let witness = Server::start(options.clone()).await;
    let stalling = options.clone().env(FAULT, "stall");
    let client = Client::new();
    let mut wrong = Vec::new();
    for trial in 0..trials {
        let victim = Server::start(stalling.clone()).await;
        let created = client
            .post(&witness.url("/api/v1/orders"), Some(&new_key()), ORDER)
            .await;
        assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
        let path = format!("/api/v1/orders/{}", created.json()["order_id"]);
        let tag = etag(&created);
        let key = new_key();
        let body = format!(r#"{{"note":"edit {trial}"}}"#);
        let edit = {
            let (client, url, key, tag, body) = (
                client.clone(),
                victim.url(&path),
                key.clone(),
                tag.clone(),
                body.clone(),
            );
            tokio::spawn(async move {
                client
                    .try_send(
                        Method::PATCH,
                        &url,
                        Some(&key),
                        &[MERGE_PATCH, ("if-match", &tag)],
                        Some(&body),
                    )
                    .await
            })
        };
        if stores.commits_first() {
            // The edit has committed (its order reads version 2) and its
            // handler stalls: the record is still running.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                let read = client.get(&witness.url(&path)).await;
                if read.json()["version"] == 2 {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the edit never committed: {read:?}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        } else {
            // The edit's write waits in the layer's transaction, uncommitted
            // and invisible: give it the time to get there.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        victim.kill9().await;
        let lost = edit.await.expect("edit task");
        assert!(lost.is_err(), "the stalled edit answered: {lost:?}");
        let retry = retry_until_final(&client, &witness.url(&path), &key, &tag, &body).await;
        let read = client.get(&witness.url(&path)).await;
        let right = retry.status == StatusCode::OK
            && retry.json()["note"] == format!("edit {trial}")
            && retry.json()["version"] == 2
            && read.json()["version"] == 2
            && retry.body == read.body
            && etag(&retry) == etag(&read);
        if !right {
            eprintln!("[faults] {test}: trial {trial}: retry {retry:?}, order now {read:?}");
            wrong.push(retry.status);
        }
    }
    report(
        test,
        format_args!(
            "{trials} kill -9 between an edit's write and its completion: {} wrong answers {wrong:?}",
            wrong.len()
        ),
    );
    assert!(
        wrong.is_empty(),
        "{} of {trials} retries did not get the edit's original 200: {wrong:?}",
        wrong.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_edit_killed_after_its_commit_answers_its_200_on_redis_with_postgres_orders() {
    kill_between_commit_and_completion(
        "edit_kill_redis_postgres",
        Stores::RedisPostgres,
        count(10, 100),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_edit_killed_after_its_commit_answers_its_200_on_redis_with_sqlite_orders() {
    kill_between_commit_and_completion("edit_kill_redis_sqlite", Stores::RedisSqlite, count(3, 30))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_edit_killed_before_its_commit_runs_once_on_the_sqlite_database_store() {
    kill_between_commit_and_completion(
        "edit_kill_database_sqlite",
        Stores::DatabaseSqlite,
        count(3, 30),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_edit_killed_before_its_commit_runs_once_on_the_postgres_database_store() {
    kill_between_commit_and_completion(
        "edit_kill_database_postgres",
        Stores::DatabasePostgres,
        count(3, 30),
    )
    .await;
}
