//! Accounts and compare-and-set transfers (PROTOCOL §18) on the real binary:
//! 64 concurrent transfers expecting one balance → exactly one applied; 64
//! concurrent debits never take a balance below zero; a transfer whose response
//! was lost is replayed with one debit; a used reference with another amount is
//! 422 naming the field — on SQLite (serve's default) and PostgreSQL.

use std::sync::Arc;

use idemgate_testkit::relay::{Fault, Relay};
use reqwest::{Method, StatusCode};
use tokio::sync::Barrier;

use crate::support::client::{Answer, Client, new_key};
use crate::support::server::{Options, Server, postgres_url, redis_url, sqlite_url};

const JSON: (&str, &str) = ("content-type", "application/json");

async fn open(server: &Server, client: &Client, balance: i64) -> i64 {
    let body = format!(r#"{{"balance":{balance},"currency":"RUB"}}"#);
    let opened = client
        .post(&server.url("/api/v1/accounts"), Some(&new_key()), &body)
        .await;
    assert_eq!(opened.status, StatusCode::CREATED, "{opened:?}");
    let account = opened.json();
    assert_eq!(account["balance"], balance);
    assert_eq!(account["currency"], "RUB");
    assert_eq!(account["version"], 1);
    account["account_id"].as_i64().unwrap()
}

async fn account(server: &Server, client: &Client, id: i64) -> serde_json::Value {
    let read = client
        .get(&server.url(&format!("/api/v1/accounts/{id}")))
        .await;
    assert_eq!(read.status, StatusCode::OK, "{read:?}");
    read.json()
}

/// A transfer, keyed by its `reference_id` alone (no `Idempotency-Key`).
async fn transfer(base: &str, client: &Client, from: i64, body: &str) -> Answer {
    let url = format!("{base}/api/v1/accounts/{from}/transfers");
    client
        .send(Method::POST, &url, None, &[JSON], Some(body))
        .await
}

async fn race(server: &Server, client: &Client, from: i64, bodies: Vec<String>) -> Vec<Answer> {
    let barrier = Arc::new(Barrier::new(bodies.len()));
    let base = server.url("");
    let tasks: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let (client, barrier, base) = (client.clone(), barrier.clone(), base.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                transfer(&base, &client, from, &body).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

async fn exactly_one_of_64_expecting_one_balance_applies(server: &Server) {
    let client = Client::new();
    let (from, to) = (
        open(server, &client, 500).await,
        open(server, &client, 0).await,
    );
    let bodies = (0..64)
        .map(|n| {
            format!(r#"{{"to":{to},"amount":100,"expected_balance":500,"reference_id":"tx_{n}"}}"#)
        })
        .collect();
    let answers = race(server, &client, from, bodies).await;
    let applied: Vec<_> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .collect();
    assert_eq!(
        applied.len(),
        1,
        "exactly one transfer applies: {answers:?}"
    );
    let created = applied[0].json();
    assert_eq!(created["from"], from);
    assert_eq!(created["to"], to);
    assert_eq!(created["amount"], 100);
    assert_eq!(created["balance"], 400);
    assert!(created["transfer_id"].is_i64());
    for refused in answers.iter().filter(|a| a.status != StatusCode::CREATED) {
        assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
        let problem = refused.json();
        assert!(
            problem["type"]
                .as_str()
                .unwrap()
                .ends_with("precondition-failed"),
            "{problem}"
        );
        assert_eq!(problem["balance"], 400);
        assert_eq!(problem["version"], 2);
    }
    assert_eq!(account(server, &client, from).await["balance"], 400);
    assert_eq!(account(server, &client, to).await["balance"], 100);

    // The 409 undid its claim: the client re-reads and retries the same
    // reference (and key) against the current balance, and it applies.
    let loser =
        format!(r#"{{"to":{to},"amount":100,"expected_balance":400,"reference_id":"tx_retry"}}"#);
    let stale = loser.replace("400", "500");
    let refused = transfer(&server.url(""), &client, from, &stale).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    let retried = transfer(&server.url(""), &client, from, &loser).await;
    assert_eq!(retried.status, StatusCode::CREATED, "{retried:?}");
    assert_eq!(retried.json()["balance"], 300);

    // A used reference with another amount: the same key, another fingerprint,
    // 422 before anything runs; nothing moved.
    let reused = loser.replace("\"amount\":100", "\"amount\":50");
    let reused = transfer(&server.url(""), &client, from, &reused).await;
    assert_eq!(
        reused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{reused:?}"
    );
    assert!(
        reused.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("key-reused"),
        "{reused:?}"
    );
    assert_eq!(account(server, &client, from).await["balance"], 300);
}

async fn balances_never_go_negative(server: &Server) {
    let client = Client::new();
    let (from, to) = (
        open(server, &client, 500).await,
        open(server, &client, 0).await,
    );
    let bodies = (0..64)
        .map(|n| format!(r#"{{"to":{to},"amount":100,"reference_id":"debit_{n}"}}"#))
        .collect();
    let answers = race(server, &client, from, bodies).await;
    let applied = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .count();
    assert_eq!(applied, 5, "500 covers five debits of 100: {answers:?}");
    for refused in answers.iter().filter(|a| a.status != StatusCode::CREATED) {
        assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
        assert!(
            refused.json()["type"]
                .as_str()
                .unwrap()
                .ends_with("insufficient-funds"),
            "{refused:?}"
        );
    }
    let source = account(server, &client, from).await;
    assert_eq!(source["balance"], 0);
    assert_eq!(source["version"], 6);
    assert_eq!(account(server, &client, to).await["balance"], 500);
}

async fn lost_transfer_is_replayed_with_one_debit(server: &Server) {
    let client = Client::new();
    let (from, to) = (
        open(server, &client, 500).await,
        open(server, &client, 0).await,
    );
    let relay = Relay::start(server.addr).await;
    relay.inject_request(Fault::LoseResponse, Some("POST"));
    let body =
        format!(r#"{{"to":{to},"amount":100,"expected_balance":500,"reference_id":"tx_789"}}"#);
    let url = relay.url(&format!("/api/v1/accounts/{from}/transfers"));
    let lost = client
        .try_send(Method::POST, &url, None, &[JSON], Some(&body))
        .await;
    assert!(lost.is_err(), "the response was lost: {lost:?}");
    // The retry's expected_balance is now false; the journal answers first.
    let retry = transfer(&relay.url(""), &client, from, &body).await;
    assert_eq!(
        retry.status,
        StatusCode::CREATED,
        "a replay, not a 409: {retry:?}"
    );
    assert!(retry.replayed());
    assert_eq!(retry.json()["balance"], 400);
    assert_eq!(
        account(server, &client, from).await["balance"],
        400,
        "one debit"
    );
    assert_eq!(account(server, &client, to).await["balance"], 100);
    // An Idempotency-Key beside the reference that differs from it: which one
    // names the operation is ambiguous, 400 before any claim, nothing moved.
    let url = server.url(&format!("/api/v1/accounts/{from}/transfers"));
    let ambiguous = client
        .send(Method::POST, &url, Some(&new_key()), &[JSON], Some(&body))
        .await;
    assert_eq!(ambiguous.status, StatusCode::BAD_REQUEST, "{ambiguous:?}");
    assert!(
        ambiguous.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("ambiguous-key"),
        "{ambiguous:?}"
    );
    assert_eq!(account(server, &client, from).await["balance"], 400);
}

/// 32 transfers each way between two accounts at once: every one applies (no
/// deadlock between opposite row locks), and the money is all still there.
async fn opposite_transfers_all_apply(server: &Server) {
    let client = Client::new();
    let (a, b) = (
        open(server, &client, 1000).await,
        open(server, &client, 1000).await,
    );
    let barrier = Arc::new(Barrier::new(64));
    let base = server.url("");
    let tasks: Vec<_> = (0..64)
        .map(|n| {
            let (client, barrier, base) = (client.clone(), barrier.clone(), base.clone());
            let (from, to) = if n % 2 == 0 { (a, b) } else { (b, a) };
            tokio::spawn(async move {
                let body = format!(r#"{{"to":{to},"amount":10,"reference_id":"swap_{n}"}}"#);
                barrier.wait().await;
                transfer(&base, &client, from, &body).await
            })
        })
        .collect();
    for task in tasks {
        let answer = task.await.unwrap();
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    }
    let (a, b) = (
        account(server, &client, a).await,
        account(server, &client, b).await,
    );
    assert_eq!(a["balance"], 1000);
    assert_eq!(b["balance"], 1000);
    assert_eq!(a["version"], 65, "32 debits and 32 credits each");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn opposite_transfers_all_apply_on_postgres() {
    opposite_transfers_all_apply(&Server::start(Options::new(&postgres_url())).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn opposite_transfers_all_apply_on_sqlite() {
    let (db, _dir) = sqlite_url();
    opposite_transfers_all_apply(&Server::start(Options::new(&db)).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_of_64_transfers_expecting_one_balance_applies_on_sqlite() {
    let (db, _dir) = sqlite_url();
    exactly_one_of_64_expecting_one_balance_applies(&Server::start(Options::new(&db)).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_of_64_transfers_expecting_one_balance_applies_on_postgres() {
    exactly_one_of_64_expecting_one_balance_applies(
        &Server::start(Options::new(&postgres_url())).await,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_of_64_transfers_applies_with_the_records_in_redis() {
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).store(&crate::support::server::redis_url())).await;
    exactly_one_of_64_expecting_one_balance_applies(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn balances_never_go_negative_on_sqlite() {
    let (db, _dir) = sqlite_url();
    balances_never_go_negative(&Server::start(Options::new(&db)).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn balances_never_go_negative_on_postgres() {
    balances_never_go_negative(&Server::start(Options::new(&postgres_url())).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_transfer_is_replayed_with_one_debit_on_sqlite() {
    let (db, _dir) = sqlite_url();
    lost_transfer_is_replayed_with_one_debit(&Server::start(Options::new(&db)).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_transfer_is_replayed_with_one_debit_on_postgres() {
    lost_transfer_is_replayed_with_one_debit(&Server::start(Options::new(&postgres_url())).await)
        .await;
}

/// 16 identical transfers with one `reference_id` at once: one debit, and every
/// answer is that transfer (201, one `transfer_id`) — some as the layer's
/// replay, some (the layer off, or its record gone) as the ledger's own
/// reference answers it; never a `503` from the reference's unique index, and
/// never a `409` because the winner's debit changed the expected balance.
async fn one_reference_raced_applies_once(server: &Server) {
    let client = Client::new();
    let (from, to) = (
        open(server, &client, 1000).await,
        open(server, &client, 0).await,
    );
    // With a precondition (the winner's debit falsifies it for the others),
    // then without one (the others would debit too, but for the reference).
    let bodies = [
        format!(r#"{{"to":{to},"amount":100,"expected_balance":1000,"reference_id":"raced"}}"#),
        format!(r#"{{"to":{to},"amount":100,"reference_id":"raced-again"}}"#),
    ];
    for (round, body) in bodies.into_iter().enumerate() {
        let answers = race(server, &client, from, vec![body; 16]).await;
        let mut transfers = std::collections::BTreeSet::new();
        for answer in &answers {
            assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
            transfers.insert(answer.json()["transfer_id"].as_i64().unwrap());
        }
        assert_eq!(transfers.len(), 1, "one transfer: {answers:?}");
        let debits = i64::try_from(round).unwrap() + 1;
        assert_eq!(
            account(server, &client, from).await["balance"],
            1000 - 100 * debits
        );
        assert_eq!(account(server, &client, to).await["balance"], 100 * debits);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_reference_raced_applies_once_on_postgres() {
    let options = Options::new(&postgres_url());
    let options = Options {
        wait_ms: 10_000,
        ..options
    };
    one_reference_raced_applies_once(&Server::start(options).await).await;
}

/// The same on SQLite, where transfers run in the one-transaction mode too:
/// the duplicates wait for the one writer, then replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_reference_raced_applies_once_on_sqlite() {
    let (db, _dir) = sqlite_url();
    let options = Options {
        wait_ms: 10_000,
        ..Options::new(&db)
    };
    one_reference_raced_applies_once(&Server::start(options).await).await;
}

/// `kill -9` of the server while a transfer is inside its transaction, on
/// PostgreSQL (the one-transaction mode, PROTOCOL §23): the claim was never
/// committed, so the dead run leaves no record behind — the retry on a
/// restarted server runs at once and is no replay (with two phases it would
/// find a `PROCESSING` record and wait out the 60 s lease) — and the money
/// moves once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transfer_killed_inside_its_transaction_leaves_no_claim_and_runs_once_on_retry() {
    use sqlx::Connection;

    let options = Options {
        wait_ms: 5_000,
        lease_seconds: 60,
        ..Options::new(&postgres_url())
    };
    let server = Server::start(options.clone()).await;
    let client = Client::new();
    let (from, to) = (
        open(&server, &client, 500).await,
        open(&server, &client, 0).await,
    );
    // The source account's row held from outside: the transfer stops inside
    // its transaction, after its claim, at the ledger's debit.
    let mut blocker = sqlx::PgConnection::connect(&postgres_url()).await.unwrap();
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE")
        .bind(from)
        .execute(&mut blocker)
        .await
        .unwrap();
    let blocker_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut blocker)
        .await
        .unwrap();
    let body = format!(
        r#"{{"to":{to},"amount":100,"reference_id":"killed-{}"}}"#,
        uuid::Uuid::new_v4().simple()
    );
    let first = tokio::spawn({
        let (client, body) = (client.clone(), body.clone());
        let url = server.url(&format!("/api/v1/accounts/{from}/transfers"));
        async move {
            client
                .try_send(Method::POST, &url, None, &[JSON], Some(&body))
                .await
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(blocker_pid)
        .fetch_one(&mut blocker)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the transfer never reached the held row"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    server.kill9().await;
    assert!(first.await.unwrap().is_err(), "the killed server answered");
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();

    let server = Server::start(options).await;
    let retry = transfer(&server.url(""), &client, from, &body).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(
        !retry.replayed(),
        "the killed run committed nothing to replay: {retry:?}"
    );
    assert_eq!(retry.json()["balance"], 400);
    let again = transfer(&server.url(""), &client, from, &body).await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, retry.body);
    assert_eq!(
        account(&server, &client, from).await["balance"],
        400,
        "one debit"
    );
    assert_eq!(account(&server, &client, to).await["balance"], 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_reference_raced_applies_once_on_postgres_without_the_layer() {
    let options = Options::new(&postgres_url()).switch("--no-idempotency");
    one_reference_raced_applies_once(&Server::start(options).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_reference_raced_applies_once_on_sqlite_without_the_layer() {
    let (db, _dir) = sqlite_url();
    let options = Options::new(&db).switch("--no-idempotency");
    one_reference_raced_applies_once(&Server::start(options).await).await;
}

/// After the record's TTL the journal no longer knows a reference, but the
/// ledger does: the same transfer answers the one it made, another amount is
/// 422 naming the field; neither debits again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_records_ttl_the_ledger_still_knows_the_reference() {
    let (db, _file) = sqlite_url();
    ledger_after_ttl(Options::new(&db)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_records_ttl_the_ledger_still_knows_the_reference_on_postgres() {
    ledger_after_ttl(Options::new(&postgres_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_records_ttl_the_ledger_still_knows_the_reference_with_redis_records() {
    let (db, _file) = sqlite_url();
    ledger_after_ttl(Options::new(&db).store(&redis_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_records_ttl_the_ledger_still_knows_the_reference_with_memory_records() {
    let (db, _file) = sqlite_url();
    ledger_after_ttl(Options::new(&db).store("memory")).await;
}

/// A transfer's record expires; the ledger still answers its reference.
async fn ledger_after_ttl(options: Options) {
    let mut options = options;
    options.ttl_seconds = 2;
    options.lease_seconds = 1;
    let server = Server::start(options).await;
    let client = Client::new();
    let (from, to) = (
        open(&server, &client, 500).await,
        open(&server, &client, 0).await,
    );
    let reference = format!("tx_old_{}", uuid::Uuid::new_v4().simple());
    let body = format!(r#"{{"to":{to},"amount":100,"reference_id":"{reference}"}}"#);
    let first = transfer(&server.url(""), &client, from, &body).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    // Another amount first: the ledger refuses it (its claim is undone), so the
    // journal holds nothing under the reference for the same transfer after it.
    let other = body.replace("\"amount\":100", "\"amount\":60");
    let other = transfer(&server.url(""), &client, from, &other).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{other:?}");
    assert_eq!(other.json()["fields"], serde_json::json!(["amount"]));
    assert_eq!(other.json()["differing"], serde_json::json!(["/amount"]));
    let same = transfer(&server.url(""), &client, from, &body).await;
    assert!(same.status.is_success(), "{same:?}");
    assert_eq!(same.json()["transfer_id"], first.json()["transfer_id"]);
    assert_eq!(
        account(&server, &client, from).await["balance"],
        400,
        "one debit"
    );
}

/// What moved: `GET /api/v1/accounts/{id}/transfers` lists an account's
/// debits and credits newest first, by pages (`limit`, `before`, `next_before`),
/// and `GET /api/v1/transfers/{id}` shows one; the debited account's holder
/// sees its balance after and the reference, the credited one only what moved;
/// a third principal sees nothing (404), and bad paging is a 400 naming it.
async fn transfers_can_be_read_back(server: &Server) {
    let (alice, bob, eve) = (Client::new(), Client::new(), Client::new());
    let (a, a2) = (
        open(server, &alice, 1_000).await,
        open(server, &alice, 0).await,
    );
    let b = open(server, &bob, 500).await;
    let base = server.url("");
    let mut sent = Vec::new();
    for n in 1..=5 {
        let body = format!(r#"{{"to":{b},"amount":{n}0,"reference_id":"to_bob_{n}"}}"#);
        let made = transfer(&base, &alice, a, &body).await;
        assert_eq!(made.status, StatusCode::CREATED, "{made:?}");
        sent.push(made.json());
    }
    let back = transfer(
        &base,
        &bob,
        b,
        &format!(r#"{{"to":{a},"amount":7,"reference_id":"back"}}"#),
    )
    .await;
    assert_eq!(back.status, StatusCode::CREATED, "{back:?}");
    let own = transfer(
        &base,
        &alice,
        a,
        &format!(r#"{{"to":{a2},"amount":1,"reference_id":"own"}}"#),
    )
    .await;
    assert_eq!(own.status, StatusCode::CREATED, "{own:?}");

    // Alice's account: 7 transfers, newest first, in pages of 3.
    let list = |client: &Client, query: &str| {
        let (client, url) = (
            client.clone(),
            server.url(&format!("/api/v1/accounts/{a}/transfers{query}")),
        );
        async move { client.get(&url).await }
    };
    let mut seen = Vec::new();
    let mut query = "?limit=3".to_owned();
    loop {
        let page = list(&alice, &query).await;
        assert_eq!(page.status, StatusCode::OK, "{page:?}");
        let page = page.json();
        let items = page["transfers"].as_array().unwrap().clone();
        assert!(items.len() <= 3, "{page}");
        seen.extend(items);
        match page["next_before"].as_i64() {
            Some(next) => query = format!("?limit=3&before={next}"),
            None => break,
        }
    }
    let ids: Vec<i64> = seen
        .iter()
        .map(|t| t["transfer_id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids.len(), 7, "{seen:?}");
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");
    // The newest: to her own account, sent by her.
    let mut expected = own.json();
    expected["reference_id"] = "own".into();
    assert_eq!(seen[0], expected);
    // Bob's credit to her: what moved, not Bob's balance or reference.
    assert_eq!(
        seen[1],
        serde_json::json!({"transfer_id": back.json()["transfer_id"], "from": b, "to": a, "amount": 7})
    );
    // Her debits: as the POST answered them, with their references.
    for (n, made) in sent.iter().rev().enumerate() {
        let mut expected = made.clone();
        expected["reference_id"] = format!("to_bob_{}", 5 - n).into();
        assert_eq!(seen[2 + n], expected);
    }
    // The default page holds them all; nothing after the last.
    let all = list(&alice, "").await.json();
    assert_eq!(all["transfers"].as_array().unwrap().len(), 7);
    assert_eq!(all["next_before"], serde_json::Value::Null);

    // One transfer by id: the sender sees it whole, the receiver what moved,
    // anyone else nothing.
    let first = sent[0]["transfer_id"].as_i64().unwrap();
    let url = server.url(&format!("/api/v1/transfers/{first}"));
    let mut whole = sent[0].clone();
    whole["reference_id"] = "to_bob_1".into();
    assert_eq!(alice.get(&url).await.json(), whole);
    assert_eq!(
        bob.get(&url).await.json(),
        serde_json::json!({"transfer_id": first, "from": a, "to": b, "amount": 10})
    );
    let hidden = eve.get(&url).await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND, "{hidden:?}");
    assert!(
        hidden.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("transfer-not-found")
    );
    let missing = alice.get(&server.url("/api/v1/transfers/999999999")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{missing:?}");

    // Another principal's account is not found, as its GET is.
    let foreign = list(&eve, "").await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND, "{foreign:?}");
    assert!(
        foreign.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("account-not-found")
    );

    // Paging out of bounds, or unknown: 400 naming what is wrong.
    for (query, field) in [
        ("?limit=0", Some("limit")),
        ("?limit=101", Some("limit")),
        ("?limit=x", Some("limit")),
        ("?before=-1", Some("before")),
        ("?limit=2&limit=3", Some("limit")),
        ("?after=3", None),
    ] {
        let refused = list(&alice, query).await;
        assert_eq!(
            refused.status,
            StatusCode::BAD_REQUEST,
            "{query}: {refused:?}"
        );
        let problem = refused.json();
        assert!(
            problem["type"]
                .as_str()
                .unwrap()
                .ends_with("invalid-request"),
            "{problem}"
        );
        assert_eq!(problem["field"].as_str(), field, "{query}: {problem}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transfers_can_be_read_back_on_sqlite() {
    let (db, _dir) = sqlite_url();
    transfers_can_be_read_back(&Server::start(Options::new(&db)).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transfers_can_be_read_back_on_postgres() {
    transfers_can_be_read_back(&Server::start(Options::new(&postgres_url())).await).await;
}
