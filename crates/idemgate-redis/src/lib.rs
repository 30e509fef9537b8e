//! A Redis store for idemgate: idempotency records in one Redis server or a Redis
//! Cluster, claimed and written by Lua scripts, so every operation is one atomic
//! round trip, fenced by (operation id, fencing token).
//!
//! [`RedisStore`] implements [`idemgate_core::Store`]; hand it to the idemgate layer
//! (`idemgate::IdempotencyLayer::new(store)`) like any other store. It passes the
//! same conformance suite (`idemgate-testkit`) as every backend, against a real
//! server and against a real three-primary cluster.
//!
//! # Quick start
//!
//! ```no_run
//! use std::time::Duration;
//! use idemgate_core::fingerprint::Fingerprint;
//! use idemgate_core::key::IdempotencyKey;
//! use idemgate_core::scope::{Identity, Principal, Scope};
//! use idemgate_core::{Claim, ClaimRequest, Store};
//! use idemgate_redis::{EvictionCheck, PersistenceCheck, RedisStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // One server (reconnects by itself) …
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! // … or a cluster, with settings:
//! let _clustered = RedisStore::builder()
//!     .with_key_prefix("shop:idem:")
//!     .with_eviction_check(EvictionCheck::Refuse)
//!     .with_persistence_check(PersistenceCheck::Refuse)
//!     .with_replication_wait(1, Duration::from_millis(250))
//!     .connect_cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
//!     .await?;
//!
//! let scope = Scope { principal: Principal::new("user:42"), method: "POST".into(), path: "/orders".into() };
//! let request = ClaimRequest {
//!     identity: Identity::new(scope, IdempotencyKey::parse(b"order-7", 255)?),
//!     fingerprint: Fingerprint::from_bytes([0; 32]),
//!     field_digests: None,
//!     lease: Duration::from_secs(30),
//!     ttl: Duration::from_secs(86_400),
//!     route_template: None,
//! };
//! match store.try_claim(&request).await? {
//!     Claim::Acquired(lease) => println!("run operation {}", lease.operation_id),
//!     Claim::Existing(snapshot) => println!("found {:?}", snapshot.record.status()),
//! }
//! # Ok(()) }
//! ```
//!
//! # How it works
//!
//! - **One round trip, atomic.** `try_claim`, `complete`, `release`, `renew`,
//!   `delete`, `get`, `append_stream_piece` and `read_stream_pieces` are each one
//!   `EVALSHA` of a Lua script (loaded with `SCRIPT LOAD` when a server does not
//!   know it yet). The claim script creates the record
//!   (with an operation id the client generated as a UUID v4 and passed in, used only
//!   when creating), or — same fingerprint only — takes over a `RELEASED` record or a
//!   `PROCESSING` one whose lease lapsed (same operation id, token + 1), or else
//!   returns the record as it is. The write scripts compare (operation id, token,
//!   status `PROCESSING`) before writing and answer applied or refused.
//! - **The server's clock.** Every script reads Redis `TIME`; leases, `now` in
//!   snapshots, `created_at` and `expires_at` are all server time, so application
//!   instances with skewed clocks agree.
//! - **Expiry is absence.** The key's `PEXPIREAT` is the record's `expires_at`
//!   (claim + ttl, then completion + ttl), so an expired record is gone without any
//!   purge. The lease is a field compared with `TIME` inside the script, never the
//!   key's expiry: a dead holder's record keeps its operation id for the next
//!   claimant.
//! - **Only Redis 7.0 commands** (`HSET HGET HGETALL HMGET HINCRBY HDEL PEXPIREAT
//!   DEL PUBLISH TIME`, `LLEN LSET RPUSH LRANGE PEXPIRETIME` for stream pieces, and
//!   `WAIT` with the replication wait), tested against 7.0.15.
//!   No `HEXPIRE` (7.4), no `WAITAOF` (7.2).
//!
//! # Key layout
//!
//! One hash per record, under `<prefix>{<identity digest, 64 hex>}` (default prefix
//! `idemgate:`):
//!
//! | field | value |
//! |---|---|
//! | `v` | record format version (`1`) |
//! | `fp` | request fingerprint, 32 raw bytes |
//! | `op` | operation id, 16 raw bytes |
//! | `tk` | fencing token: 1 at creation, +1 at every reclaim or takeover |
//! | `st` | status: `P`rocessing, `C`ompleted, `F`ailed, `R`eleased |
//! | `lu` | lease end (ms since the epoch, server time); only while `P` |
//! | `ca`, `ea` | created at, expires at (ms); `ea` is also the key's `PEXPIREAT` |
//! | `rs` | the response: a codec byte (0 raw, 1 zstd) + `StoredResponse::encode` |
//! | `w` | `1` while a waiter waits for the run to end (see Wait mode); a hint, not record data |
//!
//! A streamed answer recorded in pieces (`Store::append_stream_piece`,
//! `idemgate_core::stream`) is a list per run beside its record, under
//! `<record key>:pieces:<operation id, 32 hex>:<token>`
//! ([`RedisStore::stream_pieces_key`]), piece `i` at index `i`:
//!
//! - **append** is one script, fenced as `complete` is (the record held by this
//!   run, in progress): the next index is `RPUSH`ed, an index appended again (a
//!   write retried after an unknown outcome) replaced with `LSET`, a gap dropped;
//!   the list's `PEXPIREAT` is set to the record's own expiry (`PEXPIRETIME`), and
//!   the append is announced like the end of a run (see Wait mode);
//! - **read** is one script: `LRANGE` of the run's list while the record still
//!   names the run (same operation id and token, whatever its status), else
//!   nothing;
//! - **complete** moves the run's list's expiry to the completed record's, so an
//!   `InPieces` replay finds its pieces as long as the record lives; **delete** and
//!   **evict** delete the list of the run the record names with the record. A
//!   takeover or a reclaim streams under its new token into a new list, and the
//!   earlier run's list, which no record names any more, expires on its own (at
//!   the record's expiry as it was before the takeover).
//!
//! A list rather than a Redis stream: readers address pieces by index (`LRANGE
//! from from+limit-1`, from any piece on, in bounded batches), and a write retried
//! after an unknown outcome must replace its piece, not add a second (`LSET`); a
//! stream's entry ids are times, not indexes, and `XADD` cannot replace an entry.
//! The consumer groups and blocking reads a stream offers are not needed: readers
//! wait through the store's change announcements like every waiter.
//!
//! A resource lease (`Store::acquire_resource_lease`) is a plain string under
//! `<prefix>lease:{<resource digest, 64 hex>}` holding the holder's 16-byte
//! token and the lease's end (decimal ms, also the key's expiry: `SET NX PXAT`);
//! a release deletes it only
//! while it holds the releaser's token (a compare-and-delete script). On Redis
//! Cluster each lease, like each record, is one key in the slot of its digest.
//!
//! Large response bodies arrive compressed: the idempotency layer keeps bodies
//! over 1 KiB zstd-compressed on every store (`idemgate_core::compression`), and
//! this store keeps the bytes it is given (codec byte 0). The whole-record codec
//! (byte 1: zstd of the encoded response, headers too) is off unless
//! [`RedisStoreBuilder::with_compression_threshold`] turns it on, and records an
//! earlier version wrote with it still read back. On the `benches/compression.rs`
//! benchmark, a 64 KiB JSON response is stored in 11% of its size, for about
//! 0.13 ms to compress (once, at completion) and 0.05 ms to decompress (at each
//! replay). Bodies and header values are stored as raw bytes, so replay is
//! byte-exact.
//!
//! The `{…}` around the digest is a Redis Cluster hash tag: the slot is computed from
//! the digest alone, so all keys of one record share a slot (scripts never fail with
//! `CROSSSLOT`), while records, whose digests are uniformly random, spread over all
//! 16384 slots. The same layout works unchanged on a single server and on a cluster.
//! The prefix may not contain braces (the constructor refuses it).
//!
//! Completions, releases, deletions and appended stream pieces of records someone
//! waits for are announced on the pub/sub channel `<prefix>changes` (message: the
//! 32-byte digest), published by the scripts themselves. See
//! [`Store::wait_for_change`](idemgate_core::Store::wait_for_change) below.
//!
//! # Wait mode
//!
//! `wait_for_change` wakes on this store's own writes at once (an in-process
//! [`ChangeSignals`](idemgate_core::signals::ChangeSignals)) and on other instances'
//! writes through the pub/sub channel (subscribed at the first wait, resubscribed
//! after failures; on a cluster through any node, since `PUBLISH` reaches them all).
//! Both are hints: the wait's timeout is the floor, and callers re-read the record.
//!
//! Announcements cost only where someone waits. A waiter, once its instance is
//! subscribed, marks the record (`w`, one small script: set only while the record
//! is in progress, so a run that ended since the waiter's read ends the wait at
//! once instead of being missed); the write that ends the run publishes only when
//! the mark is there, and clears it. An appended stream piece publishes when the
//! mark is there and keeps it, so a reader of a stream in flight, on any instance,
//! is woken by every piece after its first wait (a piece appended between its
//! read and its first mark is seen at the next piece, the run's end, or the
//! waiter's recheck). Ordinary traffic — keys nobody waits for —
//! publishes nothing, so no instance reads a message per completion (before the
//! mark, every subscribed instance received every completion's 32 bytes). Each
//! wait costs one extra round trip, on the slow path of a request that found the
//! key in progress. During a rolling upgrade, instances of an earlier version
//! neither mark nor need marks (they publish always, and their own waiters fall
//! back to their poll interval when a newer instance completes the record).
//!
//! # Failures
//!
//! Every call is bounded by the response timeout plus the connect timeout (1 s +
//! 500 ms by default, [`RedisStoreBuilder::with_response_timeout`] and
//! [`RedisStoreBuilder::with_connect_timeout`]; redis-rs' own per-request response
//! and connect timeouts, on one server and on a cluster, under a deadline of their
//! sum): while Redis is down or frozen calls fail with
//! [`StoreError::Unavailable`](idemgate_core::StoreError::Unavailable) (the layer's
//! 503), never hang or panic. Connections come back by themselves (redis-rs'
//! `ConnectionManager`; the cluster connection reconnects nodes and refreshes slots,
//! and the store builds it anew when it has answered nothing but timeouts for 3 s —
//! with redis-rs 1.8.1 the failover test saw a cluster connection time out on every
//! node for as long as it was used after a failover, while a new one worked).
//! Errors are classified with redis-rs' predicates (`is_timeout`,
//! `is_connection_dropped`, `is_connection_refusal`, `is_io_error`, cluster down /
//! moved / try-again): `Unavailable`; `OOM` under `noeviction`:
//! [`StoreError::Full`](idemgate_core::StoreError::Full) (503, no record evicted); a
//! record that cannot be decoded, or a non-hash at a record key:
//! [`StoreError::Corrupt`](idemgate_core::StoreError::Corrupt); an ACL user refused a
//! command or key (`NOPERM`):
//! [`StoreError::Misconfigured`](idemgate_core::StoreError::Misconfigured) (500).
//!
//! A call that times out may still have run on the server (a claim may have created
//! its record). That is the protocol's ordinary case: the client gets a 503, its
//! retry sees the record, and once the lease lapses the retry takes it over with the
//! same operation id.
//!
//! # Eviction
//!
//! Only `maxmemory-policy noeviction` is safe. `volatile-*` policies evict keys that
//! have an expiry — every record has one — and `allkeys-*` policies evict anything;
//! an evicted record is a key that runs twice. Under `noeviction`, a full Redis
//! refuses writes (`OOM` → `Full` → 503) and keeps every live record. The
//! constructors read the policy with `CONFIG GET` (on every primary of a cluster) and,
//! per [`EvictionCheck`], refuse to start ([`RedisStoreError::EvictingPolicy`], the
//! default) or log a warning. Where `CONFIG GET` is not allowed (managed services,
//! ACLs), they warn that the policy is unknown: check it yourself. Give the store its
//! own Redis, or a database where nothing else fills memory.
//!
//! # Persistence
//!
//! A record lost from Redis is a key that runs again as a new operation. What can
//! lose one, and the settings against it:
//!
//! - **No persistence** (`save ""`, `appendonly no`): a restart loses every record,
//!   so every completed key is forgotten and its next retry runs the operation again,
//!   under a new operation id that nothing links to the first run (an external
//!   black-box run saw 20 of 20 completed keys run again after a restart; the test
//!   `a_restart_forgets_completed_keys_without_persistence_and_keeps_them_with_aof`
//!   shows it). Only for deployments where a duplicate is harmless. The
//!   constructors read `appendonly`, `appendfsync` and `save` with `CONFIG GET` (on
//!   every primary of a cluster; [`RedisStore::persistence`] tells what was found)
//!   and, per [`PersistenceCheck`], log one warning naming the risk and the fix (the
//!   default) or refuse to start ([`RedisStoreError::NoPersistence`]). Where `CONFIG
//!   GET` is not allowed, the warning says the settings are unknown, and `Refuse`
//!   refuses ([`RedisStoreError::PersistenceUnknown`]): it was asked to insist.
//! - **RDB snapshots** (`save 60 1000`): a crash loses the writes since the last
//!   snapshot — minutes.
//! - **AOF, `appendfsync everysec`** (the AOF default): each write reaches the
//!   operating system before Redis replies, so a Redis crash loses nothing, but a
//!   power loss or kernel crash loses up to about a second of acknowledged writes.
//! - **AOF, `appendfsync always`**: fsync before the reply; survives power loss, at
//!   the cost of one disk flush per write (batched across clients). This crate's
//!   tests restart an `appendfsync always` server with `kill -9` and read every
//!   completed record back unchanged.
//! - **Replicas** are asynchronous: a failover may promote a replica that had not
//!   yet received the last claims or completions. A claim acknowledged by a primary
//!   that dies before replicating it is lost, and the client's retry then claims the
//!   key anew and runs it a second time, under a new operation id.
//!   [`RedisStoreBuilder::with_replication_wait`] closes that window for claims:
//!   every claim, completion and renewal is followed by `WAIT <replicas> <timeout>`
//!   in the same round trip (a pipeline on the same connection to the key's
//!   primary), and a claim that did not reach the replicas in time is released and
//!   answered [`StoreError::Unavailable`](idemgate_core::StoreError::Unavailable)
//!   (503 + `Retry-After`), so its handler never runs unreplicated.
//!   [`ReplicationWait`] documents what each write does when replicas fall short
//!   (a completion counts — the handler ran — and a lost one only brings the key
//!   back under the same operation id). The cost: each write waits for a replica's
//!   acknowledgement (a round trip between primary and replica). `WAIT` tells which
//!   writes reached a replica; it does not make Redis replication a consensus
//!   protocol (ask for every replica a primary has). `min-replicas-to-write` makes
//!   a primary cut off from its replicas stop accepting writes (503s) instead of
//!   accepting writes it will lose.
//!
//!   Measured by `tests/failover.rs` (`kill -9` of a primary of a 3 + 3 cluster
//!   under load, then every key retried until final), in its full run
//!   (`IDEMGATE_FAULTS_FULL=1`: six kills of 1,000 keys each per mode, three with
//!   the replica keeping up, three with it cut off for 400 ms before the kill):
//!   with the replication wait, 0 of 6,000 keys ran under two operation ids (53 ran
//!   again under their own operation id after a lost completion); without it, 559
//!   of 6,000 did — 177, 178 and 204 in the kills after a cut-off replica, none in
//!   the kills where the replica kept up (on loopback the replication delay is far
//!   below a millisecond).
//!
//! # Redis or PostgreSQL?
//!
//! The record in Redis and the application's business data (orders, payments) in its
//! database are **two systems, written one after the other** (PITFALLS 7). The
//! failure window: the handler commits the order, then the process dies (or Redis is
//! unreachable) before `complete` stores the response. The record stays
//! `PROCESSING`; when the lease lapses, the client's retry takes it over and runs the
//! handler **again** — with the **same operation id**. Two things make that second
//! run harmless (PROTOCOL §11):
//!
//! - business writes are keyed by the operation id (a unique column, `INSERT … ON
//!   CONFLICT (operation_id) DO NOTHING`, then read the existing row), so the second
//!   run finds the first run's order instead of writing another;
//! - calls to other services (a payment gateway) carry an idempotency key derived
//!   from the operation id, so the gateway folds the second run's charge into the
//!   first.
//!
//! These close the window as long as the record survives (see Persistence and
//! Eviction): a lost record gives the retry a new operation id, and then nothing
//! links it to the first run.
//!
//! Choose the **PostgreSQL store** when the business data lives in that same
//! database: its transactional mode commits the record and the business writes in
//! one transaction, so there is no window at all. Choose **Redis** when the effects
//! are spread over several services or external APIs anyway (the window exists
//! whatever the store), when many application instances need a shared store with
//! sub-millisecond claims, or when the record store should not load the business
//! database — and then configure persistence and `noeviction` as above.
//!
//! # Why redis-rs (and not fred)
//!
//! redis-rs is the client maintained by the Redis project, and gives exactly what
//! this store needs with a small dependency set chosen by features: a multiplexed
//! connection with automatic reconnect (`ConnectionManager`), an async cluster client
//! (slot routing, `MOVED`/`ASK`, topology refresh), `Script` (`EVALSHA` with the
//! `NOSCRIPT` fallback, `SCRIPT LOAD` sent to every cluster node), per-attempt
//! response and connect timeouts, and error predicates (`is_timeout`,
//! `is_connection_dropped`, …) to classify failures without matching error text.
//! fred is capable too (pools, sentinel, client-side caching, its own reconnect
//! policies and command retries), but larger — dozens of features — and its
//! retry machinery would have to be tuned for what an idempotency store needs most:
//! failing fast, so the layer can answer 503, which redis-rs gives with two plain
//! timeouts. Fewer moving parts won.
//!
//! # Tests
//!
//! `scripts/test.sh` runs them all: the conformance suite against the server at
//! `IDEMGATE_TEST_REDIS_URL` (default `redis://127.0.0.1:6379`) and against a
//! three-primary cluster it starts with `scripts/redis-cluster.sh start` (node URLs
//! in `IDEMGATE_TEST_REDIS_CLUSTER_URLS`; the cluster tests fail without it), plus
//! tests that start `redis-server`s of their own (`tests/dedicated.rs`: eviction
//! and persistence checks, an outage, a frozen server, what a restart keeps with and
//! without persistence, a replica for the replication wait, a full server) and a
//! cluster of their own with replicas (`tests/failover.rs`, through
//! `scripts/redis-cluster.sh start --replicas 1`: a primary killed under load, with
//! and without the replication wait; about 25 s). `IDEMGATE_FAULTS_FULL=1` makes the
//! failover test kill each of the three primaries in turn, with 1,000 keys per kill
//! and mode, instead of one kill with 120 keys.
//!
//! # Features of the redis dependency
//!
//! `tokio-comp`, `connection-manager`, `cluster-async` and `script`. TLS
//! (`rediss://`) needs one of redis-rs' TLS features enabled in the application.

mod audit;
mod codec;
mod connection;
mod error;
mod eviction;
mod persistence;
mod replication;
mod scripts;
mod server_config;
mod store;
mod subscriber;

pub use codec::ResponseCodec;
pub use error::RedisStoreError;
pub use eviction::{EvictionCheck, EvictionPolicy};
pub use persistence::{AppendFsync, Persistence, PersistenceCheck};
pub use replication::ReplicationWait;
pub use store::{DEFAULT_KEY_PREFIX, RedisStore, RedisStoreBuilder};
