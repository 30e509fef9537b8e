//! `SqliteStore` on real files: the store conformance suite (directly and behind the
//! replay cache), the SQL stores' table suite and the transactional suite (all from
//! `idemgate-testkit`, on a [`SqliteHarness`]; durability across reopening the file
//! among them), and what is SQLite's own: the file's settings, `SQLITE_BUSY` and
//! result-code classification, SQLite's clock, group commit.
//!
//! Every test gets a database file of its own in the temp directory, removed when
//! the test's `TempDb` (or transactional harness) is dropped.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use idemgate_core::record::OperationId;
use idemgate_core::scope::IdentityDigest;
use idemgate_core::transaction::TransactionSlot;
use idemgate_core::{
    Claim, ClaimRequest, Completion, FencedWrite, Lease, Snapshot, Store, StoreError,
};
use idemgate_sqlite::{Error, PurgeTask, SqliteStore, Tx};
use idemgate_testkit::fixtures::{acquire, awkward_response, completion, fresh_request};
use idemgate_testkit::sql_store::{SqlHarness, StoredIdentity};
use idemgate_testkit::transactional::TransactionalHarness;
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{AssertSqlSafe, Connection, SqlitePool};

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
    async fn append_stream_piece(
        &self,
        lease: &Lease,
        index: u32,
        piece: &bytes::Bytes,
    ) -> Result<FencedWrite, StoreError> {
        self.store.append_stream_piece(lease, index, piece).await
    }
    async fn read_stream_pieces(
        &self,
        stream: &idemgate_core::stream::StreamId,
        from: u32,
        limit: u32,
    ) -> Result<Vec<bytes::Bytes>, StoreError> {
        self.store.read_stream_pieces(stream, from, limit).await
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
    async fn evict(
        &self,
        identity: &IdentityDigest,
        mode: idemgate_core::EvictMode,
    ) -> Result<idemgate_core::Eviction, StoreError> {
        self.store.evict(identity, mode).await
    }
    async fn get(&self, identity: &IdentityDigest) -> Result<Option<Snapshot>, StoreError> {
        self.store.get(identity).await
    }
    async fn acquire_resource_lease(
        &self,
        resource: &idemgate_core::resource_lease::ResourceId,
        ttl: Duration,
    ) -> Result<idemgate_core::resource_lease::LeaseAcquisition, StoreError> {
        self.store.acquire_resource_lease(resource, ttl).await
    }
    async fn release_resource_lease(
        &self,
        lease: &idemgate_core::resource_lease::ResourceLease,
    ) -> Result<FencedWrite, StoreError> {
        self.store.release_resource_lease(lease).await
    }
    async fn append_audit(
        &self,
        records: &[idemgate_core::audit::AuditRecord],
    ) -> Result<(), StoreError> {
        self.store.append_audit(records).await
    }

    async fn read_audit(
        &self,
        query: &idemgate_core::audit::AuditQuery,
    ) -> Result<Vec<idemgate_core::audit::AuditEntry>, StoreError> {
        self.store.read_audit(query).await
    }

    async fn audit_partitions(
        &self,
    ) -> Result<Vec<idemgate_core::audit::AuditPartition>, StoreError> {
        self.store.audit_partitions().await
    }

    async fn trim_audit(
        &self,
        instance: Option<&str>,
        before: idemgate_core::time::Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.store.trim_audit(instance, before, limit).await
    }

    async fn audit_secret(&self) -> Result<idemgate_core::audit::AuditSecret, StoreError> {
        self.store.audit_secret().await
    }

    async fn record_duration(
        &self,
        route: &str,
        duration: std::time::Duration,
    ) -> Result<(), idemgate_core::StoreError> {
        self.store.record_duration(route, duration).await
    }

    async fn route_durations(
        &self,
        route: &str,
    ) -> Result<Vec<std::time::Duration>, idemgate_core::StoreError> {
        self.store.route_durations(route).await
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

idemgate_testkit::cached_conformance!(conformance_store);

/// Two stores on one file: what one recorded, the other reads, also once the
/// first is gone (a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn route_history_is_shared_between_instances() {
    let db = TempDb::new();
    let first = db.store(4).await;
    let second = db.store(4).await;
    idemgate_testkit::conformance::route_history_is_shared(Arc::new(first), Arc::new(second)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn route_history_keeps_a_bounded_number_of_routes() {
    idemgate_testkit::conformance::route_history_keeps_a_bounded_number_of_routes(
        conformance_store().await,
    )
    .await;
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
    assert!(matches!(err, Error::Connect(_)), "{err:?}");
}

// --- the SQL suites ------------------------------------------------------------------

/// The SQL suites' database: a file of its own per test, holding the records and
/// an `orders` table (one order per operation id).
struct SqliteHarness {
    db: TempDb,
}

async fn harness() -> SqliteHarness {
    SqliteHarness { db: TempDb::new() }
}

/// `name` as an SQL identifier.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[async_trait]
impl SqlHarness for SqliteHarness {
    type Store = SqliteStore;
    const SCHEMA_VERSION: i64 = idemgate_sqlite::SCHEMA_VERSION;

    async fn unmigrated(&self, max_connections: u32) -> SqliteStore {
        SqliteStore::new(self.db.pool(max_connections).await)
    }

    async fn store(&self, max_connections: u32) -> SqliteStore {
        self.db.store(max_connections).await
    }

    /// The file reopened the way an application opens it, and migrated again.
    async fn reopen(&self) -> SqliteStore {
        let store = SqliteStore::open(&self.db.path).await.expect("reopen");
        store.migrate().await.expect("migrate again is a no-op");
        store
    }

    fn unreachable(&self) -> SqliteStore {
        let pool = SqlitePoolOptions::new()
            .acquire_timeout(Duration::from_millis(500))
            .connect_lazy_with(
                SqliteStore::connect_options(Path::new("/nonexistent-idemgate-dir/x.db"))
                    .create_if_missing(false),
            );
        SqliteStore::new(pool)
    }

    async fn migrate(&self, store: &SqliteStore) -> Result<(), Error> {
        store.migrate().await
    }

    fn with_table(&self, store: &SqliteStore, table: &str) -> SqliteStore {
        store.clone().with_table(table)
    }

    async fn schema_version(&self, store: &SqliteStore, table: &str) -> Option<i64> {
        sqlx::query_scalar("SELECT version FROM idemgate_schema_versions WHERE table_name = ?1")
            .bind(table.to_owned())
            .fetch_optional(store.pool())
            .await
            .expect("version row")
    }

    async fn set_schema_version(&self, store: &SqliteStore, table: &str, version: i64) {
        sqlx::query("UPDATE idemgate_schema_versions SET version = ?2 WHERE table_name = ?1")
            .bind(table.to_owned())
            .bind(version)
            .execute(store.pool())
            .await
            .expect("set the version");
    }

    async fn has_sqlx_migrations(&self, store: &SqliteStore) -> bool {
        let tables: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_schema WHERE name = '_sqlx_migrations'",
        )
        .fetch_one(store.pool())
        .await
        .expect("schema");
        tables > 0
    }

    async fn records(&self, store: &SqliteStore) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {}",
            quoted(store.table_name())
        )))
        .fetch_one(store.pool())
        .await
        .expect("count records")
    }

    async fn stored_identity(
        &self,
        store: &SqliteStore,
        identity: &IdentityDigest,
    ) -> StoredIdentity {
        let (principal, method, path, key) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT principal, method, path, idempotency_key FROM {} WHERE identity = ?1",
            quoted(store.table_name())
        )))
        .bind(identity.as_bytes().to_vec())
        .fetch_one(store.pool())
        .await
        .expect("row");
        StoredIdentity {
            principal,
            method,
            path,
            key,
        }
    }

    async fn corrupt_headers(&self, store: &SqliteStore, identity: &IdentityDigest) {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET response_headers = x'0005' WHERE identity = ?1",
            quoted(store.table_name())
        )))
        .bind(identity.as_bytes().to_vec())
        .execute(store.pool())
        .await
        .expect("corrupt the headers");
    }

    async fn purge_expired(&self, store: &SqliteStore, batch: usize) -> Result<u64, StoreError> {
        store.purge_expired(batch).await
    }

    fn spawn_purge(&self, store: &SqliteStore, every: Duration, batch: usize) -> PurgeTask {
        store.spawn_purge(every, batch).expect("spawn")
    }
}

#[async_trait]
impl TransactionalHarness for SqliteHarness {
    async fn insert_order(
        &self,
        tx: &mut Tx,
        operation_id: OperationId,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO orders (operation_id, amount) VALUES (?1, 4200)")
            .bind(operation_id.as_bytes().to_vec())
            .execute(&mut **tx)
            .await
            .map(|_| ())
    }

    async fn orders_for(&self, store: &SqliteStore, operation_id: OperationId) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE operation_id = ?1")
            .bind(operation_id.as_bytes().to_vec())
            .fetch_one(store.pool())
            .await
            .expect("count orders")
    }

    async fn orders(&self, store: &SqliteStore) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM orders")
            .fetch_one(store.pool())
            .await
            .expect("count orders")
    }
}

mod sql_store {
    idemgate_testkit::sql_store_conformance!(super::harness);

    /// The claim's entry rides in the claim's batch of the writer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_journaled_claim_writes_its_entry_with_it() {
        idemgate_testkit::sql_store::a_journaled_claim_writes_its_entry_with_it(
            std::sync::Arc::new(super::harness().await),
        )
        .await;
    }
}

mod transactional {
    idemgate_testkit::transactional_conformance!(super::harness);
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

/// A record's clock is SQLite's, within a second of this process's (its readable
/// parts are checked in the SQL suite).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_records_clock_is_sqlites() {
    let db = TempDb::new();
    let store = db.store(2).await;
    let request = fresh_request();
    acquire(&store, &request).await;
    let snapshot = store
        .get(request.identity.digest())
        .await
        .expect("get")
        .expect("record");
    let skew = snapshot.now.as_millis() - idemgate_core::time::Timestamp::now().as_millis();
    assert!(skew.abs() < 1_000, "SQLite's clock is {skew} ms off");
}

// --- a newcomer's setup -------------------------------------------------------------

/// A store built with `new(pool)` on a fresh file is `Misconfigured` (SQLite's
/// result code, not its message), and the layer answers 500 `store-misconfigured`
/// without running the handler; migrated, the same store serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmigrated_store_answers_500_misconfigured_until_migrated() {
    use idemgate_testkit::setup::{counting_orders, misconfiguration_code};
    use std::sync::atomic::AtomicUsize;

    let db = TempDb::new();
    let store = SqliteStore::new(db.pool(2).await);
    let code = misconfiguration_code(&store).await;
    assert_eq!(
        code.as_deref(),
        Some("1"),
        "plain SQLITE_ERROR: no such table"
    );
    let executions = Arc::new(AtomicUsize::new(0));
    let app = counting_orders(Arc::clone(&executions))
        .route_layer(idemgate::IdempotencyLayer::new(store.clone()));
    let migrate = async { store.migrate().await.expect("migrate") };
    idemgate_testkit::setup::misconfigured_until_migrated(&app, &executions, migrate).await;
}

/// `SqliteStore::open` migrates: on a fresh file, the store it returns claims,
/// completes and replays at once; reopened, the file keeps the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_is_ready_to_use_without_migrate() {
    let db = TempDb::new();
    let store = SqliteStore::open(&db.path).await.expect("open");
    idemgate_testkit::setup::ready_to_use(&store).await;
    let reopened = SqliteStore::open(&db.path).await.expect("reopen");
    idemgate_testkit::setup::ready_to_use(&reopened).await;
    store.pool().close().await;
    reopened.pool().close().await;
}

// --- group commit -----------------------------------------------------------------------

/// `n` claim requests, each its own task, released together by a barrier; their
/// answers in task order.
async fn concurrent_claims(
    store: &SqliteStore,
    requests: Vec<ClaimRequest>,
) -> Vec<Result<Claim, StoreError>> {
    let barrier = Arc::new(tokio::sync::Barrier::new(requests.len()));
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|request| {
            let store = store.clone();
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                store.try_claim(&request).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("claim task"));
    }
    answers
}

async fn record_count(store: &SqliteStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idemgate_records")
        .fetch_one(store.pool())
        .await
        .expect("count records")
}

/// The writer batches: 64 concurrent claims of distinct keys are all acquired and
/// durable, in fewer commits than claims (SQLite's own count, from a commit hook on
/// the writer's connection); 64 of one key make exactly one holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_share_commits() {
    const N: usize = 64;
    let db = TempDb::new();
    let store = db.store(8).await;
    // One at a time, each claim is its own commit: the count is SQLite's. (This
    // also opens the writer's connection before the concurrent count starts.)
    let before = store.writer_stats();
    for _ in 0..3 {
        acquire(&store, &fresh_request()).await;
    }
    let after = store.writer_stats();
    assert_eq!(after.commits - before.commits, 3, "{before:?} → {after:?}");
    assert_eq!(after.operations - before.operations, 3);

    let before = store.writer_stats();
    let answers = concurrent_claims(&store, (0..N).map(|_| fresh_request()).collect()).await;
    let after = store.writer_stats();
    let acquired = answers
        .iter()
        .filter(|answer| matches!(answer, Ok(Claim::Acquired(_))))
        .count();
    assert_eq!(acquired, N, "{answers:?}");
    assert_eq!(record_count(&store).await, N as i64 + 3);
    assert_eq!(after.operations - before.operations, N as u64);
    let commits = after.commits - before.commits;
    eprintln!("[group commit] {N} concurrent claims of distinct keys: {commits} commits");
    assert!(
        (1..N as u64).contains(&commits),
        "{N} claims took {commits} commits: the writer did not batch"
    );

    // One key: the upsert is still the one atomic claim within a batch.
    let request = fresh_request();
    let before = store.writer_stats();
    let answers = concurrent_claims(&store, vec![request.clone(); N]).await;
    let after = store.writer_stats();
    let acquired = answers
        .iter()
        .filter(|answer| matches!(answer, Ok(Claim::Acquired(_))))
        .count();
    let existing = answers
        .iter()
        .filter(|answer| matches!(answer, Ok(Claim::Existing(_))))
        .count();
    assert_eq!((acquired, existing), (1, N - 1), "{answers:?}");
    let commits = after.commits - before.commits;
    eprintln!("[group commit] {N} concurrent claims of one key: {commits} commits");

    // Reopened, every acknowledged claim is there.
    drop(store);
    let reopened = SqliteStore::open(&db.path).await.expect("reopen");
    assert_eq!(record_count(&reopened).await, N as i64 + 4);
}

/// A write that fails in a batch fails alone: a trigger refuses one key's insert
/// (`RAISE(ABORT)` undoes that statement only), and the other claims, queued in the
/// same batches, are acquired and committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_write_does_not_fail_its_batch() {
    const N: usize = 64;
    let db = TempDb::new();
    let store = db.store(8).await;
    sqlx::query(
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON idemgate_records \
         WHEN NEW.idempotency_key LIKE 'poison-%' \
         BEGIN SELECT RAISE(ABORT, 'poisoned key'); END",
    )
    .execute(store.pool())
    .await
    .expect("create trigger");

    let requests: Vec<_> = (0..N)
        .map(|i| {
            if i % 8 == 3 {
                idemgate_testkit::fixtures::request_for(
                    "alice",
                    "POST",
                    "/orders",
                    &format!("poison-{i}"),
                    1,
                )
            } else {
                fresh_request()
            }
        })
        .collect();
    let before = store.writer_stats();
    let answers = concurrent_claims(&store, requests).await;
    let after = store.writer_stats();
    for (i, answer) in answers.iter().enumerate() {
        if i % 8 == 3 {
            assert!(answer.is_err(), "poisoned claim {i}: {answer:?}");
        } else {
            assert!(
                matches!(answer, Ok(Claim::Acquired(_))),
                "claim {i}: {answer:?}"
            );
        }
    }
    assert_eq!(record_count(&store).await, (N - N / 8) as i64);
    assert!(
        after.commits - before.commits < N as u64,
        "the writer did not batch: {before:?} → {after:?}"
    );
}

/// Transactional requests share commits with each other and with claims: each of
/// 16 concurrent requests claims, writes its order through a `Tx` and completes in
/// it; every order and every completion is there, in fewer commits than the 32
/// writes (16 claims, 16 transactions).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactional_turns_share_commits() {
    const N: usize = 16;
    let db = TempDb::new();
    let store = db.store(8).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(N));
    let before = store.writer_stats();
    let tasks: Vec<_> = (0..N)
        .map(|_| {
            let store = store.clone();
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                let request = fresh_request();
                let lease = acquire(&store, &request).await;
                let slot = TransactionSlot::new();
                let mut tx = Tx::begin(&store, &slot).await.expect("begin");
                sqlx::query("INSERT INTO orders (operation_id, amount) VALUES (?1, 4200)")
                    .bind(lease.operation_id.as_bytes().to_vec())
                    .execute(&mut *tx)
                    .await
                    .expect("insert");
                drop(tx);
                let idemgate_core::transaction::SlotContents::Returned(pending) = slot.take()
                else {
                    panic!("the transaction did not come back");
                };
                let write = pending
                    .complete_and_commit(&lease, &completion(awkward_response()), &[])
                    .await
                    .expect("commit");
                assert_eq!(write, FencedWrite::Applied);
                request
            })
        })
        .collect();
    let mut requests = Vec::new();
    for task in tasks {
        requests.push(task.await.expect("request task"));
    }
    let after = store.writer_stats();
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(store.pool())
        .await
        .expect("count orders");
    assert_eq!(orders, N as i64);
    for request in &requests {
        let snapshot = store
            .get(request.identity.digest())
            .await
            .expect("get")
            .expect("record");
        assert_eq!(
            snapshot.record.status(),
            idemgate_core::record::RecordStatus::Completed
        );
    }
    assert_eq!(after.operations - before.operations, 2 * N as u64);
    assert!(
        after.commits - before.commits < 2 * N as u64,
        "{} writes took {} commits",
        2 * N,
        after.commits - before.commits
    );
}

/// A transactional handler's failing statement rolls back its turn alone: the
/// claims that share its batch commit, and its own writes vanish.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolled_back_turn_leaves_its_batch_intact() {
    let db = TempDb::new();
    let store = db.store(8).await;
    let lease = acquire(&store, &fresh_request()).await;
    let slot = TransactionSlot::new();
    let mut tx = Tx::begin(&store, &slot).await.expect("begin");
    sqlx::query("INSERT INTO orders (operation_id, amount) VALUES (?1, 1)")
        .bind(lease.operation_id.as_bytes().to_vec())
        .execute(&mut *tx)
        .await
        .expect("insert");
    // While the turn holds the writer, claims queue behind it, in its batch.
    let claims: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.try_claim(&fresh_request()).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let duplicate = sqlx::query("INSERT INTO orders (operation_id, amount) VALUES (?1, 2)")
        .bind(lease.operation_id.as_bytes().to_vec())
        .execute(&mut *tx)
        .await;
    assert!(
        duplicate.is_err(),
        "the UNIQUE column refused the duplicate"
    );
    drop(tx);
    let idemgate_core::transaction::SlotContents::Returned(pending) = slot.take() else {
        panic!("the transaction did not come back");
    };
    pending.rollback().await.expect("rollback");
    for claim in claims {
        let claim = claim.await.expect("claim task").expect("claim");
        assert!(matches!(claim, Claim::Acquired(_)), "{claim:?}");
    }
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(store.pool())
        .await
        .expect("count orders");
    assert_eq!(orders, 0, "the rolled-back turn's order stayed");
    assert_eq!(record_count(&store).await, 9);
}

// --- a streamed answer in the transactional mode ------------------------------------

/// A handler that writes through a `Tx` and answers a stream (PROTOCOL §20):
/// its transaction holds the SQLite writer until the layer settles, so the
/// stream is kept in memory and stored with the completion in that
/// transaction — it flows at once (no wait on the writer it holds), its row
/// commits, and the retry replays it byte-identical without running it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transactional_streamed_answer_commits_with_its_record() {
    use axum::body::Body;
    use axum::http::{Request, StatusCode, header};
    use axum::response::Response;
    use idemgate_core::scope::Principal;
    use idemgate_testkit::http::Answer;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt;

    const EVENTS: [&str; 3] = ["data: a\n\n", "data: b\n\n", "data: c\n\n"];
    let db = TempDb::new();
    let store = db.store(4).await;
    sqlx::query("CREATE TABLE stream_notes (n INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .expect("create");
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = Arc::clone(&runs);
        move |mut tx: Tx| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            sqlx::query("INSERT INTO stream_notes (n) VALUES (1)")
                .execute(&mut *tx)
                .await
                .expect("insert");
            drop(tx);
            let events = futures_util::stream::iter(
                EVENTS.map(|event| Ok::<_, std::io::Error>(axum::body::Bytes::from(event))),
            );
            Response::builder()
                .header(header::CONTENT_TYPE, "text/event-stream")
                .body(Body::from_stream(events))
                .expect("response")
        }
    };
    let app = axum::Router::new()
        .route("/v1/completions", axum::routing::post(handler))
        .route_layer(idemgate::IdempotencyLayer::new(store.clone()))
        .with_state(store.clone());
    let send = || {
        let mut request = Request::post("/v1/completions")
            .header("idempotency-key", "stream-in-a-transaction")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from("{}"))
            .expect("request");
        request
            .extensions_mut()
            .insert(Principal::new("user:streamer"));
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await.expect("infallible");
            tokio::time::timeout(Duration::from_secs(3), Answer::read(response))
                .await
                .expect("the stream ends within 3 s: nothing waits for the writer the transaction holds")
        }
    };
    let first = send().await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!(first.body, EVENTS.concat());
    let notes: i64 = sqlx::query_scalar("SELECT count(*) FROM stream_notes")
        .fetch_one(store.pool())
        .await
        .expect("count");
    assert_eq!(notes, 1, "the handler's row committed with the record");
    let retry = send().await;
    assert_eq!(retry.status, StatusCode::OK, "{retry:?}");
    assert_eq!(retry.headers["idempotent-replayed"], "true");
    assert_eq!(retry.body, first.body, "byte-identical");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// --- the one-transaction mode through the layer (PROTOCOL §23) ---------------------------

/// A keyed POST of `path` to `app` as `user:notes`; `fail` asks the handler
/// for a 500.
async fn send_note(
    app: axum::Router,
    path: &'static str,
    key: &'static str,
    fail: bool,
) -> idemgate_testkit::http::Answer {
    use tower::ServiceExt;
    let mut request = axum::http::Request::post(path).header("idempotency-key", key);
    if fail {
        request = request.header("x-fail", "1");
    }
    let mut request = request.body(axum::body::Body::empty()).expect("request");
    request
        .extensions_mut()
        .insert(idemgate_core::scope::Principal::new("user:notes"));
    idemgate_testkit::http::Answer::read(app.oneshot(request).await.expect("infallible")).await
}

/// The layer in the one-transaction mode over SQLite, a handler that writes a
/// note through its `Tx` and answers the status its request asks for:
/// - a new key is **one** commit of the writer (claim, note and completion
///   together), where the two-phase layer over the same store commits twice;
/// - its retry replays byte-identical without running the handler again;
/// - a 500 rolls back the note and the claim with it: no record is left,
///   and the retry runs the handler again;
/// - a handler that never takes its `Tx` is completed in the claim's
///   transaction all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_transaction_layer_commits_once_and_leaves_nothing_when_it_rolls_back() {
    use axum::http::StatusCode;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let db = TempDb::new();
    let store = db.store(4).await;
    sqlx::query("CREATE TABLE notes (key TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .expect("create");
    let runs = Arc::new(AtomicUsize::new(0));
    let writes_a_note = {
        let runs = Arc::clone(&runs);
        move |mut tx: Tx, headers: axum::http::HeaderMap| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let key = headers["idempotency-key"].to_str().unwrap().to_owned();
            sqlx::query("INSERT INTO notes (key) VALUES (?1)")
                .bind(&key)
                .execute(&mut *tx)
                .await
                .expect("insert");
            let status = match headers.get("x-fail") {
                Some(_) => StatusCode::INTERNAL_SERVER_ERROR,
                None => StatusCode::CREATED,
            };
            (status, format!("note {key}"))
        }
    };
    let router = |layer: idemgate::IdempotencyLayer| {
        axum::Router::new()
            .route("/notes", axum::routing::post(writes_a_note.clone()))
            .route(
                "/untouched",
                axum::routing::post(|| async { (StatusCode::CREATED, "nothing to write") }),
            )
            .route_layer(layer)
            .with_state(store.clone())
    };
    let one_transaction = router(
        idemgate::IdempotencyLayer::new(store.clone())
            .with_one_transaction()
            .expect("SQLite claims inside the handler's transaction"),
    );
    let two_phase = router(idemgate::IdempotencyLayer::new(store.clone()));
    let send = send_note;
    let notes = |key: &'static str| {
        let pool = store.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM notes WHERE key = ?1")
                .bind(key)
                .fetch_one(&pool)
                .await
                .expect("count")
        }
    };

    // Each layer writes a route's execution time once in a while, in a
    // commit of its own: done here, before the commits are counted.
    send(one_transaction.clone(), "/notes", "warm-one", false).await;
    send(two_phase.clone(), "/notes", "warm-two", false).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (records, runs_before) = (record_count(&store).await, runs.load(Ordering::SeqCst));

    let commits = store.writer_stats().commits;
    let first = send(one_transaction.clone(), "/notes", "one", false).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(
        store.writer_stats().commits - commits,
        1,
        "one commit per new key"
    );
    let commits = store.writer_stats().commits;
    let two = send(two_phase, "/notes", "two", false).await;
    assert_eq!(two.status, StatusCode::CREATED, "{two:?}");
    assert_eq!(
        store.writer_stats().commits - commits,
        2,
        "the two-phase claim commits on its own"
    );

    let retry = send(one_transaction.clone(), "/notes", "one", false).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.headers["idempotent-replayed"], "true");
    assert_eq!(retry.body, first.body, "byte-identical");
    assert_eq!(notes("one").await, 1);
    assert_eq!(
        runs.load(Ordering::SeqCst) - runs_before,
        2,
        "the replay ran nothing"
    );

    let failed = send(one_transaction.clone(), "/notes", "failing", true).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(notes("failing").await, 0, "the 500's note rolled back");
    assert_eq!(
        record_count(&store).await - records,
        2,
        "the 500 left no record"
    );
    let rerun = send(one_transaction.clone(), "/notes", "failing", false).await;
    assert_eq!(rerun.status, StatusCode::CREATED, "{rerun:?}");
    assert!(!rerun.headers.contains_key("idempotent-replayed"));
    assert_eq!(
        runs.load(Ordering::SeqCst) - runs_before,
        4,
        "the retry ran the handler again"
    );
    assert_eq!(notes("failing").await, 1);

    let untouched = send(one_transaction.clone(), "/untouched", "untouched", false).await;
    assert_eq!(untouched.status, StatusCode::CREATED);
    let replayed = send(one_transaction, "/untouched", "untouched", false).await;
    assert_eq!(replayed.headers["idempotent-replayed"], "true");
    assert_eq!(replayed.body, untouched.body);
    assert_eq!(record_count(&store).await - records, 4);
}

/// The one-transaction mode with the journal on: the run's `claimed` entry
/// goes into the claim's transaction with `executed`, so a new key is still
/// **one** commit of the writer, and the journal shows claimed, executed;
/// a run that rolls back shows claimed, released, and no `executed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_transaction_layer_journals_inside_its_transaction() {
    use axum::http::StatusCode;
    use idemgate::audit::{AuditEvent, AuditQuery, key_digest};

    let db = TempDb::new();
    let store = db.store(4).await;
    let secret = store.audit_secret().await.expect("secret");
    let journaled = Arc::new(journal_over(Arc::new(store.clone())).await);
    let answers = |mut tx: Tx, headers: axum::http::HeaderMap| async move {
        sqlx::query("SELECT 1")
            .execute(&mut *tx)
            .await
            .expect("a statement");
        match headers.get("x-fail") {
            Some(_) => StatusCode::INTERNAL_SERVER_ERROR,
            None => StatusCode::CREATED,
        }
    };
    let app = axum::Router::new()
        .route("/notes", axum::routing::post(answers))
        .route_layer(
            idemgate::IdempotencyLayer::from_arc(Arc::clone(&journaled) as Arc<dyn Store>)
                .with_one_transaction()
                .expect("the journal keeps the store's one-transaction mode"),
        )
        .with_state(store.clone());
    let send = |key: &'static str, fail: bool| send_note(app.clone(), "/notes", key, fail);
    let events = |key: &'static str| {
        let store = store.clone();
        let digest = key_digest(&secret, key);
        async move {
            store
                .read_audit(&AuditQuery::all(1_000))
                .await
                .expect("read")
                .into_iter()
                .filter(|entry| entry.record.key_digest == digest)
                .map(|entry| entry.record.event())
                .collect::<Vec<_>>()
        }
    };

    // The route's execution time is written once in a while in a commit of
    // its own: done here, before the commits are counted.
    send("warm", false).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let commits = store.writer_stats().commits;
    assert_eq!(send("one", false).await.status, StatusCode::CREATED);
    assert_eq!(
        store.writer_stats().commits - commits,
        1,
        "claim, entries and completion in one commit"
    );
    assert_eq!(
        events("one").await,
        [AuditEvent::Claimed, AuditEvent::Executed]
    );

    let failed = send("failing", true).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    journaled.flush().await;
    assert_eq!(
        events("failing").await,
        [AuditEvent::Claimed, AuditEvent::Released],
        "no executed entry for a run that rolled back"
    );
}

/// Concurrent claims that share a writer batch share one append of their
/// entries: each entry is written once, with its claim, and the chain holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_share_their_batchs_append() {
    use idemgate::audit::{AuditEvent, AuditPartition, AuditQuery, Verifier};

    const CLAIMS: usize = 32;
    let db = TempDb::new();
    let store = db.store(2).await;
    let journaled = Arc::new(journal_over(Arc::new(store.clone())).await);
    let commits = store.writer_stats().commits;
    let start = Arc::new(tokio::sync::Barrier::new(CLAIMS));
    let claims: Vec<_> = (0..CLAIMS)
        .map(|_| {
            let (journaled, start) = (Arc::clone(&journaled), Arc::clone(&start));
            tokio::spawn(async move {
                start.wait().await;
                match journaled.try_claim(&fresh_request()).await.expect("claim") {
                    Claim::Acquired(lease) => lease.operation_id.to_string(),
                    Claim::Existing(_) => panic!("every key is new"),
                }
            })
        })
        .collect();
    let mut operations = Vec::new();
    for claim in claims {
        operations.push(claim.await.expect("task"));
    }
    let batches = store.writer_stats().commits - commits;
    assert!(
        batches < CLAIMS as u64,
        "the claims shared batches: {batches}"
    );
    journaled.flush().await;
    assert_eq!(
        store.writer_stats().commits - commits,
        batches,
        "nothing was left for the journal's own writer"
    );
    let entries = store
        .read_audit(&AuditQuery::all(CLAIMS * 2))
        .await
        .expect("read");
    let mut journalled: Vec<String> = entries
        .iter()
        .map(|entry| {
            assert_eq!(entry.record.event(), AuditEvent::Claimed);
            entry.record.operation_id.clone().expect("an operation")
        })
        .collect();
    journalled.sort();
    operations.sort();
    assert_eq!(journalled, operations, "each claim's entry, once");
    let partitions: Vec<AuditPartition> = store.audit_partitions().await.expect("partitions");
    let mut verifier = Verifier::new(&partitions);
    for entry in &entries {
        verifier.push(entry).unwrap_or_else(|e| panic!("{e}"));
    }
    verifier.finish().expect("the chain verifies");
}
/// With the journal on, a claim's `claimed` entry is appended in the claim's
/// own batch: one commit for both, the entry in the journal when the claim
/// returns, and none left for the journal's own writer to append.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_entry_commits_in_the_claims_batch() {
    use idemgate::audit::{AuditEvent, AuditQuery};
    use idemgate::cache::{ReplayCache, ReplayCacheConfig};
    use idemgate::deadline::WithDeadline;

    // The store alone, and behind the wrappers the server puts between the
    // journal and the store: each passes the entry on to the claim.
    type Stack = fn(Arc<dyn Store>) -> Arc<dyn Store>;
    let stacks: [(&str, Stack); 3] = [
        ("the store", |store| store),
        ("the replay cache", |store| {
            Arc::new(ReplayCache::new(store, ReplayCacheConfig::default()))
        }),
        ("a deadline", |store| {
            Arc::new(WithDeadline::new(store, Duration::from_secs(5)))
        }),
    ];
    for (stack, wrap) in stacks {
        let db = TempDb::new();
        let store = db.store(2).await;
        let journaled = journal_over(wrap(Arc::new(store.clone()))).await;
        let commits = store.writer_stats().commits;
        let Claim::Acquired(lease) = journaled.try_claim(&fresh_request()).await.expect("claim")
        else {
            panic!("a new key is acquired");
        };
        assert_eq!(
            store.writer_stats().commits - commits,
            1,
            "through {stack}: the claim and its entry in one commit"
        );
        let entries = store.read_audit(&AuditQuery::all(10)).await.expect("read");
        assert_eq!(entries.len(), 1, "through {stack}");
        assert_eq!(entries[0].record.event(), AuditEvent::Claimed);
        assert_eq!(
            entries[0].record.operation_id.as_deref(),
            Some(lease.operation_id.to_string().as_str())
        );
        journaled.flush().await;
        assert_eq!(
            store
                .read_audit(&AuditQuery::all(10))
                .await
                .expect("read")
                .len(),
            1,
            "through {stack}: written once"
        );
    }
}

/// The journal, as instance `journal-test`, in front of `store`.
async fn journal_over(store: Arc<dyn Store>) -> idemgate::journal::Journaled {
    let secret = store.audit_secret().await.expect("secret");
    idemgate::journal::Journaled::new(
        store,
        idemgate::journal::JournalConfig {
            instance: "journal-test".into(),
            secret,
        },
    )
}
