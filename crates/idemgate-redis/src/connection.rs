//! One connection type over standalone Redis and Redis Cluster.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

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
    /// refreshed, nodes reconnected — and the whole connection built anew when it
    /// only times out (see [`Cluster`]).
    Cluster(Cluster),
}

/// How long a cluster connection may answer nothing but timeouts before it is built
/// anew. Seen in tests/failover.rs with redis-rs 1.8.1: after a failover whose
/// replica had fallen behind, an idle `ClusterConnection` hit by many concurrent
/// calls timed out on every node for as long as it was used (40 s), while a new
/// connection to the same cluster worked at once.
const REBUILD_AFTER: Duration = Duration::from_secs(3);

/// A cluster connection that rebuilds itself from its client when every call has
/// timed out for [`REBUILD_AFTER`] (one rebuild at a time, in the background; calls
/// keep failing fast meanwhile).
#[derive(Clone)]
pub(crate) struct Cluster {
    client: Arc<ClusterClient>,
    current: Arc<RwLock<ClusterConnection>>,
    /// When the current run of timeouts began (`None` after any answer).
    timing_out_since: Arc<Mutex<Option<Instant>>>,
    rebuilding: Arc<AtomicBool>,
    startup_bound: Duration,
}

impl Cluster {
    /// A handle on the current connection, cheap to clone.
    pub(crate) fn connection(&self) -> ClusterConnection {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn answered(&self) {
        *self
            .timing_out_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// After a failed rebuild (the cluster is down, not the connection wedged): the
    /// next attempt waits for another [`REBUILD_AFTER`] of timeouts.
    fn retry_later(&self) {
        *self
            .timing_out_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    fn timed_out(&self) {
        let since = *self
            .timing_out_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(Instant::now);
        if since.elapsed() < REBUILD_AFTER || self.rebuilding.swap(true, Ordering::AcqRel) {
            return;
        }
        let cluster = self.clone();
        tokio::spawn(async move {
            let connecting = cluster.client.get_async_connection();
            match tokio::time::timeout(cluster.startup_bound, connecting).await {
                Ok(Ok(connection)) => {
                    tracing::warn!(
                        "the Redis Cluster connection answered only timeouts for {REBUILD_AFTER:?}; \
                         replaced it with a new one"
                    );
                    *cluster
                        .current
                        .write()
                        .unwrap_or_else(PoisonError::into_inner) = connection;
                    cluster.answered();
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, "rebuilding the Redis Cluster connection failed");
                    cluster.retry_later();
                }
                Err(_) => {
                    tracing::warn!("rebuilding the Redis Cluster connection timed out");
                    cluster.retry_later();
                }
            }
            cluster.rebuilding.store(false, Ordering::Release);
        });
    }
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
            Ok(Ok(connection)) => Ok(Self::Cluster(Cluster {
                client: Arc::new(client),
                current: Arc::new(RwLock::new(connection)),
                timing_out_since: Arc::new(Mutex::new(None)),
                rebuilding: Arc::new(AtomicBool::new(false)),
                startup_bound: bound,
            })),
            Ok(Err(err)) => Err(RedisStoreError::Connect(err)),
            Err(_) => Err(RedisStoreError::ConnectTimeout(bound)),
        }
    }

    /// Runs a script (`EVALSHA`, then `SCRIPT LOAD` and `EVALSHA` again if the server
    /// does not know it yet — after a restart or on a new cluster node).
    pub(crate) async fn invoke(&self, invocation: &ScriptInvocation<'_>) -> RedisResult<Value> {
        match self {
            Self::Standalone(manager) => invocation.invoke_async(&mut manager.clone()).await,
            Self::Cluster(cluster) => invocation.invoke_async(&mut cluster.connection()).await,
        }
    }

    /// Tells the connection how a call ended: `timed_out` when it got no answer in
    /// time, so a wedged cluster connection is noticed and rebuilt.
    pub(crate) fn observe(&self, timed_out: bool) {
        if let Self::Cluster(cluster) = self {
            if timed_out {
                cluster.timed_out();
            } else {
                cluster.answered();
            }
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
                    .connection()
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
            Self::Cluster(cluster) => invocation.load_async(&mut cluster.connection()).await,
        }
    }
}

/// How long a constructor waits for its first connection: a few connect attempts.
fn startup_bound(timeouts: Timeouts) -> Duration {
    timeouts.connect * 3 + MAX_RECONNECT_DELAY
}
