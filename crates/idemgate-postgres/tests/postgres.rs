//! `PostgresStore` against a real PostgreSQL: the store conformance suite (directly
//! and behind the replay cache), the SQL stores' table suite and the transactional
//! suite (all from `idemgate-testkit`, on a [`PgHarness`]), and what is PostgreSQL's
//! own: read-only sessions, partitioned tables, SQLSTATE classification, schemas.
//!
//! The server is at `IDEMGATE_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); the tests fail, loudly, when it is
//! unreachable. They share one schema and use random identities; tests that count or
//! delete rows, and every SQL-suite and transactional test, get a schema of their own.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idemgate_core::record::OperationId;
use idemgate_core::scope::IdentityDigest;
use idemgate_core::transaction::{SlotContents, TransactionSlot};
use idemgate_core::{Claim, FencedWrite, LeaseOrigin, Store, StoreError};
use idemgate_postgres::{Error, PostgresStore, PurgeTask, Tx, TxRejection};
use idemgate_testkit::fixtures::{
    acquire, awkward_response, claim_with_ttl, completion, fresh_request,
};
use idemgate_testkit::sql_store::{SqlHarness, StoredIdentity};
use idemgate_testkit::tap::Tap;
use idemgate_testkit::transactional::TransactionalHarness;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgPool};

const SHARED_SCHEMA: &str = "idemgate_test";

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

/// A store in the shared test schema, migrated.
async fn shared_store(max_connections: u32) -> PostgresStore {
    let store = PostgresStore::new(pool(max_connections).await).with_schema(SHARED_SCHEMA);
    store.migrate().await.expect("migrate");
    store
}

async fn conformance_store() -> Arc<dyn Store> {
    Arc::new(shared_store(10).await)
}

mod conformance {
    idemgate_testkit::store_conformance!(super::conformance_store);
}

idemgate_testkit::cached_conformance!(conformance_store);

/// Two instances on one database: what one recorded, the other reads, also
/// once the first is gone (a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn route_history_is_shared_between_instances() {
    idemgate_testkit::conformance::route_history_is_shared(
        conformance_store().await,
        conformance_store().await,
    )
    .await;
}

/// On a schema of its own: the bound evicts other tests' routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn route_history_keeps_a_bounded_number_of_routes() {
    let schema = TempSchema::new().await;
    let store = schema.store();
    store.migrate().await.expect("migrate");
    idemgate_testkit::conformance::route_history_keeps_a_bounded_number_of_routes(Arc::new(store))
        .await;
    assert!(schema.count("idemgate_records_durations").await > 0);
    schema.drop_schema().await;
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

    async fn drop_schema(&self) {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
            self.name
        )))
        .execute(&self.pool)
        .await
        .expect("drop schema");
    }
}

// --- the SQL suites ------------------------------------------------------------------

/// The SQL suites' database: a schema of its own per test (created by the first
/// `migrate()`), holding the records and an `orders` table (one order per
/// operation id).
struct PgHarness {
    schema: TempSchema,
}

async fn harness() -> PgHarness {
    PgHarness {
        schema: TempSchema::new().await,
    }
}

#[async_trait]
impl SqlHarness for PgHarness {
    type Store = PostgresStore;
    const SCHEMA_VERSION: i64 = idemgate_postgres::SCHEMA_VERSION;

    async fn unmigrated(&self, max_connections: u32) -> PostgresStore {
        PostgresStore::new(pool(max_connections).await).with_schema(self.schema.name.clone())
    }

    async fn store(&self, max_connections: u32) -> PostgresStore {
        let store = self.unmigrated(max_connections).await;
        store.migrate().await.expect("migrate");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS \"{}\".orders ( \
                 id BIGSERIAL PRIMARY KEY, \
                 operation_id UUID NOT NULL UNIQUE, \
                 amount BIGINT NOT NULL)",
            self.schema.name
        )))
        .execute(store.pool())
        .await
        .expect("create orders");
        store
    }

    fn unreachable(&self) -> PostgresStore {
        let pool = PgPoolOptions::new()
            .acquire_timeout(Duration::from_millis(500))
            .connect_lazy("postgres://postgres@127.0.0.1:1/test")
            .expect("lazy pool");
        PostgresStore::new(pool)
    }

    async fn migrate(&self, store: &PostgresStore) -> Result<(), Error> {
        store.migrate().await
    }

    fn with_table(&self, store: &PostgresStore, table: &str) -> PostgresStore {
        store.clone().with_table(table)
    }

    async fn schema_version(&self, store: &PostgresStore, table: &str) -> Option<i64> {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT version FROM \"{}\".idemgate_schema_versions WHERE table_name = $1",
            self.schema.name
        )))
        .bind(table)
        .fetch_optional(store.pool())
        .await
        .expect("version row")
    }

    async fn set_schema_version(&self, store: &PostgresStore, table: &str, version: i64) {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE \"{}\".idemgate_schema_versions SET version = $2 WHERE table_name = $1",
            self.schema.name
        )))
        .bind(table)
        .bind(version)
        .execute(store.pool())
        .await
        .expect("set the version");
    }

    async fn has_sqlx_migrations(&self, store: &PostgresStore) -> bool {
        let table: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT to_regclass('\"{}\"._sqlx_migrations')::text",
            self.schema.name
        )))
        .fetch_one(store.pool())
        .await
        .expect("regclass");
        table.is_some()
    }

    async fn records(&self, store: &PostgresStore) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {}",
            store.table_name()
        )))
        .fetch_one(store.pool())
        .await
        .expect("count records")
    }

    async fn stored_identity(
        &self,
        store: &PostgresStore,
        identity: &IdentityDigest,
    ) -> StoredIdentity {
        let (principal, method, path, key) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT principal, method, path, idempotency_key FROM {} WHERE identity = $1",
            store.table_name()
        )))
        .bind(identity.as_bytes().as_slice())
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

    async fn corrupt_headers(&self, store: &PostgresStore, identity: &IdentityDigest) {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET response_headers = '\\x0005'::bytea WHERE identity = $1",
            store.table_name()
        )))
        .bind(identity.as_bytes().as_slice())
        .execute(store.pool())
        .await
        .expect("corrupt the headers");
    }

    async fn purge_expired(&self, store: &PostgresStore, batch: usize) -> Result<u64, StoreError> {
        store.purge_expired(batch).await
    }

    fn spawn_purge(&self, store: &PostgresStore, every: Duration, batch: usize) -> PurgeTask {
        store.spawn_purge(every, batch).expect("spawn")
    }

    async fn finish(&self) {
        self.schema.drop_schema().await;
    }
}

#[async_trait]
impl TransactionalHarness for PgHarness {
    async fn insert_order(
        &self,
        tx: &mut Tx,
        operation_id: OperationId,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{}\".orders (operation_id, amount) VALUES ($1, 4200)",
            self.schema.name
        )))
        .bind(operation_id.as_uuid())
        .execute(&mut **tx)
        .await
        .map(|_| ())
    }

    async fn orders_for(&self, store: &PostgresStore, operation_id: OperationId) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{}\".orders WHERE operation_id = $1",
            self.schema.name
        )))
        .bind(operation_id.as_uuid())
        .fetch_one(store.pool())
        .await
        .expect("count orders")
    }

    async fn orders(&self, _store: &PostgresStore) -> i64 {
        self.schema.count("orders").await
    }
}

mod sql_store {
    idemgate_testkit::sql_store_conformance!(super::harness);
}

mod transactional {
    idemgate_testkit::transactional_conformance!(super::harness);
}

// --- purge ----------------------------------------------------------------------------

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

/// Once current, `migrate()` runs no DDL: it passes even in a read-only session
/// (the rest of what migrations promise is in the SQL suite).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_current_schema_migrates_in_a_read_only_session() {
    let schema = TempSchema::new().await;
    schema.store().migrate().await.expect("migrate");
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
    assert_eq!(snapshot.record.response(), Some(&awkward_response()));
    // The pieces' foreign key references the partitioned table.
    let streaming = acquire(&store, &fresh_request()).await;
    let piece = Bytes::from_static(b"head");
    assert_eq!(
        store
            .append_stream_piece(&streaming, 0, &piece)
            .await
            .expect("append"),
        FencedWrite::Applied
    );
    assert_eq!(
        store
            .read_stream_pieces(&streaming.stream(), 0, 10)
            .await
            .expect("read"),
        [piece]
    );
    assert_eq!(
        store.delete(&streaming).await.expect("delete"),
        FencedWrite::Applied
    );
    for _ in 0..12 {
        claim_with_ttl(&store, Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(store.purge_expired(5).await.expect("purge"), 12);
    assert_eq!(schema.count("idemgate_records").await, 1);
    schema.drop_schema().await;
}

// --- errors ---------------------------------------------------------------------------

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

// --- round trips and a frozen server ---------------------------------------------

/// A store on a pool of `pool_options()` (one connection, `acquire_timeout`)
/// whose connections pass through a [`Tap`] in front of the test PostgreSQL.
async fn tapped_store(acquire_timeout: Duration) -> (PostgresStore, Tap) {
    let options: PgConnectOptions = url().parse().expect("url");
    let tap = Tap::start_to(options.get_host(), options.get_port()).await;
    let pool = PostgresStore::pool_options()
        .max_connections(1)
        .acquire_timeout(acquire_timeout)
        .connect_with(options.host("127.0.0.1").port(tap.addr().port()))
        .await
        .expect("connect through the tap");
    let store = PostgresStore::new(pool).with_schema(SHARED_SCHEMA);
    store.migrate().await.expect("migrate");
    (store, tap)
}

/// The sends `call` made through `tap`, once the pool took its connection back
/// (sqlx pings a returned connection in a task of its own).
async fn sends_of(tap: &Tap, store: &PostgresStore, call: impl Future<Output = ()>) -> usize {
    let before = tap.client_sends();
    call.await;
    wait_until_idle(store).await;
    tap.client_sends() - before
}

/// Runs a statement on the pool's one connection, waits until it is pooled
/// again (used a moment ago: its next checkout sends no ping), then freezes the
/// server behind `tap`.
async fn freeze_after_a_statement(store: &PostgresStore, tap: &Tap) {
    sqlx::query("SELECT 1")
        .execute(store.pool())
        .await
        .expect("a statement while it answers");
    wait_until_idle(store).await;
    tap.freeze();
}

/// Until the pool's one connection is back, after the release's ping answered.
async fn wait_until_idle(store: &PostgresStore) {
    idemgate_testkit::wait::wait_until(
        "the connection back in the pool",
        Duration::from_secs(5),
        || store.pool().num_idle() > 0,
    )
    .await;
}

/// `pool_options()` pings a connection at checkout only after it sat idle for
/// `IDLE_PING_AFTER`: a store call on a connection used a moment ago is its
/// statement and sqlx's release ping (2 round trips), one on a connection idle
/// for longer adds the checkout's ping (3), as sqlx's default does for every
/// checkout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkout_pings_only_a_connection_that_sat_idle() {
    let (store, tap) = tapped_store(Duration::from_secs(5)).await;
    let identity = *fresh_request().identity.digest();
    let get = || async {
        store.get(&identity).await.expect("get");
    };
    sends_of(&tap, &store, get()).await; // the statement's preparation
    for _ in 0..5 {
        assert_eq!(
            sends_of(&tap, &store, get()).await,
            2,
            "a connection in use"
        );
    }
    tokio::time::sleep(idemgate_postgres::IDLE_PING_AFTER + Duration::from_millis(100)).await;
    assert_eq!(
        sends_of(&tap, &store, get()).await,
        3,
        "a connection idle past IDLE_PING_AFTER is pinged first"
    );
}

/// A journal append whose partition's head this store wrote a moment ago is
/// one statement (its send and the release ping: 2), not a transaction that
/// locks and reads the head first (`BEGIN`, the lock, the insert, `COMMIT`
/// and the ping: 5); a head another process moved sends it back to that
/// transaction once (the refused statement and its ping, then 5), and the
/// chain holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_append_is_one_statement_while_the_head_is_known() {
    use idemgate_core::audit::AuditEvent;
    use idemgate_testkit::conformance::{audit_of, audit_record, verify_partition};
    let (store, tap) = tapped_store(Duration::from_secs(5)).await;
    let instance = format!("tapped-{}", uuid::Uuid::new_v4().simple());
    let append = |store: &PostgresStore| {
        let store = store.clone();
        let batch = [
            audit_record(&instance, AuditEvent::Replayed, 1),
            audit_record(&instance, AuditEvent::Conflict, 2),
        ];
        async move { store.append_audit(&batch).await.expect("append_audit") }
    };
    sends_of(&tap, &store, append(&store)).await; // learns the head, prepares
    sends_of(&tap, &store, append(&store)).await; // prepares the one statement
    for _ in 0..3 {
        assert_eq!(sends_of(&tap, &store, append(&store)).await, 2);
    }
    let other = PostgresStore::new(pool(2).await).with_schema(SHARED_SCHEMA);
    append(&other).await;
    assert_eq!(
        sends_of(&tap, &store, append(&store)).await,
        2 + 5,
        "refused, then the locking transaction"
    );
    assert_eq!(sends_of(&tap, &store, append(&store)).await, 2);

    let entries = audit_of(&store, &instance).await;
    assert_eq!(entries.len(), 2 * 8, "every entry");
    assert_eq!(verify_partition(&store, &instance, &entries).await, 16);
    remove_partition(&store, &instance).await;
}

/// Removes the entries a test wrote on `instance` of the shared schema.
async fn remove_partition(store: &PostgresStore, instance: &str) {
    store
        .trim_audit(
            Some(instance),
            idemgate_core::time::Timestamp::now().saturating_add(Duration::from_secs(60)),
            100,
        )
        .await
        .expect("trim_audit");
}

/// One transactional run through `store` (a pool of one connection behind
/// `tap`): a claim, a business transaction, the completion with one
/// `executed` entry of `instance`, the same completion again (final once
/// applied: refused, and it appends nothing), the commit. Answers what the
/// first completion did, and the sends each completion took.
async fn transactional_run(
    store: &PostgresStore,
    tap: &Tap,
    instance: &str,
) -> (FencedWrite, usize, usize) {
    use idemgate_core::audit::AuditEvent;
    use idemgate_sqlx::{BusinessTransaction, SqlStore};
    use idemgate_testkit::conformance::audit_record;
    let lease = acquire(store, &fresh_request()).await;
    let mut transaction = SqlStore::begin(store).await.expect("begin");
    let journal = [audit_record(instance, AuditEvent::Executed, 1)];
    let mut complete = async || {
        let before = tap.client_sends();
        let write = store
            .complete_and_append_in(
                &mut transaction,
                &lease,
                &completion(awkward_response()),
                &journal,
            )
            .await
            .expect("complete_and_append_in");
        (write, tap.client_sends() - before)
    };
    let (write, sends) = complete().await;
    let (again, sends_again) = complete().await;
    assert_eq!(again, FencedWrite::Refused, "a completed record's lease");
    BusinessTransaction::<PostgresStore>::commit(transaction)
        .await
        .expect("commit");
    wait_until_idle(store).await;
    (write, sends, sends_again)
}

/// In a business transaction, the completion and its journal entries are one
/// statement while their chain's head is known (1 send, against the
/// completion's and the compare-and-set's 2). When another store moved that
/// head, the statement completes and appends nothing, and the locking append
/// follows (1 + 2). A refused completion is one send and appends nothing.
/// Every entry lands, in one chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_completion_carries_its_entries_in_one_statement() {
    use idemgate_core::audit::AuditEvent;
    use idemgate_testkit::conformance::{audit_of, audit_record, verify_partition};
    let (store, tap) = tapped_store(Duration::from_secs(5)).await;
    let instance = format!("tx-tapped-{}", uuid::Uuid::new_v4().simple());
    // The head learned, and the statements prepared.
    for _ in 0..2 {
        assert_eq!(
            transactional_run(&store, &tap, &instance).await.0,
            FencedWrite::Applied
        );
    }
    for _ in 0..3 {
        assert_eq!(
            transactional_run(&store, &tap, &instance).await,
            (FencedWrite::Applied, 1, 1)
        );
    }
    let other = PostgresStore::new(pool(2).await).with_schema(SHARED_SCHEMA);
    other
        .append_audit(&[audit_record(&instance, AuditEvent::Replayed, 2)])
        .await
        .expect("another store appends");
    assert_eq!(
        transactional_run(&store, &tap, &instance).await,
        (FencedWrite::Applied, 1 + 2, 1),
        "completed, then the locking append"
    );
    assert_eq!(
        transactional_run(&store, &tap, &instance).await,
        (FencedWrite::Applied, 1, 1)
    );

    let entries = audit_of(&store, &instance).await;
    assert_eq!(entries.len(), 7 + 1, "every entry, the other store's too");
    assert_eq!(verify_partition(&store, &instance, &entries).await, 8);
    remove_partition(&store, &instance).await;
}

/// The journal's locking append (a head another process moved, and every
/// append inside a business transaction) runs statements PostgreSQL settles
/// on a generic plan for, as it does for every statement of the store. Its
/// insert used to join the partitions with `UNNEST` of a parameter, whose
/// generic plan guesses ten rows: on a partitions table of some size (many
/// instances over time, or one bloated by its heads' updates) PostgreSQL
/// planned it anew at every execution — 14 % of its CPU per new key. Read
/// back from `pg_prepared_statements` of the store's one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journals_statements_keep_a_generic_plan() {
    use idemgate_core::audit::AuditEvent;
    use idemgate_testkit::conformance::audit_record;
    let schema = TempSchema::new().await;
    let one = PostgresStore::new(pool(1).await).with_schema(schema.name.clone());
    one.migrate().await.expect("migrate");
    let two = PostgresStore::new(pool(1).await).with_schema(schema.name.clone());
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO \"{s}\".idemgate_records_audit_partitions (instance, head, anchor) \
         SELECT 'other-' || i, '\\x00', '\\x00' FROM generate_series(1, 20000) AS i; \
         ANALYZE \"{s}\".idemgate_records_audit_partitions",
        s = schema.name
    )))
    .execute(&schema.pool)
    .await
    .expect("many partitions");
    let instance = format!("planned-{}", uuid::Uuid::new_v4().simple());
    let batch = || [audit_record(&instance, AuditEvent::Replayed, 1)];
    for _ in 0..8 {
        // `two` moves the head: `one` is refused and takes the locking path.
        two.append_audit(&batch()).await.expect("append_audit");
        one.append_audit(&batch()).await.expect("append_audit");
    }
    let replanned: Vec<(String, i64)> = sqlx::query_as(
        "SELECT statement, custom_plans FROM pg_prepared_statements WHERE custom_plans > 5",
    )
    .fetch_all(one.pool())
    .await
    .expect("pg_prepared_statements");
    schema.drop_schema().await;
    assert!(
        replanned.is_empty(),
        "planned anew at every execution: {replanned:#?}"
    );
}

/// With no ping at checkout, a `BEGIN` sent to a frozen PostgreSQL is bounded on
/// the client's side: `Tx::begin` fails as unavailable within the pool's acquire
/// timeout (the handler's 503). Once the server answers again, the connection
/// is pooled outside any transaction (the given-up `BEGIN` was finished and
/// rolled back, not cut in half) and serves the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_begin_on_a_frozen_server_fails_within_the_acquire_timeout() {
    let acquire_timeout = Duration::from_millis(500);
    let (store, tap) = tapped_store(acquire_timeout).await;
    freeze_after_a_statement(&store, &tap).await;
    let started = std::time::Instant::now();
    let slot = TransactionSlot::new();
    let begun = tokio::time::timeout(Duration::from_secs(10), Tx::begin(&store, &slot))
        .await
        .expect("Tx::begin held past 10 s on a frozen server");
    let took = started.elapsed();
    assert!(
        matches!(
            begun,
            Err(TxRejection::Unavailable(StoreError::Unavailable(_)))
        ),
        "{:?}",
        begun.map(drop)
    );
    assert!(
        took >= acquire_timeout && took < acquire_timeout * 4,
        "answered after {took:?}"
    );
    tap.thaw();
    // The `BEGIN` given up on reached the server once it thawed: the connection
    // comes back outside any transaction. Inside the one a cut `BEGIN` leaves
    // open, `now()` would stay the time of that `BEGIN`.
    wait_until_idle(&store).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let inside_an_old_transaction: bool =
        sqlx::query_scalar("SELECT clock_timestamp() - now() > interval '100 milliseconds'")
            .fetch_one(store.pool())
            .await
            .expect("a statement after the thaw");
    assert!(
        !inside_an_old_transaction,
        "the pooled connection was left inside the given-up transaction"
    );
    let slot = TransactionSlot::new();
    let mut tx = tokio::time::timeout(Duration::from_secs(10), Tx::begin(&store, &slot))
        .await
        .expect("thawed")
        .expect("begin after the thaw");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut *tx)
        .await
        .expect("a statement in the new transaction");
    assert_eq!(one, 1);
}

/// A `Tx::begin` given up on by a deadline of the caller's own (shorter than the
/// pool's) while its `BEGIN` waits on a frozen server leaves an empty
/// transaction in the slot: the layer sees that nothing was written, not a
/// handler that kept its transaction (which it would answer 500).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_begin_given_up_on_leaves_nothing_lent() {
    let (store, tap) = tapped_store(Duration::from_secs(5)).await;
    freeze_after_a_statement(&store, &tap).await;
    let slot = TransactionSlot::new();
    let given_up = tokio::time::timeout(Duration::from_millis(200), Tx::begin(&store, &slot)).await;
    assert!(given_up.is_err(), "the BEGIN answered a frozen server");
    assert!(
        matches!(slot.take(), SlotContents::Returned(_)),
        "the slot still counts the transaction as lent"
    );
    tap.thaw();
    wait_until_idle(&store).await;
}

// --- a newcomer's setup -------------------------------------------------------------

/// A store built with `new(pool)` whose table was never migrated — in a fresh schema,
/// and under a fresh table name in a migrated schema — is `Misconfigured` (by
/// SQLSTATE), and the layer answers 500 `store-misconfigured` without running the
/// handler; migrated, the same store serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmigrated_store_answers_500_misconfigured_until_migrated() {
    use idemgate_testkit::setup::{counting_orders, misconfiguration_code};
    use std::sync::atomic::AtomicUsize;

    let schema = TempSchema::new().await;
    let fresh_table = format!("records_{}", uuid::Uuid::new_v4().simple());
    for store in [
        schema.store(),
        shared_store(2).await.with_table(fresh_table.clone()),
    ] {
        let sqlstate = misconfiguration_code(&store).await;
        assert!(
            matches!(sqlstate.as_deref(), Some("42P01" | "3F000")),
            "{sqlstate:?}"
        );
        let executions = Arc::new(AtomicUsize::new(0));
        let app = counting_orders(Arc::clone(&executions))
            .route_layer(idemgate::IdempotencyLayer::new(store.clone()));
        let migrate = async { store.migrate().await.expect("migrate") };
        idemgate_testkit::setup::misconfigured_until_migrated(&app, &executions, migrate).await;
    }
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE \"{SHARED_SCHEMA}\".\"{fresh_table}_stream_pieces\"; \
         DROP TABLE \"{SHARED_SCHEMA}\".\"{fresh_table}\"; \
         DROP TABLE \"{SHARED_SCHEMA}\".\"{fresh_table}_resource_leases\"; \
         DROP SEQUENCE \"{SHARED_SCHEMA}\".\"{fresh_table}_token_seq\"; \
         DELETE FROM \"{SHARED_SCHEMA}\".idemgate_schema_versions \
         WHERE table_name = '{fresh_table}'"
    )))
    .execute(&schema.pool)
    .await
    .expect("drop the fresh table");
    schema.drop_schema().await;
}

/// `PostgresStore::connect` migrates: on a database whose `search_path` has no
/// record table yet, the store it returns claims, completes and replays at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_is_ready_to_use_without_migrate() {
    let schema = TempSchema::new().await;
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA \"{}\"", schema.name)))
        .execute(&schema.pool)
        .await
        .expect("create schema");
    let separator = if url().contains('?') { '&' } else { '?' };
    let url = format!(
        "{}{separator}options=-c%20search_path%3D{}",
        url(),
        schema.name
    );
    let store = PostgresStore::connect(&url).await.expect("connect");
    idemgate_testkit::setup::ready_to_use(&store).await;
    assert_eq!(schema.count("idemgate_records").await, 1);
    store.pool().close().await;
    schema.drop_schema().await;
}

// --- waiting across instances ---------------------------------------------------------

/// Waits on `digest` through `store` for up to 10 s, from a task of its own, and
/// returns how long it waited.
fn waiter(store: &PostgresStore, digest: IdentityDigest) -> tokio::task::JoinHandle<Duration> {
    let store = store.clone();
    tokio::spawn(async move {
        let start = std::time::Instant::now();
        store
            .wait_for_change(&digest, Duration::from_secs(10))
            .await;
        start.elapsed()
    })
}

/// A waiter on one instance (its own pool and listener) wakes when another
/// instance completes, releases or deletes the record — through `LISTEN/NOTIFY`,
/// well before its 10 s timeout and before the layer's 1 s recheck. (A completion
/// inside a business transaction runs the same statement, so it notifies at
/// commit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instances_end_of_run_wakes_a_waiter_through_notify() {
    let a = shared_store(4).await;
    let b = shared_store(4).await;
    // The first wait starts b's listener; let it settle before measuring.
    b.wait_for_change(
        &IdentityDigest::from_bytes([0; 32]),
        Duration::from_millis(300),
    )
    .await;
    for end in ["complete", "release", "delete"] {
        let request = fresh_request();
        let digest = *request.identity.digest();
        let lease = acquire(&a, &request).await;
        let waited = waiter(&b, digest);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let write = match end {
            "complete" => a.complete(&lease, &completion(awkward_response())).await,
            "release" => a.release(&lease).await,
            _ => a.delete(&lease).await,
        };
        assert_eq!(write.expect(end), FencedWrite::Applied, "{end}");
        let waited = waited.await.expect("waiter");
        assert!(
            waited < Duration::from_millis(300 + 500),
            "{end} on another instance woke the waiter only after {waited:?}"
        );
    }
}

/// Two instances on one database read each other's stream pieces, and a reader
/// waiting on one instance (which marked the record at its first wait) wakes at
/// each piece appended through the other — through `LISTEN/NOTIFY`, well before
/// its 10 s timeout — and, the piece announcements having kept its mark, at the
/// run's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instances_pieces_are_read_and_wake_a_waiter_through_notify() {
    let a = shared_store(4).await;
    let b = shared_store(4).await;
    b.wait_for_change(
        &IdentityDigest::from_bytes([0; 32]),
        Duration::from_millis(300),
    )
    .await;
    let request = fresh_request();
    let digest = *request.identity.digest();
    let lease = acquire(&a, &request).await;
    let stream = lease.stream();
    let read = |store: &PostgresStore| {
        let store = store.clone();
        async move {
            store
                .read_stream_pieces(&stream, 0, 100)
                .await
                .expect("read")
        }
    };
    assert!(read(&b).await.is_empty());
    let sent: Vec<Bytes> = (0..4)
        .map(|i| Bytes::from(format!("data: piece {i}\n\n")))
        .collect();
    for (index, piece) in sent.iter().enumerate() {
        let waited = waiter(&b, digest);
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The last piece goes through b: either instance appends for the run.
        let through = if index + 1 < sent.len() { &a } else { &b };
        assert_eq!(
            through
                .append_stream_piece(&lease, index as u32, piece)
                .await
                .expect("append"),
            FencedWrite::Applied
        );
        let waited = waited.await.expect("waiter");
        assert!(
            waited < Duration::from_millis(300 + 500),
            "piece {index} woke the waiter only after {waited:?}"
        );
        assert_eq!(read(&b).await, sent[..=index], "b after piece {index}");
        assert_eq!(read(&a).await, sent[..=index], "a after piece {index}");
    }
    let waited = waiter(&b, digest);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let response = idemgate_core::record::StoredResponse {
        trailers: Vec::new(),
        body: idemgate_core::record::StoredBody::InPieces(3),
        ..awkward_response()
    };
    assert_eq!(
        a.complete(&lease, &completion(response))
            .await
            .expect("complete"),
        FencedWrite::Applied
    );
    let waited = waited.await.expect("waiter");
    assert!(
        waited < Duration::from_millis(300 + 500),
        "the end of a streamed run woke the waiter only after {waited:?}"
    );
    assert_eq!(
        read(&b).await,
        sent,
        "the completed record names its stream"
    );
}

/// An appended piece notifies only for a marked record, with a payload that
/// says "a piece" (so it does not end the waiting instance's mark).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pieces_notify_only_when_waited_and_say_so() {
    let schema = TempSchema::new().await;
    let store = schema.store();
    store.migrate().await.expect("migrate");
    let mut listener = sqlx::postgres::PgListener::connect(&url())
        .await
        .expect("listener");
    listener
        .listen(&idemgate_channel(&store.table_name()))
        .await
        .expect("listen");
    // The first wait starts the store's listener; let it settle.
    store
        .wait_for_change(
            &IdentityDigest::from_bytes([0; 32]),
            Duration::from_millis(300),
        )
        .await;
    let request = fresh_request();
    let lease = acquire(&store, &request).await;
    let piece = Bytes::from_static(b"head");
    assert_eq!(
        store
            .append_stream_piece(&lease, 0, &piece)
            .await
            .expect("append"),
        FencedWrite::Applied
    );
    let heard = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(heard.is_err(), "an unwaited piece notified: {heard:?}");
    // A waiter marks the record; the next piece is announced.
    let waited = waiter(&store, *request.identity.digest());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        store
            .append_stream_piece(&lease, 1, &piece)
            .await
            .expect("append"),
        FencedWrite::Applied
    );
    let heard = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a waited piece notifies")
        .expect("notification");
    let hex: String = request
        .identity
        .digest()
        .as_bytes()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    assert_eq!(heard.payload(), format!("{hex}+piece"));
    assert!(waited.await.expect("waiter") < Duration::from_secs(5));
    schema.drop_schema().await;
}

/// Pieces go with their record when the purge deletes it (the foreign key's
/// cascade), and a refused append keeps nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purged_records_take_their_pieces_along() {
    let schema = TempSchema::new().await;
    let store = schema.store();
    store.migrate().await.expect("migrate");
    let lease = claim_with_ttl(&store, Duration::from_millis(200)).await;
    for index in 0..3 {
        assert_eq!(
            store
                .append_stream_piece(&lease, index, &Bytes::from_static(b"piece"))
                .await
                .expect("append"),
            FencedWrite::Applied
        );
    }
    assert_eq!(schema.count("idemgate_records_stream_pieces").await, 3);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        store
            .append_stream_piece(&lease, 3, &Bytes::from_static(b"late"))
            .await
            .expect("append"),
        FencedWrite::Refused,
        "an expired record takes no piece"
    );
    assert_eq!(store.purge_expired(10).await.expect("purge"), 1);
    assert_eq!(schema.count("idemgate_records_stream_pieces").await, 0);
    schema.drop_schema().await;
}

/// A run that ends between the waiter's read and its wait is not missed: the
/// waiter's mark finds the record no longer in progress and the wait ends at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_on_a_run_that_already_ended_returns_at_once() {
    let a = shared_store(4).await;
    let b = shared_store(4).await;
    b.wait_for_change(
        &IdentityDigest::from_bytes([0; 32]),
        Duration::from_millis(300),
    )
    .await;
    let request = fresh_request();
    let lease = acquire(&a, &request).await;
    assert_eq!(
        a.complete(&lease, &completion(awkward_response()))
            .await
            .expect("complete"),
        FencedWrite::Applied
    );
    let waited = waiter(&b, *request.identity.digest())
        .await
        .expect("waiter");
    assert!(
        waited < Duration::from_millis(500),
        "waited {waited:?} for a run that had ended"
    );
}

/// Runs nobody waits for announce nothing: a listener hears no notification for
/// them (only a waiter's mark makes the statement that ends a run notify).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwaited_runs_notify_nothing() {
    // A table of its own: other tests' waiters mark records of the shared one.
    let schema = TempSchema::new().await;
    let store = schema.store();
    store.migrate().await.expect("migrate");
    let mut listener = sqlx::postgres::PgListener::connect(&url())
        .await
        .expect("listener");
    listener
        .listen(&idemgate_channel(&store.table_name()))
        .await
        .expect("listen");
    for _ in 0..5 {
        let request = fresh_request();
        let lease = acquire(&store, &request).await;
        assert_eq!(
            store
                .complete(&lease, &completion(awkward_response()))
                .await
                .expect("complete"),
            FencedWrite::Applied
        );
    }
    let heard = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(heard.is_err(), "an unwaited completion notified: {heard:?}");
    schema.drop_schema().await;
}

/// The store's channel name for `qualified_table` (mirrors `changes::channel`).
fn idemgate_channel(qualified_table: &str) -> String {
    let hash = qualified_table
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("idemgate_changes_{hash:016x}")
}
