//! `ReplayCache`: final records in process memory, in front of any store (the
//! seeds' two-level cache, "горячие ключи в памяти").
//!
//! A replay is a claim that finds a final record. A claim never changes a
//! `COMPLETED` or `FAILED` record, so the record this process last read answers the
//! next claim of its identity as well as the store would: the cache hands back the
//! same [`Snapshot`] and [`crate::decide()`] does the rest, the fingerprint check
//! included (a changed body still gets 422). `PROCESSING` and `RELEASED` records
//! change under other instances' claims, so they are never cached.
//!
//! How long an entry may answer:
//! - never past the record's `expires_at`, measured on the store's clock: the
//!   snapshot carries the store's `now`, and the entry lives for
//!   `expires_at - now` on this process's monotonic clock from just before the
//!   read, so a skewed local wall clock does not matter;
//! - never longer than [`ReplayCacheConfig::max_age`] after the read. This bounds
//!   what the cache cannot see: an operator eviction (`idemgate keys evict`,
//!   `DELETE /v1/keys`) served by *another* instance takes effect in this one's
//!   cache within `max_age`. An eviction or a delete through this store drops the
//!   entry at once.
//!
//! Where entries come from:
//! - a claim or a read that returned a final record: the store's record, field for
//!   field;
//! - a completion of a claim this cache saw acquired as a new operation
//!   (`LeaseOrigin::New`), through [`Store::complete`] or committed in the handler's
//!   transaction ([`Store::completed_in_transaction`]): the record the store just wrote, rebuilt from the claim
//!   request, the lease and the completion, so the client's retry after a lost
//!   response is answered from memory too. Its `expires_at` is a lower bound (the
//!   claim's store clock plus the TTL; the store counts from its completion), so the
//!   entry never outlives the record. Takeovers and released records are not filled
//!   this way: their `created_at` is older than this process knows.
//!
//! The cache is bounded by entries and by bytes (the body, the headers and a fixed
//! overhead per entry): each entry weighs at least `bytes / entries`, so a full cache
//! of small entries stops at the entry bound and one of large entries at the byte
//! bound. Eviction is quick_cache's S3-FIFO, which keeps hot keys and resists scans.
//!
//! Metrics: `idemgate_replay_cache_total{result="hit"|"miss"}`, one per claim or
//! read that asked the cache.
//!
//! ```
//! use std::sync::Arc;
//! use idemgate_core::{MemoryStore, Store};
//! use idemgate_core::cache::{ReplayCache, ReplayCacheConfig};
//!
//! let store: Arc<dyn Store> = Arc::new(ReplayCache::new(Arc::new(MemoryStore::new()), ReplayCacheConfig::default()));
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;

use crate::audit::{AuditEntry, AuditPartition, AuditQuery, AuditRecord, AuditSecret};
use crate::fingerprint::{FieldDigests, Fingerprint};
use crate::record::{
    FencingToken, LeaseOrigin, OperationId, RECORD_FORMAT_VERSION, Record, StoredBody,
};
use crate::resource_lease::{LeaseAcquisition, ResourceId, ResourceLease};
use crate::scope::IdentityDigest;
use crate::store::{
    Claim, ClaimRequest, Completion, EvictMode, Eviction, FencedWrite, Lease, Snapshot, Store,
    StoreError,
};
use crate::stream::StreamId;
use crate::time::Timestamp;
use crate::transaction::ClaimInTransaction;

/// The counter of cache lookups, labelled `result="hit"` or `"miss"`.
pub const REPLAY_CACHE_METRIC: &str = "idemgate_replay_cache_total";

/// What an entry costs beyond its body and headers: the record's fixed fields, the
/// key, the cache's own bookkeeping (a round figure, measured from the types).
const ENTRY_OVERHEAD: u64 = 256;

/// How large and how fresh the cache is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayCacheConfig {
    /// At most this many records (at least 1).
    pub entries: usize,
    /// At most this many bytes of records (at least 1).
    pub bytes: u64,
    /// An entry answers at most this long after the store returned it: the bound on
    /// how long another instance's eviction stays invisible here.
    pub max_age: Duration,
}

impl ReplayCacheConfig {
    /// Default entry bound.
    pub const DEFAULT_ENTRIES: usize = 10_000;
    /// Default byte bound (32 MiB).
    pub const DEFAULT_BYTES: u64 = 32 * 1024 * 1024;
    /// Default max age: short enough that an operator's eviction reaches every
    /// instance before a human retries, long enough that a client's retry storm is
    /// answered from memory.
    pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(5);
}

impl Default for ReplayCacheConfig {
    fn default() -> Self {
        Self {
            entries: Self::DEFAULT_ENTRIES,
            bytes: Self::DEFAULT_BYTES,
            max_age: Self::DEFAULT_MAX_AGE,
        }
    }
}

/// A final record as a store returned it, and until when it may answer.
#[derive(Debug)]
struct Entry {
    record: Record,
    /// The store's clock at the read...
    store_now: Timestamp,
    /// ...taken no later than this instant (just before the call).
    read_at: Instant,
    /// `min(read_at + max_age, the record's expiry on this clock)`.
    fresh_until: Instant,
    /// Its weight against the byte bound, computed once.
    weight: u64,
}

impl Entry {
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            record: self.record.clone(),
            now: self.store_now.saturating_add(self.read_at.elapsed()),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct EntryWeight;

impl quick_cache::Weighter<IdentityDigest, Arc<Entry>> for EntryWeight {
    fn weight(&self, _key: &IdentityDigest, entry: &Arc<Entry>) -> u64 {
        entry.weight
    }
}

type Entries = quick_cache::sync::Cache<IdentityDigest, Arc<Entry>, EntryWeight>;

/// A new operation this cache saw claimed, kept until its completion so the record
/// the completion writes can be cached without reading it back.
#[derive(Debug, Clone)]
struct NewClaim {
    fingerprint: Fingerprint,
    /// The claim's per-field digests, kept in the record like the fingerprint.
    field_digests: Option<FieldDigests>,
    operation_id: OperationId,
    token: FencingToken,
    /// The store's clock at the claim (the lease's end minus its length): the
    /// record's `created_at`.
    claimed_at: Timestamp,
    /// Just after the claim returned, so `claimed_at` is no later than the store's
    /// clock at this instant.
    clock_read: Instant,
    /// The invalidation count before the claim.
    epoch: u64,
}

/// A store whose final records are also kept in this process's memory; see the
/// [module docs](self) for what makes that safe and how long an entry lives.
pub struct ReplayCache {
    inner: Arc<dyn Store>,
    entries: Entries,
    /// New operations claimed through this cache and not yet completed; bounded
    /// like the entries (a claim that falls out is simply not filled).
    new_claims: quick_cache::sync::Cache<IdentityDigest, NewClaim>,
    config: ReplayCacheConfig,
    /// Every entry weighs at least this, so the byte bound also bounds entries.
    min_weight: u64,
    /// Bumped by every local invalidation, so a read that raced one does not put
    /// the record it read back (see [`ReplayCache::fill`]).
    invalidations: AtomicU64,
}

impl std::fmt::Debug for ReplayCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayCache")
            .field("config", &self.config)
            .field("len", &self.entries.len())
            .finish_non_exhaustive()
    }
}

impl ReplayCache {
    /// `inner` with a cache of its final records bounded by `config` (zero bounds
    /// count as 1).
    pub fn new(inner: Arc<dyn Store>, config: ReplayCacheConfig) -> Self {
        let entries = config.entries.max(1);
        let bytes = config.bytes.max(1);
        let min_weight = bytes.div_ceil(entries as u64);
        Self {
            inner,
            entries: Entries::with_weighter(entries, bytes, EntryWeight),
            new_claims: quick_cache::sync::Cache::new(entries),
            config,
            min_weight,
            invalidations: AtomicU64::new(0),
        }
    }

    /// Records cached now (expired ones not yet dropped included).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no record is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The weight of the cached records in bytes, as counted against the bound.
    pub fn weight(&self) -> u64 {
        self.entries.weight()
    }

    /// The cached record under `identity`, if it may still answer.
    fn lookup(&self, identity: &IdentityDigest) -> Option<Snapshot> {
        let found = self.entries.get(identity).and_then(|entry| {
            if Instant::now() < entry.fresh_until {
                Some(entry.snapshot())
            } else {
                self.entries.remove(identity);
                None
            }
        });
        let result = if found.is_some() { "hit" } else { "miss" };
        metrics::counter!(REPLAY_CACHE_METRIC, "result" => result).increment(1);
        found
    }

    /// Caches `snapshot` if its record is final and still has time to live.
    /// `read_at` is an instant before the store read, `epoch` the invalidation count
    /// then: a local evict or delete that ran meanwhile wins over this fill.
    fn fill(&self, identity: &IdentityDigest, snapshot: &Snapshot, read_at: Instant, epoch: u64) {
        if snapshot.record.status().is_final() {
            self.put(
                identity,
                snapshot.record.clone(),
                snapshot.now,
                read_at,
                epoch,
            );
        }
    }

    /// A claim answered from the cache where it holds the record; otherwise
    /// the store's claim (with the journal's `entry`, where the journal passes
    /// one: the store may write it with the claim), whose answer fills the
    /// cache or notes the new claim.
    async fn claim(
        &self,
        request: &ClaimRequest,
        entry: Option<&AuditRecord>,
    ) -> Result<(Claim, bool), StoreError> {
        let identity = request.identity.digest();
        if let Some(snapshot) = self.lookup(identity) {
            return Ok((Claim::Existing(snapshot), false));
        }
        let epoch = self.invalidations.load(Ordering::SeqCst);
        let read_at = Instant::now();
        let (claim, written) = match entry {
            Some(entry) => self.inner.try_claim_journaled(request, entry).await?,
            None => (self.inner.try_claim(request).await?, false),
        };
        match &claim {
            Claim::Existing(snapshot) => self.fill(identity, snapshot, read_at, epoch),
            Claim::Acquired(lease) => self.note_claim(request, lease, epoch),
        }
        Ok((claim, written))
    }

    /// Caches the record `completion` just wrote for a new operation this cache saw
    /// claimed (see the [module docs](self)).
    /// Notes a new record's claim, so its completion can fill the cache without a
    /// read. Takeovers are not noted: their `created_at` is older than this
    /// process knows.
    fn note_claim(&self, request: &ClaimRequest, lease: &Lease, epoch: u64) {
        if lease.origin != LeaseOrigin::New {
            return;
        }
        let lease_ms = i64::try_from(request.lease.as_millis()).unwrap_or(i64::MAX);
        let claimed_at =
            Timestamp::from_millis(lease.locked_until.as_millis().saturating_sub(lease_ms));
        let note = NewClaim {
            fingerprint: request.fingerprint,
            field_digests: request.field_digests.clone(),
            operation_id: lease.operation_id,
            token: lease.token,
            claimed_at,
            clock_read: Instant::now(),
            epoch,
        };
        self.new_claims.insert(*request.identity.digest(), note);
    }

    fn fill_completed(&self, lease: &Lease, completion: &Completion) {
        let Some((_, claim)) = self.new_claims.remove(&lease.identity) else {
            return;
        };
        if claim.operation_id != lease.operation_id || claim.token != lease.token {
            return;
        }
        let record = Record {
            fingerprint: claim.fingerprint,
            field_digests: claim.field_digests,
            format_version: RECORD_FORMAT_VERSION,
            operation_id: claim.operation_id,
            token: claim.token,
            state: completion.state(),
            created_at: claim.claimed_at,
            expires_at: claim.claimed_at.saturating_add(completion.ttl),
        };
        self.put(
            &lease.identity,
            record,
            claim.claimed_at,
            claim.clock_read,
            claim.epoch,
        );
    }

    /// Caches the final `record`, read when the store's clock said `store_now`, no
    /// later than `read_at`, unless an invalidation since `epoch` forbids it.
    fn put(
        &self,
        identity: &IdentityDigest,
        record: Record,
        store_now: Timestamp,
        read_at: Instant,
        epoch: u64,
    ) {
        // A millisecond off for the store clock's truncation, so the entry never
        // outlives the record.
        let left = record
            .expires_at
            .duration_since(store_now)
            .saturating_sub(Duration::from_millis(1));
        if left.is_zero() {
            return;
        }
        let entry = Entry {
            weight: entry_bytes(&record).max(self.min_weight),
            record,
            store_now,
            read_at,
            fresh_until: read_at + left.min(self.config.max_age),
        };
        if self.invalidations.load(Ordering::SeqCst) != epoch {
            return;
        }
        self.entries.insert(*identity, Arc::new(entry));
        // An invalidation between the check and the insert may have removed nothing;
        // then it is this fill's to undo.
        if self.invalidations.load(Ordering::SeqCst) != epoch {
            self.entries.remove(identity);
        }
    }

    /// Drops the entry under `identity` and fences out fills that read before now.
    fn invalidate(&self, identity: &IdentityDigest) {
        self.invalidations.fetch_add(1, Ordering::SeqCst);
        self.entries.remove(identity);
    }
}

/// What a record costs in memory: body, headers, and a fixed overhead.
fn entry_bytes(record: &Record) -> u64 {
    // Each kept field: its pointer, its 8-byte digest, and the `String`.
    let fields: usize = record
        .field_digests
        .iter()
        .flat_map(FieldDigests::pointers)
        .map(|pointer| pointer.len() + 8 + 24)
        .sum();
    let Some(response) = record.response() else {
        return ENTRY_OVERHEAD + fields as u64;
    };
    let body = match &response.body {
        StoredBody::Retained(body) => body.len(),
        StoredBody::NotRetained | StoredBody::InPieces(_) => 0,
    };
    let headers: usize = response
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 32)
        .sum();
    ENTRY_OVERHEAD + (body + headers + fields) as u64
}

#[async_trait]
impl Store for ReplayCache {
    async fn try_claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        self.claim(request, None).await.map(|(claim, _)| claim)
    }

    async fn try_claim_journaled(
        &self,
        request: &ClaimRequest,
        entry: &AuditRecord,
    ) -> Result<(Claim, bool), StoreError> {
        self.claim(request, Some(entry)).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<FencedWrite, StoreError> {
        let written = self.inner.complete(lease, completion).await;
        if matches!(written, Ok(FencedWrite::Applied)) {
            self.fill_completed(lease, completion);
        } else {
            self.new_claims.remove(&lease.identity);
        }
        written
    }

    async fn release(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        self.new_claims.remove(&lease.identity);
        self.inner.release(lease).await
    }

    async fn append_stream_piece(
        &self,
        lease: &Lease,
        index: u32,
        piece: &Bytes,
    ) -> Result<FencedWrite, StoreError> {
        self.inner.append_stream_piece(lease, index, piece).await
    }

    async fn read_stream_pieces(
        &self,
        stream: &StreamId,
        from: u32,
        limit: u32,
    ) -> Result<Vec<Bytes>, StoreError> {
        self.inner.read_stream_pieces(stream, from, limit).await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<FencedWrite, StoreError> {
        self.inner.renew(lease, lease_for).await
    }

    async fn delete(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        self.new_claims.remove(&lease.identity);
        let written = self.inner.delete(lease).await;
        self.invalidate(&lease.identity);
        written
    }

    async fn evict(
        &self,
        identity: &IdentityDigest,
        mode: EvictMode,
    ) -> Result<Eviction, StoreError> {
        let eviction = self.inner.evict(identity, mode).await;
        self.invalidate(identity);
        eviction
    }

    async fn get(&self, identity: &IdentityDigest) -> Result<Option<Snapshot>, StoreError> {
        if let Some(snapshot) = self.lookup(identity) {
            return Ok(Some(snapshot));
        }
        let epoch = self.invalidations.load(Ordering::SeqCst);
        let read_at = Instant::now();
        let found = self.inner.get(identity).await?;
        if let Some(snapshot) = &found {
            self.fill(identity, snapshot, read_at, epoch);
        }
        Ok(found)
    }

    /// Resource leases are not records: straight to the store.
    async fn acquire_resource_lease(
        &self,
        resource: &ResourceId,
        ttl: Duration,
    ) -> Result<LeaseAcquisition, StoreError> {
        self.inner.acquire_resource_lease(resource, ttl).await
    }

    async fn release_resource_lease(
        &self,
        lease: &ResourceLease,
    ) -> Result<FencedWrite, StoreError> {
        self.inner.release_resource_lease(lease).await
    }

    async fn append_audit(&self, records: &[AuditRecord]) -> Result<(), StoreError> {
        self.inner.append_audit(records).await
    }

    async fn read_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        self.inner.read_audit(query).await
    }

    async fn audit_partitions(&self) -> Result<Vec<AuditPartition>, StoreError> {
        self.inner.audit_partitions().await
    }

    async fn trim_audit(
        &self,
        instance: Option<&str>,
        before: Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.inner.trim_audit(instance, before, limit).await
    }

    async fn audit_secret(&self) -> Result<AuditSecret, StoreError> {
        self.inner.audit_secret().await
    }

    async fn record_duration(
        &self,
        route: &str,
        duration: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.inner.record_duration(route, duration).await
    }

    async fn route_durations(&self, route: &str) -> Result<Vec<std::time::Duration>, StoreError> {
        self.inner.route_durations(route).await
    }

    fn journal_expiries(&self, journal: crate::audit::ExpiryJournal) {
        self.inner.journal_expiries(journal);
    }

    fn completed_in_transaction(&self, lease: &Lease, completion: &Completion) {
        self.fill_completed(lease, completion);
        self.inner.completed_in_transaction(lease, completion);
    }

    fn supports_one_transaction(&self) -> bool {
        self.inner.supports_one_transaction()
    }

    /// As [`Store::try_claim`]: answered from the cache when it holds the
    /// final record; a committed record the claim meets fills it, and a new
    /// claim is noted for its transactional completion.
    async fn claim_in_transaction(
        &self,
        request: &ClaimRequest,
        lock_wait: Duration,
    ) -> Result<ClaimInTransaction, StoreError> {
        let identity = request.identity.digest();
        if let Some(snapshot) = self.lookup(identity) {
            return Ok(ClaimInTransaction::Existing(snapshot));
        }
        let epoch = self.invalidations.load(Ordering::SeqCst);
        let read_at = Instant::now();
        let claim = self.inner.claim_in_transaction(request, lock_wait).await?;
        match &claim {
            ClaimInTransaction::Existing(snapshot) => self.fill(identity, snapshot, read_at, epoch),
            ClaimInTransaction::Acquired { lease, .. } => self.note_claim(request, lease, epoch),
            ClaimInTransaction::Locked => {}
        }
        Ok(claim)
    }

    /// The claim is gone, as after a release: its note goes too.
    fn rolled_back_in_transaction(&self, lease: &Lease) {
        self.new_claims.remove(&lease.identity);
        self.inner.rolled_back_in_transaction(lease);
    }

    async fn transaction_journal_entries(
        &self,
        lease: &Lease,
        completion: &Completion,
    ) -> Vec<crate::audit::AuditRecord> {
        self.inner
            .transaction_journal_entries(lease, completion)
            .await
    }

    async fn wait_for_change(&self, identity: &IdentityDigest, timeout: Duration) {
        self.inner.wait_for_change(identity, timeout).await;
    }
}
