//! `PostgresStore`: the [`Store`](idemgate_core::Store) on a `sqlx::PgPool`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use idemgate_core::audit::{
    AuditEntry, AuditPartition, AuditQuery, AuditRecord, AuditSecret, ExpiryJournal,
};
use idemgate_core::fingerprint::FieldDigests;
use idemgate_core::record::{OperationId, RECORD_FORMAT_VERSION};
use idemgate_core::scope::IdentityDigest;
use idemgate_core::signals::ChangeSignals;
use idemgate_core::stream::StreamId;
use idemgate_core::time::Timestamp;
use idemgate_core::{
    Claim, ClaimRequest, Completion, EvictMode, Eviction, FencedWrite, Lease, StoreError,
};
use idemgate_sqlx::{PurgeTask, millis};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, Connection, PgPool, Row};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::audit::{self, AuditNames, CompletedAndAppended, WriterHint};
use crate::changes::{self, Announcements};
use crate::durations::{self, DurationStatements};
use crate::error::{ClaimContended, Error, store_error};
use crate::pieces::{self, PieceStatements};
use crate::sql::{self, Names, Statements};

/// The pool size [`PostgresStore::connect`] opens.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// How long [`PostgresStore::connect`]'s pool waits for a free connection before a
/// call fails with [`StoreError::Unavailable`] (the layer's 503).
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a pooled connection may sit idle before its checkout pings it
/// ([`PostgresStore::pool_options`]).
pub const IDLE_PING_AFTER: Duration = Duration::from_secs(1);

/// How often one claim re-runs when the record changes between its statements.
const CLAIM_ATTEMPTS: usize = 4;

/// Idempotency records in PostgreSQL.
///
/// Cheap to clone (an `Arc` inside): clones share the pool and the in-process
/// change signals. Configure with the `with_*` methods before cloning it around.
///
/// [`PostgresStore::connect`] gives a store ready to use (connected, table
/// migrated):
///
/// ```no_run
/// # async fn run() -> Result<(), idemgate_postgres::Error> {
/// let store = idemgate_postgres::PostgresStore::connect("postgres://app@127.0.0.1/app").await?;
/// # Ok(()) }
/// ```
///
/// [`PostgresStore::new`] takes a pool of your own and touches nothing: run
/// [`PostgresStore::migrate`] before the first request, or every request answers
/// [`StoreError::Misconfigured`] (the layer's 500 `store-misconfigured`).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/app").await?;
/// let store = idemgate_postgres::PostgresStore::new(pool).with_schema("idemgate");
/// store.migrate().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    names: Names,
    sql: Statements,
    /// The journal's tables (`crate::audit`).
    audit: AuditNames,
    /// What this store's journal appends learned (`crate::audit::WriterHint`).
    audit_hint: WriterHint,
    /// The transactional completion with its journal entries, in one
    /// statement (`crate::audit::complete_and_append_statement`).
    complete_and_append: Arc<str>,
    /// The routes' execution histories (`crate::durations`).
    durations: DurationStatements,
    /// The streams recorded in pieces (`crate::pieces`).
    pieces: PieceStatements,
    signals: Arc<ChangeSignals>,
    /// What this instance marked; see [`crate::changes`].
    announcements: Arc<Announcements>,
    /// Whether the listener's `LISTEN` is in effect.
    listening: watch::Sender<bool>,
    /// The listener, started at the first wait.
    listener: OnceLock<AbortHandle>,
    /// Set once the journal is on: purges journal what they delete
    /// (`Store::journal_expiries`).
    expiries: OnceLock<ExpiryJournal>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.listener.get() {
            task.abort();
        }
    }
}

impl PostgresStore {
    /// Connects to `url` on a pool of [`DEFAULT_MAX_CONNECTIONS`] connections that
    /// waits at most [`DEFAULT_ACQUIRE_TIMEOUT`] for a free one, and runs
    /// [`PostgresStore::migrate`] for `idemgate_records` on the `search_path`: the
    /// store is ready to use. For other pool settings, a TLS setup or another table,
    /// build the pool yourself and use [`PostgresStore::new`].
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemgate_postgres::Error> {
    /// let store = idemgate_postgres::PostgresStore::connect("postgres://app@127.0.0.1/app").await?;
    /// // Hand `store` to `IdempotencyLayer::new`.
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let pool = Self::pool_options()
            .connect(url)
            .await
            .map_err(Error::Connect)?;
        let store = Self::new(pool);
        store.migrate().await?;
        Ok(store)
    }

    /// The pool settings [`PostgresStore::connect`] uses, to start from when
    /// building a pool of your own: [`DEFAULT_MAX_CONNECTIONS`],
    /// [`DEFAULT_ACQUIRE_TIMEOUT`], and a checkout that pings only a connection
    /// idle for [`IDLE_PING_AFTER`] or longer.
    ///
    /// sqlx's default pings every connection it hands out: one more round trip
    /// before the first statement of every checkout, and a new key checks out
    /// twice (the claim, then the business transaction). A connection used less
    /// than a second ago is alive as far as a ping can tell; one that died since
    /// fails its statement instead, as [`StoreError::Unavailable`] (the layer's
    /// 503 with `Retry-After`, safe to retry), and sqlx does not pool it again.
    ///
    /// What the ping also did, bound a `BEGIN` on a frozen server by the acquire
    /// timeout, the store does itself: every call of the layer is bounded by its
    /// store timeout, and [`Tx`](crate::Tx) bounds its checkout and `BEGIN`
    /// together by the pool's acquire timeout.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = idemgate_postgres::PostgresStore::pool_options()
    ///     .max_connections(32)
    ///     .connect("postgres://app@127.0.0.1/app")
    ///     .await?;
    /// let store = idemgate_postgres::PostgresStore::new(pool);
    /// # Ok(()) }
    /// ```
    pub fn pool_options() -> PgPoolOptions {
        PgPoolOptions::new()
            .max_connections(DEFAULT_MAX_CONNECTIONS)
            .acquire_timeout(DEFAULT_ACQUIRE_TIMEOUT)
            .test_before_acquire(false)
            .before_acquire(|connection, meta| {
                Box::pin(async move {
                    if meta.idle_for >= IDLE_PING_AFTER {
                        connection.ping().await?;
                    }
                    Ok(true)
                })
            })
    }

    /// A store on `pool`, with its records in `idemgate_records` on the connection's
    /// `search_path`.
    ///
    /// Nothing is created: the caller runs [`PostgresStore::migrate`] (once per
    /// start is fine, from many instances at once) before the store serves. Until
    /// then every call fails with [`StoreError::Misconfigured`], which the layer
    /// answers 500 `store-misconfigured` and logs with this fix.
    pub fn new(pool: PgPool) -> Self {
        Self::build(
            pool,
            Names {
                schema: None,
                table: sql::DEFAULT_TABLE.to_owned(),
            },
        )
    }

    fn build(pool: PgPool, names: Names) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool,
                sql: Statements::new(&names),
                audit: AuditNames::new(&names),
                audit_hint: WriterHint::default(),
                complete_and_append: audit::complete_and_append_statement(
                    &names,
                    &sql::complete_update(&names),
                    &changes::channel(&names.table()),
                )
                .into(),
                durations: DurationStatements::new(&names),
                pieces: PieceStatements::new(&names),
                names,
                signals: Arc::new(ChangeSignals::new()),
                announcements: Arc::default(),
                listening: watch::Sender::new(false),
                listener: OnceLock::new(),
                expiries: OnceLock::new(),
            }),
        }
    }

    fn rebuild(self, change: impl FnOnce(&mut Names)) -> Self {
        let mut names = self.inner.names.clone();
        change(&mut names);
        Self::build(self.inner.pool.clone(), names)
    }

    /// Keeps records in `table` instead of `idemgate_records`. The name is quoted, so
    /// any name is safe; the sequence and index are named after it. The renamed
    /// table needs its own [`PostgresStore::migrate`].
    ///
    /// ```no_run
    /// # let pool: sqlx::PgPool = unimplemented!();
    /// let store = idemgate_postgres::PostgresStore::new(pool).with_table("payments_idempotency");
    /// ```
    pub fn with_table(self, table: impl Into<String>) -> Self {
        let table = table.into();
        self.rebuild(|names| names.table = table)
    }

    /// Keeps the record table (and the schema-version table) in `schema`, created by
    /// [`PostgresStore::migrate`] if missing, instead of the `search_path`.
    ///
    /// ```no_run
    /// # let pool: sqlx::PgPool = unimplemented!();
    /// let store = idemgate_postgres::PostgresStore::new(pool).with_schema("idemgate");
    /// ```
    pub fn with_schema(self, schema: impl Into<String>) -> Self {
        let schema = schema.into();
        self.rebuild(|names| names.schema = Some(schema))
    }

    /// The pool the store (and its [`crate::Tx`]) uses.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The record table's qualified, quoted name, for operational queries.
    pub fn table_name(&self) -> String {
        self.inner.names.table()
    }

    /// Creates the record table, its token sequence and its `expires_at` index if
    /// they are missing, and records the schema version in `idemgate_schema_versions`
    /// (never in sqlx's `_sqlx_migrations`, so it lives beside an application's own
    /// migrations). Safe to run from many instances at once: it runs in one
    /// transaction under a transaction-scoped advisory lock.
    ///
    /// Fails with [`Error::SchemaTooNew`] when a newer build already migrated the
    /// table further.
    pub async fn migrate(&self) -> Result<(), Error> {
        crate::migrate::run(&self.inner.pool, &self.inner.names).await
    }

    /// Deletes expired records, at most `batch` per statement, until none is left;
    /// returns how many went. Each batch is its own short statement and skips rows
    /// that a claim holds locked, so purging never blocks traffic for long.
    /// A `batch` of 0 deletes nothing.
    ///
    /// With the journal on ([`idemgate_core::Store::journal_expiries`]), each batch journals
    /// what it deletes as `expired`, in the same transaction.
    pub async fn purge_expired(&self, batch: usize) -> Result<u64, StoreError> {
        let Some(journal) = self.inner.expiries.get() else {
            return self.purge_now(batch).await;
        };
        let table = self.inner.names.table();
        idemgate_sqlx::purge_in_batches(batch, |limit| {
            audit::expire(&self.inner.pool, &self.inner.audit, &table, journal, limit)
        })
        .await
    }

    /// Runs [`PostgresStore::purge_expired`] every `every` on the current tokio
    /// runtime, until the returned handle is dropped or aborted. Failed runs are
    /// logged and retried at the next tick.
    ///
    /// ```no_run
    /// # async fn run(store: idemgate_postgres::PostgresStore) -> Result<(), idemgate_postgres::Error> {
    /// let purge = store.spawn_purge(std::time::Duration::from_secs(60), 1_000)?;
    /// // ... serve; dropping `purge` stops it.
    /// # Ok(()) }
    /// ```
    pub fn spawn_purge(&self, every: Duration, batch: usize) -> Result<PurgeTask, Error> {
        self.spawn_purge_task(every, batch)
            .map_err(Error::NoRuntime)
    }
}

impl PostgresStore {
    async fn audit_append(&self, records: &[AuditRecord]) -> Result<(), StoreError> {
        audit::append(
            &self.inner.pool,
            &self.inner.audit,
            &self.inner.audit_hint,
            records,
        )
        .await
    }

    /// Journal entries appended on `connection` (a business transaction),
    /// without committing.
    pub(crate) async fn append_audit_on(
        &self,
        connection: &mut sqlx::PgConnection,
        records: &[AuditRecord],
    ) -> Result<(), StoreError> {
        audit::append_in_transaction(
            connection,
            &self.inner.audit,
            &self.inner.audit_hint,
            records,
        )
        .await
        .map_err(store_error)
    }

    /// The fenced completion of `lease` and, if it applied, `journal`
    /// appended, on `connection` (a business transaction), without
    /// committing, in one statement (`crate::audit::complete_and_append`);
    /// `None`, having sent nothing, when the entries' chain head is not known.
    /// When another writer moved that head, the statement completes only,
    /// and the locking append follows.
    pub(crate) async fn complete_with_known_head(
        &self,
        connection: &mut sqlx::PgConnection,
        lease: &Lease,
        completion: &Completion,
        journal: &[AuditRecord],
    ) -> Result<Option<FencedWrite>, StoreError> {
        let hint = &self.inner.audit_hint;
        let Some(sealed) = audit::Sealed::after_known_head(hint, journal) else {
            return Ok(None);
        };
        let Some(query) = self.complete_query(&self.inner.complete_and_append, lease, completion)
        else {
            return Ok(Some(FencedWrite::Refused));
        };
        let write = match audit::complete_and_append(connection, hint, query, sealed)
            .await
            .map_err(store_error)?
        {
            CompletedAndAppended::Refused => FencedWrite::Refused,
            CompletedAndAppended::Both => FencedWrite::Applied,
            CompletedAndAppended::CompletedOnly => {
                self.append_audit_on(connection, journal).await?;
                FencedWrite::Applied
            }
        };
        Ok(Some(write))
    }

    async fn audit_read(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        audit::read(&self.inner.pool, &self.inner.audit, query).await
    }

    async fn audit_partitions_of(&self) -> Result<Vec<AuditPartition>, StoreError> {
        audit::partitions(&self.inner.pool, &self.inner.audit).await
    }

    async fn audit_trim(
        &self,
        instance: Option<&str>,
        before: Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        audit::trim(
            &self.inner.pool,
            &self.inner.audit,
            instance,
            before.as_millis(),
            limit,
        )
        .await
    }

    /// `Store::journal_expiries`: the first journal wins.
    fn journal_expiries_of(&self, journal: ExpiryJournal) {
        let _ = self.inner.expiries.set(journal);
    }

    async fn audit_secret_of(&self) -> Result<AuditSecret, StoreError> {
        audit::secret(&self.inner.pool, &self.inner.audit).await
    }

    async fn durations_record(&self, route: &str, duration: Duration) -> Result<(), StoreError> {
        durations::record(&self.inner.pool, &self.inner.durations, route, duration).await
    }

    async fn durations_of(&self, route: &str) -> Result<Vec<Duration>, StoreError> {
        durations::read(&self.inner.pool, &self.inner.durations, route).await
    }

    /// `Store::append_stream_piece`: one fenced statement (`crate::pieces`),
    /// which announces the piece to other instances' waiters when the record is
    /// marked; this instance's waiters are woken here.
    async fn pieces_append(
        &self,
        lease: &Lease,
        index: u32,
        piece: &Bytes,
    ) -> Result<FencedWrite, StoreError> {
        let write =
            pieces::append(&self.inner.pool, &self.inner.pieces, lease, index, piece).await?;
        if write == FencedWrite::Applied {
            self.inner.signals.notify(&lease.identity);
        }
        Ok(write)
    }

    async fn pieces_read(
        &self,
        stream: &StreamId,
        from: u32,
        limit: u32,
    ) -> Result<Vec<Bytes>, StoreError> {
        pieces::read(&self.inner.pool, &self.inner.pieces, stream, from, limit).await
    }

    /// The claim: one statement, and a read when it returned nothing; see the
    /// crate docs.
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        self.claim_on_either(request, None).await
    }

    /// The claim as the first statement of `transaction` (the one-transaction
    /// mode, PROTOCOL §23). It waits on the record's unique index for another
    /// transaction's uncommitted claim of the same key; `None` when that wait ran
    /// past the transaction's `lock_timeout` (`crate::tx`).
    pub(crate) async fn claim_on(
        &self,
        connection: &mut sqlx::PgConnection,
        request: &ClaimRequest,
    ) -> Result<Option<Claim>, StoreError> {
        let claim = self.claim_on_either(request, Some(connection)).await;
        match claim {
            Err(StoreError::Unavailable(cause)) if is_lock_timeout(cause.as_ref()) => Ok(None),
            other => other.map(Some),
        }
    }

    /// The claim statement, on the pool (`None`) or on a transaction's
    /// connection, again while the record changes under it.
    async fn claim_on_either(
        &self,
        request: &ClaimRequest,
        mut connection: Option<&mut sqlx::PgConnection>,
    ) -> Result<Claim, StoreError> {
        let identity = request.identity.digest();
        let scope = request.identity.scope();
        for attempt in 1..=CLAIM_ATTEMPTS {
            // One statement inserts, replaces an expired record, or takes over
            // (`claimed`); or returns the live record that blocks the claim
            // (`existing`, read without a write); or, when the record changed under
            // it, nothing.
            let statement = match connection {
                Some(_) => &self.inner.sql.claim_in_transaction,
                None => &self.inner.sql.claim,
            };
            let query = sqlx::query(AssertSqlSafe(Arc::clone(statement)))
                .bind(identity.as_bytes().as_slice())
                .bind(scope.principal.as_str())
                .bind(scope.method.as_str())
                .bind(scope.path.as_str())
                .bind(request.identity.key().as_str())
                .bind(request.fingerprint.as_bytes().as_slice())
                .bind(i32::from(RECORD_FORMAT_VERSION))
                .bind(OperationId::generate().as_uuid())
                .bind(millis(request.lease))
                .bind(millis(request.ttl))
                .bind(request.field_digests.as_ref().map(FieldDigests::encode));
            let row = match connection.as_deref_mut() {
                Some(connection) => query.fetch_optional(connection).await,
                None => query.fetch_optional(&self.inner.pool).await,
            }
            .map_err(store_error)?;
            if let Some(row) = row {
                let outcome: String = row.try_get("outcome").map_err(StoreError::corrupt)?;
                return if outcome == "claimed" {
                    idemgate_sqlx::decode_lease(&row, *identity).map(Claim::Acquired)
                } else {
                    idemgate_sqlx::decode_snapshot(&row).map(Claim::Existing)
                };
            }
            // The read only reports what blocked the claim; it never decides to
            // insert. If the record expired, went away or became claimable in
            // between, the claim statement runs again.
            match self.read(identity).await? {
                Some(snapshot)
                    if attempt == CLAIM_ATTEMPTS
                        || snapshot
                            .record
                            .claim_origin(&request.fingerprint, snapshot.now)
                            .is_none() =>
                {
                    return Ok(Claim::Existing(snapshot));
                }
                _ => {}
            }
        }
        Err(StoreError::unavailable(ClaimContended))
    }

    /// The operator's conditional delete: one statement that locks, judges and
    /// deletes the live record (see `Statements::evict`).
    async fn evict_record(
        &self,
        identity: &IdentityDigest,
        mode: EvictMode,
    ) -> Result<Eviction, StoreError> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.evict)))
            .bind(identity.as_bytes().as_slice())
            .bind(mode == EvictMode::Force)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)?;
        idemgate_sqlx::decode_eviction(row.as_ref())
    }
}

/// Whether `cause` is PostgreSQL's `lock_not_available` (`55P03`): a
/// `lock_timeout` ran out.
fn is_lock_timeout(cause: &(dyn std::error::Error + 'static)) -> bool {
    cause
        .downcast_ref::<sqlx::Error>()
        .and_then(|error| error.as_database_error())
        .and_then(|error| error.code())
        .is_some_and(|code| code == "55P03")
}

impl PostgresStore {
    /// [`Store::wait_for_change`](idemgate_core::Store::wait_for_change): wakes on
    /// this store's own writes at once, and on other instances' through `LISTEN`
    /// (see [`crate::changes`]). Once listening (the first wait starts the
    /// listener and waits for its `LISTEN` within its timeout), it marks the
    /// record as waited on — once per run and instance — so that the statement
    /// ending the run notifies; a record no longer in progress when marked ends
    /// the wait at once. The timeout is the floor either way.
    async fn wait_announced(&self, identity: &IdentityDigest, timeout: Duration) {
        let until = tokio::time::Instant::now() + timeout;
        self.ensure_listening();
        let mut listening = self.inner.listening.subscribe();
        // Not listening yet: a mark now could be announced before anyone hears.
        let _ = tokio::time::timeout_at(until, listening.wait_for(|up| *up)).await;
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        let signal = self.inner.signals.wait(identity, left);
        tokio::pin!(signal);
        // Its first poll registers the waiter before the mark, so an announcement
        // right after the mark finds it.
        if futures_util::FutureExt::now_or_never(signal.as_mut()).is_some() {
            return;
        }
        let listening = *listening.borrow();
        if listening && !self.inner.announcements.is_marked(identity) {
            let marked = tokio::time::timeout_at(until, self.mark_waited(identity)).await;
            match marked {
                Ok(Ok(true)) => self.inner.announcements.marked(identity),
                // The run ended since the caller's read: look now (and wake this
                // instance's other waiters on it, which look too).
                Ok(Ok(false)) => self.inner.signals.notify(identity),
                // Unknown: the timeout stays the floor.
                Ok(Err(_)) | Err(_) => {}
            }
        }
        // Always awaited to its end, so the signal's entry is removed.
        signal.await;
    }

    /// Marks `identity` as waited on; `false` when no live record is in progress.
    async fn mark_waited(&self, identity: &IdentityDigest) -> Result<bool, StoreError> {
        let marked: i64 =
            sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.inner.sql.mark_waited)))
                .bind(identity.as_bytes().as_slice())
                .fetch_one(&self.inner.pool)
                .await
                .map_err(store_error)?;
        Ok(marked > 0)
    }

    fn ensure_listening(&self) {
        self.inner.listener.get_or_init(|| {
            tokio::spawn(changes::run(
                self.inner.pool.clone(),
                changes::channel(&self.inner.names.table()),
                Arc::downgrade(&self.inner.signals),
                Arc::downgrade(&self.inner.announcements),
                self.inner.listening.clone(),
            ))
            .abort_handle()
        });
    }
}

idemgate_sqlx::sql_store_methods!(PostgresStore);
