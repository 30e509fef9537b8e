//! `RedisStore`, its builder, and its `Store` implementation.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idemgate_core::audit::{AuditEntry, AuditPartition, AuditQuery, AuditRecord, AuditSecret};
use idemgate_core::fingerprint::FieldDigests;
use idemgate_core::hex_text;
use idemgate_core::record::{FencingToken, OperationId, RECORD_FORMAT_VERSION};
use idemgate_core::resource_lease::{LeaseAcquisition, LeaseToken, ResourceId, ResourceLease};
use idemgate_core::scope::IdentityDigest;
use idemgate_core::signals::ChangeSignals;
use idemgate_core::stream::StreamId;
use idemgate_core::time::Timestamp;
use idemgate_core::{
    Claim, ClaimRequest, Completion, EvictMode, Eviction, FencedWrite, Lease, LeaseOrigin,
    Snapshot, Store, StoreError,
};
use redis::{ScriptInvocation, Value};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::audit::{ClaimEntryReply, Journal, Runner, SealedClaim};
use crate::codec::{
    ResponseCodec, array_of, bytes_of, decode_record, int_of, parse_status, status_code,
};
use crate::connection::{Connection, Timeouts};
use crate::error::{RedisStoreError, classify};
use crate::eviction::{self, EvictionCheck, EvictionPolicy, read_policy};
use crate::persistence::{self, Persistence, PersistenceCheck, read_persistence};
use crate::replication::{Acknowledged, ReplicationWait};
use crate::scripts::Scripts;
use crate::subscriber;

/// The default key prefix.
pub const DEFAULT_KEY_PREFIX: &str = "idemgate:";

/// The longest lease or TTL a store writes (ten years); longer ones are cut to it so
/// that `now + ttl` stays a valid `PEXPIREAT` time.
const MAX_DURATION_MS: u64 = 10 * 365 * 86_400_000;

/// Idempotency records in Redis: one server through a reconnecting
/// `ConnectionManager`, or a Redis Cluster. See the [crate docs](crate) for the key
/// layout, persistence and eviction settings.
///
/// Cloning is cheap and shares the connection. Every [`Store`] method is one
/// `EVALSHA` round trip, bounded by the response and connect timeouts: while Redis
/// is down, calls fail with [`StoreError::Unavailable`] instead of hanging.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Connection,
    scripts: Scripts,
    /// The journal's scripts and keys (`crate::audit`).
    journal: Journal,
    key_prefix: String,
    channel: String,
    codec: ResponseCodec,
    deadline: Duration,
    eviction_policy: EvictionPolicy,
    persistence: Persistence,
    replication_wait: Option<ReplicationWait>,
    signals: Arc<ChangeSignals>,
    subscriber: OnceLock<AbortHandle>,
    /// `true` while the subscriber's subscription is confirmed.
    subscribed: watch::Sender<bool>,
    pubsub_clients: Vec<redis::Client>,
    connect_timeout: Duration,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.subscriber.get() {
            task.abort();
        }
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("connection", &self.inner.connection)
            .field("key_prefix", &self.inner.key_prefix)
            .field("codec", &self.inner.codec)
            .field("deadline", &self.inner.deadline)
            .field("eviction_policy", &self.inner.eviction_policy)
            .field("persistence", &self.inner.persistence)
            .field("replication_wait", &self.inner.replication_wait)
            .finish_non_exhaustive()
    }
}

/// Configures and connects a [`RedisStore`].
///
/// ```no_run
/// # async fn run() -> Result<(), idemgate_redis::RedisStoreError> {
/// use std::time::Duration;
/// use idemgate_redis::{EvictionCheck, RedisStore};
///
/// let store = RedisStore::builder()
///     .with_key_prefix("shop:idem:")
///     .with_response_timeout(Duration::from_millis(500))
///     .with_eviction_check(EvictionCheck::Warn)
///     .connect("redis://127.0.0.1:6379")
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `connect` is called"]
pub struct RedisStoreBuilder {
    key_prefix: String,
    codec: ResponseCodec,
    response_timeout: Duration,
    connect_timeout: Duration,
    eviction_check: EvictionCheck,
    persistence_check: PersistenceCheck,
    replication_wait: Option<ReplicationWait>,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        Self {
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            // The layer compresses large bodies for every store
            // (idemgate_core::compression); Redis adds no second codec unless
            // asked, and reads records an earlier version compressed whole.
            codec: ResponseCodec::new(usize::MAX),
            response_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_millis(500),
            eviction_check: EvictionCheck::default(),
            persistence_check: PersistenceCheck::default(),
            replication_wait: None,
        }
    }
}

impl RedisStoreBuilder {
    /// Prefixes every record key (default `idemgate:`), so several applications can
    /// share one Redis. It must not contain `{` or `}`, which would change the hash
    /// tag.
    ///
    /// ```
    /// let builder = idemgate_redis::RedisStore::builder().with_key_prefix("billing:idem:");
    /// ```
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Also compresses whole stored responses (headers and body) whose encoding
    /// is larger than `bytes` with zstd (default: never, `usize::MAX`). The layer
    /// already keeps bodies over 1 KiB compressed on every store
    /// (`idemgate_core::compression`, never compressed twice), so this only pays
    /// for records with large header sets. Readers decode either form, so the
    /// threshold can change at any time.
    ///
    /// ```
    /// let builder = idemgate_redis::RedisStore::builder().with_compression_threshold(4096);
    /// ```
    pub fn with_compression_threshold(mut self, bytes: usize) -> Self {
        self.codec = ResponseCodec::new(bytes).with_level(self.codec.level());
        self
    }

    /// The zstd level for compressed responses (default 1; higher is slower and,
    /// on some bodies, smaller).
    ///
    /// ```
    /// let builder = idemgate_redis::RedisStore::builder().with_compression_level(3);
    /// ```
    pub fn with_compression_level(mut self, level: i32) -> Self {
        self.codec = self.codec.with_level(level);
        self
    }

    /// How long one command may wait for its reply (default 1 s).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let builder = idemgate_redis::RedisStore::builder().with_response_timeout(Duration::from_millis(800));
    /// ```
    pub fn with_response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long one connection attempt may take (default 500 ms).
    ///
    /// Every store call is bounded by the response timeout plus this one, so while
    /// Redis is unreachable calls fail within that bound (1.5 s by default).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let builder = idemgate_redis::RedisStore::builder().with_connect_timeout(Duration::from_millis(300));
    /// ```
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// What to do when `maxmemory-policy` may evict records (default
    /// [`EvictionCheck::Refuse`]).
    ///
    /// ```
    /// use idemgate_redis::{EvictionCheck, RedisStore};
    /// let builder = RedisStore::builder().with_eviction_check(EvictionCheck::Warn);
    /// ```
    pub fn with_eviction_check(mut self, check: EvictionCheck) -> Self {
        self.eviction_check = check;
        self
    }

    /// What to do when Redis persists nothing, so that a restart would forget every
    /// record and let completed keys run again (default [`PersistenceCheck::Warn`]:
    /// one warning at startup; [`PersistenceCheck::Refuse`] fails the constructor).
    ///
    /// ```
    /// use idemgate_redis::{PersistenceCheck, RedisStore};
    /// let builder = RedisStore::builder().with_persistence_check(PersistenceCheck::Refuse);
    /// ```
    pub fn with_persistence_check(mut self, check: PersistenceCheck) -> Self {
        self.persistence_check = check;
        self
    }

    /// After every claim, completion and renewal, waits until `replicas` replicas
    /// have it (`WAIT replicas timeout`, in the same round trip), so that a primary
    /// failing over cannot lose a claim whose handler runs: a claim that did not
    /// reach them in `timeout` is released and answered
    /// [`StoreError::Unavailable`] (503), its handler not run. Off by default (one
    /// round trip, no wait). See [`ReplicationWait`] for what each write does when
    /// replicas fall short; `timeout` must be shorter than the response timeout.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let builder = idemgate_redis::RedisStore::builder()
    ///     .with_replication_wait(1, Duration::from_millis(250));
    /// ```
    pub fn with_replication_wait(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replication_wait = Some(ReplicationWait { replicas, timeout });
        self
    }

    /// Connects to one Redis server (`redis://[user:password@]host:port[/db]`,
    /// `rediss://` needs a TLS feature of redis-rs), then checks its eviction policy and
    /// its persistence.
    pub async fn connect(self, url: &str) -> Result<RedisStore, RedisStoreError> {
        self.check_options()?;
        let client = redis::Client::open(url).map_err(RedisStoreError::Config)?;
        let connection = Connection::standalone(client.clone(), self.timeouts()).await?;
        self.finish(connection, vec![client]).await
    }

    /// Connects to a Redis Cluster through any of `nodes` (the rest of the topology
    /// is discovered), then checks the eviction policy and persistence of every
    /// primary.
    pub async fn connect_cluster<I, S>(self, nodes: I) -> Result<RedisStore, RedisStoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.check_options()?;
        let nodes: Vec<String> = nodes
            .into_iter()
            .map(|node| node.as_ref().to_owned())
            .collect();
        if nodes.is_empty() {
            return Err(RedisStoreError::NoClusterNodes);
        }
        let pubsub_clients = nodes
            .iter()
            .map(|node| redis::Client::open(node.as_str()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(RedisStoreError::Config)?;
        let connection = Connection::cluster(&nodes, self.timeouts()).await?;
        self.finish(connection, pubsub_clients).await
    }

    fn check_options(&self) -> Result<(), RedisStoreError> {
        if self.key_prefix.contains(['{', '}']) {
            return Err(RedisStoreError::InvalidKeyPrefix(self.key_prefix.clone()));
        }
        if let Some(wait) = self.replication_wait
            && wait.timeout >= self.response_timeout
        {
            return Err(RedisStoreError::ReplicationWaitTooLong {
                wait: wait.timeout,
                response: self.response_timeout,
            });
        }
        Ok(())
    }

    fn timeouts(&self) -> Timeouts {
        Timeouts {
            response: self.response_timeout,
            connect: self.connect_timeout,
        }
    }

    async fn finish(
        self,
        connection: Connection,
        pubsub_clients: Vec<redis::Client>,
    ) -> Result<RedisStore, RedisStoreError> {
        let deadline = self.response_timeout + self.connect_timeout;
        let eviction_policy = tokio::time::timeout(deadline, read_policy(&connection))
            .await
            .unwrap_or(EvictionPolicy::Unknown);
        eviction::enforce(&eviction_policy, self.eviction_check)?;
        let persistence = tokio::time::timeout(deadline, read_persistence(&connection))
            .await
            .unwrap_or(Persistence::Unknown);
        persistence::enforce(&persistence, self.persistence_check)?;
        Ok(RedisStore {
            inner: Arc::new(Inner {
                connection,
                scripts: Scripts::new(),
                journal: Journal::new(&self.key_prefix),
                channel: format!("{}changes", self.key_prefix),
                key_prefix: self.key_prefix,
                codec: self.codec,
                deadline,
                eviction_policy,
                persistence,
                replication_wait: self.replication_wait,
                signals: Arc::new(ChangeSignals::new()),
                subscriber: OnceLock::new(),
                subscribed: watch::Sender::new(false),
                pubsub_clients,
                connect_timeout: self.connect_timeout,
            }),
        })
    }
}

impl Runner for RedisStore {
    fn run<'a>(
        &'a self,
        invocation: &'a ScriptInvocation<'a>,
    ) -> impl Future<Output = Result<Value, StoreError>> + Send + 'a {
        RedisStore::run(self, invocation)
    }
}

impl RedisStore {
    /// A builder with the defaults: prefix `idemgate:`, compression above 1 KiB,
    /// 1 s response and 500 ms connect timeouts, [`EvictionCheck::Refuse`].
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// Connects to one Redis server with the default settings.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemgate_redis::RedisStoreError> {
    /// let store = idemgate_redis::RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, RedisStoreError> {
        Self::builder().connect(url).await
    }

    /// Connects to a Redis Cluster with the default settings.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemgate_redis::RedisStoreError> {
    /// let store = idemgate_redis::RedisStore::connect_cluster([
    ///     "redis://10.0.0.1:6379",
    ///     "redis://10.0.0.2:6379",
    /// ])
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_cluster<I, S>(nodes: I) -> Result<Self, RedisStoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::builder().connect_cluster(nodes).await
    }

    /// The Redis key of the record under `identity`: `<prefix>{<hex digest>}`.
    pub fn record_key(&self, identity: &IdentityDigest) -> String {
        format!("{}{{{}}}", self.inner.key_prefix, identity.to_hex())
    }

    /// The Redis key of the list of `stream`'s pieces (`Store::append_stream_piece`):
    /// `<record key>:pieces:<operation id, 32 lowercase hex>:<token>`, one list
    /// per run, piece `i` at index `i`. The record key's hash tag, so on Redis
    /// Cluster it lives in its record's slot, and one script reads or writes both.
    /// It expires with the record (and is deleted with it); a takeover's run
    /// streams under its new token, leaving the earlier run's list to expire at
    /// the record's expiry as it stood then.
    pub fn stream_pieces_key(&self, stream: &StreamId) -> String {
        format!(
            "{}:pieces:{}:{}",
            self.record_key(&stream.identity),
            hex_text::encode(stream.operation_id.as_bytes()),
            stream.token.0
        )
    }

    /// The Redis key of the resource lease on `resource`:
    /// `<prefix>lease:{<hex digest>}`, a string holding the holder's token and
    /// the lease's end, which is also its expiry. One key per lease, its digest the hash tag,
    /// so on Redis Cluster each lease lives in its own slot like a record.
    pub fn resource_lease_key(&self, resource: &ResourceId) -> String {
        format!("{}lease:{{{}}}", self.inner.key_prefix, resource.to_hex())
    }

    /// The keys of the routes' execution histories (`Store::record_duration`):
    /// `<prefix>{<prefix>durations}:routes`, the sorted set of routes with
    /// history by when each was last recorded (at most `estimate::MAX_ROUTES`),
    /// and `<prefix>{<prefix>durations}:route:<route>`, a route's list of
    /// durations in microseconds, newest first, at most `estimate::WINDOW`. One
    /// hash tag for all, so on Redis Cluster the script that bounds the set and
    /// pushes on a list runs in one slot.
    pub fn duration_keys(&self, route: &str) -> (String, String) {
        let (routes, lists) = self.duration_key_bases();
        (
            routes,
            format!("{lists}{}", idemgate_core::estimate::route_key(route)),
        )
    }

    /// The routes' set key, and the prefix of every route's list key.
    fn duration_key_bases(&self) -> (String, String) {
        let prefix = &self.inner.key_prefix;
        let base = format!("{prefix}{{{prefix}durations}}");
        (format!("{base}:routes"), format!("{base}:route:"))
    }

    /// The pub/sub channel completions, releases, deletions and stream pieces of
    /// records someone waits for are announced on: `<prefix>changes`, with the
    /// 32-byte identity digest as the message (writes nobody waits for announce
    /// nothing).
    pub fn change_channel(&self) -> &str {
        &self.inner.channel
    }

    /// The `maxmemory-policy` found at startup.
    pub fn eviction_policy(&self) -> &EvictionPolicy {
        &self.inner.eviction_policy
    }

    /// The persistence found at startup (on a cluster, the weakest primary's).
    pub fn persistence(&self) -> &Persistence {
        &self.inner.persistence
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.connection, Connection::Cluster(_))
    }

    /// One claim script call: `request` claimed, a record created under
    /// `new_operation`, and with a new record `entry` appended to the journal
    /// where one is given. A claim a failover may lose must not run: it is
    /// released (and its entry, if written, followed by `released`), and the
    /// answer is unavailable.
    async fn claim(
        &self,
        request: &ClaimRequest,
        new_operation: OperationId,
        entry: Option<&SealedClaim<'_>>,
    ) -> Result<ClaimReply, StoreError> {
        let identity = *request.identity.digest();
        let key = self.record_key(&identity);
        let mut invocation = self.inner.scripts.claim.key(&key);
        invocation
            .arg(request.fingerprint.as_bytes())
            .arg(new_operation.as_bytes())
            .arg(millis(request.lease))
            .arg(millis(request.ttl))
            .arg(RECORD_FORMAT_VERSION)
            .arg(
                request
                    .field_digests
                    .as_ref()
                    .map(FieldDigests::encode)
                    .unwrap_or_default(),
            );
        if let Some(entry) = entry {
            entry.add_to(&mut invocation);
        }
        let (reply, acknowledged) = self.run_replicated(&invocation, &key).await?;
        let reply =
            decode_claim(reply, identity, &self.inner.codec).map_err(StoreError::corrupt)?;
        match (&reply.claim, acknowledged) {
            (Claim::Acquired(lease), Some(acknowledged)) if acknowledged.is_short() => {
                tracing::warn!(
                    replicas = acknowledged.replicas,
                    wanted = acknowledged.wanted,
                    "claim not replicated in time; released, answering unavailable"
                );
                if let Err(error) = self.release(lease).await {
                    tracing::warn!(%error, "releasing the unreplicated claim failed; a retry takes it over once the lease lapses");
                }
                if let (Some(entry), ClaimEntryReply::Written) = (entry, &reply.entry)
                    && let Err(error) = self.inner.journal.append(self, &[entry.released()]).await
                {
                    tracing::warn!(%error, "journalling the unreplicated claim's release failed");
                }
                Err(not_replicated(acknowledged))
            }
            _ => Ok(reply),
        }
    }

    /// Runs one script, bounded by the operation deadline.
    async fn run(&self, invocation: &ScriptInvocation<'_>) -> Result<Value, StoreError> {
        let deadline = self.inner.deadline;
        let outcome =
            tokio::time::timeout(deadline, self.inner.connection.invoke(invocation)).await;
        self.observe(&outcome);
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(classify(err)),
            Err(_) => Err(StoreError::unavailable(RedisStoreError::Timeout(deadline))),
        }
    }

    /// Runs one script on `key` and, with a replication wait, `WAIT`s behind it;
    /// `None` when no wait is configured. Bounded by the operation deadline.
    async fn run_replicated(
        &self,
        invocation: &ScriptInvocation<'_>,
        key: &str,
    ) -> Result<(Value, Option<Acknowledged>), StoreError> {
        let Some(wait) = self.inner.replication_wait else {
            return Ok((self.run(invocation).await?, None));
        };
        let deadline = self.inner.deadline;
        let call = self.inner.connection.invoke_and_wait(invocation, key, wait);
        let outcome = tokio::time::timeout(deadline, call).await;
        self.observe(&outcome);
        match outcome {
            Ok(Ok((value, acknowledged))) => Ok((value, Some(acknowledged))),
            Ok(Err(err)) => Err(classify(err)),
            Err(_) => Err(StoreError::unavailable(RedisStoreError::Timeout(deadline))),
        }
    }

    /// Tells the connection whether a call timed out (its own deadline or redis-rs'
    /// response timeout) or got an answer.
    fn observe<T>(&self, outcome: &Result<redis::RedisResult<T>, tokio::time::error::Elapsed>) {
        let timed_out = match outcome {
            Err(_) => true,
            Ok(Err(err)) => err.is_timeout(),
            Ok(Ok(_)) => false,
        };
        self.inner.connection.observe(timed_out);
    }

    /// Runs a fenced script: 1 applied, 0 refused.
    async fn fenced(&self, invocation: &ScriptInvocation<'_>) -> Result<FencedWrite, StoreError> {
        fenced_reply(self.run(invocation).await?)
    }

    fn notify(&self, identity: &IdentityDigest, write: FencedWrite) {
        if write == FencedWrite::Applied {
            self.inner.signals.notify(identity);
        }
    }

    /// Marks the record as waited on (the write ending its run will announce it),
    /// or finds it no longer in progress. A hint: failures and timeouts (at
    /// `until`) count as marked, so the wait falls back to its timeout.
    async fn mark_waiting(
        &self,
        identity: &IdentityDigest,
        until: tokio::time::Instant,
    ) -> MarkedWaiting {
        let key = self.record_key(identity);
        let invocation = self.inner.scripts.mark_waiting.key(&key);
        match tokio::time::timeout_at(until, self.run(&invocation)).await {
            Ok(Ok(Value::Int(0))) => MarkedWaiting::Ended,
            Ok(Err(error)) => {
                tracing::debug!(%error, "marking a Redis record as waited on failed");
                MarkedWaiting::Marked
            }
            _ => MarkedWaiting::Marked,
        }
    }

    fn ensure_subscribed(&self) {
        self.inner.subscriber.get_or_init(|| {
            tokio::spawn(subscriber::run(
                self.inner.pubsub_clients.clone(),
                self.inner.channel.clone(),
                Arc::downgrade(&self.inner.signals),
                self.inner.subscribed.clone(),
                self.inner.connect_timeout,
            ))
            .abort_handle()
        });
    }
}

/// What marking a record as waited on found.
#[derive(Debug, PartialEq, Eq)]
enum MarkedWaiting {
    /// In progress, now marked (or unknown: the mark failed or timed out).
    Marked,
    /// Absent, released or final: nothing left to wait for.
    Ended,
}

fn fenced_reply(reply: Value) -> Result<FencedWrite, StoreError> {
    match int_of(reply).map_err(StoreError::corrupt)? {
        1 => Ok(FencedWrite::Applied),
        _ => Ok(FencedWrite::Refused),
    }
}

fn not_replicated(acknowledged: Acknowledged) -> StoreError {
    StoreError::unavailable(RedisStoreError::NotReplicated {
        acknowledged: acknowledged.replicas,
        wanted: acknowledged.wanted,
    })
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, MAX_DURATION_MS)
}

fn token_arg(token: FencingToken) -> String {
    token.0.to_string()
}

/// Decodes the resource lease acquisition script's reply for `proposed`.
fn decode_lease_acquisition(
    reply: Value,
    resource: ResourceId,
    proposed: LeaseToken,
) -> Result<LeaseAcquisition, RedisStoreError> {
    let mut items = array_of(reply)?.into_iter();
    let mut next = || {
        items
            .next()
            .ok_or(RedisStoreError::UnexpectedReply(
                "short resource lease reply",
            ))
            .and_then(int_of)
    };
    let acquired = next()?;
    let now = Timestamp::from_millis(next()?);
    let until = Timestamp::from_millis(next()?);
    Ok(match acquired {
        1 => LeaseAcquisition::Acquired(ResourceLease {
            resource,
            token: proposed,
            until,
        }),
        _ => LeaseAcquisition::Held { until, now },
    })
}

/// The claim script's reply.
struct ClaimReply {
    claim: Claim,
    /// The server's clock when the script ran.
    now: Timestamp,
    /// What it did with the journal entry it was given.
    entry: ClaimEntryReply,
}

/// Decodes the claim script's reply.
fn decode_claim(
    reply: Value,
    identity: IdentityDigest,
    codec: &ResponseCodec,
) -> Result<ClaimReply, RedisStoreError> {
    let mut items = array_of(reply)?.into_iter();
    let mut next = || {
        items
            .next()
            .ok_or(RedisStoreError::UnexpectedReply("short claim reply"))
    };
    let tag = bytes_of(next()?)?;
    let now = Timestamp::from_millis(int_of(next()?)?);
    let origin = match tag.as_slice() {
        b"E" => {
            let record = decode_record(next()?, codec)?.ok_or(RedisStoreError::UnexpectedReply(
                "existing record without fields",
            ))?;
            return Ok(ClaimReply {
                claim: Claim::Existing(Snapshot { record, now }),
                now,
                entry: ClaimEntryReply::NoNewRecord,
            });
        }
        b"N" => LeaseOrigin::New,
        b"R" => LeaseOrigin::Released,
        b"T" => LeaseOrigin::TakenOver,
        _ => return Err(RedisStoreError::UnexpectedReply("unknown claim outcome")),
    };
    let operation_id = <[u8; 16]>::try_from(bytes_of(next()?)?.as_slice())
        .map(OperationId::from_bytes)
        .map_err(|_| RedisStoreError::UnexpectedReply("operation id is not 16 bytes"))?;
    let token = u64::try_from(int_of(next()?)?)
        .map_err(|_| RedisStoreError::UnexpectedReply("negative token"))?;
    let locked_until = Timestamp::from_millis(int_of(next()?)?);
    let entry = match items.next() {
        None => ClaimEntryReply::NoNewRecord,
        Some(Value::Int(1)) => ClaimEntryReply::Written,
        Some(head) => ClaimEntryReply::HeadMoved(
            String::from_utf8(bytes_of(head)?)
                .map_err(|_| RedisStoreError::UnexpectedReply("a journal head is not text"))?,
        ),
    };
    Ok(ClaimReply {
        claim: Claim::Acquired(Lease {
            identity,
            operation_id,
            token: FencingToken(token),
            origin,
            locked_until,
        }),
        now,
        entry,
    })
}

/// Decodes the evict script's reply.
fn decode_eviction(reply: Value) -> Result<Eviction, RedisStoreError> {
    let mut items = array_of(reply)?.into_iter();
    let mut next = || {
        items
            .next()
            .ok_or(RedisStoreError::UnexpectedReply("short evict reply"))
    };
    let tag = bytes_of(next()?)?;
    let now = Timestamp::from_millis(int_of(next()?)?);
    match tag.as_slice() {
        b"A" => Ok(Eviction::Absent),
        b"L" => Ok(Eviction::RefusedLiveLease {
            locked_until: Timestamp::from_millis(int_of(next()?)?),
            now,
        }),
        b"E" => Ok(Eviction::Evicted {
            status: parse_status(&bytes_of(next()?)?)
                .map_err(|_| RedisStoreError::UnexpectedReply("unknown record status"))?,
        }),
        _ => Err(RedisStoreError::UnexpectedReply("unknown evict outcome")),
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn try_claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        let reply = self.claim(request, OperationId::generate(), None).await?;
        Ok(reply.claim)
    }

    /// On one server, the entry goes into the claim script: a new key's claim
    /// and its entry are one round trip, and the claim does not wait for the
    /// journal's writer. On Cluster the record's slot is not the journal's, and
    /// the writer appends it (the default).
    async fn try_claim_journaled(
        &self,
        request: &ClaimRequest,
        entry: &AuditRecord,
    ) -> Result<(Claim, bool), StoreError> {
        if self.is_cluster() {
            return Ok((self.try_claim(request).await?, false));
        }
        let new_operation = OperationId::generate();
        let sealed = self
            .inner
            .journal
            .seal_claim(entry.clone().of_claim(LeaseOrigin::New, new_operation));
        let reply = self.claim(request, new_operation, sealed.as_ref()).await?;
        self.inner.journal.claim_read_clock(reply.now);
        let written = sealed.is_some_and(|sealed| sealed.settle(&reply.entry));
        Ok((reply.claim, written))
    }

    async fn complete(
        &self,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<FencedWrite, StoreError> {
        let key = self.record_key(&lease.identity);
        let pieces = self.stream_pieces_key(&lease.stream());
        let response = self.inner.codec.encode(&completion.response);
        let mut invocation = self.inner.scripts.complete.key(&key);
        invocation
            .key(&pieces)
            .arg(lease.operation_id.as_bytes())
            .arg(token_arg(lease.token))
            .arg(status_code(completion.status.into()))
            .arg(response.as_slice())
            .arg(millis(completion.ttl))
            .arg(&self.inner.channel)
            .arg(lease.identity.as_bytes());
        let (reply, acknowledged) = self.run_replicated(&invocation, &key).await?;
        let write = fenced_reply(reply)?;
        if write == FencedWrite::Applied
            && let Some(acknowledged) = acknowledged.filter(Acknowledged::is_short)
        {
            // The handler ran; that cannot be undone. The claim was replicated, so a
            // failover now brings the record back in progress under the same
            // operation id, which a retry takes over (PROTOCOL §11).
            tracing::warn!(
                replicas = acknowledged.replicas,
                wanted = acknowledged.wanted,
                "completion not replicated in time; if the primary fails now, a retry runs the \
                 operation again under the same operation id"
            );
        }
        self.notify(&lease.identity, write);
        Ok(write)
    }

    async fn release(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        let key = self.record_key(&lease.identity);
        let mut invocation = self.inner.scripts.release.key(&key);
        invocation
            .arg(lease.operation_id.as_bytes())
            .arg(token_arg(lease.token))
            .arg(&self.inner.channel)
            .arg(lease.identity.as_bytes());
        let write = self.fenced(&invocation).await?;
        self.notify(&lease.identity, write);
        Ok(write)
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<FencedWrite, StoreError> {
        let key = self.record_key(&lease.identity);
        let mut invocation = self.inner.scripts.renew.key(&key);
        invocation
            .arg(lease.operation_id.as_bytes())
            .arg(token_arg(lease.token))
            .arg(millis(lease_for));
        let (reply, acknowledged) = self.run_replicated(&invocation, &key).await?;
        let write = fenced_reply(reply)?;
        match acknowledged {
            Some(acknowledged) if write == FencedWrite::Applied && acknowledged.is_short() => {
                Err(not_replicated(acknowledged))
            }
            _ => Ok(write),
        }
    }

    async fn delete(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        let key = self.record_key(&lease.identity);
        let pieces = self.stream_pieces_key(&lease.stream());
        let mut invocation = self.inner.scripts.delete.key(&key);
        invocation
            .key(&pieces)
            .arg(lease.operation_id.as_bytes())
            .arg(token_arg(lease.token))
            .arg(&self.inner.channel)
            .arg(lease.identity.as_bytes());
        let write = self.fenced(&invocation).await?;
        self.notify(&lease.identity, write);
        Ok(write)
    }

    async fn evict(
        &self,
        identity: &IdentityDigest,
        mode: EvictMode,
    ) -> Result<Eviction, StoreError> {
        let key = self.record_key(identity);
        let mut invocation = self.inner.scripts.evict.key(&key);
        invocation
            .arg(if mode == EvictMode::Force { "1" } else { "0" })
            .arg(&self.inner.channel)
            .arg(identity.as_bytes());
        let eviction =
            decode_eviction(self.run(&invocation).await?).map_err(StoreError::corrupt)?;
        if matches!(eviction, Eviction::Evicted { .. }) {
            self.inner.signals.notify(identity);
        }
        Ok(eviction)
    }

    /// One script (see `scripts.rs`): fenced as `complete` is, then `LSET` (an
    /// index appended again), `RPUSH` (the next one) or nothing (a gap) on the
    /// run's list, which expires with the record; announced on the change channel
    /// when a waiter marked the record. Not followed by the replication wait: a
    /// completion that reached the replicas brings every piece appended before it
    /// (one primary's replication stream is in order), and a lost piece costs a
    /// reader of the stream in flight at most what a failover costs the run.
    async fn append_stream_piece(
        &self,
        lease: &Lease,
        index: u32,
        piece: &Bytes,
    ) -> Result<FencedWrite, StoreError> {
        let key = self.record_key(&lease.identity);
        let pieces = self.stream_pieces_key(&lease.stream());
        let mut invocation = self.inner.scripts.append_piece.key(&key);
        invocation
            .key(&pieces)
            .arg(lease.operation_id.as_bytes())
            .arg(token_arg(lease.token))
            .arg(index)
            .arg(piece.as_ref())
            .arg(&self.inner.channel)
            .arg(lease.identity.as_bytes());
        let write = match int_of(self.run(&invocation).await?).map_err(StoreError::corrupt)? {
            1 => FencedWrite::Applied,
            2 => {
                return Err(StoreError::corrupt(
                    "a stream piece past the end of its list: earlier pieces are gone",
                ));
            }
            _ => FencedWrite::Refused,
        };
        self.notify(&lease.identity, write);
        Ok(write)
    }

    /// One script: `LRANGE` of the run's list while the record names the run.
    async fn read_stream_pieces(
        &self,
        stream: &StreamId,
        from: u32,
        limit: u32,
    ) -> Result<Vec<Bytes>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let key = self.record_key(&stream.identity);
        let pieces = self.stream_pieces_key(stream);
        let mut invocation = self.inner.scripts.read_pieces.key(&key);
        invocation
            .key(&pieces)
            .arg(stream.operation_id.as_bytes())
            .arg(token_arg(stream.token))
            .arg(from)
            .arg(u64::from(from) + u64::from(limit) - 1);
        let reply = self.run(&invocation).await?;
        let decode = || -> Result<Vec<Bytes>, RedisStoreError> {
            array_of(reply)?
                .into_iter()
                .map(|piece| bytes_of(piece).map(Bytes::from))
                .collect()
        };
        decode().map_err(StoreError::corrupt)
    }

    async fn get(&self, identity: &IdentityDigest) -> Result<Option<Snapshot>, StoreError> {
        let key = self.record_key(identity);
        let invocation = self.inner.scripts.get.key(&key);
        let reply = self.run(&invocation).await?;
        let decode = || -> Result<Option<Snapshot>, RedisStoreError> {
            let mut items = array_of(reply)?.into_iter();
            let now = items
                .next()
                .ok_or(RedisStoreError::UnexpectedReply("short get reply"))?;
            let now = Timestamp::from_millis(int_of(now)?);
            let fields = items
                .next()
                .ok_or(RedisStoreError::UnexpectedReply("short get reply"))?;
            Ok(decode_record(fields, &self.inner.codec)?.map(|record| Snapshot { record, now }))
        };
        decode().map_err(StoreError::corrupt)
    }

    /// `SET NX PXAT` in one script (see `scripts.rs`). With a replication wait, an
    /// acquisition the replicas did not get in time is released and answered
    /// [`StoreError::Unavailable`], as a claim is: a failover could otherwise
    /// lose it and let a second holder in.
    async fn acquire_resource_lease(
        &self,
        resource: &ResourceId,
        ttl: Duration,
    ) -> Result<LeaseAcquisition, StoreError> {
        let key = self.resource_lease_key(resource);
        let token = LeaseToken::random();
        let mut invocation = self.inner.scripts.acquire_resource_lease.key(&key);
        invocation.arg(token.as_bytes().as_slice()).arg(millis(ttl));
        let (reply, acknowledged) = self.run_replicated(&invocation, &key).await?;
        let acquisition =
            decode_lease_acquisition(reply, *resource, token).map_err(StoreError::corrupt)?;
        match (acquisition, acknowledged) {
            (LeaseAcquisition::Acquired(lease), Some(acknowledged)) if acknowledged.is_short() => {
                tracing::warn!(
                    replicas = acknowledged.replicas,
                    wanted = acknowledged.wanted,
                    "resource lease not replicated in time; released, answering unavailable"
                );
                if let Err(error) = self.release_resource_lease(&lease).await {
                    tracing::warn!(%error, "releasing the unreplicated resource lease failed; it lapses at its TTL");
                }
                Err(not_replicated(acknowledged))
            }
            (acquisition, _) => Ok(acquisition),
        }
    }

    async fn append_audit(&self, records: &[AuditRecord]) -> Result<(), StoreError> {
        self.inner.journal.append(self, records).await
    }

    async fn read_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        self.inner.journal.read(self, query).await
    }

    async fn audit_partitions(&self) -> Result<Vec<AuditPartition>, StoreError> {
        self.inner.journal.partitions(self).await
    }

    async fn trim_audit(
        &self,
        instance: Option<&str>,
        before: Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.inner.journal.trim(self, instance, before, limit).await
    }

    async fn audit_secret(&self) -> Result<AuditSecret, StoreError> {
        self.inner.journal.secret(self).await
    }

    async fn record_duration(&self, route: &str, duration: Duration) -> Result<(), StoreError> {
        use idemgate_core::estimate::{MAX_ROUTES, WINDOW, route_key};
        let (routes, list) = self.duration_keys(route);
        let (_, lists) = self.duration_key_bases();
        let mut invocation = self.inner.scripts.record_duration.key(&routes);
        invocation
            .key(&list)
            .arg(route_key(route))
            .arg(u64::try_from(duration.as_micros()).unwrap_or(u64::MAX))
            .arg(MAX_ROUTES)
            .arg(WINDOW)
            .arg(&lists);
        self.run(&invocation).await.map(drop)
    }

    async fn route_durations(&self, route: &str) -> Result<Vec<Duration>, StoreError> {
        let (_, list) = self.duration_keys(route);
        let invocation = self.inner.scripts.route_durations.key(&list);
        match self.run(&invocation).await? {
            redis::Value::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    redis::Value::Int(micros) => {
                        Ok(Duration::from_micros(u64::try_from(micros).unwrap_or(0)))
                    }
                    other => Err(StoreError::corrupt(format!(
                        "a route duration is not an integer: {other:?}"
                    ))),
                })
                .collect(),
            other => Err(StoreError::corrupt(format!(
                "a route's durations are not a list: {other:?}"
            ))),
        }
    }

    async fn release_resource_lease(
        &self,
        lease: &ResourceLease,
    ) -> Result<FencedWrite, StoreError> {
        let key = self.resource_lease_key(&lease.resource);
        let mut invocation = self.inner.scripts.release_resource_lease.key(&key);
        invocation.arg(lease.token.as_bytes().as_slice());
        self.fenced(&invocation).await
    }

    /// Wakes on this store's own completions, releases, deletions and appended
    /// stream pieces at once, and on other instances' through the pub/sub channel.
    /// Once subscribed (the first wait subscribes, and waits for the confirmation
    /// within its timeout), it marks the record as waited on, so that the write
    /// ending the run, and each piece appended before it, announces it (writes
    /// nobody waits for announce nothing); a record that is no longer in progress
    /// when marked ends the wait at once. The timeout is the floor either way.
    async fn wait_for_change(&self, identity: &IdentityDigest, timeout: Duration) {
        let until = tokio::time::Instant::now() + timeout;
        self.ensure_subscribed();
        let mut subscribed = self.inner.subscribed.subscribe();
        // Not subscribed (Redis down, or the first wait): a mark now could be
        // announced before anyone listens, so wait for the subscription first.
        let _ = tokio::time::timeout_at(until, subscribed.wait_for(|up| *up)).await;
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        let signal = self.inner.signals.wait(identity, left);
        tokio::pin!(signal);
        // Its first poll registers the waiter before the mark, so an announcement
        // right after the mark finds it.
        if futures_util::FutureExt::now_or_never(signal.as_mut()).is_some() {
            return;
        }
        let subscribed = *subscribed.borrow();
        if subscribed && self.mark_waiting(identity, until).await == MarkedWaiting::Ended {
            // It changed since the caller's read: end this wait (and wake local
            // waiters on the record, which re-read) instead of sleeping it out.
            self.inner.signals.notify(identity);
        }
        // Always awaited to its end (its own timeout is what is left), so the
        // signal's entry is removed.
        signal.await;
    }
}
