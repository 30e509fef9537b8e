//! One connection type over standalone Redis and Redis Cluster.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{RedisResult, ScriptInvocation, Value};

use crate::error::RedisStoreError;

/// How often a dropped connection is retried before a call fails (each call triggers
/// a new round when the previous one gave up).
const RECONNECT_RETRIES: usize = 2;
/// The longest pause between two reconnect attempts.
const MAX_RECONNECT_DELAY: Duration = Duration::from_millis(500);

/// The connection a store sends its scripts over. Both variants are cheap handles
/// onto a multiplexed connection (or one per cluster node), cloned per call.
#[derive(Clone)]
pub(crate) enum Connection {
    /// One server, reconnected automatically by redis-rs' `ConnectionManager`.
    Standalone(ConnectionManager),
    /// Redis Cluster: commands routed by key slot, `MOVED`/`ASK` followed, topology
    /// refreshed, nodes reconnected.
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Standalone(_) => "Connection::Standalone",
            Self::Cluster(_) => "Connection::Cluster",
        })
    }
}

/// Timeouts both kinds of connection apply.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub(crate) response: Duration,
    pub(crate) connect: Duration,
}

impl Connection {
    /// Connects to one server, failing (not hanging) when it is unreachable.
    pub(crate) async fn standalone(
        client: redis::Client,
        timeouts: Timeouts,
    ) -> Result<Self, RedisStoreError> {
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeouts.response))
            .set_connection_timeout(Some(timeouts.connect))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_max_delay(MAX_RECONNECT_DELAY);
        let bound = startup_bound(timeouts);
        match tokio::time::timeout(bound, ConnectionManager::new_with_config(client, config)).await
        {
            Ok(Ok(manager)) => Ok(Self::Standalone(manager)),
            Ok(Err(err)) => Err(RedisStoreError::Connect(err)),
            Err(_) => Err(RedisStoreError::ConnectTimeout(bound)),
        }
    }

    /// Connects to a cluster through any of its `nodes`.
    pub(crate) async fn cluster(
        nodes: &[String],
        timeouts: Timeouts,
    ) -> Result<Self, RedisStoreError> {
        let client = ClusterClient::builder(nodes.iter().map(String::as_str))
            .connection_timeout(timeouts.connect)
            .response_timeout(timeouts.response)
            .retries(RECONNECT_RETRIES as u32)
            .min_retry_wait(10)
            .max_retry_wait(MAX_RECONNECT_DELAY.as_millis() as u64)
            .build()
            .map_err(RedisStoreError::Config)?;
        let bound = startup_bound(timeouts);
        match tokio::time::timeout(bound, client.get_async_connection()).await {
            Ok(Ok(connection)) => Ok(Self::Cluster(connection)),
            Ok(Err(err)) => Err(RedisStoreError::Connect(err)),
            Err(_) => Err(RedisStoreError::ConnectTimeout(bound)),
        }
    }

    /// Runs a script (`EVALSHA`, then `SCRIPT LOAD` and `EVALSHA` again if the server
    /// does not know it yet — after a restart or on a new cluster node).
    pub(crate) async fn invoke(&self, invocation: &ScriptInvocation<'_>) -> RedisResult<Value> {
        match self {
            Self::Standalone(manager) => invocation.invoke_async(&mut manager.clone()).await,
            Self::Cluster(cluster) => invocation.invoke_async(&mut cluster.clone()).await,
        }
    }
}

/// How long a constructor waits for its first connection: a few connect attempts.
fn startup_bound(timeouts: Timeouts) -> Duration {
    timeouts.connect * 3 + MAX_RECONNECT_DELAY
}
