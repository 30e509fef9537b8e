//! `serve`'s payment webhook (`POST /webhooks/payments`, `src/orders/webhook.rs`)
//! on the real binary, on SQLite and PostgreSQL: the gateway's
//! `payment.succeeded` marks its order's payment confirmed exactly once — the
//! event's record and the order's change commit in one transaction (the inbox
//! pattern). Deliveries the tests send are signed by the `standardwebhooks`
//! package (`tests/webhooks/sign.py`, as the proxy's webhook tests sign them);
//! the built-in simulated gateway signs its own. Every scenario counts what
//! committed: the order's version (the confirmation's write is deliberately
//! unconditional, so a second run would show) and the event's record rows.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use reqwest::StatusCode;
use sqlx::Connection as _;
use tokio::sync::Barrier;

use crate::support::client::{Answer, Client, ORDER, new_key};
use crate::support::gateway::MockGateway;
use crate::support::server::{Options, Server, TempDir, postgres_url, run_to_exit, sqlite_url};
use crate::support::webhooks::{Delivery, Signed, now, sign};

/// A fresh Standard Webhooks secret.
fn secret() -> String {
    let key: Vec<u8> = (0..2)
        .flat_map(|_| uuid::Uuid::new_v4().into_bytes())
        .collect();
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    )
}

/// The orders database of a test: SQLite (its own file) or the shared PostgreSQL.
fn database(kind: &str) -> (String, Option<TempDir>) {
    match kind {
        "sqlite" => {
            let (url, dir) = sqlite_url();
            (url, Some(dir))
        }
        "postgres" => (postgres_url(), None),
        other => panic!("no database {other}"),
    }
}

fn options(database: &str, secret: &str) -> Options {
    let mut options = Options::new(database).env("IDEMGATE_PAYMENT_WEBHOOK_SECRET", secret);
    // Redeliveries racing a running delivery wait for its answer.
    options.wait_ms = 10_000;
    options
}

/// Creates an order; its representation and the operation id that created it
/// (the charge's `order_ref`, read from the mock gateway's call).
async fn create_order(server: &Server, gateway: &MockGateway) -> (serde_json::Value, String) {
    let client = Client::new();
    let created = client
        .post(&server.url("/api/v1/orders"), Some(&new_key()), ORDER)
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let order = created.json();
    assert_eq!(order["status"], "paid", "the create's contract: {order}");
    assert!(order.get("payment_confirmed_at").is_none(), "{order}");
    let calls = gateway.calls();
    let order_ref = calls.last().expect("one charge").body["order_ref"].clone();
    (order, order_ref.as_str().unwrap().to_owned())
}

/// A `payment.succeeded` for the order `order_ref` created, signed now.
async fn event(secret: &str, order_ref: &str) -> Signed {
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let payload = serde_json::json!({
        "type": "payment.succeeded",
        "data": {"order_ref": order_ref, "charge_id": "ch_e2e", "amount": 1500, "currency": "RUB"},
    })
    .to_string();
    let delivery = Delivery {
        provider: "standard",
        secret: secret.to_owned(),
        payload,
        id,
        timestamp: now(),
    };
    let mut signed = sign(&[delivery]).await.remove(0);
    signed.path = "/webhooks/payments".to_owned();
    signed
}

fn event_id(signed: &Signed) -> String {
    signed
        .headers
        .iter()
        .find(|(name, _)| name == "webhook-id")
        .expect("a webhook-id")
        .1
        .clone()
}

async fn deliver(base: &str, signed: &Signed, timeout: Duration) -> Result<Answer, reqwest::Error> {
    let mut request = reqwest::Client::new()
        .post(format!("{base}{}", signed.path))
        .timeout(timeout)
        .body(signed.body.clone());
    for (name, value) in &signed.headers {
        request = request.header(name, value);
    }
    let response = request.send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await?;
    Ok(Answer {
        status,
        headers,
        body,
    })
}

/// The order, as the database holds it now: (version, payment_event_id,
/// payment_confirmed_at).
async fn order_row(database: &str, order_id: i64) -> (i64, Option<String>, Option<i64>) {
    let sql = "SELECT version, payment_event_id, payment_confirmed_at FROM orders WHERE id = ";
    let statement = format!("{sql}{order_id}");
    if database.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(database).await.unwrap();
        sqlx::query_as(sqlx::AssertSqlSafe(statement))
            .fetch_one(&mut conn)
            .await
            .unwrap()
    } else {
        let mut conn = sqlx::PgConnection::connect(database).await.unwrap();
        sqlx::query_as(sqlx::AssertSqlSafe(statement))
            .fetch_one(&mut conn)
            .await
            .unwrap()
    }
}

/// The event's idempotency records (the inbox rows): their statuses.
async fn inbox_rows(database: &str, event_id: &str) -> Vec<String> {
    let sql = "SELECT status FROM idemgate_records WHERE principal = 'webhook:standard' AND idempotency_key = ";
    if database.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(database).await.unwrap();
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("{sql}?1")))
            .bind(event_id)
            .fetch_all(&mut conn)
            .await
            .unwrap()
    } else {
        let mut conn = sqlx::PgConnection::connect(database).await.unwrap();
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("{sql}$1")))
            .bind(event_id)
            .fetch_all(&mut conn)
            .await
            .unwrap()
    }
}

/// `idemgate_webhooks_total{provider="standard", outcome}` on `server`.
async fn webhooks_total(server: &Server, outcome: &str) -> u64 {
    let text = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|line| {
            line.starts_with("idemgate_webhooks_total{")
                && line.contains(r#"provider="standard""#)
                && line.contains(&format!(r#"outcome="{outcome}""#))
        })
        .and_then(|line| line.rsplit(' ').next())
        .map_or(0, |value| value.parse().unwrap())
}

/// Sends `signed` 16 times at once; every answer.
async fn sixteen_at_once(server: &Server, signed: &Signed) -> Vec<Answer> {
    let barrier = Arc::new(Barrier::new(16));
    let base = server.url("");
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (barrier, base, signed) = (barrier.clone(), base.clone(), signed.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                deliver(&base, &signed, Duration::from_secs(30))
                    .await
                    .expect("an answer")
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

/// The simulated gateway confirms each charge itself: the create answers
/// `201 paid` as always, then the order's payment is confirmed once, by the
/// event the gateway delivered; a retry of the create charges nothing and
/// confirms nothing again.
async fn the_simulated_gateway_confirms_each_order_once(kind: &str) {
    let (database, _dir) = database(kind);
    let server = Server::start(options(&database, &secret())).await;
    let client = Client::new();
    let key = new_key();
    let created = client
        .post(&server.url("/api/v1/orders"), Some(&key), ORDER)
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let order = created.json();
    assert_eq!(order["status"], "paid", "{order}");
    assert_eq!(order["version"], 1, "{order}");
    let id = order["order_id"].as_i64().unwrap();
    let url = server.url(&format!("/api/v1/orders/{id}"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let confirmed = loop {
        let read = client.get(&url).await.json();
        if read.get("payment_confirmed_at").is_some() {
            break read;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the simulated gateway's confirmation did not arrive within 20 s: {read}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(confirmed["status"], "paid");
    assert_eq!(confirmed["version"], 2, "one confirmation: {confirmed}");
    let event_id = confirmed["payment_event_id"].as_str().unwrap().to_owned();
    assert!(event_id.starts_with("msg_"), "{confirmed}");
    // The create's retry is its replay; nothing is charged or confirmed again.
    let retried = client
        .post(&server.url("/api/v1/orders"), Some(&key), ORDER)
        .await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert_eq!(
        retried.body, created.body,
        "the create's answer, byte for byte"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        order_row(&database, id).await,
        (
            2,
            Some(event_id.clone()),
            confirmed["payment_confirmed_at"].as_i64()
        )
    );
    // One record of the event (a delivery that came before the order's
    // commit was answered 404 and released, so the gateway's redelivery ran
    // again: the same record).
    assert_eq!(inbox_rows(&database, &event_id).await, ["COMPLETED"]);
    server.stop().await;
}

/// 16 concurrent redeliveries of one event, as a gateway with a short timeout
/// sends them: all 2xx, the order confirmed once (one version step), one
/// record of the event; a forged copy sent first claims nothing.
async fn sixteen_concurrent_redeliveries_confirm_once(kind: &str) {
    let (database, _dir) = database(kind);
    let secret = secret();
    let gateway = MockGateway::start().await;
    let server = Server::start(options(&database, &secret).gateway(gateway.url())).await;
    let (order, order_ref) = create_order(&server, &gateway).await;
    let id = order["order_id"].as_i64().unwrap();
    let signed = event(&secret, &order_ref).await;
    let event_id = event_id(&signed);
    // An unsigned copy first: refused, nothing claimed.
    let forged = deliver(
        &server.url(""),
        &signed.clone().unsigned(),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(forged.status, StatusCode::UNAUTHORIZED, "{forged:?}");
    assert!(inbox_rows(&database, &event_id).await.is_empty());
    let answers = sixteen_at_once(&server, &signed).await;
    for answer in &answers {
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(answer.json()["payment_event_id"], event_id.as_str());
    }
    let (version, confirmed_by, confirmed_at) = order_row(&database, id).await;
    assert_eq!(version, 2, "the order changed {} times", version - 1);
    assert_eq!(confirmed_by.as_deref(), Some(event_id.as_str()));
    assert!(confirmed_at.is_some());
    assert_eq!(inbox_rows(&database, &event_id).await, ["COMPLETED"]);
    assert_eq!(webhooks_total(&server, "verified").await, 1);
    assert_eq!(webhooks_total(&server, "duplicate").await, 15);
    assert_eq!(webhooks_total(&server, "bad_signature").await, 1);
    server.stop().await;
}

/// `kill -9` while the handler runs (its write done, not committed: the
/// test-only `IDEMGATE_TEST_FAULT_IN_PAYMENT_WEBHOOK=stall`), then the
/// gateway's redeliveries to the restarted server: the order confirmed once.
async fn a_crash_mid_handler_then_redelivery_confirms_once(kind: &str) {
    let (database, _dir) = database(kind);
    let secret = secret();
    let gateway = MockGateway::start().await;
    let mut crashing = options(&database, &secret)
        .gateway(gateway.url())
        .env("IDEMGATE_TEST_FAULT_IN_PAYMENT_WEBHOOK", "stall");
    crashing.lease_seconds = 2;
    crashing.ttl_seconds = 3600;
    let server = Server::start(crashing.clone()).await;
    let (order, order_ref) = create_order(&server, &gateway).await;
    let id = order["order_id"].as_i64().unwrap();
    let signed = event(&secret, &order_ref).await;
    let event_id = event_id(&signed);
    // The gateway gives up waiting, as a provider's timeout does.
    let timed_out = deliver(&server.url(""), &signed, Duration::from_secs(2)).await;
    assert!(
        timed_out.as_ref().is_err_and(reqwest::Error::is_timeout),
        "the stalled handler answered: {timed_out:?}"
    );
    assert_eq!(inbox_rows(&database, &event_id).await, ["PROCESSING"]);
    server.kill9().await;
    // Nothing of the handler's transaction survived.
    assert_eq!(order_row(&database, id).await, (1, None, None));
    let mut restarted = options(&database, &secret).gateway(gateway.url());
    restarted.lease_seconds = 2;
    restarted.ttl_seconds = 3600;
    let server = Server::start(restarted).await;
    // The gateway redelivers until a 2xx (the crashed run's lease ends first).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let first = loop {
        let answer = deliver(&server.url(""), &signed, Duration::from_secs(15)).await;
        match answer {
            Ok(answer) if answer.status.is_success() => break answer,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "no 2xx within 30 s: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(first.json()["version"], 2, "{first:?}");
    for answer in sixteen_at_once(&server, &signed).await {
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(answer.body, first.body, "the stored answer, byte for byte");
    }
    assert_eq!(
        order_row(&database, id).await,
        (
            2,
            Some(event_id.clone()),
            first.json()["payment_confirmed_at"].as_i64()
        )
    );
    assert_eq!(inbox_rows(&database, &event_id).await, ["COMPLETED"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn simulated_gateway_confirms_once_on_sqlite() {
    the_simulated_gateway_confirms_each_order_once("sqlite").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn simulated_gateway_confirms_once_on_postgres() {
    the_simulated_gateway_confirms_each_order_once("postgres").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sixteen_redeliveries_confirm_once_on_sqlite() {
    sixteen_concurrent_redeliveries_confirm_once("sqlite").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sixteen_redeliveries_confirm_once_on_postgres() {
    sixteen_concurrent_redeliveries_confirm_once("postgres").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kill9_mid_handler_then_redelivery_confirms_once_on_sqlite() {
    a_crash_mid_handler_then_redelivery_confirms_once("sqlite").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kill9_mid_handler_then_redelivery_confirms_once_on_postgres() {
    a_crash_mid_handler_then_redelivery_confirms_once("postgres").await;
}

/// A secret with another record store is refused at startup, naming the flag.
#[tokio::test]
async fn a_payment_webhook_needs_the_records_in_the_orders_database() {
    let output = run_to_exit(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
            .args(["serve", "--idempotency-store", "memory", "--database"])
            .arg(sqlite_url().0)
            .env("IDEMGATE_PAYMENT_WEBHOOK_SECRET", secret()),
    )
    .await;
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--payment-webhook-secret")
            && stderr.contains("--idempotency-store database"),
        "{stderr}"
    );
}
