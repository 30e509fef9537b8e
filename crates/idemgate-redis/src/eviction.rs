//! The startup check of `maxmemory-policy` (PITFALLS 6).

use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{RedisResult, Value};

use crate::codec::{array_of, bytes_of};
use crate::connection::Connection;

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
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let replies: Vec<RedisResult<Value>> = match connection {
        Connection::Standalone(manager) => vec![cmd.query_async(&mut manager.clone()).await],
        Connection::Cluster(cluster) => {
            let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
            match cluster.clone().route_command(cmd, routing).await {
                // One (node address, reply) pair per primary.
                Ok(Value::Map(per_node)) => {
                    per_node.into_iter().map(|(_, reply)| Ok(reply)).collect()
                }
                other => vec![other],
            }
        }
    };
    let mut unknown = false;
    for reply in replies {
        match reply.ok().and_then(policy_of) {
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

/// The value of a `CONFIG GET maxmemory-policy` reply: `[name, value]`, or a map.
fn policy_of(reply: Value) -> Option<String> {
    if let Value::ServerError(_) = reply {
        return None;
    }
    let mut items = array_of(reply).ok()?.into_iter();
    let (_name, value) = (items.next()?, items.next()?);
    String::from_utf8(bytes_of(value).ok()?).ok()
}
