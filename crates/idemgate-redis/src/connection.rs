//! One connection type over standalone Redis and Redis Cluster.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{ErrorKind, RedisResult, ScriptInvocation, ServerErrorKind, Value};

use crate::error::RedisStoreError;
use crate::replication::{Acknowledged, ReplicationWait};

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

    /// Runs a script on `key` and `WAIT`s for replicas behind it: one pipeline, so
    /// both go over the same connection to the same primary, and the `WAIT` covers
    /// the script's write (a `WAIT` sent after a reconnect would cover nothing). If
    /// the server does not know the script yet (`NOSCRIPT`: nothing ran), it is
    /// loaded and the pipeline sent again.
    pub(crate) async fn invoke_and_wait(
        &self,
        invocation: &ScriptInvocation<'_>,
        key: &str,
        wait: ReplicationWait,
    ) -> RedisResult<(Value, Acknowledged)> {
        let mut pipe = redis::pipe();
        pipe.invoke_script(invocation)
            .cmd("WAIT")
            .arg(wait.replicas)
            .arg(wait.timeout_ms())
            .ignore_errors();
        let mut replies = self.pipeline(&pipe, key).await?;
        if matches!(&replies.0, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
        {
            self.load(invocation).await?;
            replies = self.pipeline(&pipe, key).await?;
        }
        let (script, acknowledged) = replies;
        let replicas = match acknowledged.extract_error()? {
            Value::Int(n) => n,
            _ => {
                return Err(redis::RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "WAIT did not answer an integer",
                )));
            }
        };
        Ok((
            script.extract_error()?,
            Acknowledged {
                replicas,
                wanted: wait.replicas,
            },
        ))
    }

    /// Sends a two-command pipeline to the server, or to the primary of `key`'s slot.
    async fn pipeline(&self, pipe: &redis::Pipeline, key: &str) -> RedisResult<(Value, Value)> {
        let replies = match self {
            Self::Standalone(manager) => pipe.query_async(&mut manager.clone()).await?,
            Self::Cluster(cluster) => {
                let route =
                    SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
                cluster
                    .clone()
                    .route_pipeline(pipe.clone(), 0, 2, route)
                    .await?
            }
        };
        let mut replies: Vec<Value> = replies;
        match (replies.pop(), replies.pop()) {
            (Some(second), Some(first)) if replies.is_empty() => Ok((first, second)),
            _ => Err(redis::RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "a two-command pipeline did not get two replies",
            ))),
        }
    }

    async fn load(&self, invocation: &ScriptInvocation<'_>) -> RedisResult<String> {
        match self {
            Self::Standalone(manager) => invocation.load_async(&mut manager.clone()).await,
            Self::Cluster(cluster) => invocation.load_async(&mut cluster.clone()).await,
        }
    }
}

/// How long a constructor waits for its first connection: a few connect attempts.
fn startup_bound(timeouts: Timeouts) -> Duration {
    timeouts.connect * 3 + MAX_RECONNECT_DELAY
}
