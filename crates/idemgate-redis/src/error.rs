//! What can go wrong, and how it maps onto [`StoreError`].

use std::time::Duration;

use idemgate_core::StoreError;
use idemgate_core::record::DecodeError;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Why a [`RedisStore`](crate::RedisStore) could not be built, or why one of its
/// operations failed (as the source of a [`StoreError`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// A URL or client option redis-rs refused.
    #[error("invalid Redis configuration")]
    Config(#[source] RedisError),
    /// The cluster constructor was given no node URLs.
    #[error("no Redis Cluster node URL given")]
    NoClusterNodes,
    /// The key prefix would break the `{…}` hash tag of record keys.
    #[error("key prefix {0:?} must not contain '{{' or '}}' (it would change the hash tag)")]
    InvalidKeyPrefix(String),
    /// The first connection failed.
    #[error("could not connect to Redis")]
    Connect(#[source] RedisError),
    /// The first connection did not complete in time.
    #[error("connecting to Redis timed out after {0:?}")]
    ConnectTimeout(Duration),
    /// `maxmemory-policy` lets Redis evict records and the store was told to refuse.
    #[error(
        "Redis maxmemory-policy is {policy:?}: it may evict idempotency records, which lets keys run twice; set it to noeviction"
    )]
    EvictingPolicy {
        /// The policy the server reported (on the first node that had one other than
        /// `noeviction`).
        policy: String,
    },
    /// Redis persists nothing (`appendonly no`, `save ""`) and the store was told to
    /// refuse ([`PersistenceCheck::Refuse`](crate::PersistenceCheck::Refuse)).
    #[error(
        "Redis persists nothing (appendonly no, save \"\"): a restart would forget every idempotency record and let completed keys run again; enable appendonly yes"
    )]
    NoPersistence,
    /// The persistence settings could not be read (`CONFIG GET` refused) and the
    /// store was told to refuse rather than guess.
    #[error(
        "could not read Redis persistence settings (CONFIG GET refused?) and the persistence check is Refuse; use PersistenceCheck::Warn where CONFIG is disabled"
    )]
    PersistenceUnknown,
    /// The replication wait's timeout is not shorter than the response timeout, so
    /// the reply to a write and its `WAIT` could not arrive in time.
    #[error(
        "replication wait timeout {wait:?} must be shorter than the response timeout {response:?}"
    )]
    ReplicationWaitTooLong {
        /// The `WAIT` timeout asked for.
        wait: Duration,
        /// The response timeout.
        response: Duration,
    },
    /// A write reached fewer replicas than the store's replication wait asks for:
    /// the claim was released, not run (see [`ReplicationWait`](crate::ReplicationWait)).
    #[error("Redis write reached {acknowledged} of {wanted} replicas in time")]
    NotReplicated {
        /// Replicas that acknowledged.
        acknowledged: i64,
        /// Replicas asked for.
        wanted: u32,
    },
    /// A command failed.
    #[error("Redis command failed")]
    Redis(#[source] RedisError),
    /// A command did not answer within the operation deadline.
    #[error("Redis did not answer within {0:?}")]
    Timeout(Duration),
    /// A reply did not have the shape the scripts return.
    #[error("unexpected reply from Redis: {0}")]
    UnexpectedReply(&'static str),
    /// A stored record's fields cannot be read back.
    #[error("undecodable record")]
    Decode(#[source] DecodeError),
    /// A stored response's compressed body cannot be decompressed.
    #[error("undecodable compressed response")]
    Decompress(#[source] std::io::Error),
}

impl From<DecodeError> for RedisStoreError {
    fn from(err: DecodeError) -> Self {
        Self::Decode(err)
    }
}

/// Classifies a failed command for the layer.
///
/// - unreachable, timed out, connection dropped or refused, I/O, a cluster that is
///   down or moving slots, a loading or read-only replica: [`StoreError::Unavailable`]
///   (503, retry later);
/// - `OOM` (`maxmemory` reached under `noeviction`): [`StoreError::Full`] (503), the
///   store refusing new records rather than evicting live ones;
/// - `WRONGTYPE` (something else wrote a non-hash at a record key): [`StoreError::Corrupt`];
/// - `NOPERM` (the ACL user may not run a command or touch a key the store needs):
///   [`StoreError::Misconfigured`] (500, logged with the fix);
/// - anything else (a script error): `Unavailable`, keeping the cause, so the layer
///   fails closed.
pub(crate) fn classify(err: RedisError) -> StoreError {
    if err.code() == Some("OOM") {
        return StoreError::Full;
    }
    if err.code() == Some("WRONGTYPE") {
        return StoreError::corrupt(RedisStoreError::Redis(err));
    }
    if matches!(err.kind(), ErrorKind::Server(ServerErrorKind::NoPerm)) {
        // An ACL user without the commands or keys the store needs: retrying does
        // not help, an operator must grant them.
        return StoreError::misconfigured(RedisStoreError::Redis(err));
    }
    let transient = err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_io_error()
        || err.is_cluster_error()
        || err.is_unrecoverable_error()
        || matches!(
            err.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::BusyLoading
                        | ServerErrorKind::ReadOnly
                )
        );
    if !transient {
        tracing::error!(error = %err, "unexpected Redis error; answering as unavailable");
    }
    StoreError::unavailable(RedisStoreError::Redis(err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_permission_is_misconfiguration() {
        let refused = RedisError::from((
            ErrorKind::Server(ServerErrorKind::NoPerm),
            "this user has no permissions to run the 'evalsha' command",
        ));
        assert!(matches!(classify(refused), StoreError::Misconfigured(_)));
        let busy = RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "loading"));
        assert!(matches!(classify(busy), StoreError::Unavailable(_)));
    }
}
