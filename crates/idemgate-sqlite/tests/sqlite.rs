//! `SqliteStore` on real files: the conformance suite, the transactional mode,
//! durability across reopening, purging, migrations and error classification.
//!
//! Every test gets a database file of its own in the temp directory, removed when
//! the test's store is dropped.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::body::Body;
use axum::routing::post;
use axum::{Extension, Router};
use bytes::Bytes;
use http::{Request, StatusCode};
use idemgate_core::record::{OperationId, RecordStatus, StoredBody, StoredResponse};
use idemgate_core::scope::IdentityDigest;
use idemgate_core::transaction::{PendingTransaction, SlotContents, TransactionSlot};
use idemgate_core::{
    Claim, ClaimRequest, Completion, Decision, FencedWrite, FinalStatus, Lease, LeaseOrigin,
    Snapshot, Store, StoreError, decide,
};
use idemgate_sqlite::{Error, SqliteStore, Tx};
use idemgate_testkit::conformance::{awkward_response, fresh_request};
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{Connection, SqlitePool};
use tokio::sync::Barrier;
use tower::ServiceExt;

const DAY: Duration = Duration::from_secs(86_400);

/// A database file that is removed (with its WAL and shared-memory files) on drop.
struct TempDb {
    path: PathBuf,
}

impl TempDb {
    fn new() -> Self {
        let dir = std::env::temp_dir().join("idemgate-sqlite-tests");
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self {
            path: dir.join(format!("{}.db", uuid::Uuid::new_v4().simple())),
        }
    }

    async fn pool(&self, max_connections: u32) -> SqlitePool {
        SqlitePoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(SqliteStore::connect_options(&self.path))
            .await
            .expect("open the database file")
    }

    /// A migrated store with an `orders` table beside it.
    async fn store(&self, max_connections: u32) -> SqliteStore {
        let store = SqliteStore::new(self.pool(max_connections).await);
        store.migrate().await.expect("migrate");
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS orders ( \
                 id INTEGER PRIMARY KEY, \
                 operation_id BLOB NOT NULL UNIQUE, \
                 amount INTEGER NOT NULL)",
        )
        .execute(store.pool())
        .await
        .expect("create orders");
        store
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.path.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A store and the file it lives in, removed when the store is dropped.
struct TempStore {
    store: SqliteStore,
    _db: TempDb,
}

#[async_trait]
impl Store for TempStore {
    async fn try_claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        self.store.try_claim(request).await
    }
    async fn complete(&self, lease: &Lease, c: &Completion) -> Result<FencedWrite, StoreError> {
        self.store.complete(lease, c).await
    }
    async fn release(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        self.store.release(lease).await
    }
    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<FencedWrite, StoreError> {
        self.store.renew(lease, lease_for).await
    }
    async fn delete(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        self.store.delete(lease).await
    }
    async fn get(&self, identity: &IdentityDigest) -> Result<Option<Snapshot>, StoreError> {
        self.store.get(identity).await
    }
    async fn wait_for_change(&self, identity: &IdentityDigest, timeout: Duration) {
        self.store.wait_for_change(identity, timeout).await;
    }
}

async fn conformance_store() -> Arc<dyn Store> {
    let db = TempDb::new();
    let store = db.store(8).await;
    Arc::new(TempStore { store, _db: db })
}

mod conformance {
    idemgate_testkit::store_conformance!(super::conformance_store);
}

async fn insert_order(tx: &mut Tx, operation_id: OperationId) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO orders (operation_id, amount) VALUES (?1, 4200)")
        .bind(operation_id.as_bytes().to_vec())
        .execute(&mut **tx)
        .await
        .map(|_| ())
}

async fn orders_for(store: &SqliteStore, operation_id: OperationId) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM orders WHERE operation_id = ?1")
        .bind(operation_id.as_bytes().to_vec())
        .fetch_one(store.pool())
        .await
        .expect("count orders")
}

async fn count_records(store: &SqliteStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idemgate_records")
        .fetch_one(store.pool())
        .await
        .expect("count records")
}

fn completion(response: StoredResponse) -> Completion {
    Completion {
        status: FinalStatus::Completed,
        response,
        ttl: DAY,
    }
}

async fn acquire(store: &SqliteStore, request: &ClaimRequest) -> Lease {
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

// --- the file -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_uses_wal_full_sync_busy_timeout_and_foreign_keys() {
    let db = TempDb::new();
    let store = SqliteStore::open(&db.path).await.expect("open");
    store.migrate().await.expect("migrate");
    assert!(db.path.exists(), "the file was not created");
    let mut conn = store.pool().acquire().await.expect("connection");
    let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .expect("journal_mode");
    let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .expect("synchronous");
    let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await
        .expect("busy_timeout");
    let foreign_keys: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
        .fetch_one(&mut *conn)
        .await
        .expect("foreign_keys");
    assert_eq!(journal, "wal");
    assert_eq!(synchronous, 2, "synchronous = FULL");
    assert_eq!(busy, 5_000);
    assert_eq!(foreign_keys, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_an_impossible_path_is_an_error() {
    let err = SqliteStore::open("/nonexistent-idemgate-dir/sub/x.db")
        .await
        .expect_err("cannot create");
    assert!(matches!(err, Error::Open(_)), "{err:?}");
}

// --- transactional mode -------------------------------------------------------------

/// (a) A failure after the business insert and before commit: the layer rolls back,
/// no order row remains, and the record can be released and reclaimed with the same
/// operation id; the retry then commits order and record together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_leaves_no_order_and_release_reclaims_the_operation() {
    let db = TempDb::new();
    let store = db.store(4).await;
    let request = fresh_request();
    let lease = acquire(&store, &request).await;

    let slot = TransactionSlot::new();
    let mut tx = Tx::begin(&store, &slot).await.expect("begin");
    insert_order(&mut tx, lease.operation_id)
        .await
        .expect("insert");
    drop(tx);
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

/// (a') The process dies between the business insert and the commit: nothing is
/// committed, and once the lease lapses the next request takes the record over with
/// the same operation id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_transaction_rolls_back_and_the_lapsed_lease_is_taken_over() {
    let db = TempDb::new();
    let store = db.store(4).await;
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
    let db = TempDb::new();
    let store = db.store(4).await;
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
/// one order; the first holder is slow (its lease lapses while it runs).
async fn transactional_request(
    store: SqliteStore,
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

/// (b) 64 concurrent requests with one key over two pools on one file ("two
/// instances"): exactly one order row, one COMPLETED record, one executed response
/// that all others replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_transactional_requests_on_two_instances_write_one_order() {
    const REQUESTS: usize = 64;
    let db = TempDb::new();
    let instances = [db.store(8).await, db.store(8).await];
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
    let all_orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(instances[1].pool())
        .await
        .expect("count");
    assert_eq!(all_orders, 1);
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

/// (d) Durability: complete, close the pool, reopen the same file: the replayed
/// response is identical and the one order is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_records_survive_reopening_the_file() {
    let db = TempDb::new();
    let request = fresh_request();
    let operation_id = {
        let store = db.store(2).await;
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
        store.pool().close().await;
        lease.operation_id
    };

    let store = SqliteStore::open(&db.path).await.expect("reopen");
    store.migrate().await.expect("migrate again is a no-op");
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
    let db = TempDb::new();
    let store = db.store(2).await;
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
    let db = TempDb::new();
    let store = db.store(4).await;
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
    let db = TempDb::new();
    let store = db.store(4).await;
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
    let pending = returned(&slot);
    assert_eq!(
        orders_for(&store, operation_id).await,
        0,
        "nothing commits before the layer"
    );
    pending.commit().await.expect("commit");
    assert_eq!(orders_for(&store, operation_id).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extractor_without_the_layer_answers_a_problem() {
    let db = TempDb::new();
    let store = db.store(2).await;
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
        body.contains(idemgate_sqlite::PROBLEM_NOT_BEHIND_LAYER),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_transaction_in_one_request_is_refused() {
    let db = TempDb::new();
    let store = db.store(4).await;
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
    assert!(
        body_text(response)
            .await
            .contains("already took its transaction")
    );
    assert!(matches!(slot.take(), SlotContents::Returned(_)));
}

// --- purge ----------------------------------------------------------------------------

async fn claim_with_ttl(store: &SqliteStore, ttl: Duration) {
    let request = ClaimRequest {
        ttl,
        ..fresh_request()
    };
    acquire(store, &request).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_only_expired_records_in_batches() {
    let db = TempDb::new();
    let store = db.store(2).await;
    for _ in 0..25 {
        claim_with_ttl(&store, Duration::from_millis(100)).await;
    }
    for _ in 0..5 {
        claim_with_ttl(&store, DAY).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.purge_expired(0).await.expect("purge"), 0);
    assert_eq!(store.purge_expired(10).await.expect("purge"), 25);
    assert_eq!(count_records(&store).await, 5);
    assert_eq!(store.purge_expired(10).await.expect("purge"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_purge_runs_until_dropped() {
    let db = TempDb::new();
    let store = db.store(2).await;
    for _ in 0..10 {
        claim_with_ttl(&store, Duration::from_millis(50)).await;
    }
    let task = store
        .spawn_purge(Duration::from_millis(50), 3)
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(5);
    while count_records(&store).await > 0 {
        assert!(Instant::now() < deadline, "the purge task did not purge");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(task);
    for _ in 0..4 {
        claim_with_ttl(&store, Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        count_records(&store).await,
        4,
        "the dropped task still purges"
    );
}

// --- migrations -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrations_and_version_tracking() {
    let db = TempDb::new();
    let pools = [db.pool(4).await, db.pool(4).await];
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = SqliteStore::new(pools[i % 2].clone());
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for task in tasks {
        task.await.expect("task").expect("concurrent migrate");
    }
    let store = SqliteStore::new(pools[0].clone());
    let version: i64 = sqlx::query_scalar(
        "SELECT version FROM idemgate_schema_versions WHERE table_name = 'idemgate_records'",
    )
    .fetch_one(store.pool())
    .await
    .expect("version row");
    assert_eq!(version, 1);
    let sqlx_tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sqlite_schema WHERE name = '_sqlx_migrations'")
            .fetch_one(store.pool())
            .await
            .expect("schema");
    assert_eq!(
        sqlx_tables, 0,
        "the store must not use sqlx's migration table"
    );

    let custom = SqliteStore::new(pools[0].clone()).with_table("payments keys");
    custom.migrate().await.expect("migrate custom table");
    claim_with_ttl(&custom, DAY).await;
    let custom_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM \"payments keys\"")
        .fetch_one(store.pool())
        .await
        .expect("count");
    assert_eq!(custom_rows, 1);

    sqlx::query(
        "UPDATE idemgate_schema_versions SET version = 99 WHERE table_name = 'idemgate_records'",
    )
    .execute(store.pool())
    .await
    .expect("bump version");
    let err = store.migrate().await.expect_err("newer schema");
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
}

// --- errors ---------------------------------------------------------------------------

/// Another connection holds the write lock past the busy timeout: `SQLITE_BUSY`, which
/// is `Unavailable` with the database error kept as its source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_database_is_unavailable() {
    let db = TempDb::new();
    let store = db.store(2).await;
    let mut blocker = sqlx::SqliteConnection::connect_with(&SqliteStore::connect_options(&db.path))
        .await
        .expect("connect");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut blocker)
        .await
        .expect("take the write lock");

    let impatient = SqliteStore::new(
        SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(
                SqliteStore::connect_options(&db.path).busy_timeout(Duration::from_millis(100)),
            )
            .await
            .expect("connect"),
    );
    let start = Instant::now();
    let err = impatient
        .try_claim(&fresh_request())
        .await
        .expect_err("busy");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    let StoreError::Unavailable(source) = &err else {
        panic!("expected Unavailable, got {err:?}");
    };
    let code = source
        .downcast_ref::<sqlx::Error>()
        .and_then(|e| e.as_database_error())
        .and_then(|e| e.code())
        .and_then(|c| c.parse::<i32>().ok());
    assert_eq!(code.map(|c| c & 0xff), Some(5), "SQLITE_BUSY");
    let slot = TransactionSlot::new();
    let err = Tx::begin(&impatient, &slot).await.expect_err("busy");
    assert!(
        matches!(err, idemgate_sqlite::TxRejection::Unavailable(_)),
        "{err:?}"
    );
    sqlx::query("ROLLBACK")
        .execute(&mut blocker)
        .await
        .expect("release the lock");
    drop(store);
}

/// A file that cannot be opened, and a closed pool: `Unavailable`, quickly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_database_is_unavailable() {
    let pool = SqlitePoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy_with(
            SqliteStore::connect_options(Path::new("/nonexistent-idemgate-dir/x.db"))
                .create_if_missing(false),
        );
    let store = SqliteStore::new(pool);
    let request = fresh_request();
    let start = Instant::now();
    let err = store.try_claim(&request).await.expect_err("unreachable");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let err = store
        .get(request.identity.digest())
        .await
        .expect_err("unreachable");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let err = store.purge_expired(10).await.expect_err("unreachable");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );

    let db = TempDb::new();
    let store = db.store(2).await;
    store.pool().close().await;
    let err = store.try_claim(&request).await.expect_err("closed");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
}

/// A record that cannot be decoded is `Corrupt`, not a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_record_is_corrupt() {
    let db = TempDb::new();
    let store = db.store(2).await;
    let request = fresh_request();
    let lease = acquire(&store, &request).await;
    let write = store
        .complete(&lease, &completion(awkward_response()))
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Applied);
    sqlx::query("UPDATE idemgate_records SET response_headers = x'0005' WHERE identity = ?1")
        .bind(lease.identity.as_bytes().to_vec())
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

/// The record's readable parts are stored beside the digest, and its clock is
/// SQLite's, within a second of this process's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readable_parts_and_the_clock() {
    let db = TempDb::new();
    let store = db.store(2).await;
    let request = fresh_request();
    acquire(&store, &request).await;
    let (principal, method, path, key): (String, String, String, String) = sqlx::query_as(
        "SELECT principal, method, path, idempotency_key FROM idemgate_records WHERE identity = ?1",
    )
    .bind(request.identity.digest().as_bytes().to_vec())
    .fetch_one(store.pool())
    .await
    .expect("row");
    assert_eq!(principal, request.identity.scope().principal.as_str());
    assert_eq!((method.as_str(), path.as_str()), ("POST", "/orders"));
    assert_eq!(key, request.identity.key().as_str());
    let snapshot = store
        .get(request.identity.digest())
        .await
        .expect("get")
        .expect("record");
    let skew = snapshot.now.as_millis() - idemgate_core::time::Timestamp::now().as_millis();
    assert!(skew.abs() < 1_000, "SQLite's clock is {skew} ms off");
}
