//! What a fault test asserts: effects, per idempotency key. Each key gets its own
//! bearer token (orders are stored per principal, so the orders table says how many
//! orders the key made) and its own amount (the gateway sees amounts and downstream
//! keys, never the client's key, so the amount says which charges belong to it).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use sha2::{Digest, Sha256};
use sqlx::Row;
use tokio::time::Instant;

use crate::support::client::{Answer, Client, new_key};
use crate::support::gateway::MockGateway;

/// Amounts are unique across the whole test binary, so no two keys share one.
static NEXT_AMOUNT: AtomicI64 = AtomicI64::new(1_000);

/// One idempotency key under test, with what identifies its effects.
#[derive(Clone)]
pub struct Probe {
    pub key: String,
    pub client: Client,
    pub amount: i64,
}

impl Probe {
    /// A fresh key with a fresh principal and a fresh amount; `timeout` bounds each
    /// request (generously: a frozen store holds requests).
    pub fn new(timeout: Duration) -> Self {
        Self {
            key: new_key(),
            client: Client::with_timeout(timeout),
            amount: NEXT_AMOUNT.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// A fresh key, principal and amount on `client`'s HTTP connections: for tests
    /// that make hundreds of keys, each of which would otherwise build a client.
    pub fn on(client: &Client) -> Self {
        Self {
            key: new_key(),
            client: client.with_token(&format!("token-{}", new_key())),
            amount: NEXT_AMOUNT.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The order this key asks for.
    pub fn body(&self) -> String {
        format!(
            r#"{{"items":[{{"id":42,"quantity":1}}],"currency":"RUB","amount":{}}}"#,
            self.amount
        )
    }

    /// The principal the server stores the key's orders under (see `authenticate`).
    pub fn principal(&self) -> String {
        format!(
            "bearer:{}",
            hex::encode(Sha256::digest(self.client.token.as_bytes()))
        )
    }

    /// One POST of this key to the server at `base` (`Server::url("")`: a plain
    /// string, so spawned tasks can hold it).
    pub async fn post(&self, base: &str) -> reqwest::Result<Answer> {
        self.client
            .try_post(
                &format!("{base}/api/v1/orders"),
                Some(&self.key),
                &self.body(),
            )
            .await
    }

    /// Retries until the final answer (201), as a client following the protocol
    /// does: 409 (in progress) and 503 (store unavailable) are retried, anything
    /// else fails the test, and so does no final answer within `patience`.
    pub async fn settle(&self, base: &str, patience: Duration) -> Answer {
        settle(&format!("key {}", self.key), patience, || self.post(base)).await
    }
}

/// A 409 or 503 must be problem+json with a `Retry-After` of at least 1 s.
/// Sends (`send`) again until the final answer (201), as a client following
/// the protocol does: 409 (in progress) and 503 (store unavailable) are
/// retried, anything else fails the test, and so does no final answer within
/// `patience`. `what` names the request in failures.
pub async fn settle<F>(what: &str, patience: Duration, mut send: impl FnMut() -> F) -> Answer
where
    F: std::future::Future<Output = reqwest::Result<Answer>>,
{
    let deadline = Instant::now() + patience;
    loop {
        let answer = send()
            .await
            .unwrap_or_else(|e| panic!("{what}: the live server did not answer: {e}"));
        match answer.status {
            StatusCode::CREATED => return answer,
            StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE => {
                assert_retryable_problem(&answer);
            }
            _ => panic!("{what}: not a final success: {answer:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "{what}: no final answer within {patience:?}; last {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub fn assert_retryable_problem(answer: &Answer) {
    let kind = answer.problem_type();
    let retry_after: u64 = answer
        .headers
        .get("retry-after")
        .unwrap_or_else(|| panic!("{kind} without Retry-After: {answer:?}"))
        .to_str()
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("Retry-After is not seconds: {answer:?}"));
    assert!(retry_after >= 1, "{answer:?}");
}

/// The orders table the server writes, read directly.
#[derive(Debug, Clone)]
pub enum OrdersTable {
    Sqlite(String),
    Postgres(String),
}

impl OrdersTable {
    /// The table of the server's `--database` URL.
    pub fn of(database: &str) -> Self {
        match database.strip_prefix("sqlite://") {
            Some(path) => Self::Sqlite(path.to_owned()),
            None => Self::Postgres(database.to_owned()),
        }
    }

    /// The operation ids of each principal's orders.
    async fn operations(&self, principals: &[String]) -> BTreeMap<String, Vec<String>> {
        let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let rows = match self {
            Self::Sqlite(path) => {
                let options = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(path)
                    .read_only(true);
                let pool = sqlx::SqlitePool::connect_with(options)
                    .await
                    .expect("open the SQLite orders database");
                let mut rows = Vec::new();
                for principal in principals {
                    for row in sqlx::query(
                        "SELECT CAST(operation_id AS TEXT) FROM orders WHERE principal = ?",
                    )
                    .bind(principal)
                    .fetch_all(&pool)
                    .await
                    .expect("read orders")
                    {
                        rows.push((principal.clone(), row.get::<String, _>(0)));
                    }
                }
                pool.close().await;
                rows
            }
            Self::Postgres(url) => {
                let pool = sqlx::PgPool::connect(url)
                    .await
                    .expect("connect to the PostgreSQL orders database");
                let rows = sqlx::query(
                    "SELECT principal, operation_id::text FROM orders WHERE principal = ANY($1)",
                )
                .bind(principals.to_vec())
                .fetch_all(&pool)
                .await
                .expect("read orders")
                .iter()
                .map(|row| (row.get::<String, _>(0), row.get::<String, _>(1)))
                .collect();
                pool.close().await;
                rows
            }
        };
        for (principal, operation) in rows {
            found.entry(principal).or_default().push(operation);
        }
        found
    }
}

/// What the keys of a test did, in total.
#[derive(Debug, Clone, Copy)]
pub struct Totals {
    /// Keys checked.
    pub keys: usize,
    /// Calls the gateway received (a takeover or a retry calls again).
    pub gateway_calls: usize,
    /// Distinct charges the gateway made.
    pub charges: usize,
    /// Orders stored.
    pub orders: usize,
}

/// Exactly once, per key: one order in the database, one distinct charge at the
/// gateway, and the order's operation is the charge's downstream key. Also: the
/// gateway saw no amount that belongs to no key (nothing charged behind our back).
pub async fn assert_exactly_once(
    probes: &[Probe],
    orders: &OrdersTable,
    gateway: &MockGateway,
) -> Totals {
    let principals: Vec<String> = probes.iter().map(Probe::principal).collect();
    let stored = orders.operations(&principals).await;
    let mut charges: BTreeMap<i64, BTreeSet<String>> = BTreeMap::new();
    let calls = gateway.calls();
    for call in &calls {
        let amount = call.body["amount"].as_i64().expect("an amount");
        let key = call
            .idempotency_key
            .clone()
            .expect("every call carries the downstream key");
        charges.entry(amount).or_default().insert(key);
    }
    let mut failures = Vec::new();
    for (probe, principal) in probes.iter().zip(&principals) {
        let operations = stored.get(principal).map(Vec::as_slice).unwrap_or_default();
        let charged = charges.remove(&probe.amount).unwrap_or_default();
        if operations.len() != 1 || charged.len() != 1 || !charged.contains(&operations[0]) {
            failures.push(format!(
                "key {}: orders {operations:?}, distinct charges {charged:?}",
                probe.key
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} keys not exactly once:\n{}",
        failures.len(),
        probes.len(),
        failures.join("\n")
    );
    assert!(
        charges.is_empty(),
        "charges for no key of this test: {charges:?}"
    );
    Totals {
        keys: probes.len(),
        gateway_calls: calls.len(),
        charges: gateway.distinct_charges(),
        orders: stored.values().map(Vec::len).sum(),
    }
}
