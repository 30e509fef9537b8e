//! The `Store` trait: where records live (PROTOCOL §5, §6).

use std::time::Duration;

use async_trait::async_trait;

use crate::fingerprint::Fingerprint;
pub use crate::record::LeaseOrigin;
use crate::record::{FencingToken, OperationId, Record, RecordState, RecordStatus, StoredResponse};
use crate::scope::{Identity, IdentityDigest};
use crate::time::Timestamp;

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

    /// Told that the handler's transaction (the transactional mode,
    /// [`crate::transaction`]) committed `completion` under `lease`: the one
    /// completion that does not go through [`Store::complete`]. Not a write, and
    /// nothing for a store to do (the default); a wrapper that keeps what
    /// completions write, the replay cache, learns of it here.
    fn completed_in_transaction(&self, lease: &Lease, completion: &Completion) {
        let _ = (lease, completion);
    }

    /// Returns when the record under `identity` may have changed, or after `timeout`.
    /// A hint only: callers re-read with [`Store::get`]. The default sleeps, which
    /// turns waiting into polling.
    async fn wait_for_change(&self, identity: &IdentityDigest, timeout: Duration) {
        let _ = identity;
        tokio::time::sleep(timeout).await;
    }
}

/// What a claim asks for.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// Whose operation, and its name.
    pub identity: Identity,
    /// What the request asked for.
    pub fingerprint: Fingerprint,
    /// How long the claimant may run before others may take over.
    pub lease: Duration,
    /// How long the record lives; completion restarts it.
    pub ttl: Duration,
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
