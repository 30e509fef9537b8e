//! The writer: the one connection that runs every write of a store, in batches that
//! share one transaction and one commit (group commit).
//!
//! SQLite lets one connection write at a time, and with `synchronous = FULL` every
//! commit is an `fsync`. Concurrent requests therefore queue their writes (claims,
//! fenced writes, evictions, purge batches, resource leases, and turns of the
//! transactional mode) on
//! a channel to one task that owns one connection. The task takes the first queued
//! write, begins an `IMMEDIATE` transaction, runs that write and every other one
//! already queued (up to [`MAX_BATCH`]), commits once, and only then answers each
//! caller: what one caller is told is durable, whichever batch it rode in.
//!
//! Each write is one statement (a claim: its upsert, plus a read of the record that
//! blocked it, which writes nothing), so a statement that fails is undone by SQLite
//! alone and the others stand: that caller gets its error, the rest commit. Errors
//! after which SQLite may have rolled the whole transaction back (busy, I/O, a full
//! disk, out of memory, a corrupt file: the `Transient` and `Corrupt` classes) fail
//! the whole batch instead, and so does a failed `COMMIT`: every caller in it gets
//! [`StoreError::Unavailable`] (the failing one its own error), none is
//! acknowledged. A caller that gave up (its future dropped) before its write ran is
//! skipped; one that waited in the queue longer than [`DEFAULT_BUSY_TIMEOUT`](crate::DEFAULT_BUSY_TIMEOUT) (a
//! transactional turn may hold the writer that long, too) is answered
//! `Unavailable` without running, as a busy database would.
//!
//! A transactional turn lends the connection out: the writer opens a savepoint,
//! hands the connection to the handler's `Tx` inside a [`WriterTransaction`], and
//! waits for it to come back, its writes kept ([`WriterTransaction::keep`], which
//! then waits for the batch's commit) or rolled back to the savepoint
//! ([`WriterTransaction::discard`], or a drop). That lending protocol lives here,
//! with the connection it lends; `tx.rs` only plugs it into the shared `Tx`.
//!
//! Errors are classified through the crate's error module (`crate::error`): the
//! writer never names the store.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use idemgate_core::audit::AuditRecord;
use idemgate_core::fingerprint::FieldDigests;
use idemgate_core::record::{OperationId, RECORD_FORMAT_VERSION};
use idemgate_core::scope::IdentityDigest;
use idemgate_core::time::Timestamp;
use idemgate_core::{Claim, ClaimRequest, EvictMode, Eviction, Lease, StoreError};
use idemgate_sqlx::{AUDIT_ROWS_PER_INSERT, ErrorClass, millis};
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{AssertSqlSafe, Connection, Sqlite, SqliteConnection, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use crate::audit::{self, AuditNames, AuditWrite};
use crate::error::{ClaimContended, classify, store_error};
use crate::sql::{BEGIN_IMMEDIATE, Statements};

/// At most this many writes share one transaction, so a batch's answers do not
/// wait behind an endless stream of later writes.
pub(crate) const MAX_BATCH: usize = 256;

/// How many writes may wait for the writer before callers wait to enqueue.
const QUEUE: usize = 4096;

/// The savepoint a transactional turn runs in, inside the batch's transaction.
const TURN: &str = "idemgate_turn";

/// The savepoint a journal write runs in.
const AUDIT: &str = "idemgate_audit";

/// A ready statement whose answer is how many rows it changed.
pub(crate) type Statement = sqlx::query::Query<'static, Sqlite, SqliteArguments>;

/// Where a write's result goes.
type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// One write, as a caller queues it.
pub(crate) enum Op {
    /// A fenced write or a purge batch: answered with the rows it changed.
    Execute {
        statement: Statement,
        reply: Reply<u64>,
    },
    /// A write that returns a row (the resource lease's upsert): answered with
    /// its first row.
    Fetch {
        statement: Statement,
        reply: Reply<Option<SqliteRow>>,
    },
    /// The claim: the upsert, and if it changed nothing the record that blocked it.
    /// With `entry` (the request's journal entry), an acquired claim's entry
    /// ([`AuditRecord::of_claim`]) is appended in the same batch, with every
    /// other claim's of the batch, before its commit; the answer says whether
    /// it was.
    Claim {
        request: ClaimRequest,
        // Boxed: the queue's slots stay small.
        entry: Option<Box<AuditRecord>>,
        reply: Reply<(Claim, bool)>,
    },
    /// The operator's conditional delete, and if it deleted nothing, why.
    Evict {
        identity: IdentityDigest,
        mode: EvictMode,
        reply: Reply<Eviction>,
    },
    /// A transactional turn: the writer lends its connection, inside a savepoint
    /// of the batch, to a handler's [`crate::Tx`] until it comes back.
    Turn { lend: Reply<WriterTransaction> },
    /// A journal write (several statements), in a savepoint of the batch so
    /// that it stands or falls whole: answered with the rows it wrote or removed.
    Audit {
        write: AuditWrite,
        reply: Reply<u64>,
    },
}

impl Op {
    /// Whether the caller stopped waiting for the answer.
    fn abandoned(&self) -> bool {
        match self {
            Self::Execute { reply, .. } => reply.is_closed(),
            Self::Fetch { reply, .. } => reply.is_closed(),
            Self::Claim { reply, .. } => reply.is_closed(),
            Self::Evict { reply, .. } => reply.is_closed(),
            Self::Turn { lend } => lend.is_closed(),
            Self::Audit { reply, .. } => reply.is_closed(),
        }
    }

    /// Answers the caller with `error` without running the write.
    fn refuse(self, error: StoreError) {
        // A caller that is gone needs no answer.
        match self {
            Self::Execute { reply, .. } => drop(reply.send(Err(error))),
            Self::Fetch { reply, .. } => drop(reply.send(Err(error))),
            Self::Claim { reply, .. } => drop(reply.send(Err(error))),
            Self::Evict { reply, .. } => drop(reply.send(Err(error))),
            Self::Turn { lend } => drop(lend.send(Err(error))),
            Self::Audit { reply, .. } => drop(reply.send(Err(error))),
        }
    }
}

/// A write in the queue, with when it was queued.
pub(crate) struct Queued {
    op: Op,
    at: Instant,
}

/// What the writer has done since the store was created: commits counted by
/// SQLite itself (a commit hook on the writer's connection), writes it answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriterStats {
    /// Transactions SQLite committed on the writer's connection: one per batch.
    pub commits: u64,
    /// Writes (claims, fenced writes, evictions, purge batches, transactional
    /// turns) answered after their batch committed.
    pub operations: u64,
}

#[derive(Debug, Default)]
struct Counters {
    commits: AtomicU64,
    operations: AtomicU64,
}

/// The store's side of the writer: the queue into its task, started on first use
/// (and again if it stopped: its runtime ended or its pool was closed).
#[derive(Debug)]
pub(crate) struct Writer {
    queue: Mutex<Option<mpsc::Sender<Queued>>>,
    pool: SqlitePool,
    sql: Arc<Statements>,
    /// The journal's tables, where a batch appends its claims' and turns' entries.
    audit: AuditNames,
    counters: Arc<Counters>,
    /// How long a write may wait in the queue, and a turn hold the connection
    /// ([`DEFAULT_BUSY_TIMEOUT`](crate::DEFAULT_BUSY_TIMEOUT): sqlx does not tell a pool's own busy timeout).
    patience: Duration,
}

/// The writer's task stopped before it answered.
#[derive(Debug, thiserror::Error)]
#[error("the SQLite store's writer stopped before answering")]
struct WriterGone;

/// The transaction a SQLite [`Tx`](crate::Tx) holds
/// ([`SqlStore::Transaction`](idemgate_sqlx::SqlStore::Transaction)): the store's
/// writer connection, lent for one turn inside the writer's current batch.
///
/// It dereferences to the [`SqliteConnection`]; the handler's statements run in a
/// savepoint of the batch's transaction. Committing it releases the savepoint into
/// the batch and waits for the batch's one `COMMIT`; rolling it back (or dropping
/// it) rolls back to the savepoint. Either way the connection goes back to the
/// writer, which goes on with the batch. Never run `COMMIT`, `ROLLBACK` or
/// `RELEASE` on it yourself: that fails the whole batch.
pub struct WriterTransaction {
    /// `Some` until it goes back to the writer.
    connection: Option<SqliteConnection>,
    back: Option<oneshot::Sender<Returned>>,
    /// The batch's commit, for a turn whose writes were kept.
    committed: oneshot::Receiver<Result<(), StoreError>>,
    /// The turn's journal entries ([`WriterTransaction::journal`]).
    journal: Vec<AuditRecord>,
}

/// A lent connection on its way back to the writer.
struct Returned {
    connection: SqliteConnection,
    /// Keep the turn's writes (release its savepoint) and its journal
    /// entries, or roll them back.
    keep: bool,
    journal: Vec<AuditRecord>,
}

impl WriterTransaction {
    fn new(
        connection: SqliteConnection,
        back: oneshot::Sender<Returned>,
        committed: oneshot::Receiver<Result<(), StoreError>>,
    ) -> Self {
        Self {
            connection: Some(connection),
            back: Some(back),
            committed,
            journal: Vec::new(),
        }
    }

    /// Journals `records` with the turn: the writer appends them, with the
    /// rest of its batch's entries, before the batch's commit, if the turn's
    /// writes are kept — they commit exactly when those writes do.
    pub(crate) fn journal(&mut self, records: &[AuditRecord]) {
        self.journal.extend_from_slice(records);
    }

    /// Hands the connection back with the turn's writes kept (its savepoint
    /// released into the batch), and waits for the batch's `COMMIT`: `Ok` only
    /// once they are durable.
    pub(crate) async fn keep(mut self) -> Result<(), StoreError> {
        if !self.give_back(true) {
            return Err(StoreError::unavailable(WriterGone));
        }
        (&mut self.committed)
            .await
            .map_err(|_| StoreError::unavailable(WriterGone))?
    }

    /// Hands the connection back with the turn's writes rolled back to its
    /// savepoint. If the writer is gone, the connection closed and rolled back the
    /// batch with it: nothing to wait for either way.
    pub(crate) fn discard(mut self) {
        self.give_back(false);
    }

    /// Hands the connection back to the writer; `false` if the writer stopped
    /// waiting for it (the connection then closes, rolling everything back).
    fn give_back(&mut self, keep: bool) -> bool {
        match (self.connection.take(), self.back.take()) {
            (Some(connection), Some(back)) => back
                .send(Returned {
                    connection,
                    keep,
                    journal: std::mem::take(&mut self.journal),
                })
                .is_ok(),
            _ => false,
        }
    }
}

impl Deref for WriterTransaction {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        // Invariant: `connection` is `Some` until `commit`, `rollback` or `drop`,
        // which consume the transaction.
        self.connection
            .as_ref()
            .expect("WriterTransaction used after it was handed back")
    }
}

impl DerefMut for WriterTransaction {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.connection
            .as_mut()
            .expect("WriterTransaction used after it was handed back")
    }
}

impl Drop for WriterTransaction {
    fn drop(&mut self) {
        self.give_back(false);
    }
}

impl fmt::Debug for WriterTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriterTransaction")
            .field("lent", &self.connection.is_some())
            .finish_non_exhaustive()
    }
}

/// A write waited in the queue longer than the writer's patience.
#[derive(Debug, thiserror::Error)]
#[error("the SQLite store's writer was busy for longer than {0:?}")]
pub(crate) struct QueueTimeout(Duration);

/// Another write in the same batch failed so that the batch could not commit.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the SQLite transaction this write shared with others failed: {0}")]
pub(crate) struct BatchFailed(String);

impl Writer {
    pub(crate) fn new(
        pool: SqlitePool,
        sql: Arc<Statements>,
        audit: AuditNames,
        patience: Duration,
    ) -> Self {
        Self {
            queue: Mutex::new(None),
            pool,
            sql,
            audit,
            counters: Arc::default(),
            patience,
        }
    }

    pub(crate) fn stats(&self) -> WriterStats {
        WriterStats {
            commits: self.counters.commits.load(Ordering::Relaxed),
            operations: self.counters.operations.load(Ordering::Relaxed),
        }
    }

    /// Queues the write `op` builds around its reply channel and waits for the
    /// answer, which comes once the write's batch committed (or failed).
    pub(crate) async fn run<T>(&self, op: impl FnOnce(Reply<T>) -> Op) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        let queue = self.queue()?;
        let queued = Queued {
            op: op(reply),
            at: Instant::now(),
        };
        queue
            .send(queued)
            .await
            .map_err(|_| StoreError::unavailable(WriterGone))?;
        answer
            .await
            .map_err(|_| StoreError::unavailable(WriterGone))?
    }

    /// The queue of the running writer task, started if there is none.
    fn queue(&self) -> Result<mpsc::Sender<Queued>, StoreError> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(running) = queue.as_ref().filter(|sender| !sender.is_closed()) {
            return Ok(running.clone());
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(StoreError::unavailable)?;
        let (sender, receiver) = mpsc::channel(QUEUE);
        let task = Task {
            queue: receiver,
            pool: self.pool.clone(),
            sql: Arc::clone(&self.sql),
            audit: self.audit.clone(),
            counters: Arc::clone(&self.counters),
            patience: self.patience,
            connection: None,
        };
        runtime.spawn(task.run());
        *queue = Some(sender.clone());
        Ok(sender)
    }
}

/// The writer task: its queue, its connection (opened on the first batch, and
/// again after a failed one), and what it needs to run the writes.
struct Task {
    queue: mpsc::Receiver<Queued>,
    pool: SqlitePool,
    sql: Arc<Statements>,
    audit: AuditNames,
    counters: Arc<Counters>,
    patience: Duration,
    connection: Option<SqliteConnection>,
}

/// A write whose batch has not committed yet: its result, held back until then.
trait Held: Send {
    /// The batch committed: send the result.
    fn commit(self: Box<Self>);
    /// The batch failed: send `error` instead.
    fn fail(self: Box<Self>, error: StoreError);
}

struct Answer<T> {
    reply: Reply<T>,
    result: Result<T, StoreError>,
}

impl<T: Send> Held for Answer<T> {
    fn commit(self: Box<Self>) {
        drop(self.reply.send(self.result));
    }

    fn fail(self: Box<Self>, error: StoreError) {
        drop(self.reply.send(Err(error)));
    }
}

/// Why a write in a batch failed.
enum StepError {
    /// This write alone: SQLite undid its statement, the batch goes on.
    Own(StoreError),
    /// The batch's transaction may be gone: the batch fails.
    Batch(sqlx::Error),
}

impl From<sqlx::Error> for StepError {
    fn from(err: sqlx::Error) -> Self {
        // Busy, locked, I/O, full, out of memory, interrupted, a corrupt file: SQLite
        // may have rolled the whole transaction back (https://www.sqlite.org/lang_transaction.html,
        // "Response To Errors Within A Transaction"), so no later statement may
        // count on it. Anything else (a missing table, a constraint) ends the
        // statement alone.
        match classify(&err) {
            ErrorClass::Transient | ErrorClass::Corrupt => Self::Batch(err),
            ErrorClass::Misconfigured | ErrorClass::Unexpected => Self::Own(store_error(err)),
        }
    }
}

impl From<StoreError> for StepError {
    fn from(err: StoreError) -> Self {
        Self::Own(err)
    }
}

/// One open batch: its held answers and the clock reading its claims use.
struct Batch {
    held: Vec<Box<dyn Held>>,
    /// The journal entries of its claims and turns, appended before it
    /// commits ([`append_journal`]).
    journal: BatchJournal,
    now: i64,
}

/// The journal entries a batch appends before its commit, in one statement:
/// its acquired claims' (their answers held until then) and its kept turns'.
#[derive(Default)]
struct BatchJournal {
    entries: Vec<AuditRecord>,
    claims: Vec<(Reply<(Claim, bool)>, Lease)>,
    /// Whether a turn's entries are among them: those must commit with the
    /// turn's writes, so an append that fails fails the batch.
    of_turns: bool,
}

impl BatchJournal {
    fn claimed(&mut self, reply: Reply<(Claim, bool)>, lease: Lease, entry: AuditRecord) {
        self.entries
            .push(entry.of_claim(lease.origin, lease.operation_id));
        self.claims.push((reply, lease));
    }

    fn turn(&mut self, entries: Vec<AuditRecord>) {
        if !entries.is_empty() {
            self.entries.extend(entries);
            self.of_turns = true;
        }
    }
}

impl Batch {
    fn hold<T: Send + 'static>(&mut self, reply: Reply<T>, result: Result<T, StoreError>) {
        self.held.push(Box::new(Answer { reply, result }));
    }

    /// Fails every held write: none is acknowledged.
    fn fail(self, why: &BatchFailed) {
        for held in self.held {
            held.fail(StoreError::unavailable(why.clone()));
        }
        for (reply, _) in self.journal.claims {
            drop(reply.send(Err(StoreError::unavailable(why.clone()))));
        }
    }
}

impl Task {
    async fn run(mut self) {
        while let Some(first) = self.queue.recv().await {
            if self.pool.is_closed() {
                // The store is shutting down: so does the writer, closing its
                // connection. A later write starts a new one, which refuses too.
                first.op.refuse(store_error(sqlx::Error::PoolClosed));
                self.refuse_queued(|| store_error(sqlx::Error::PoolClosed));
                break;
            }
            self.batch(first).await;
        }
        if let Some(connection) = self.connection.take() {
            // Nothing is open on it between batches.
            drop(connection.close().await);
        }
    }

    /// Answers every write queued right now with `error()`, without running it.
    fn refuse_queued(&mut self, error: impl Fn() -> StoreError) {
        while let Ok(queued) = self.queue.try_recv() {
            queued.op.refuse(error());
        }
    }

    /// The writer's connection: opened with the pool's options, its commits
    /// counted by a commit hook.
    async fn connection(&mut self) -> Result<SqliteConnection, sqlx::Error> {
        if let Some(connection) = self.connection.take() {
            return Ok(connection);
        }
        let mut connection = SqliteConnection::connect_with(&self.pool.connect_options()).await?;
        let counters = Arc::clone(&self.counters);
        connection.lock_handle().await?.set_commit_hook(move || {
            counters.commits.fetch_add(1, Ordering::Relaxed);
            true // let it commit
        });
        Ok(connection)
    }

    /// Runs `first` and whatever else is queued in one transaction, and answers.
    async fn batch(&mut self, first: Queued) {
        let Some(first) = self.admit(first) else {
            return;
        };
        let begun = match self.connection().await {
            Ok(mut connection) => match begin(&mut connection, &self.sql).await {
                Ok(now) => Ok((connection, now)),
                Err(err) => Err(err),
            },
            Err(err) => Err(err),
        };
        let (mut connection, now) = match begun {
            Ok(begun) => begun,
            Err(err) => {
                // No transaction, so nothing to roll back; the writes queued behind
                // this one would meet the same database: they fail too.
                let reason = err.to_string();
                first.refuse(store_error(err));
                self.refuse_queued(|| StoreError::unavailable(BatchFailed(reason.clone())));
                return;
            }
        };
        let mut batch = Batch {
            held: Vec::new(),
            journal: BatchJournal::default(),
            now,
        };
        let mut next = Some(first);
        let mut count = 0;
        while let Some(op) = next.take() {
            count += 1;
            // Checked again here: the first write's caller may have given up while
            // `BEGIN` waited for another process's lock (the layer's store timeout).
            if !op.abandoned() {
                let step = match op {
                    Op::Turn { lend } => match self.turn(connection, lend, &mut batch).await {
                        Ok(back) => {
                            connection = back;
                            Ok(())
                        }
                        Err(lost) => {
                            // The connection is gone with the handler (it rolls back
                            // when dropped): the batch cannot commit.
                            batch.fail(&lost);
                            return;
                        }
                    },
                    op => self.apply(&mut connection, op, &mut batch).await,
                };
                if let Err(why) = step {
                    // Whatever is left of the transaction goes, with the connection:
                    // the next batch opens a fresh one.
                    drop(sqlx::query("ROLLBACK").execute(&mut connection).await);
                    drop(connection.close().await);
                    batch.fail(&why);
                    return;
                }
            }
            if count < MAX_BATCH {
                next = self.next_queued();
            }
        }
        if let Err(why) = append_journal(&mut connection, &self.audit, &mut batch).await {
            drop(sqlx::query("ROLLBACK").execute(&mut connection).await);
            drop(connection.close().await);
            batch.fail(&why);
            return;
        }
        match sqlx::query("COMMIT").execute(&mut connection).await {
            Ok(_) => {
                self.counters
                    .operations
                    .fetch_add(batch.held.len() as u64, Ordering::Relaxed);
                for held in batch.held {
                    held.commit();
                }
                self.connection = Some(connection);
            }
            Err(err) => {
                // Nothing in the batch is acknowledged; closing the connection
                // rolls back whatever the failed commit left open.
                drop(connection.close().await);
                batch.fail(&BatchFailed(err.to_string()));
            }
        }
    }

    /// The next queued write that may run, if any is queued now.
    fn next_queued(&mut self) -> Option<Op> {
        while let Ok(queued) = self.queue.try_recv() {
            if let Some(op) = self.admit(queued) {
                return Some(op);
            }
        }
        None
    }

    /// The write, unless its caller gave up or waited too long.
    fn admit(&self, queued: Queued) -> Option<Op> {
        if queued.op.abandoned() {
            return None;
        }
        if queued.at.elapsed() > self.patience {
            queued
                .op
                .refuse(StoreError::unavailable(QueueTimeout(self.patience)));
            return None;
        }
        Some(queued.op)
    }

    /// Runs one write (not a turn) in the batch and holds its answer. `Err` when
    /// the batch must fail (the write's own caller is answered here).
    async fn apply(
        &self,
        connection: &mut SqliteConnection,
        op: Op,
        batch: &mut Batch,
    ) -> Result<(), BatchFailed> {
        match op {
            Op::Execute { statement, reply } => {
                let done = statement
                    .execute(&mut *connection)
                    .await
                    .map(|done| done.rows_affected())
                    .map_err(StepError::from);
                settle(batch, reply, done)
            }
            Op::Fetch { statement, reply } => {
                let row = statement
                    .fetch_optional(&mut *connection)
                    .await
                    .map_err(StepError::from);
                settle(batch, reply, row)
            }
            Op::Claim {
                request,
                entry,
                reply,
            } => {
                let claim = claim(connection, &self.sql, &request, batch.now).await;
                match (claim, entry) {
                    (Ok(Claim::Acquired(lease)), Some(entry)) => {
                        batch.journal.claimed(reply, lease, *entry);
                        Ok(())
                    }
                    (claim, _) => settle(batch, reply, claim.map(|claim| (claim, false))),
                }
            }
            Op::Evict {
                identity,
                mode,
                reply,
            } => {
                let eviction = evict(connection, &self.sql, &identity, mode, batch.now).await;
                settle(batch, reply, eviction)
            }
            Op::Audit { write, reply } => {
                let done = audit(connection, &write, batch.now).await;
                settle(batch, reply, done)
            }
            Op::Turn { lend } => {
                // `batch` sends turns to `turn`; never here.
                drop(lend.send(Err(StoreError::unavailable(WriterGone))));
                Ok(())
            }
        }
    }

    /// Lends the connection to a transactional handler inside a savepoint, and
    /// takes it back: its writes released into the batch (its commit answer held
    /// with the others) or rolled back to the savepoint. `Err` when the
    /// connection did not come back in time.
    async fn turn(
        &self,
        mut connection: SqliteConnection,
        lend: Reply<WriterTransaction>,
        batch: &mut Batch,
    ) -> Result<SqliteConnection, BatchFailed> {
        if let Err(err) = savepoint(&mut connection, "SAVEPOINT").await {
            drop(lend.send(Err(store_error(err))));
            // The batch's transaction may still be fine; the next statement or the
            // commit finds out.
            return Ok(connection);
        }
        let (back, returned) = oneshot::channel();
        let (committed, commit_answer) = oneshot::channel();
        // A handler that gave up before its turn drops the transaction unsent,
        // which hands the connection back (rolled back) all the same.
        drop(lend.send(Ok(WriterTransaction::new(connection, back, commit_answer))));
        match tokio::time::timeout(self.patience, returned).await {
            Ok(Ok(Returned {
                connection,
                keep,
                journal,
            })) => {
                let connection = self.take_back(connection, keep, batch).await?;
                if keep {
                    batch.journal.turn(journal);
                    batch.hold(committed, Ok(()));
                }
                Ok(connection)
            }
            _ => Err(BatchFailed(format!(
                "a transactional handler held the SQLite writer for longer than {:?}",
                self.patience
            ))),
        }
    }

    /// Ends a turn's savepoint (`keep`: its writes stay in the batch) and reads
    /// the clock again, since the handler took its time: in the process, not
    /// by a statement (SQLite's clock is the machine's, [the crate docs](crate)),
    /// so a turn holds the writer for one hop less.
    async fn take_back(
        &self,
        mut connection: SqliteConnection,
        keep: bool,
        batch: &mut Batch,
    ) -> Result<SqliteConnection, BatchFailed> {
        let ended = async {
            if !keep {
                savepoint(&mut connection, "ROLLBACK TO").await?;
            }
            savepoint(&mut connection, "RELEASE").await
        }
        .await;
        match ended {
            Ok(_) => {
                batch.now = batch.now.max(Timestamp::now().as_millis());
                Ok(connection)
            }
            Err(err) => {
                // The handler ended the transaction itself, or SQLite did: the
                // batch cannot commit as one.
                drop(connection.close().await);
                Err(BatchFailed(err.to_string()))
            }
        }
    }
}

/// Holds a write's result in the batch, or fails the batch.
fn settle<T: Send + 'static>(
    batch: &mut Batch,
    reply: Reply<T>,
    result: Result<T, StepError>,
) -> Result<(), BatchFailed> {
    match result {
        Ok(value) => batch.hold(reply, Ok(value)),
        Err(StepError::Own(err)) => batch.hold(reply, Err(err)),
        Err(StepError::Batch(err)) => {
            let why = BatchFailed(err.to_string());
            drop(reply.send(Err(store_error(err))));
            return Err(why);
        }
    }
    Ok(())
}

/// Appends the journal entries of the batch's claims and kept turns into
/// `names`' tables, one statement for all (a batch's fewer than
/// [`AUDIT_ROWS_PER_INSERT`]: one per claim, at most two per turn), and holds
/// the claims' answers: written, or — the statement undone whole — not, and
/// the journal appends them on its own. `Err` when the batch must fail (its
/// `fail` answers the claims): the store failed it, or the entries of a turn
/// could not be written with it.
async fn append_journal(
    connection: &mut SqliteConnection,
    names: &AuditNames,
    batch: &mut Batch,
) -> Result<(), BatchFailed> {
    if batch.journal.entries.is_empty() {
        return Ok(());
    }
    let entries = std::mem::take(&mut batch.journal.entries);
    let written = match audit::append(connection, names, &entries, batch.now).await {
        Ok(_) => true,
        Err(err) => match StepError::from(err) {
            // Only claims' entries, undone: the journal appends them itself.
            StepError::Own(_) if !batch.journal.of_turns => false,
            StepError::Own(err) => return Err(BatchFailed(err.to_string())),
            StepError::Batch(err) => return Err(BatchFailed(err.to_string())),
        },
    };
    for (reply, lease) in std::mem::take(&mut batch.journal.claims) {
        batch.hold(reply, Ok((Claim::Acquired(lease), written)));
    }
    Ok(())
}

const _: () = assert!(2 * MAX_BATCH <= AUDIT_ROWS_PER_INSERT);

/// `BEGIN IMMEDIATE` (the write lock, waiting up to the busy timeout for other
/// processes) and the clock read under it.
async fn begin(connection: &mut SqliteConnection, sql: &Statements) -> Result<i64, sqlx::Error> {
    sqlx::query(BEGIN_IMMEDIATE)
        .execute(&mut *connection)
        .await?;
    match now(connection, sql).await {
        Ok(now) => Ok(now),
        Err(err) => {
            drop(sqlx::query("ROLLBACK").execute(&mut *connection).await);
            Err(err)
        }
    }
}

/// The store's clock.
async fn now(connection: &mut SqliteConnection, sql: &Statements) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(AssertSqlSafe(Arc::clone(&sql.now)))
        .fetch_one(connection)
        .await
}

/// A journal write inside its own savepoint: its statements all stay, or none.
async fn audit(
    connection: &mut SqliteConnection,
    write: &AuditWrite,
    now: i64,
) -> Result<u64, StepError> {
    if write.writes_in_one_statement() {
        // Undone whole by SQLite should it fail: no savepoint to pay for
        // (two more hops, and a copy of every page it changes).
        return write.run(connection, now).await.map_err(StepError::from);
    }
    sqlx::query(AssertSqlSafe(format!("SAVEPOINT {AUDIT}")))
        .execute(&mut *connection)
        .await?;
    match write.run(connection, now).await {
        Ok(rows) => {
            sqlx::query(AssertSqlSafe(format!("RELEASE {AUDIT}")))
                .execute(&mut *connection)
                .await?;
            Ok(rows)
        }
        Err(err) => {
            let step = StepError::from(err);
            if matches!(step, StepError::Own(_)) {
                // Its own failure: undo its statements, keep the batch.
                sqlx::query(AssertSqlSafe(format!("ROLLBACK TO {AUDIT}")))
                    .execute(&mut *connection)
                    .await?;
                sqlx::query(AssertSqlSafe(format!("RELEASE {AUDIT}")))
                    .execute(&mut *connection)
                    .await?;
            }
            Err(step)
        }
    }
}

async fn savepoint(connection: &mut SqliteConnection, verb: &str) -> Result<(), sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!("{verb} {TURN}")))
        .execute(connection)
        .await
        .map(drop)
}

/// The claim at `now`: the upsert inserts a `PROCESSING` record, replaces an
/// expired one (new operation id), or takes over a `RELEASED` record or a lapsed
/// lease with the same fingerprint; when it changes nothing, the record that
/// blocked it is read in the same transaction.
async fn claim(
    connection: &mut SqliteConnection,
    sql: &Statements,
    request: &ClaimRequest,
    now: i64,
) -> Result<Claim, StepError> {
    let identity = request.identity.digest();
    let scope = request.identity.scope();
    let row: Option<SqliteRow> = sqlx::query(AssertSqlSafe(Arc::clone(&sql.claim)))
        .bind(identity.as_bytes().to_vec())
        .bind(scope.principal.as_str().to_owned())
        .bind(scope.method.clone())
        .bind(scope.path.clone())
        .bind(request.identity.key().as_str().to_owned())
        .bind(request.fingerprint.as_bytes().to_vec())
        .bind(i64::from(RECORD_FORMAT_VERSION))
        .bind(OperationId::generate().as_uuid())
        .bind(now)
        .bind(millis(request.lease))
        .bind(millis(request.ttl))
        .bind(request.field_digests.as_ref().map(FieldDigests::encode))
        .fetch_optional(&mut *connection)
        .await?;
    if let Some(row) = row {
        return Ok(Claim::Acquired(idemgate_sqlx::decode_lease(
            &row, *identity,
        )?));
    }
    let row = sqlx::query(AssertSqlSafe(Arc::clone(&sql.read_at)))
        .bind(identity.as_bytes().to_vec())
        .bind(now)
        .fetch_optional(connection)
        .await?;
    match row {
        Some(row) => Ok(Claim::Existing(idemgate_sqlx::decode_snapshot(&row)?)),
        // The insert conflicted, so the row is there in this transaction.
        None => Err(StepError::Own(StoreError::unavailable(ClaimContended))),
    }
}

/// The claim inside a transactional turn (the one-transaction mode, PROTOCOL
/// §23) at the store's clock now: the turn's savepoint holds it uncommitted
/// until the handler's writes and the completion join it.
pub(crate) async fn claim_in_turn(
    connection: &mut SqliteConnection,
    sql: &Statements,
    request: &ClaimRequest,
) -> Result<Claim, StoreError> {
    let now = now(connection, sql).await.map_err(store_error)?;
    claim(connection, sql, request, now)
        .await
        .map_err(|error| match error {
            StepError::Own(error) => error,
            // The turn comes back to a batch that cannot commit: the writer
            // fails it when it takes the connection back.
            StepError::Batch(error) => store_error(error),
        })
}

/// The operator's conditional delete at `now`: the delete and the read that
/// explains a refusal see the same record, inside the batch's transaction.
async fn evict(
    connection: &mut SqliteConnection,
    sql: &Statements,
    identity: &IdentityDigest,
    mode: EvictMode,
    now: i64,
) -> Result<Eviction, StepError> {
    let mut row = None;
    for statement in [&sql.evict, &sql.evict_refused] {
        row = sqlx::query(AssertSqlSafe(Arc::clone(statement)))
            .bind(identity.as_bytes().to_vec())
            .bind(now)
            .bind(mode == EvictMode::Force)
            .fetch_optional(&mut *connection)
            .await?;
        if row.is_some() {
            break;
        }
    }
    Ok(idemgate_sqlx::decode_eviction(row.as_ref())?)
}
