//! `SqliteStore`: the [`Store`](idemgate_core::Store) on a `sqlx::SqlitePool`.

use std::borrow::Cow;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idemgate_core::audit::{
    AuditEntry, AuditPartition, AuditQuery, AuditRecord, AuditSecret, ExpiryJournal,
};
use idemgate_core::resource_lease::{LeaseAcquisition, LeaseToken, ResourceId, ResourceLease};
use idemgate_core::scope::IdentityDigest;
use idemgate_core::signals::ChangeSignals;
use idemgate_core::stream::StreamId;
use idemgate_core::time::Timestamp;
use idemgate_core::{
    Claim, ClaimRequest, Completion, EvictMode, Eviction, FencedWrite, Lease, Snapshot, Store,
    StoreError,
};
use idemgate_sqlx::{CompletionColumns, PurgeTask, applied, millis, token_param};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{AssertSqlSafe, SqliteConnection, SqlitePool};

use crate::audit::{self, AuditNames, AuditWrite};
use crate::durations::{self, DurationStatements};
use crate::error::{Error, store_error};
use crate::pieces::PieceStatements;
use crate::sql::{self, Statements, quote};
use crate::writer::{Op, Statement, Writer, WriterStats, WriterTransaction};

/// How long a connection waits for another's write lock before answering
/// `SQLITE_BUSY` (→ [`StoreError::Unavailable`]).
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a waiter reads the file again when no write of this process woke
/// it: another process sharing the file announces nothing.
const POLL: Duration = Duration::from_millis(250);

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
    /// The readers' pool (and the options the writer opens its connection with).
    pool: SqlitePool,
    table: String,
    sql: Arc<Statements>,
    signals: ChangeSignals,
    /// Every write goes through it (see the crate docs, "How each operation runs").
    writer: Writer,
    /// The journal's tables (`crate::audit`).
    audit: AuditNames,
    /// The routes' execution histories (`crate::durations`).
    durations: DurationStatements,
    /// Streams recorded in pieces (`crate::pieces`).
    pieces: PieceStatements,
    /// Set once the journal is on: purges journal what they delete
    /// (`Store::journal_expiries`).
    expiries: OnceLock<ExpiryJournal>,
}

impl SqliteStore {
    /// The connect options this crate recommends for `path`: create the file if
    /// missing, WAL journal, `synchronous = FULL` (a completed record survives a power
    /// loss), a [`DEFAULT_BUSY_TIMEOUT`] busy timeout, foreign keys on, temporary
    /// data (statement journals) in memory. Adjust and pass
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
            // A statement that may fail halfway inside the writer's batch (a
            // multi-row journal append, its chain trigger) first copies each
            // page it changes into a statement journal; in memory that copy
            // is not two more writes to a temporary file per page.
            .pragma("temp_store", "memory")
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
        let sql = Arc::new(Statements::new(&table));
        let audit = AuditNames::new(&table);
        Self {
            inner: Arc::new(Inner {
                writer: Writer::new(
                    pool.clone(),
                    Arc::clone(&sql),
                    audit.clone(),
                    DEFAULT_BUSY_TIMEOUT,
                ),
                pool,
                sql,
                audit,
                durations: DurationStatements::new(&table),
                pieces: PieceStatements::new(&table),
                table,
                signals: ChangeSignals::new(),
                expiries: OnceLock::new(),
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

    /// The pool the store reads on. Its writes, and every [`crate::Tx`], run on
    /// the store's one writer connection, opened with this pool's connect options
    /// (see the crate docs, "How each operation runs").
    pub fn pool(&self) -> &SqlitePool {
        &self.inner.pool
    }

    /// What the writer has done so far: SQLite's own count of its commits, and
    /// the writes answered. Fewer commits than writes means batches were shared.
    pub fn writer_stats(&self) -> WriterStats {
        self.inner.writer.stats()
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
    ///
    /// With the journal on ([`Store::journal_expiries`]), each batch journals
    /// what it deletes as `expired`, in the same savepoint.
    pub async fn purge_expired(&self, batch: usize) -> Result<u64, StoreError> {
        if let Some(journal) = self.inner.expiries.get() {
            return idemgate_sqlx::purge_in_batches(batch, |limit| {
                let write = AuditWrite::Expire {
                    names: self.inner.audit.clone(),
                    records: quote(&self.inner.table),
                    journal: journal.clone(),
                    limit,
                };
                self.inner.writer.run(|reply| Op::Audit { write, reply })
            })
            .await;
        }
        idemgate_sqlx::purge_in_batches(batch, |limit| {
            let statement =
                sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.purge))).bind(limit);
            self.inner
                .writer
                .run(|reply| Op::Execute { statement, reply })
        })
        .await
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
        let store = self.clone();
        PurgeTask::spawn(every, move || {
            let store = store.clone();
            async move { store.purge_expired(batch).await }
        })
        .map_err(Error::NoRuntime)
    }

    /// The claim. A record that is there and that this request may not take is
    /// answered from a read on the pool, without waiting for the writer (a replay,
    /// a 409, a 422); anything else goes to the writer, whose upsert is the one
    /// atomic claim (it restates `Record::claim_origin` in SQL).
    /// The claim; with `entry`, its journal entry appended in the claim's
    /// batch when it acquires (answered: whether it was).
    async fn claim(
        &self,
        request: &ClaimRequest,
        entry: Option<&AuditRecord>,
    ) -> Result<(Claim, bool), StoreError> {
        if let Some(snapshot) = self.read(request.identity.digest()).await?
            && snapshot
                .record
                .claim_origin(&request.fingerprint, snapshot.now)
                .is_none()
        {
            return Ok((Claim::Existing(snapshot), false));
        }
        let request = request.clone();
        let entry = entry.map(|entry| Box::new(entry.clone()));
        self.inner
            .writer
            .run(|reply| Op::Claim {
                request,
                entry,
                reply,
            })
            .await
    }

    /// The record as the pool sees it now (committed writes only).
    async fn read(&self, identity: &IdentityDigest) -> Result<Option<Snapshot>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.read)))
            .bind(identity.as_bytes().to_vec())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)?;
        row.as_ref().map(idemgate_sqlx::decode_snapshot).transpose()
    }

    /// A fenced statement (`sql`, parameters 1–3: identity, operation id, token),
    /// ready for more parameters; `None` for a token no record can hold.
    fn fenced(&self, sql: &Arc<str>, lease: &Lease) -> Option<Statement> {
        let token = token_param(lease.token)?;
        Some(
            sqlx::query(AssertSqlSafe(Arc::clone(sql)))
                .bind(lease.identity.as_bytes().to_vec())
                .bind(lease.operation_id.as_uuid())
                .bind(token),
        )
    }

    /// The fenced completion of `lease` with `completion`.
    fn completion(&self, lease: &Lease, completion: &Completion) -> Option<Statement> {
        let columns = CompletionColumns::of(completion);
        Some(
            self.fenced(&self.inner.sql.complete, lease)?
                .bind(columns.status)
                .bind(i32::from(columns.response_status))
                .bind(columns.headers)
                .bind(columns.body.map(Cow::into_owned))
                .bind(columns.retained)
                .bind(columns.ttl_ms),
        )
    }

    /// Runs a fenced write through the writer; wakes in-process waiters when it
    /// applied and `notify` says the record changed for them.
    async fn write(
        &self,
        statement: Option<Statement>,
        lease: &Lease,
        notify: bool,
    ) -> Result<FencedWrite, StoreError> {
        let Some(statement) = statement else {
            return Ok(FencedWrite::Refused);
        };
        let rows = self
            .inner
            .writer
            .run(|reply| Op::Execute { statement, reply })
            .await?;
        let write = applied(rows);
        if notify && write == FencedWrite::Applied {
            self.inner.signals.notify(&lease.identity);
        }
        Ok(write)
    }

    /// The fenced completion on `connection` (a transactional turn), without
    /// committing.
    pub(crate) async fn complete_on(
        &self,
        connection: &mut SqliteConnection,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<FencedWrite, StoreError> {
        let Some(statement) = self.completion(lease, completion) else {
            return Ok(FencedWrite::Refused);
        };
        let done = statement.execute(connection).await.map_err(store_error)?;
        Ok(applied(done.rows_affected()))
    }

    /// A transactional turn on the writer's connection (for [`crate::Tx`]).
    pub(crate) async fn lend_writer(&self) -> Result<WriterTransaction, StoreError> {
        self.inner.writer.run(|lend| Op::Turn { lend }).await
    }

    /// The claim on a lent writer connection (the one-transaction mode).
    pub(crate) async fn claim_in_turn(
        &self,
        connection: &mut sqlx::SqliteConnection,
        request: &ClaimRequest,
    ) -> Result<Claim, StoreError> {
        crate::writer::claim_in_turn(connection, &self.inner.sql, request).await
    }

    pub(crate) fn signals(&self) -> &ChangeSignals {
        &self.inner.signals
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn try_claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        self.claim(request, None).await.map(|(claim, _)| claim)
    }

    /// The entry rides in the claim's batch: no batch of its own, and no
    /// wait for the journal's writer.
    async fn try_claim_journaled(
        &self,
        request: &ClaimRequest,
        entry: &AuditRecord,
    ) -> Result<(Claim, bool), StoreError> {
        self.claim(request, Some(entry)).await
    }

    fn supports_one_transaction(&self) -> bool {
        true
    }

    /// A turn on the writer, the claim its first statement: a concurrent claim
    /// of the same key waits for the writer (as every write does) and then
    /// finds the record committed. The writer's patience bounds the wait, not
    /// `lock_wait`.
    async fn claim_in_transaction(
        &self,
        request: &ClaimRequest,
        lock_wait: Duration,
    ) -> Result<idemgate_core::transaction::ClaimInTransaction, StoreError> {
        idemgate_sqlx::claim_in_transaction(self, request, lock_wait).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<FencedWrite, StoreError> {
        self.write(self.completion(lease, completion), lease, true)
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        self.write(self.fenced(&self.inner.sql.release, lease), lease, true)
            .await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<FencedWrite, StoreError> {
        let statement = self
            .fenced(&self.inner.sql.renew, lease)
            .map(|statement| statement.bind(millis(lease_for)));
        self.write(statement, lease, false).await
    }

    async fn delete(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        self.write(self.fenced(&self.inner.sql.delete, lease), lease, true)
            .await
    }

    async fn evict(
        &self,
        identity: &IdentityDigest,
        mode: EvictMode,
    ) -> Result<Eviction, StoreError> {
        let eviction = self
            .inner
            .writer
            .run(|reply| Op::Evict {
                identity: *identity,
                mode,
                reply,
            })
            .await?;
        if matches!(eviction, Eviction::Evicted { .. }) {
            self.inner.signals.notify(identity);
        }
        Ok(eviction)
    }

    async fn get(&self, identity: &IdentityDigest) -> Result<Option<Snapshot>, StoreError> {
        self.read(identity).await
    }

    /// Through the writer, like every write: the upsert in `sql.rs` is the one
    /// atomic step, and it answers only once its batch committed.
    async fn acquire_resource_lease(
        &self,
        resource: &ResourceId,
        ttl: Duration,
    ) -> Result<LeaseAcquisition, StoreError> {
        let token = LeaseToken::random();
        let statement = sqlx::query(AssertSqlSafe(Arc::clone(
            &self.inner.sql.acquire_resource_lease,
        )))
        .bind(resource.as_bytes().to_vec())
        .bind(token.as_bytes().to_vec())
        .bind(millis(ttl));
        let row = self
            .inner
            .writer
            .run(|reply| Op::Fetch { statement, reply })
            .await?
            .ok_or_else(|| idemgate_sqlx::corrupt("the resource lease upsert returned no row"))?;
        idemgate_sqlx::decode_lease_acquisition(&row, *resource, token)
    }

    async fn release_resource_lease(
        &self,
        lease: &ResourceLease,
    ) -> Result<FencedWrite, StoreError> {
        let statement = sqlx::query(AssertSqlSafe(Arc::clone(
            &self.inner.sql.release_resource_lease,
        )))
        .bind(lease.resource.as_bytes().to_vec())
        .bind(lease.token.as_bytes().to_vec());
        let rows = self
            .inner
            .writer
            .run(|reply| Op::Execute { statement, reply })
            .await?;
        Ok(applied(rows))
    }

    fn journal_expiries(&self, journal: ExpiryJournal) {
        let _ = self.inner.expiries.set(journal);
    }

    /// Through the writer, in a savepoint of its batch (`crate::audit`).
    async fn append_audit(&self, records: &[AuditRecord]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let write = AuditWrite::Append {
            names: self.inner.audit.clone(),
            records: records.to_vec(),
        };
        self.inner
            .writer
            .run(|reply| Op::Audit { write, reply })
            .await
            .map(drop)
    }

    async fn read_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        audit::read(&self.inner.pool, &self.inner.audit, query).await
    }

    async fn audit_partitions(&self) -> Result<Vec<AuditPartition>, StoreError> {
        audit::partitions(&self.inner.pool, &self.inner.audit).await
    }

    async fn trim_audit(
        &self,
        instance: Option<&str>,
        before: Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        let write = AuditWrite::Trim {
            names: self.inner.audit.clone(),
            instance: instance.map(str::to_owned),
            before: before.as_millis(),
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
        };
        self.inner
            .writer
            .run(|reply| Op::Audit { write, reply })
            .await
    }

    /// Through the writer: one statement in its batch (`crate::durations`).
    async fn record_duration(&self, route: &str, duration: Duration) -> Result<(), StoreError> {
        let statement = self.inner.durations.record(route, duration);
        self.inner
            .writer
            .run(|reply| Op::Execute { statement, reply })
            .await
            .map(drop)
    }

    /// Through the writer, fenced (`crate::pieces`); wakes this process's
    /// readers (another process sharing the file reads on at its next poll).
    async fn append_stream_piece(
        &self,
        lease: &Lease,
        index: u32,
        piece: &Bytes,
    ) -> Result<FencedWrite, StoreError> {
        let statement = self.inner.pieces.append(&lease.stream(), index, piece);
        self.write(statement, lease, true).await
    }

    async fn read_stream_pieces(
        &self,
        stream: &StreamId,
        from: u32,
        limit: u32,
    ) -> Result<Vec<Bytes>, StoreError> {
        self.inner
            .pieces
            .read(&self.inner.pool, stream, from, limit)
            .await
    }

    async fn route_durations(&self, route: &str) -> Result<Vec<Duration>, StoreError> {
        durations::read(&self.inner.pool, &self.inner.durations, route).await
    }

    async fn audit_secret(&self) -> Result<AuditSecret, StoreError> {
        let statement = sqlx::query(AssertSqlSafe(self.inner.audit.secret_upsert()))
            .bind(AuditSecret::random().as_bytes().to_vec());
        let row = self
            .inner
            .writer
            .run(|reply| Op::Fetch { statement, reply })
            .await?
            .ok_or_else(|| idemgate_sqlx::corrupt("the journal secret upsert returned no row"))?;
        let bytes: Vec<u8> = sqlx::Row::try_get(&row, 0).map_err(StoreError::corrupt)?;
        let bytes: [u8; 32] = bytes
            .try_into()
            .map_err(|_| idemgate_sqlx::corrupt("the journal secret is not 32 bytes"))?;
        Ok(AuditSecret::from_bytes(bytes))
    }

    /// Wakes at once on this store's own writes (every writer of the file in
    /// this process goes through it); another process writing the same file
    /// announces nothing, so the wait also ends every 250 ms and the caller
    /// reads the file again.
    async fn wait_for_change(&self, identity: &IdentityDigest, timeout: Duration) {
        self.inner.signals.wait(identity, timeout.min(POLL)).await;
    }
}
