//! `PostgresStore` against a real PostgreSQL: the conformance suite, the
//! transactional mode, purging, migrations and error classification.
//!
//! The server is at `IDEMGATE_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); the tests fail, loudly, when it is
//! unreachable. They share one schema and use random identities; tests that count or
//! delete rows get a schema of their own.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::post;
use axum::{Extension, Router};
use bytes::Bytes;
use http::{Request, StatusCode};
use idemgate_core::record::{OperationId, RecordStatus, StoredBody, StoredResponse};
use idemgate_core::transaction::{PendingTransaction, SlotContents, TransactionSlot};
use idemgate_core::{
    Claim, ClaimRequest, Completion, Decision, FencedWrite, FinalStatus, Lease, LeaseOrigin, Store,
    StoreError, decide,
};
use idemgate_postgres::{Error, PostgresStore, Tx};
use idemgate_testkit::conformance::{awkward_response, fresh_request};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::sync::Barrier;
use tower::ServiceExt;

const SHARED_SCHEMA: &str = "idemgate_test";
const DAY: Duration = Duration::from_secs(86_400);

fn url() -> String {
    std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

async fn pool(max_connections: u32) -> PgPool {
    let url = url();
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .unwrap_or_else(|err| {
            panic!(
                "PostgreSQL at {url} is unreachable ({err}): start it with \
                 `scripts/services.sh postgres` or set IDEMGATE_TEST_POSTGRES_URL"
            )
        })
}

/// A store in the shared test schema, migrated, with an `orders` table beside it.
async fn shared_store(max_connections: u32) -> PostgresStore {
    let store = PostgresStore::new(pool(max_connections).await).with_schema(SHARED_SCHEMA);
    store.migrate().await.expect("migrate");
    create_orders(store.pool(), SHARED_SCHEMA).await;
    store
}

async fn conformance_store() -> Arc<dyn Store> {
    Arc::new(shared_store(10).await)
}

mod conformance {
    idemgate_testkit::store_conformance!(super::conformance_store);
}

/// The business table of the transactional tests: one order per operation.
async fn create_orders(pool: &PgPool, schema: &str) {
    let mut tx = pool.begin().await.expect("begin");
    // Concurrent `CREATE TABLE IF NOT EXISTS` can still collide; serialize them.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('idemgate.test.orders', 0))")
        .execute(&mut *tx)
        .await
        .expect("lock");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS \"{schema}\".orders ( \
             id BIGSERIAL PRIMARY KEY, \
             operation_id UUID NOT NULL UNIQUE, \
             amount BIGINT NOT NULL)"
    )))
    .execute(&mut *tx)
    .await
    .expect("create orders");
    tx.commit().await.expect("commit");
}

async fn insert_order(tx: &mut Tx, operation_id: OperationId) -> Result<(), sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{SHARED_SCHEMA}\".orders (operation_id, amount) VALUES ($1, 4200)"
    )))
    .bind(operation_id.as_uuid())
    .execute(&mut **tx)
    .await
    .map(|_| ())
}

async fn orders_for(store: &PostgresStore, operation_id: OperationId) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{SHARED_SCHEMA}\".orders WHERE operation_id = $1"
    )))
    .bind(operation_id.as_uuid())
    .fetch_one(store.pool())
    .await
    .expect("count orders")
}

fn completion(response: StoredResponse) -> Completion {
    Completion {
        status: FinalStatus::Completed,
        response,
        ttl: DAY,
    }
}

async fn acquire(store: &PostgresStore, request: &ClaimRequest) -> Lease {
    match store.try_claim(request).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        Claim::Existing(snapshot) => {
            panic!("expected to acquire, found {:?}", snapshot.record.status)
        }
    }
}

fn returned(slot: &TransactionSlot) -> Box<dyn PendingTransaction> {
    match slot.take() {
        SlotContents::Returned(pending) => pending,
        SlotContents::Unused => panic!("the slot is unused"),
        SlotContents::StillLent => panic!("the transaction was not given back"),
    }
}

/// A schema of its own, for tests that count or delete every row of a table.
struct TempSchema {
    name: String,
    pool: PgPool,
}

impl TempSchema {
    async fn new() -> Self {
        Self {
            name: format!("idemgate_t_{}", uuid::Uuid::new_v4().simple()),
            pool: pool(4).await,
        }
    }

    fn store(&self) -> PostgresStore {
        PostgresStore::new(self.pool.clone()).with_schema(self.name.clone())
    }

    async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{}\".\"{table}\"",
            self.name
        )))
        .fetch_one(&self.pool)
        .await
        .expect("count")
    }

    async fn drop_schema(self) {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
            self.name
        )))
        .execute(&self.pool)
        .await
        .expect("drop schema");
    }
}

// --- transactional mode -------------------------------------------------------------

/// (a) A failure after the business insert and before commit: the layer rolls back,
/// no order row remains, and the record can be released and reclaimed with the same
/// operation id; the retry then commits order and record together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_leaves_no_order_and_release_reclaims_the_operation() {
    let store = shared_store(4).await;
    let request = fresh_request();
    let lease = acquire(&store, &request).await;

    let slot = TransactionSlot::new();
    let mut tx = Tx::begin(&store, &slot).await.expect("begin");
    insert_order(&mut tx, lease.operation_id)
        .await
        .expect("insert");
    drop(tx); // the handler fails here: a 5xx whose effects the rollback undoes
    returned(&slot).rollback().await.expect("rollback");
    assert_eq!(
        orders_for(&store, lease.operation_id).await,
        0,
        "rolled-back order is visible"
    );
    assert_eq!(
        store.release(&lease).await.expect("release"),
        FencedWrite::Applied
    );

    let retry = acquire(&store, &request).await;
    assert_eq!(retry.origin, LeaseOrigin::Released);
    assert_eq!(
        retry.operation_id, lease.operation_id,
        "a retry continues the same operation"
    );
    let slot = TransactionSlot::new();
    let mut tx = Tx::begin(&store, &slot).await.expect("begin");
    insert_order(&mut tx, retry.operation_id)
        .await
        .expect("insert");
    drop(tx);
    let write = returned(&slot)
        .complete_and_commit(&retry, &completion(awkward_response()))
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Applied);
    assert_eq!(orders_for(&store, retry.operation_id).await, 1);
    let snapshot = store
        .get(request.identity.digest())
        .await
        .expect("get")
        .expect("record");
    assert_eq!(snapshot.record.status, RecordStatus::Completed);
    assert_eq!(snapshot.record.response, Some(awkward_response()));
}

/// (a') The process dies between the business insert and the commit: the pending
/// transaction is simply dropped. Nothing is committed, and once the lease lapses the
/// next request takes the record over with the same operation id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_transaction_rolls_back_and_the_lapsed_lease_is_taken_over() {
    let store = shared_store(4).await;
    let request = ClaimRequest {
        lease: Duration::from_millis(200),
        ..fresh_request()
    };
    let lease = acquire(&store, &request).await;
    let slot = TransactionSlot::new();
    let mut tx = Tx::begin(&store, &slot).await.expect("begin");
    insert_order(&mut tx, lease.operation_id)
        .await
        .expect("insert");
    drop(tx);
    drop(returned(&slot)); // never committed
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(orders_for(&store, lease.operation_id).await, 0);
    let takeover = acquire(
        &store,
        &ClaimRequest {
            lease: DAY,
            ..request
        },
    )
    .await;
    assert_eq!(takeover.origin, LeaseOrigin::TakenOver);
    assert_eq!(takeover.operation_id, lease.operation_id);
    assert_ne!(takeover.token, lease.token);
}

/// (c) A holder whose lease was taken over completes in its transaction: refused, and
/// its order row is rolled back with it; the new holder's commit goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_transactional_completion_is_refused_and_rolled_back() {
    let store = shared_store(4).await;
    let request = ClaimRequest {
        lease: Duration::from_millis(200),
        ..fresh_request()
    };
    let stale = acquire(&store, &request).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let current = acquire(
        &store,
        &ClaimRequest {
            lease: DAY,
            ..request.clone()
        },
    )
    .await;
    assert_eq!(current.origin, LeaseOrigin::TakenOver);

    let slot = TransactionSlot::new();
    let mut tx = Tx::begin(&store, &slot).await.expect("begin");
    insert_order(&mut tx, stale.operation_id)
        .await
        .expect("insert");
    drop(tx);
    let write = returned(&slot)
        .complete_and_commit(&stale, &completion(awkward_response()))
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Refused);
    assert_eq!(
        orders_for(&store, stale.operation_id).await,
        0,
        "a refused completion kept its order"
    );
    let snapshot = store
        .get(request.identity.digest())
        .await
        .expect("get")
        .expect("record");
    assert_eq!(snapshot.record.status, RecordStatus::Processing);
    assert_eq!(snapshot.record.token, current.token);

    let slot = TransactionSlot::new();
    let mut tx = Tx::begin(&store, &slot).await.expect("begin");
    insert_order(&mut tx, current.operation_id)
        .await
        .expect("insert");
    drop(tx);
    let write = returned(&slot)
        .complete_and_commit(&current, &completion(awkward_response()))
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Applied);
    assert_eq!(orders_for(&store, current.operation_id).await, 1);
}

#[derive(Debug)]
enum Outcome {
    Executed,
    Replayed(StoredResponse),
}

/// One "request" as the layer would run it, with a transactional handler that writes
/// one order. The first holder is slow, so its lease lapses and another request takes
/// the operation over while it still runs.
async fn transactional_request(
    store: PostgresStore,
    request: Arc<ClaimRequest>,
    refused: Arc<AtomicUsize>,
) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match store.try_claim(&request).await.expect("claim") {
            Claim::Acquired(lease) => {
                let slot = TransactionSlot::new();
                let mut tx = Tx::begin(&store, &slot).await.expect("begin");
                let inserted = insert_order(&mut tx, lease.operation_id).await;
                if lease.origin == LeaseOrigin::New {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                }
                drop(tx);
                let pending = returned(&slot);
                if inserted.is_err() {
                    pending.rollback().await.expect("rollback");
                    let _ = store.release(&lease).await.expect("release");
                    continue;
                }
                let body = StoredResponse {
                    body: StoredBody::Retained(Bytes::from(lease.operation_id.to_string())),
                    ..awkward_response()
                };
                match pending
                    .complete_and_commit(&lease, &completion(body))
                    .await
                    .expect("complete")
                {
                    FencedWrite::Applied => return Outcome::Executed,
                    FencedWrite::Refused => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Claim::Existing(snapshot) => match decide(&snapshot, &request.fingerprint) {
                Decision::Replay(response) => return Outcome::Replayed(response.clone()),
                Decision::InProgress { .. } => tokio::time::sleep(Duration::from_millis(20)).await,
                Decision::Claimable => {}
                Decision::Mismatch => panic!("same request, other fingerprint"),
            },
        }
    }
    panic!("a request neither executed nor replayed within 20 s");
}

/// (b) 64 concurrent requests with one key over two pools ("two instances"): exactly
/// one order row, one COMPLETED record, one executed response that all others replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_transactional_requests_on_two_instances_write_one_order() {
    const REQUESTS: usize = 64;
    let instances = [shared_store(8).await, shared_store(8).await];
    let request = Arc::new(ClaimRequest {
        lease: Duration::from_millis(200),
        ..fresh_request()
    });
    let barrier = Arc::new(Barrier::new(REQUESTS));
    let refused = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let store = instances[i % 2].clone();
            let (request, barrier, refused) = (
                Arc::clone(&request),
                Arc::clone(&barrier),
                Arc::clone(&refused),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                transactional_request(store, request, refused).await
            })
        })
        .collect();
    let mut executed = 0;
    let mut replays = Vec::new();
    for task in tasks {
        match task.await.expect("task") {
            Outcome::Executed => executed += 1,
            Outcome::Replayed(response) => replays.push(response),
        }
    }
    assert_eq!(
        executed, 1,
        "{executed} of {REQUESTS} requests executed; exactly one may"
    );
    let snapshot = instances[0]
        .get(request.identity.digest())
        .await
        .expect("get")
        .expect("record");
    assert_eq!(snapshot.record.status, RecordStatus::Completed);
    let operation_id = snapshot.record.operation_id;
    assert_eq!(
        orders_for(&instances[0], operation_id).await,
        1,
        "one operation must write exactly one order"
    );
    let stored = snapshot.record.response.expect("stored response");
    assert_eq!(
        stored.body,
        StoredBody::Retained(Bytes::from(operation_id.to_string()))
    );
    assert!(
        replays.iter().all(|r| *r == stored),
        "a replay differs from the stored response"
    );
    eprintln!(
        "{} refused transactional completion(s) rolled back",
        refused.load(Ordering::Relaxed)
    );
}

/// (d) The completed record and its response survive the pool: a new pool (a
/// restarted instance) replays the identical response and finds the one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_records_survive_a_reconnect() {
    let request = fresh_request();
    let (operation_id, pool) = {
        let store = shared_store(2).await;
        let lease = acquire(&store, &request).await;
        let slot = TransactionSlot::new();
        let mut tx = Tx::begin(&store, &slot).await.expect("begin");
        insert_order(&mut tx, lease.operation_id)
            .await
            .expect("insert");
        drop(tx);
        let write = returned(&slot)
            .complete_and_commit(&lease, &completion(awkward_response()))
            .await
            .expect("complete");
        assert_eq!(write, FencedWrite::Applied);
        (lease.operation_id, store.pool().clone())
    };
    pool.close().await;

    let store = shared_store(2).await;
    match store.try_claim(&request).await.expect("claim") {
        Claim::Existing(snapshot) => {
            assert_eq!(snapshot.record.status, RecordStatus::Completed);
            assert_eq!(snapshot.record.operation_id, operation_id);
            assert_eq!(snapshot.record.response, Some(awkward_response()));
        }
        Claim::Acquired(lease) => panic!("a completed record was lost: acquired {lease:?}"),
    }
    assert_eq!(orders_for(&store, operation_id).await, 1);
}

/// Keyless requests: `commit` keeps the business writes, `rollback` drops them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_transactions_commit_or_roll_back() {
    let store = shared_store(2).await;
    for commit in [true, false] {
        let operation_id = OperationId::random();
        let slot = TransactionSlot::new();
        let mut tx = Tx::begin(&store, &slot).await.expect("begin");
        insert_order(&mut tx, operation_id).await.expect("insert");
        drop(tx);
        let pending = returned(&slot);
        if commit {
            pending.commit().await.expect("commit");
        } else {
            pending.rollback().await.expect("rollback");
        }
        assert_eq!(orders_for(&store, operation_id).await, i64::from(commit));
    }
}

/// A transactional completion wakes a waiter on the same instance at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_commit_wakes_waiters() {
    let store = shared_store(4).await;
    let request = fresh_request();
    let lease = acquire(&store, &request).await;
    let digest = *request.identity.digest();
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            store
                .wait_for_change(&digest, Duration::from_secs(10))
                .await;
            start.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let slot = TransactionSlot::new();
    drop(Tx::begin(&store, &slot).await.expect("begin"));
    let write = returned(&slot)
        .complete_and_commit(&lease, &completion(awkward_response()))
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Applied);
    let waited = waiter.await.expect("waiter");
    assert!(
        waited < Duration::from_secs(5),
        "woke only after {waited:?}"
    );
}

// --- the axum extractor ---------------------------------------------------------------

async fn order_handler(
    mut tx: Tx,
    Extension(operation_id): Extension<OperationId>,
) -> &'static str {
    insert_order(&mut tx, operation_id).await.expect("insert");
    "created"
}

async fn greedy_handler(_first: Tx, _second: Tx) -> &'static str {
    "unreachable"
}

async fn body_text(response: axum::response::Response) -> String {
    let bytes = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .expect("body");
    String::from_utf8(bytes.to_vec()).expect("utf-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extractor_lends_the_slot_transaction() {
    let store = shared_store(4).await;
    let operation_id = OperationId::random();
    let slot = TransactionSlot::new();
    let app = Router::new()
        .route("/orders", post(order_handler))
        .layer(Extension(slot.clone()))
        .layer(Extension(operation_id))
        .with_state(store.clone());
    let response = app
        .oneshot(
            Request::post("/orders")
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        orders_for(&store, operation_id).await,
        0,
        "nothing commits before the layer"
    );
    returned(&slot).commit().await.expect("commit");
    assert_eq!(orders_for(&store, operation_id).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extractor_without_the_layer_answers_a_problem() {
    let store = shared_store(2).await;
    let app = Router::new()
        .route("/orders", post(order_handler))
        .layer(Extension(OperationId::random()))
        .with_state(store);
    let response = app
        .oneshot(
            Request::post("/orders")
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        response.headers()[http::header::CONTENT_TYPE],
        "application/problem+json"
    );
    let body = body_text(response).await;
    assert!(
        body.contains("route is not behind IdempotencyLayer"),
        "{body}"
    );
    assert!(
        body.contains(idemgate_postgres::PROBLEM_NOT_BEHIND_LAYER),
        "{body}"
    );
    assert!(body.contains("\"status\":500"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_transaction_in_one_request_is_refused() {
    let store = shared_store(4).await;
    let slot = TransactionSlot::new();
    let app = Router::new()
        .route("/orders", post(greedy_handler))
        .layer(Extension(slot.clone()))
        .with_state(store);
    let response = app
        .oneshot(
            Request::post("/orders")
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        response.headers()[http::header::CONTENT_TYPE],
        "application/problem+json"
    );
    assert!(
        body_text(response)
            .await
            .contains("already took its transaction")
    );
    // The first transaction went back to the slot when the handler's arguments dropped.
    assert!(matches!(slot.take(), SlotContents::Returned(_)));
}

// --- purge ----------------------------------------------------------------------------

async fn claim_with_ttl(store: &PostgresStore, ttl: Duration) {
    let request = ClaimRequest {
        ttl,
        ..fresh_request()
    };
    acquire(store, &request).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_only_expired_records_in_batches() {
    let schema = TempSchema::new().await;
    let store = schema.store();
    store.migrate().await.expect("migrate");
    for _ in 0..25 {
        claim_with_ttl(&store, Duration::from_millis(100)).await;
    }
    for _ in 0..5 {
        claim_with_ttl(&store, DAY).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.purge_expired(0).await.expect("purge"), 0);
    assert_eq!(store.purge_expired(10).await.expect("purge"), 25);
    assert_eq!(schema.count("idemgate_records").await, 5);
    assert_eq!(store.purge_expired(10).await.expect("purge"), 0);
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_purge_runs_until_dropped() {
    let schema = TempSchema::new().await;
    let store = schema.store();
    store.migrate().await.expect("migrate");
    for _ in 0..10 {
        claim_with_ttl(&store, Duration::from_millis(50)).await;
    }
    let task = store
        .spawn_purge(Duration::from_millis(50), 3)
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(5);
    while schema.count("idemgate_records").await > 0 {
        assert!(Instant::now() < deadline, "the purge task did not purge");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(task);
    for _ in 0..4 {
        claim_with_ttl(&store, Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        schema.count("idemgate_records").await,
        4,
        "the dropped task still purges"
    );
    schema.drop_schema().await;
}

#[test]
fn spawning_a_purge_outside_a_runtime_is_an_error() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let store = runtime.block_on(async {
        PostgresStore::new(
            PgPoolOptions::new()
                .connect_lazy(&url())
                .expect("lazy pool"),
        )
    });
    let err = store
        .spawn_purge(Duration::from_secs(1), 10)
        .expect_err("no runtime");
    assert!(matches!(err, Error::NoRuntime(_)), "{err:?}");
}

// --- migrations -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrations_and_version_tracking() {
    let schema = TempSchema::new().await;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = schema.store();
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for task in tasks {
        task.await.expect("task").expect("concurrent migrate");
    }
    let version: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT version FROM \"{}\".idemgate_schema_versions WHERE table_name = 'idemgate_records'",
        schema.name
    )))
    .fetch_one(&schema.pool)
    .await
    .expect("version row");
    assert_eq!(version, 1);
    let sqlx_table: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT to_regclass('\"{}\"._sqlx_migrations')::text",
        schema.name
    )))
    .fetch_one(&schema.pool)
    .await
    .expect("regclass");
    assert_eq!(
        sqlx_table, None,
        "the store must not use sqlx's migration table"
    );

    // Once current, `migrate()` runs no DDL: it passes even in a read-only session.
    let options: PgConnectOptions = url().parse().expect("url");
    let read_only = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.options([("default_transaction_read_only", "on")]))
        .await
        .expect("connect");
    PostgresStore::new(read_only)
        .with_schema(schema.name.clone())
        .migrate()
        .await
        .expect("a current schema needs no DDL");

    // A custom table keeps its own version row in the same schema.
    let custom = schema.store().with_table("payments-keys");
    custom.migrate().await.expect("migrate custom table");
    claim_with_ttl(&custom, DAY).await;
    assert_eq!(schema.count("payments-keys").await, 1);

    sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{}\".idemgate_schema_versions SET version = 99 WHERE table_name = 'idemgate_records'",
        schema.name
    )))
    .execute(&schema.pool)
    .await
    .expect("bump version");
    let err = schema.store().migrate().await.expect_err("newer schema");
    assert!(
        matches!(
            err,
            Error::SchemaTooNew {
                found: 99,
                supported: 1
            }
        ),
        "{err:?}"
    );
    schema.drop_schema().await;
}

/// The documented hash-partitioned layout works: claim, replay, purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_partitioned_table_works() {
    let schema = TempSchema::new().await;
    let s = &schema.name;
    let ddl = format!(
        "CREATE SCHEMA \"{s}\"; \
         CREATE TABLE \"{s}\".idemgate_records ( \
             identity BYTEA NOT NULL PRIMARY KEY CHECK (octet_length(identity) = 32), \
             principal TEXT NOT NULL, method TEXT NOT NULL, path TEXT NOT NULL, \
             idempotency_key TEXT NOT NULL, \
             fingerprint BYTEA NOT NULL CHECK (octet_length(fingerprint) = 32), \
             format_version INTEGER NOT NULL, operation_id UUID NOT NULL, token BIGINT NOT NULL, \
             status TEXT NOT NULL CHECK (status IN ('PROCESSING','COMPLETED','FAILED','RELEASED')), \
             lease_origin TEXT NOT NULL CHECK (lease_origin IN ('NEW','RELEASED','TAKEN_OVER')), \
             locked_until TIMESTAMPTZ, response_status INTEGER, response_headers BYTEA, \
             response_body BYTEA, body_retained BOOLEAN, \
             created_at TIMESTAMPTZ NOT NULL, expires_at TIMESTAMPTZ NOT NULL \
         ) PARTITION BY HASH (identity); \
         CREATE TABLE \"{s}\".p0 PARTITION OF \"{s}\".idemgate_records FOR VALUES WITH (MODULUS 4, REMAINDER 0); \
         CREATE TABLE \"{s}\".p1 PARTITION OF \"{s}\".idemgate_records FOR VALUES WITH (MODULUS 4, REMAINDER 1); \
         CREATE TABLE \"{s}\".p2 PARTITION OF \"{s}\".idemgate_records FOR VALUES WITH (MODULUS 4, REMAINDER 2); \
         CREATE TABLE \"{s}\".p3 PARTITION OF \"{s}\".idemgate_records FOR VALUES WITH (MODULUS 4, REMAINDER 3);"
    );
    sqlx::raw_sql(AssertSqlSafe(ddl))
        .execute(&schema.pool)
        .await
        .expect("partitioned table");
    let store = schema.store();
    store
        .migrate()
        .await
        .expect("migrate over a partitioned table");
    let request = fresh_request();
    let lease = acquire(&store, &request).await;
    assert_eq!(lease.origin, LeaseOrigin::New);
    assert!(matches!(
        store.try_claim(&request).await.expect("claim"),
        Claim::Existing(_)
    ));
    let write = store
        .complete(&lease, &completion(awkward_response()))
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Applied);
    let snapshot = store
        .get(request.identity.digest())
        .await
        .expect("get")
        .expect("record");
    assert_eq!(snapshot.record.response, Some(awkward_response()));
    for _ in 0..12 {
        claim_with_ttl(&store, Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(store.purge_expired(5).await.expect("purge"), 12);
    assert_eq!(schema.count("idemgate_records").await, 1);
    schema.drop_schema().await;
}

// --- errors ---------------------------------------------------------------------------

/// A pool pointing at a closed port: every method answers `Unavailable`, quickly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_database_is_unavailable() {
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy("postgres://postgres@127.0.0.1:1/test")
        .expect("lazy pool");
    let store = PostgresStore::new(pool);
    let request = fresh_request();
    let start = Instant::now();
    let err = store.try_claim(&request).await.expect_err("unreachable");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let err = store
        .get(request.identity.digest())
        .await
        .expect_err("unreachable");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let lease = Lease {
        identity: *request.identity.digest(),
        operation_id: OperationId::random(),
        token: idemgate_core::record::FencingToken(1),
        origin: LeaseOrigin::New,
        locked_until: idemgate_core::time::Timestamp::now(),
    };
    let err = store
        .complete(&lease, &completion(awkward_response()))
        .await
        .expect_err("unreachable");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let err = store.purge_expired(10).await.expect_err("unreachable");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let slot = TransactionSlot::new();
    let err = Tx::begin(&store, &slot).await.expect_err("unreachable");
    assert!(
        matches!(err, idemgate_postgres::TxRejection::Unavailable(_)),
        "{err:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
}

/// A statement that hits `statement_timeout` (SQLSTATE 57014) is `Unavailable`, with
/// the database error kept as its source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_is_unavailable() {
    let store = shared_store(2).await;
    let request = fresh_request();
    let lease = acquire(&store, &request).await;
    // Hold the record's row lock, so the next claim waits on it.
    let mut blocker = store.pool().begin().await.expect("begin");
    sqlx::query(AssertSqlSafe(format!(
        "SELECT 1 FROM \"{SHARED_SCHEMA}\".idemgate_records WHERE identity = $1 FOR UPDATE"
    )))
    .bind(lease.identity.as_bytes().as_slice())
    .execute(&mut *blocker)
    .await
    .expect("lock row");

    let options: PgConnectOptions = url().parse().expect("url");
    let impatient = PostgresStore::new(
        PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options.options([("statement_timeout", "200")]))
            .await
            .expect("connect"),
    )
    .with_schema(SHARED_SCHEMA);
    let err = impatient
        .release(&lease)
        .await
        .expect_err("statement timeout");
    let StoreError::Unavailable(source) = &err else {
        panic!("expected Unavailable, got {err:?}");
    };
    let code = source
        .downcast_ref::<sqlx::Error>()
        .and_then(|e| e.as_database_error())
        .and_then(|e| e.code())
        .map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("57014"));
    blocker.rollback().await.expect("rollback");
}

/// A record that cannot be decoded is `Corrupt`, not a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_record_is_corrupt() {
    let store = shared_store(2).await;
    let request = fresh_request();
    let lease = acquire(&store, &request).await;
    let write = store
        .complete(&lease, &completion(awkward_response()))
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Applied);
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{SHARED_SCHEMA}\".idemgate_records SET response_headers = '\\x0005'::bytea \
         WHERE identity = $1"
    )))
    .bind(lease.identity.as_bytes().as_slice())
    .execute(store.pool())
    .await
    .expect("corrupt the headers");
    let err = store
        .get(request.identity.digest())
        .await
        .expect_err("corrupt");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    let err = store.try_claim(&request).await.expect_err("corrupt");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
}

/// The record's readable parts are stored beside the digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readable_identity_parts_are_stored() {
    let store = shared_store(2).await;
    let request = fresh_request();
    acquire(&store, &request).await;
    let (principal, method, path, key): (String, String, String, String) =
        sqlx::query_as(AssertSqlSafe(format!(
            "SELECT principal, method, path, idempotency_key \
             FROM \"{SHARED_SCHEMA}\".idemgate_records WHERE identity = $1"
        )))
        .bind(request.identity.digest().as_bytes().as_slice())
        .fetch_one(store.pool())
        .await
        .expect("row");
    let scope = request.identity.scope();
    assert_eq!(principal, scope.principal.as_str());
    assert_eq!((method.as_str(), path.as_str()), ("POST", "/orders"));
    assert_eq!(key, request.identity.key().as_str());
}
