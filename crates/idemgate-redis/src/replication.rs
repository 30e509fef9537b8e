//! Waiting for replicas after a write (`WAIT numreplicas timeout`): what closes the
//! failover window in which a claim acknowledged by a primary that dies before
//! replicating it is lost, and a retry runs the operation a second time.

use std::time::Duration;

/// Asks every claim, completion and renewal to reach `replicas` replicas before it
/// counts, by sending `WAIT <replicas> <timeout>` right behind the script, on the
/// same connection to the same primary, in one round trip. Set with
/// [`RedisStoreBuilder::with_replication_wait`](crate::RedisStoreBuilder::with_replication_wait).
///
/// What "fewer replicas acknowledged than asked" (a lagging or absent replica, the
/// timeout passed, or the primary failing) means for each write, so that nothing
/// runs whose claim may be lost in a failover:
///
/// - **claim** (a record created, released record claimed again, or lapsed lease
///   taken over): the claim is released again (fenced, best effort) and the call
///   fails with [`StoreError::Unavailable`](idemgate_core::StoreError::Unavailable)
///   — the layer answers 503 with `Retry-After` and **does not run the handler**. A
///   claim that finds an existing record wrote nothing and is answered as usual.
/// - **completion**: the handler has already run, which cannot be undone, so the
///   completion counts as applied (the client gets its response) and a warning is
///   logged. Its claim was replicated, so if the primary fails now the promoted
///   replica holds the record as in progress under the **same operation id**, and a
///   retry takes it over once the lease lapses — the case business writes keyed by
///   the operation id make harmless (PROTOCOL §11), never a new operation.
/// - **renewal**: fails with `Unavailable`, so the layer does not count on the
///   longer lease (it retries at the next tick).
/// - **release and delete** are not waited for: losing one only brings back the
///   record in progress under its lease, which a retry takes over when it lapses.
///
/// For the guarantee, ask for every replica a primary has (with one replica each,
/// `replicas = 1`): Redis promotes the replica with the most data, but with several
/// replicas and `replicas` below their number the promoted one may be one that had
/// not acknowledged. Redis replication stays asynchronous — `WAIT` tells which
/// writes reached a replica; it is not a consensus protocol. On a server without
/// replicas every claim fails: do not set it there.
///
/// The `WAIT` timeout must be shorter than the response timeout (the constructors
/// refuse it otherwise with
/// [`RedisStoreError::ReplicationWaitTooLong`](crate::RedisStoreError::ReplicationWaitTooLong)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicationWait {
    /// How many replicas must acknowledge a write.
    pub replicas: u32,
    /// How long the primary waits for them (`WAIT`'s timeout).
    pub timeout: Duration,
}

impl ReplicationWait {
    /// The `WAIT` timeout in whole milliseconds, at least 1 (`0` would wait forever).
    pub(crate) fn timeout_ms(&self) -> u64 {
        u64::try_from(self.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// How many replicas acknowledged a write, against how many were asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Acknowledged {
    pub(crate) replicas: i64,
    pub(crate) wanted: u32,
}

impl Acknowledged {
    pub(crate) fn is_short(&self) -> bool {
        self.replicas < i64::from(self.wanted)
    }
}
