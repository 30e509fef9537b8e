//! `SqliteStore`: the [`Store`](idemgate_core::Store) on a `sqlx::SqlitePool`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idemgate_core::record::{OperationId, RECORD_FORMAT_VERSION};
use idemgate_core::scope::IdentityDigest;
use idemgate_core::signals::ChangeSignals;
use idemgate_core::{Claim, ClaimRequest, EvictMode, Eviction, StoreError};
use idemgate_sqlx::{PurgeTask, millis};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{AssertSqlSafe, SqlitePool};

use crate::error::{ClaimContended, Error, store_error};
use crate::sql::{self, BEGIN_IMMEDIATE, Statements};

/// How long a connection waits for another's write lock before answering
/// `SQLITE_BUSY` (→ [`StoreError::Unavailable`]).
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Idempotency records in one SQLite file: the embedded default.
///
/// Cheap to clone (an `Arc` inside): clones share the pool and the in-process change
/// signals. Configure with the `with_*` methods before cloning it around.
///
/// [`SqliteStore::open`] gives a store ready to use (file created, table migrated):
///
/// ```no_run
/// # async fn run() -> Result<(), idemgate_sqlite::Error> {
/// let store = idemgate_sqlite::SqliteStore::open("idemgate.db").await?;
/// # Ok(()) }
/// ```
///
/// [`SqliteStore::new`] takes a pool of your own and touches nothing: run
/// [`SqliteStore::migrate`] before the first request, or every request answers
/// [`StoreError::Misconfigured`] (the layer's 500 `store-misconfigured`).
#[derive(Clone, Debug)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: SqlitePool,
    table: String,
    sql: Statements,
    signals: ChangeSignals,
}

impl SqliteStore {
    /// The connect options this crate recommends for `path`: create the file if
    /// missing, WAL journal, `synchronous = FULL` (a completed record survives a power
    /// loss), a [`DEFAULT_BUSY_TIMEOUT`] busy timeout, foreign keys on. Adjust and pass
    /// to a pool of your own, then [`SqliteStore::new`].
    ///
    /// ```
    /// use sqlx::sqlite::SqliteSynchronous;
    /// let options = idemgate_sqlite::SqliteStore::connect_options("idemgate.db")
    ///     .synchronous(SqliteSynchronous::Normal); // faster; may lose the last commits on power loss
    /// ```
    pub fn connect_options(path: impl AsRef<Path>) -> SqliteConnectOptions {
        SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(DEFAULT_BUSY_TIMEOUT)
            .foreign_keys(true)
    }

    /// Opens (or creates) the database file at `path` with
    /// [`SqliteStore::connect_options`], on a pool of 8 connections that waits at most
    /// 5 s for a free one, and runs [`SqliteStore::migrate`]: the store is ready to
    /// use. Opening a file a newer build migrated fails with [`Error::SchemaTooNew`].
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemgate_sqlite::Error> {
    /// let store = idemgate_sqlite::SqliteStore::open("/var/lib/myapp/idemgate.db").await?;
    /// // Hand `store` to `IdempotencyLayer::new`.
    /// # Ok(()) }
    /// ```
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(Self::connect_options(path))
            .await
            .map_err(Error::Connect)?;
        let store = Self::new(pool);
        store.migrate().await?;
        Ok(store)
    }

    /// A store on `pool`, with its records in `idemgate_records`. The pool should use
    /// WAL and a busy timeout (see [`SqliteStore::connect_options`]).
    ///
    /// Nothing is created: the caller runs [`SqliteStore::migrate`] (once per start
    /// is fine) before the store serves. Until then every call fails with
    /// [`StoreError::Misconfigured`], which the layer answers 500
    /// `store-misconfigured` and logs with this fix.
    pub fn new(pool: SqlitePool) -> Self {
        Self::build(pool, sql::DEFAULT_TABLE.to_owned())
    }

    fn build(pool: SqlitePool, table: String) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool,
                sql: Statements::new(&table),
                table,
                signals: ChangeSignals::new(),
            }),
        }
    }

    /// Keeps records in `table` instead of `idemgate_records`. The name is quoted, so
    /// any name is safe; the index is named after it. The renamed table needs its
    /// own [`SqliteStore::migrate`].
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use idemgate_sqlite::SqliteStore;
    /// let pool = sqlx::SqlitePool::connect_with(SqliteStore::connect_options("app.db")).await?;
    /// let store = SqliteStore::new(pool).with_table("idempotency");
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_table(self, table: impl Into<String>) -> Self {
        Self::build(self.inner.pool.clone(), table.into())
    }

    /// The pool the store (and its [`crate::Tx`]) uses.
    pub fn pool(&self) -> &SqlitePool {
        &self.inner.pool
    }

    /// The record table's name.
    pub fn table_name(&self) -> &str {
        &self.inner.table
    }

    /// Creates the record table and its `expires_at` index if they are missing, and
    /// records the schema version in `idemgate_schema_versions` (never in sqlx's
    /// `_sqlx_migrations`, so it lives beside an application's own migrations). Runs
    /// in one `IMMEDIATE` transaction, so concurrent calls run one after the other.
    ///
    /// Fails with [`Error::SchemaTooNew`] when a newer build already migrated the
    /// table further.
    pub async fn migrate(&self) -> Result<(), Error> {
        crate::migrate::run(&self.inner.pool, &self.inner.table).await
    }

    /// Deletes expired records, at most `batch` per statement, until none is left;
    /// returns how many went. Each batch is its own short write, so claims get the
    /// write lock in between. A `batch` of 0 deletes nothing.
    pub async fn purge_expired(&self, batch: usize) -> Result<u64, StoreError> {
        self.purge_now(batch).await
    }

    /// Runs [`SqliteStore::purge_expired`] every `every` on the current tokio runtime,
    /// until the returned handle is dropped or aborted. Failed runs are logged and
    /// retried at the next tick.
    ///
    /// ```no_run
    /// # async fn run(store: idemgate_sqlite::SqliteStore) -> Result<(), idemgate_sqlite::Error> {
    /// let purge = store.spawn_purge(std::time::Duration::from_secs(60), 1_000)?;
    /// // ... serve; dropping `purge` stops it.
    /// # Ok(()) }
    /// ```
    pub fn spawn_purge(&self, every: Duration, batch: usize) -> Result<PurgeTask, Error> {
        self.spawn_purge_task(every, batch)
            .map_err(Error::NoRuntime)
    }

    /// The claim, in one `IMMEDIATE` transaction: the clock is read once the write
    /// lock is held, the upsert runs, and if it changed nothing the record that
    /// blocked it is read under the same lock.
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        let identity = request.identity.digest();
        let scope = request.identity.scope();
        let (mut tx, now) = self.begin_at_now().await?;
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.claim)))
            .bind(identity.as_bytes().to_vec())
            .bind(scope.principal.as_str().to_owned())
            .bind(scope.method.clone())
            .bind(scope.path.clone())
            .bind(request.identity.key().as_str().to_owned())
            .bind(request.fingerprint.as_bytes().to_vec())
            .bind(i64::from(RECORD_FORMAT_VERSION))
            .bind(OperationId::random().as_uuid())
            .bind(now)
            .bind(millis(request.lease))
            .bind(millis(request.ttl))
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error)?;
        // An early return drops `tx`, which rolls the claim back.
        let claim = match row {
            Some(row) => Claim::Acquired(idemgate_sqlx::decode_lease(&row, *identity)?),
            None => {
                let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.read_at)))
                    .bind(identity.as_bytes().to_vec())
                    .bind(now)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(store_error)?;
                match row {
                    Some(row) => Claim::Existing(idemgate_sqlx::decode_snapshot(&row)?),
                    // The insert conflicted, so the row is there under this lock.
                    None => return Err(StoreError::unavailable(ClaimContended)),
                }
            }
        };
        tx.commit().await.map_err(store_error)?;
        Ok(claim)
    }

    /// An IMMEDIATE transaction (the write lock held from its start) and the
    /// store's clock read inside it.
    async fn begin_at_now(
        &self,
    ) -> Result<(sqlx::Transaction<'static, sqlx::Sqlite>, i64), StoreError> {
        let mut tx = self
            .inner
            .pool
            .begin_with(BEGIN_IMMEDIATE)
            .await
            .map_err(store_error)?;
        let now: i64 = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.inner.sql.now)))
            .fetch_one(&mut *tx)
            .await
            .map_err(store_error)?;
        Ok((tx, now))
    }

    /// The operator's conditional delete, under the write lock of an IMMEDIATE
    /// transaction: the delete and the read that explains a refusal see the same
    /// record, since no other writer runs in between.
    async fn evict_record(
        &self,
        identity: &IdentityDigest,
        mode: EvictMode,
    ) -> Result<Eviction, StoreError> {
        let (mut tx, now) = self.begin_at_now().await?;
        let mut row = None;
        for sql in [&self.inner.sql.evict, &self.inner.sql.evict_refused] {
            row = sqlx::query(AssertSqlSafe(Arc::clone(sql)))
                .bind(identity.as_bytes().to_vec())
                .bind(now)
                .bind(mode == EvictMode::Force)
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_error)?;
            if row.is_some() {
                break;
            }
        }
        let eviction = idemgate_sqlx::decode_eviction(row.as_ref())?;
        tx.commit().await.map_err(store_error)?;
        Ok(eviction)
    }
}

idemgate_sqlx::sql_store_methods!(SqliteStore);
