//! What every SQL store does with its table, whatever its dialect, as plain async
//! functions: migrations and their version tracking, corrupt rows, the readable
//! identity stored beside the digest, a database it cannot reach. The SQL stores'
//! test files held these twice, once per backend; [`crate::sql_store_conformance!`]
//! instantiates all of them for one store (feature `sql`).
//!
//! A store's tests describe their database once, in a [`SqlHarness`]: how to open
//! a store on a test database of its own (a PostgreSQL schema, an SQLite file), and
//! the few statements the suite cannot write portably (reading a schema version,
//! corrupting a row). The transactional suite builds on the same harness
//! ([`crate::transactional::TransactionalHarness`]). Each scenario gets a fresh
//! harness, so it can count every record in its database, and ends by calling
//! [`SqlHarness::finish`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use idemgate_core::record::{FencingToken, OperationId};
use idemgate_core::scope::IdentityDigest;
use idemgate_core::time::Timestamp;
use idemgate_core::transaction::TransactionSlot;
use idemgate_core::{FencedWrite, Lease, LeaseOrigin, Store, StoreError};
use idemgate_sqlx::{PurgeTask, SetupError, SqlStore, Tx, TxRejection};

use crate::fixtures::{DAY, acquire, awkward_response, claim_with_ttl, completion, fresh_request};

/// The record table every store migrates unless told otherwise.
pub const DEFAULT_TABLE: &str = "idemgate_records";

/// One SQL store's test database, as the SQL suites need it.
///
/// A harness is made fresh for every scenario and owns a database no other test
/// uses (a PostgreSQL schema, an SQLite file). The methods that only forward to the
/// store (`migrate`, `with_table`, the purge) are here because the stores have them
/// as inherent methods, not on [`SqlStore`].
#[async_trait]
pub trait SqlHarness: Send + Sync + 'static {
    /// The store under test.
    type Store: SqlStore;

    /// A store on a new pool of `max_connections` over this harness's database, as
    /// the store's `new(pool)` makes it: nothing created, nothing migrated.
    async fn unmigrated(&self, max_connections: u32) -> Self::Store;

    /// A store on a new pool of `max_connections` over this harness's database,
    /// migrated (for a [`TransactionalHarness`](crate::transactional::TransactionalHarness),
    /// with the orders table in place too). Two calls give two instances of a
    /// service sharing one database.
    async fn store(&self, max_connections: u32) -> Self::Store;

    /// A store as a restarted instance opens it, once every earlier pool is closed.
    async fn reopen(&self) -> Self::Store {
        self.store(2).await
    }

    /// A store whose database cannot be reached (a closed port, a file that cannot
    /// be opened), on a pool that gives up on a connection within 500 ms.
    fn unreachable(&self) -> Self::Store;

    /// The store's `migrate()`.
    async fn migrate(&self, store: &Self::Store) -> Result<(), SetupError>;

    /// The store's `with_table(table)`: its records in another table of the same
    /// database.
    fn with_table(&self, store: &Self::Store, table: &str) -> Self::Store;

    /// The schema version `idemgate_schema_versions` records for `table`, if any.
    async fn schema_version(&self, store: &Self::Store, table: &str) -> Option<i64>;

    /// Records `version` as `table`'s schema version, as a newer build's migration
    /// would.
    async fn set_schema_version(&self, store: &Self::Store, table: &str, version: i64);

    /// Whether sqlx's own migration table (`_sqlx_migrations`) exists where the
    /// store keeps its tables.
    async fn has_sqlx_migrations(&self, store: &Self::Store) -> bool;

    /// How many idempotency records there are in the store's table, expired or not.
    async fn records(&self, store: &Self::Store) -> i64;

    /// The readable parts of the identity stored beside `identity`'s digest.
    async fn stored_identity(
        &self,
        store: &Self::Store,
        identity: &IdentityDigest,
    ) -> StoredIdentity;

    /// Overwrites the stored response headers of `identity`'s record with bytes
    /// that do not decode.
    async fn corrupt_headers(&self, store: &Self::Store, identity: &IdentityDigest);

    /// The store's `purge_expired(batch)`.
    async fn purge_expired(&self, store: &Self::Store, batch: usize) -> Result<u64, StoreError>;

    /// The store's `spawn_purge(every, batch)`, on the current runtime.
    fn spawn_purge(&self, store: &Self::Store, every: Duration, batch: usize) -> PurgeTask;

    /// Removes this harness's database (what `Drop` cannot do asynchronously).
    async fn finish(&self) {}
}

/// The readable columns a record keeps beside its identity digest, for operators
/// reading the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredIdentity {
    /// The principal's name.
    pub principal: String,
    /// The request method.
    pub method: String,
    /// The request path.
    pub path: String,
    /// The idempotency key.
    pub key: String,
}

/// Instantiates every test of [`crate::sql_store`] for one SQL store, as
/// `#[tokio::test]`s on a multi-threaded runtime. `$factory` is an async fn returning
/// a fresh [`SqlHarness`]; it is called once per test.
///
/// The calling crate needs `tokio` (with `macros` and `rt-multi-thread`) among its
/// dev-dependencies.
#[macro_export]
macro_rules! sql_store_conformance {
    ($factory:path) => {
        $crate::sql_store_conformance!(@tests $factory;
            concurrent_migrations_and_version_tracking,
            undecodable_record_is_corrupt,
            readable_identity_parts_are_stored,
            unreachable_database_is_unavailable,
        );
    };
    (@tests $factory:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                $crate::sql_store::$name(::std::sync::Arc::new($factory().await)).await;
            }
        )*
    };
}

/// Eight instances migrate one fresh database at once (over two pools): all
/// succeed, the version is recorded in `idemgate_schema_versions` (never in sqlx's
/// `_sqlx_migrations`), a custom table keeps its own version row and works, and a
/// table a newer build migrated is refused with [`SetupError::SchemaTooNew`].
pub async fn concurrent_migrations_and_version_tracking<H: SqlHarness>(harness: Arc<H>) {
    let pools = [harness.unmigrated(4).await, harness.unmigrated(4).await];
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (harness, store) = (Arc::clone(&harness), pools[i % 2].clone());
            tokio::spawn(async move { harness.migrate(&store).await })
        })
        .collect();
    for task in tasks {
        task.await.expect("task").expect("concurrent migrate");
    }
    let store = &pools[0];
    assert_eq!(harness.schema_version(store, DEFAULT_TABLE).await, Some(1));
    assert!(
        !harness.has_sqlx_migrations(store).await,
        "the store must not use sqlx's migration table"
    );

    // A custom table (a name that needs quoting) keeps its own version row.
    let custom_table = "payments-keys v1";
    let custom = harness.with_table(store, custom_table);
    harness
        .migrate(&custom)
        .await
        .expect("migrate custom table");
    claim_with_ttl(&custom, DAY).await;
    assert_eq!(harness.records(&custom).await, 1);
    assert_eq!(harness.schema_version(store, custom_table).await, Some(1));

    harness.set_schema_version(store, DEFAULT_TABLE, 99).await;
    let err = harness.migrate(store).await.expect_err("newer schema");
    assert!(
        matches!(
            err,
            SetupError::SchemaTooNew {
                found: 99,
                supported: 1
            }
        ),
        "{err:?}"
    );
    harness.finish().await;
}

/// A record that cannot be decoded is `Corrupt`, not a panic, for a read and for a
/// claim.
pub async fn undecodable_record_is_corrupt<H: SqlHarness>(harness: Arc<H>) {
    let store = harness.store(2).await;
    let request = fresh_request();
    let lease = acquire(&store, &request).await;
    let write = store
        .complete(&lease, &completion(awkward_response()))
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Applied);
    harness.corrupt_headers(&store, &lease.identity).await;
    let err = store
        .get(request.identity.digest())
        .await
        .expect_err("corrupt");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    let err = store.try_claim(&request).await.expect_err("corrupt");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    harness.finish().await;
}

/// The record's readable parts (principal, method, path, key) are stored beside
/// the digest, as the request had them.
pub async fn readable_identity_parts_are_stored<H: SqlHarness>(harness: Arc<H>) {
    let store = harness.store(2).await;
    let request = fresh_request();
    acquire(&store, &request).await;
    let scope = request.identity.scope();
    assert_eq!(
        harness
            .stored_identity(&store, request.identity.digest())
            .await,
        StoredIdentity {
            principal: scope.principal.as_str().to_owned(),
            method: "POST".to_owned(),
            path: "/orders".to_owned(),
            key: request.identity.key().as_str().to_owned(),
        }
    );
    harness.finish().await;
}

/// A database the store cannot reach: every method (and a transactional
/// `Tx::begin`) answers `Unavailable`, quickly. A closed pool too.
pub async fn unreachable_database_is_unavailable<H: SqlHarness>(harness: Arc<H>) {
    let store = harness.unreachable();
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
        token: FencingToken(1),
        origin: LeaseOrigin::New,
        locked_until: Timestamp::now(),
    };
    let err = store
        .complete(&lease, &completion(awkward_response()))
        .await
        .expect_err("unreachable");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let err = harness
        .purge_expired(&store, 10)
        .await
        .expect_err("unreachable");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let slot = TransactionSlot::new();
    let err = Tx::begin(&store, &slot).await.expect_err("unreachable");
    assert!(matches!(err, TxRejection::Unavailable(_)), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );

    let store = harness.store(2).await;
    store.pool().close().await;
    let err = store.try_claim(&request).await.expect_err("closed");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    harness.finish().await;
}
