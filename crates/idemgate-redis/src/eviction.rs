//! The startup check of `maxmemory-policy` (PITFALLS 6).

use crate::connection::Connection;
use crate::error::RedisStoreError;
use crate::server_config;

/// What a constructor does when `maxmemory-policy` lets Redis evict records.
///
/// Only `noeviction` is safe: the `volatile-*` policies evict keys that have an expiry
/// — every record has one — and the `allkeys-*` policies evict anything. An evicted
/// record is a key that runs twice. Under `noeviction` a full Redis refuses writes
/// instead (`OOM`), which the store reports as [`StoreError::Full`] (503).
///
/// Where `CONFIG GET` is not allowed (managed services, ACLs), the policy is
/// [`EvictionPolicy::Unknown`] and both modes only warn.
///
/// [`StoreError::Full`]: idemgate_core::StoreError::Full
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EvictionCheck {
    /// Log a `tracing` warning and go on.
    Warn,
    /// Fail the constructor with [`RedisStoreError::EvictingPolicy`](crate::RedisStoreError::EvictingPolicy).
    #[default]
    Refuse,
}

/// The `maxmemory-policy` a store found at startup (on every primary of a cluster).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// `noeviction` everywhere: records are never evicted.
    NoEviction,
    /// A policy that may evict records (the first one found other than `noeviction`).
    Evicting(String),
    /// `CONFIG GET` was refused or failed on some node.
    Unknown,
}

/// Reads `maxmemory-policy` from the server, or from every primary of a cluster.
pub(crate) async fn read_policy(connection: &Connection) -> EvictionPolicy {
    let mut unknown = false;
    for node in server_config::read(connection, &["maxmemory-policy"]).await {
        match node.and_then(|mut settings| settings.remove("maxmemory-policy")) {
            Some(policy) if policy == "noeviction" => {}
            Some(policy) => return EvictionPolicy::Evicting(policy),
            None => unknown = true,
        }
    }
    if unknown {
        EvictionPolicy::Unknown
    } else {
        EvictionPolicy::NoEviction
    }
}

/// Applies `check` to what was found: a warning, or the constructor's error.
pub(crate) fn enforce(
    policy: &EvictionPolicy,
    check: EvictionCheck,
) -> Result<(), RedisStoreError> {
    match (policy, check) {
        (EvictionPolicy::NoEviction, _) => {}
        (EvictionPolicy::Evicting(policy), EvictionCheck::Refuse) => {
            return Err(RedisStoreError::EvictingPolicy {
                policy: policy.clone(),
            });
        }
        (EvictionPolicy::Evicting(policy), EvictionCheck::Warn) => tracing::warn!(
            maxmemory_policy = %policy,
            "Redis may evict idempotency records under memory pressure, letting keys run twice; \
             set maxmemory-policy to noeviction"
        ),
        (EvictionPolicy::Unknown, _) => tracing::warn!(
            maxmemory_policy = "unknown",
            "could not read Redis maxmemory-policy (CONFIG GET refused?); make sure it is \
             noeviction, or records may be evicted and keys run twice"
        ),
    }
    Ok(())
}
