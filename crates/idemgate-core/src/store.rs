//! The `Store` trait: where records live (PROTOCOL §5, §6).

use std::any::Any;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::audit::{AuditEntry, AuditPartition, AuditQuery, AuditRecord, AuditSecret};

use crate::fingerprint::{FieldDigests, Fingerprint};
pub use crate::record::LeaseOrigin;
use crate::record::{FencingToken, OperationId, Record, RecordState, RecordStatus, StoredResponse};
use crate::resource_lease::{LeaseAcquisition, ResourceId, ResourceLease};
use crate::scope::{Identity, IdentityDigest};
use crate::stream::StreamId;
use crate::time::Timestamp;

/// How long [`Store::wait_for_change`]'s default sleeps at most: the polling
/// interval of a store that announces no changes.
pub const DEFAULT_POLL: Duration = Duration::from_millis(100);

/// A boxed error cause.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Where records live.
///
/// Every method is one atomic step in its backend (`INSERT … ON CONFLICT … RETURNING`,
/// a Lua script, a map entry under a lock). There are no default methods that compose
/// others: a claim built from a read and a write is the check-then-act race this
/// crate exists to prevent (PITFALLS 1). The one default, [`Store::wait_for_change`],
/// only decides how long a waiter sleeps before it looks again.
///
/// Writes after the claim carry the [`Lease`] and succeed only while the record still
/// holds its (operation id, fencing token); otherwise they return
/// [`FencedWrite::Refused`] and change nothing.
///
/// A record past its `expires_at` is absent to every method, whether or not a purge
/// has removed it. `Arc<dyn Store>` works: the layer holds one.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Claims `request.identity` atomically:
    /// - absent (or expired): insert `Processing` with a new operation id and token;
    /// - same fingerprint and `Released`, or `Processing` with a lapsed lease: take it
    ///   over, keeping the operation id, with a new token, and
    ///   `expires_at = max(expires_at, now + ttl)` so the record outlives the new run;
    /// - otherwise return the record as it is.
    async fn try_claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError>;

    /// Claims as [`Store::try_claim`] does and, when it acquires, appends the
    /// journal's entry of that claim ([`AuditRecord::of_claim`] of `entry`)
    /// in the same write, so the claim and its entry are durable together.
    /// Answers whether the entry was written; the default claims alone and
    /// answers `false`, and the journal then appends the entry itself.
    async fn try_claim_journaled(
        &self,
        request: &ClaimRequest,
        entry: &AuditRecord,
    ) -> Result<(Claim, bool), StoreError> {
        let _ = entry;
        Ok((self.try_claim(request).await?, false))
    }

    /// Stores the final response: status `Completed` or `Failed`,
    /// `expires_at = now + completion.ttl`.
    async fn complete(
        &self,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<FencedWrite, StoreError>;

    /// Marks the record `Released`: claimable again, same operation id.
    async fn release(&self, lease: &Lease) -> Result<FencedWrite, StoreError>;

    /// Extends the lease to `now + lease_for`.
    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<FencedWrite, StoreError>;

    /// Removes the record, so the key can be used again with another body (a request
    /// rejected before the operation started).
    async fn delete(&self, lease: &Lease) -> Result<FencedWrite, StoreError>;

    /// Removes the record under `identity` for an operator (`idemgate keys evict`,
    /// `DELETE /v1/keys`): the one write that carries no lease. Unless `mode` is
    /// [`EvictMode::Force`], a `Processing` record whose lease is live (store
    /// clock) is left as it is and reported as [`Eviction::RefusedLiveLease`]; a
    /// lapsed lease, a released or a final record is removed. The test and the
    /// removal are one atomic step (a conditional `DELETE`, a Lua script, a map
    /// update under a lock), never a read that decides whether to delete. Waiters
    /// on the identity are woken.
    ///
    /// Dangerous by nature: the next request with the key is a new operation, so an
    /// operation that already ran — or still runs, when forced — can run twice.
    async fn evict(
        &self,
        identity: &IdentityDigest,
        mode: EvictMode,
    ) -> Result<Eviction, StoreError>;

    /// Reads the record without claiming it (wait mode polls with it).
    async fn get(&self, identity: &IdentityDigest) -> Result<Option<Snapshot>, StoreError>;

    /// Acquires the lease on `resource` for `ttl` (store clock), in one atomic
    /// step: when no live lease holds it (none, or one past its `until`), a new
    /// one with a fresh [`LeaseToken`](crate::resource_lease::LeaseToken) is
    /// written and returned; otherwise nothing changes and the holder's `until`
    /// comes back as [`LeaseAcquisition::Held`]. Never waits for the holder: the
    /// caller decides whether and how to wait (see [`crate::resource_lease`]).
    async fn acquire_resource_lease(
        &self,
        resource: &ResourceId,
        ttl: Duration,
    ) -> Result<LeaseAcquisition, StoreError>;

    /// Gives `lease` up, fenced by its token: [`FencedWrite::Applied`] when the
    /// store still held this token live (the resource is free at once),
    /// [`FencedWrite::Refused`] when the lease had lapsed or another holder's
    /// token replaced it (nothing changes). One atomic step (a compare-and-delete).
    async fn release_resource_lease(
        &self,
        lease: &ResourceLease,
    ) -> Result<FencedWrite, StoreError>;

    /// Appends `records` to the journal (`crate::audit`), in order, as one
    /// atomic step: each gets the next `seq`, the store's clock as `at`, and is
    /// linked after its partition's head (its `instance`), which moves to it.
    /// Appends of one partition are serialised by the store (a locked head row,
    /// a compare-and-set on a head key), so concurrent writers never fork a
    /// chain. Empty `records` writes nothing.
    async fn append_audit(&self, records: &[AuditRecord]) -> Result<(), StoreError>;

    /// Reads journal entries in `query`'s range, oldest (lowest `seq`) first.
    async fn read_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError>;

    /// Every journal partition's head and anchor, for [`crate::audit::Verifier`].
    async fn audit_partitions(&self) -> Result<Vec<AuditPartition>, StoreError>;

    /// Removes at most `limit` of the oldest entries written before `before`
    /// (retention) — of `instance`'s partition, or of every partition when
    /// `None` — in `seq` order, and moves each partition's anchor to the hash of
    /// its last entry removed, in one atomic step. Returns how many went.
    async fn trim_audit(
        &self,
        instance: Option<&str>,
        before: Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError>;

    /// Appends piece `index` of the stream `lease`'s run records (PROTOCOL §20,
    /// [`crate::stream`]), only while the record still holds the lease (in
    /// progress, same operation id and token, not expired): otherwise
    /// [`FencedWrite::Refused`] and nothing is kept. A run appends its pieces
    /// in order from [`crate::stream::HEAD_PIECE`], one at a time; appending an
    /// index again replaces it (a write retried after an unknown outcome). An
    /// index past the next is an error ([`StoreError::Corrupt`]) where earlier
    /// pieces can be lost on their own (the memory store refuses it, Redis,
    /// whose lists may be evicted, finds it); the SQL stores keep pieces with
    /// their record and store it as given, a read stopping at the gap. The
    /// append is announced like the end of a run ([`Store::wait_for_change`]),
    /// so readers of a stream in flight, on any instance, read on at once.
    async fn append_stream_piece(
        &self,
        lease: &Lease,
        index: u32,
        piece: &Bytes,
    ) -> Result<FencedWrite, StoreError>;

    /// At most `limit` pieces of `stream` from index `from` on, in order: the
    /// ones appended so far, stopping at the first missing one; none when the
    /// record no longer names the stream's run (gone, expired, or another
    /// run's), whose pieces are gone with it.
    async fn read_stream_pieces(
        &self,
        stream: &StreamId,
        from: u32,
        limit: u32,
    ) -> Result<Vec<Bytes>, StoreError>;

    /// The journal's secret, the key of [`crate::audit::key_digest`]: made at
    /// random by the first call on a store and the same for every later one
    /// (an insert-if-absent, never a read that decides whether to write).
    async fn audit_secret(&self) -> Result<AuditSecret, StoreError>;

    /// Adds one execution of `route` (a route template: method and scope path)
    /// that took `duration` to the route's history, in one atomic step, for the
    /// `Retry-After` of a 409 ([`crate::estimate`]). Bounded: at most
    /// [`crate::estimate::WINDOW`] durations per route, a new one replacing the
    /// oldest (or a random slot) once full; at most
    /// [`crate::estimate::MAX_ROUTES`] routes, a new route beyond them taking
    /// the place of the least recently recorded; a route key cut to [`crate::estimate::MAX_ROUTE_LEN`] bytes
    /// ([`crate::estimate::route_key`]). Shared by every instance on the store
    /// and kept across restarts, as long as the store keeps its data.
    async fn record_duration(&self, route: &str, duration: Duration) -> Result<(), StoreError>;

    /// The durations [`Store::record_duration`] keeps for `route`, in no
    /// particular order; empty when it has none.
    async fn route_durations(&self, route: &str) -> Result<Vec<Duration>, StoreError>;

    /// Whether [`Store::claim_in_transaction`] works: the one-transaction mode
    /// (PROTOCOL §23) is refused on a store that says no (the default).
    fn supports_one_transaction(&self) -> bool {
        false
    }

    /// Opens a business transaction and claims `request.identity` as its first
    /// statement, uncommitted (the one-transaction mode, PROTOCOL §23): the claim
    /// commits with the handler's writes and the completion, or vanishes with them.
    /// A concurrent claim of the same key waits for this transaction (on the
    /// record's unique index, or SQLite's one writer); where the database can bound
    /// that wait, `lock_wait` bounds it and the answer past it is
    /// [`ClaimInTransaction::Locked`]. The default refuses:
    /// [`OneTransactionUnsupported`](OneTransactionUnsupported),
    /// as [`StoreError::Misconfigured`].
    async fn claim_in_transaction(
        &self,
        request: &ClaimRequest,
        lock_wait: Duration,
    ) -> Result<ClaimInTransaction, StoreError> {
        let _ = (request, lock_wait);
        Err(StoreError::misconfigured(OneTransactionUnsupported))
    }

    /// Told that the transaction a claim was made in (the one-transaction mode)
    /// rolled back under `lease`: the claim is gone with it, as if released. Not
    /// a write; the journal records it as `released`.
    fn rolled_back_in_transaction(&self, lease: &Lease) {
        let _ = lease;
    }

    /// Told that the handler's transaction (the transactional mode,
    /// [`crate::transaction`]) committed `completion` under `lease`: the one
    /// completion that does not go through [`Store::complete`]. Not a write, and
    /// nothing for a store to do (the default); a wrapper that keeps what
    /// completions write, the replay cache, learns of it here.
    fn completed_in_transaction(&self, lease: &Lease, completion: &Completion) {
        let _ = (lease, completion);
    }

    /// The journal entries a transactional completion of `lease` appends
    /// inside the handler's transaction
    /// ([`crate::transaction::PendingTransaction::complete_and_commit`]), in
    /// order, so that they commit or roll back with the business writes; none
    /// (the default) when nothing journals through this store. The journal
    /// writer (`idemgate::journal::Journaled`) answers the run's `executed`
    /// entry — preceded by its `claimed` entry when that is still queued, which
    /// it then leaves out of its queue, so the journal does not show a run
    /// executed before it was claimed.
    async fn transaction_journal_entries(
        &self,
        lease: &Lease,
        completion: &Completion,
    ) -> Vec<AuditRecord> {
        let _ = (lease, completion);
        Vec::new()
    }

    /// Told that the journal is on, with what an `expired` entry needs: a
    /// store that deletes expired records itself (the SQL stores' purge)
    /// journals each deletion as `expired`, in the same transaction as the
    /// delete, so the journal neither misses an expiry nor reports one that
    /// did not happen. Nothing to do by default: the memory store forgets
    /// expired records without a sweep, and Redis expires them by TTL, telling
    /// no one. Wrappers pass it on.
    fn journal_expiries(&self, journal: crate::audit::ExpiryJournal) {
        let _ = journal;
    }

    /// Returns when the record under `identity` may have changed, or after `timeout`.
    /// A hint only: callers re-read with [`Store::get`], and may be woken early
    /// for nothing.
    ///
    /// A store announces the end of a run — completion, release, deletion,
    /// eviction, on this instance or any other sharing the store — and each
    /// piece a stream appends ([`Store::append_stream_piece`]), so a waiter
    /// wakes the moment the outcome is recorded: the memory store in process,
    /// Redis through pub/sub, PostgreSQL through `LISTEN/NOTIFY`; SQLite polls
    /// its file. The default sleeps at most [`DEFAULT_POLL`], which turns waiting
    /// into polling, for stores that announce nothing.
    async fn wait_for_change(&self, identity: &IdentityDigest, timeout: Duration) {
        let _ = identity;
        tokio::time::sleep(timeout.min(DEFAULT_POLL)).await;
    }
}

/// An open business transaction waiting for the layer to finish it.
#[async_trait]
pub trait PendingTransaction: Send {
    /// Runs the fenced completion inside the transaction, appends `journal` (the
    /// run's `executed` entry, when the journal is on) to the store's journal in
    /// the same transaction, and commits: the journal never reports an effect
    /// that rolled back, nor misses one that committed. When the fence refuses
    /// (zero rows), rolls back and returns [`FencedWrite::Refused`]: the
    /// business writes and the entry vanish with it.
    async fn complete_and_commit(
        self: Box<Self>,
        lease: &Lease,
        completion: &Completion,
        journal: &[AuditRecord],
    ) -> Result<FencedWrite, StoreError>;

    /// Commits the business writes alone: for requests without an idempotency key,
    /// which have no record to complete.
    async fn commit(self: Box<Self>) -> Result<(), StoreError>;

    /// Rolls the business writes back.
    async fn rollback(self: Box<Self>) -> Result<(), StoreError>;

    /// The concrete transaction, for the extractor that takes an
    /// [offered](crate::transaction::TransactionSlot::offer) one back as its store's type.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

/// What a claim inside a new transaction came to
/// ([`Store::claim_in_transaction`], the
/// one-transaction mode, PROTOCOL §23).
pub enum ClaimInTransaction {
    /// Claimed, uncommitted, in `transaction`: no one else sees the record until it
    /// commits, and a crash or a rollback leaves no claim behind.
    Acquired {
        /// The run's lease, as [`Claim::Acquired`] gives it.
        lease: Lease,
        /// The open transaction holding the claim; the handler's writes go into it.
        transaction: Box<dyn PendingTransaction>,
    },
    /// A committed record blocks the claim (the transaction was rolled back):
    /// decided as for [`Claim::Existing`].
    Existing(Snapshot),
    /// Another request's transaction holds an uncommitted claim of the same key and
    /// did not finish within the wait (the transaction was rolled back): in flight.
    Locked,
}

impl std::fmt::Debug for ClaimInTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Acquired { lease, .. } => f
                .debug_struct("Acquired")
                .field("lease", lease)
                .finish_non_exhaustive(),
            Self::Existing(snapshot) => f.debug_tuple("Existing").field(snapshot).finish(),
            Self::Locked => f.write_str("Locked"),
        }
    }
}

/// The store cannot claim inside a business transaction: only the SQL stores
/// (PostgreSQL, SQLite) keep the record in the business's own database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "this store cannot claim inside the handler's transaction: the one-transaction mode needs PostgreSQL or SQLite"
)]
pub struct OneTransactionUnsupported;

/// What a claim asks for.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// Whose operation, and its name.
    pub identity: Identity,
    /// What the request asked for.
    pub fingerprint: Fingerprint,
    /// The request's per-field digests ([`FieldDigests`], `None` for a body that
    /// is not JSON): a new record keeps them beside the fingerprint, so a later
    /// request with another body learns which fields differ. A takeover (same
    /// fingerprint, so the same digests) leaves them as they are.
    pub field_digests: Option<FieldDigests>,
    /// How long the claimant may run before others may take over.
    pub lease: Duration,
    /// How long the record lives; completion restarts it.
    pub ttl: Duration,
    /// The route's template where one is known (a route of the proxy's file,
    /// axum's `MatchedPath`), which the scope's path is not when the key is the
    /// client's own header: `/payments/{id}/capture`, not `/payments/7/capture`.
    /// Not part of the identity and not stored in the record: what the route's
    /// execution history ([`Store::record_duration`]) and the journal
    /// (`AuditRecord::route`) name the operation's route by, so every id of a
    /// route shares one history. `None`: the scope's path.
    pub route_template: Option<String>,
}

impl ClaimRequest {
    /// The operation's route: its template where known, else the scope's path
    /// (see [`ClaimRequest::route_template`]).
    pub fn route(&self) -> &str {
        self.route_template
            .as_deref()
            .unwrap_or(&self.identity.scope().path)
    }
}

/// A record as a store saw it, with the store's clock at that moment.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The record.
    pub record: Record,
    /// The store's `now` when it read the record: leases compare against it.
    pub now: Timestamp,
}

/// The result of [`Store::try_claim`].
///
/// Exhaustive on purpose, like every enum a store returns: callers must handle
/// every answer a store can give, so a new one is a breaking change.
#[derive(Clone, Debug)]
pub enum Claim {
    /// The caller holds the operation and must run it.
    Acquired(Lease),
    /// Someone else's record (or one with another fingerprint): decide with
    /// [`crate::decide()`].
    Existing(Snapshot),
}

/// The right to run an operation, and the credentials its writes carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The record's identity.
    pub identity: IdentityDigest,
    /// The operation.
    pub operation_id: OperationId,
    /// This holder's token.
    pub token: FencingToken,
    /// How the claim came about.
    pub origin: LeaseOrigin,
    /// Until when the store will not let others take over (store clock).
    pub locked_until: Timestamp,
}

impl Lease {
    /// The stream this lease's run records (PROTOCOL §20).
    pub fn stream(&self) -> StreamId {
        StreamId {
            identity: self.identity,
            operation_id: self.operation_id,
            token: self.token,
        }
    }
}

/// The final status of a completion.
///
/// Exhaustive on purpose: every store must write, and read back, every final state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinalStatus {
    /// A final result.
    Completed,
    /// A 5xx kept and replayed under the `store` policy.
    Failed,
}

impl From<FinalStatus> for RecordStatus {
    fn from(status: FinalStatus) -> Self {
        match status {
            FinalStatus::Completed => RecordStatus::Completed,
            FinalStatus::Failed => RecordStatus::Failed,
        }
    }
}

/// What [`Store::complete`] writes.
#[derive(Clone, Debug)]
pub struct Completion {
    /// `Completed` or `Failed`.
    pub status: FinalStatus,
    /// The response to replay.
    pub response: StoredResponse,
    /// The record lives this long after completion.
    pub ttl: Duration,
}

impl Completion {
    /// The state the completed record holds: the response under its final status.
    pub fn state(&self) -> RecordState {
        match self.status {
            FinalStatus::Completed => RecordState::Completed(self.response.clone()),
            FinalStatus::Failed => RecordState::Failed(self.response.clone()),
        }
    }
}

/// Whether a fenced write happened.
///
/// Exhaustive on purpose: a caller must handle both, and there is no third answer.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FencedWrite {
    /// The record still held the caller's (operation id, token); the write is done.
    Applied,
    /// The record moved on (taken over, completed, expired or deleted); nothing
    /// was written.
    Refused,
}

/// Whether [`Store::evict`] may remove a record whose holder may still run it.
///
/// Exhaustive on purpose: every store must honour both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictMode {
    /// Refuse a `Processing` record with a live lease: its holder may still be
    /// running the operation, and evicting it would let a retry run it beside it.
    UnlessRunning,
    /// Remove the record whatever its state, a live lease included. The holder's
    /// later writes are fenced out (the record is gone), so its result is not
    /// stored.
    Force,
}

/// What [`Store::evict`] did.
///
/// Exhaustive on purpose: a caller must handle every answer.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// The record was removed; the next request with its key is a new operation.
    Evicted {
        /// The state it was removed in.
        status: RecordStatus,
    },
    /// There was no live record: never claimed, expired, or already removed.
    Absent,
    /// A `Processing` record with a live lease, left as it was
    /// ([`EvictMode::UnlessRunning`]).
    RefusedLiveLease {
        /// End of the holder's lease (store clock).
        locked_until: Timestamp,
        /// The store's clock when it refused.
        now: Timestamp,
    },
}

/// Why a store could not answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Unreachable, timed out, or out of connections: retry later (503).
    #[error("idempotency store unavailable")]
    Unavailable(#[source] BoxError),
    /// A capacity-bounded store refuses new claims rather than evict a live record (503).
    #[error("idempotency store is full")]
    Full,
    /// A record that cannot be decoded (500).
    #[error("corrupt idempotency record")]
    Corrupt(#[source] BoxError),
    /// The store is set up wrong: its table is missing (its `migrate()` never ran)
    /// or its credentials lack a permission. Retrying does not help; an operator
    /// must fix it, so the layer answers 500 and logs the fix, not 503.
    #[error("idempotency store misconfigured: run the store's migrate() and check its permissions")]
    Misconfigured(#[source] BoxError),
}

impl StoreError {
    /// An `Unavailable` error from any cause.
    pub fn unavailable(cause: impl Into<BoxError>) -> Self {
        Self::Unavailable(cause.into())
    }

    /// A `Misconfigured` error from any cause.
    pub fn misconfigured(cause: impl Into<BoxError>) -> Self {
        Self::Misconfigured(cause.into())
    }

    /// A `Corrupt` error from any cause.
    pub fn corrupt(cause: impl Into<BoxError>) -> Self {
        Self::Corrupt(cause.into())
    }
}
