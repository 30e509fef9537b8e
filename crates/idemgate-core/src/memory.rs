//! `MemoryStore`: records in this process's memory.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::audit::{
    AuditEntry, AuditPartition, AuditQuery, AuditRecord, AuditSecret, ChainHash, seal_all,
};
use crate::record::{FencingToken, OperationId, RECORD_FORMAT_VERSION, Record, RecordState};
use crate::resource_lease::{LeaseAcquisition, LeaseToken, ResourceId, ResourceLease};
use crate::scope::IdentityDigest;
use crate::signals::ChangeSignals;
use crate::store::{
    Claim, ClaimRequest, Completion, EvictMode, Eviction, FencedWrite, Lease, LeaseOrigin,
    Snapshot, Store, StoreError,
};
use crate::stream::StreamId;
use crate::time::Timestamp;

const SHARDS: usize = 64;

/// How often each shard drops its expired records while it is in use.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Records in this process's memory: the default for tests and single-process use.
///
/// Lock-striped over 64 shards by identity digest, so claims of different keys rarely
/// contend; a claim is one map update under its shard's lock, hence atomic. Expired
/// records are absent at once and their memory is freed by a sweep each shard runs at
/// most once a second while in use (or on [`MemoryStore::purge_expired`]).
///
/// Records do not survive the process and are not shared between processes; use a
/// SQL or Redis store for that.
///
/// ```
/// use idemgate_core::MemoryStore;
/// let store = MemoryStore::new().with_capacity(100_000);
/// assert_eq!(store.len(), 0);
/// ```
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    tokens: AtomicU64,
    len: AtomicUsize,
    capacity: Option<usize>,
    signals: ChangeSignals,
    /// Resource leases: their token and end. One lock for all: a lease is taken
    /// per conditional write, far rarer than claims, and each step is one map
    /// operation.
    resource_leases: Mutex<HashMap<ResourceId, (LeaseToken, Timestamp)>>,
    /// The journal (`crate::audit`): one lock, appends are batches.
    journal: Mutex<Journal>,
    /// Each route's recent execution durations (`Store::record_duration`),
    /// oldest first, with the number of the record that last added one; at
    /// most `estimate::MAX_ROUTES` routes, the least recently recorded making
    /// way for a new one.
    durations: Mutex<Durations>,
}

/// The routes' execution histories, and how many durations were recorded.
#[derive(Debug, Default)]
struct Durations {
    routes: HashMap<String, (u64, VecDeque<Duration>)>,
    recorded: u64,
}

/// The memory store's journal: its entries, each partition's head and anchor,
/// and its secret, made with the store.
#[derive(Debug)]
struct Journal {
    entries: std::collections::VecDeque<AuditEntry>,
    heads: HashMap<String, ChainHash>,
    anchors: HashMap<String, ChainHash>,
    next_seq: u64,
    secret: AuditSecret,
}

impl Default for Journal {
    fn default() -> Self {
        Self {
            entries: std::collections::VecDeque::new(),
            heads: HashMap::new(),
            anchors: HashMap::new(),
            next_seq: 1,
            secret: AuditSecret::random(),
        }
    }
}

/// Past this many resource leases held (lapsed ones included), an acquisition
/// first drops the lapsed ones, so leases whose holders never released them do
/// not pile up.
const RESOURCE_LEASE_SWEEP_AT: usize = 1024;

#[derive(Debug, Default)]
struct Shard {
    records: HashMap<IdentityDigest, Record>,
    /// The streams recorded in pieces (`crate::stream`), at most one per
    /// identity: a new run's first piece replaces an earlier run's stream, and
    /// the sweep drops those whose record no longer names their run.
    streams: HashMap<IdentityDigest, RecordedStream>,
    next_sweep: Option<Timestamp>,
}

/// One run's stream, as the memory store keeps it.
#[derive(Debug)]
struct RecordedStream {
    operation_id: OperationId,
    token: FencingToken,
    pieces: Vec<Bytes>,
}

impl RecordedStream {
    fn of_run(&self, operation_id: OperationId, token: FencingToken) -> bool {
        self.operation_id == operation_id && self.token == token
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty, unbounded store.
    pub fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            tokens: AtomicU64::new(0),
            len: AtomicUsize::new(0),
            capacity: None,
            signals: ChangeSignals::new(),
            resource_leases: Mutex::default(),
            journal: Mutex::default(),
            durations: Mutex::default(),
        }
    }

    /// Holds at most `records` records. A claim of a new identity beyond that is
    /// refused with [`StoreError::Full`] (the layer's 503); a live record is never
    /// evicted to make room, since that would let its key run twice.
    ///
    /// ```
    /// let store = idemgate_core::MemoryStore::new().with_capacity(10_000);
    /// ```
    pub fn with_capacity(mut self, records: usize) -> Self {
        self.capacity = Some(records);
        self
    }

    /// Records held, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired record now and returns how many went.
    pub fn purge_expired(&self) -> usize {
        let now = Timestamp::now();
        (0..SHARDS)
            .map(|i| self.sweep(&mut self.lock(i), now))
            .sum()
    }

    fn shard_of(identity: &IdentityDigest) -> usize {
        identity.as_bytes()[0] as usize % SHARDS
    }

    fn journal(&self) -> MutexGuard<'_, Journal> {
        // Every update of the journal is a few assignments that cannot panic
        // half-way through a chain link.
        self.journal.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        // A panic elsewhere cannot leave a shard half-updated: every update below is
        // a single assignment or map operation.
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn sweep(&self, shard: &mut Shard, now: Timestamp) -> usize {
        let before = shard.records.len();
        shard.records.retain(|_, record| record.expires_at > now);
        shard.records.shrink_to(shard.records.len() * 2);
        let Shard {
            records, streams, ..
        } = shard;
        streams.retain(|identity, stream| {
            records
                .get(identity)
                .is_some_and(|record| stream.of_run(record.operation_id, record.token))
        });
        shard.next_sweep = Some(now.saturating_add(SWEEP_INTERVAL));
        let removed = before - shard.records.len();
        self.len.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    fn sweep_if_due(&self, shard: &mut Shard, now: Timestamp) {
        if shard.next_sweep.is_none_or(|due| now >= due) {
            self.sweep(shard, now);
        }
    }

    /// Counts one more record, unless that would pass the capacity.
    fn reserve_slot(&self, locked_shard: usize, shard: &mut Shard, now: Timestamp) -> bool {
        let Some(capacity) = self.capacity else {
            self.len.fetch_add(1, Ordering::Relaxed);
            return true;
        };
        let try_reserve = || {
            self.len
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < capacity).then_some(n + 1)
                })
                .is_ok()
        };
        if try_reserve() {
            return true;
        }
        // Full: expired records may still hold slots. Sweep this shard, then the
        // others one at a time (never two locks at once, so no lock-order deadlock).
        self.sweep(shard, now);
        for other in (0..SHARDS).filter(|&i| i != locked_shard) {
            if try_reserve() {
                return true;
            }
            self.sweep(&mut self.lock(other), now);
        }
        try_reserve()
    }

    fn resource_leases(&self) -> MutexGuard<'_, HashMap<ResourceId, (LeaseToken, Timestamp)>> {
        // Every update under it is a single map operation: nothing half-done to see.
        self.resource_leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn next_token(&self) -> FencingToken {
        FencingToken(self.tokens.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Applies `write` if the record under the lease still holds it.
    fn fenced(&self, lease: &Lease, write: impl FnOnce(&mut Shard, Timestamp)) -> FencedWrite {
        let now = Timestamp::now();
        let mut shard = self.lock(Self::shard_of(&lease.identity));
        let holds = shard
            .records
            .get(&lease.identity)
            .is_some_and(|record| record.admits_fenced_write(lease.operation_id, lease.token, now));
        if !holds {
            return FencedWrite::Refused;
        }
        write(&mut shard, now);
        FencedWrite::Applied
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn try_claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        let now = Timestamp::now();
        let digest = *request.identity.digest();
        let index = Self::shard_of(&digest);
        let mut shard = self.lock(index);
        self.sweep_if_due(&mut shard, now);
        let locked_until = now.saturating_add(request.lease);
        if let Some(record) = shard
            .records
            .get_mut(&digest)
            .filter(|r| r.expires_at > now)
        {
            let Some(origin) = record.claim_origin(&request.fingerprint, now) else {
                return Ok(Claim::Existing(Snapshot {
                    record: record.clone(),
                    now,
                }));
            };
            record.state = RecordState::Processing { locked_until };
            record.token = self.next_token();
            // A record taken up again near the end of its life must outlive its new
            // run, or it would expire mid-run and its key start a second operation.
            record.expires_at = record.expires_at.max(now.saturating_add(request.ttl));
            return Ok(Claim::Acquired(Lease {
                identity: digest,
                operation_id: record.operation_id,
                token: record.token,
                origin,
                locked_until,
            }));
        }
        let replaces_expired = shard.records.contains_key(&digest);
        if !replaces_expired && !self.reserve_slot(index, &mut shard, now) {
            return Err(StoreError::Full);
        }
        let record = Record {
            fingerprint: request.fingerprint,
            field_digests: request.field_digests.clone(),
            format_version: RECORD_FORMAT_VERSION,
            operation_id: OperationId::generate(),
            token: self.next_token(),
            state: RecordState::Processing { locked_until },
            created_at: now,
            expires_at: now.saturating_add(request.ttl),
        };
        let lease = Lease {
            identity: digest,
            operation_id: record.operation_id,
            token: record.token,
            origin: LeaseOrigin::New,
            locked_until,
        };
        shard.records.insert(digest, record);
        Ok(Claim::Acquired(lease))
    }

    async fn complete(
        &self,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<FencedWrite, StoreError> {
        let write = self.fenced(lease, |shard, now| {
            if let Some(record) = shard.records.get_mut(&lease.identity) {
                record.state = completion.state();
                record.expires_at = now.saturating_add(completion.ttl);
            }
        });
        self.signals.notify(&lease.identity);
        Ok(write)
    }

    async fn append_stream_piece(
        &self,
        lease: &Lease,
        index: u32,
        piece: &Bytes,
    ) -> Result<FencedWrite, StoreError> {
        // Kept as its own copy: a piece may be a view into the buffer it was
        // read into, which keeping it would pin ([`StoredResponse::detached`]).
        let piece = Bytes::copy_from_slice(piece);
        let mut gap = false;
        let write = self.fenced(lease, |shard, _| {
            let stream = shard
                .streams
                .entry(lease.identity)
                .or_insert_with(|| RecordedStream {
                    operation_id: lease.operation_id,
                    token: lease.token,
                    pieces: Vec::new(),
                });
            if !stream.of_run(lease.operation_id, lease.token) {
                *stream = RecordedStream {
                    operation_id: lease.operation_id,
                    token: lease.token,
                    pieces: Vec::new(),
                };
            }
            let index = index as usize;
            match index.cmp(&stream.pieces.len()) {
                std::cmp::Ordering::Less => stream.pieces[index] = piece.clone(),
                std::cmp::Ordering::Equal => stream.pieces.push(piece.clone()),
                std::cmp::Ordering::Greater => gap = true,
            }
        });
        if gap {
            return Err(StoreError::corrupt("a stream piece past the next index"));
        }
        self.signals.notify(&lease.identity);
        Ok(write)
    }

    async fn read_stream_pieces(
        &self,
        stream: &StreamId,
        from: u32,
        limit: u32,
    ) -> Result<Vec<Bytes>, StoreError> {
        let now = Timestamp::now();
        let shard = self.lock(Self::shard_of(&stream.identity));
        let named = shard.records.get(&stream.identity).is_some_and(|record| {
            record.expires_at > now
                && record.operation_id == stream.operation_id
                && record.token == stream.token
        });
        let pieces = shard
            .streams
            .get(&stream.identity)
            .filter(|recorded| named && recorded.of_run(stream.operation_id, stream.token))
            .map(|recorded| {
                recorded
                    .pieces
                    .iter()
                    .skip(from as usize)
                    .take(limit as usize)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        Ok(pieces)
    }

    async fn release(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        let write = self.fenced(lease, |shard, _| {
            if let Some(record) = shard.records.get_mut(&lease.identity) {
                record.state = RecordState::Released;
            }
        });
        self.signals.notify(&lease.identity);
        Ok(write)
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<FencedWrite, StoreError> {
        Ok(self.fenced(lease, |shard, now| {
            if let Some(record) = shard.records.get_mut(&lease.identity) {
                record.state = RecordState::Processing {
                    locked_until: now.saturating_add(lease_for),
                };
            }
        }))
    }

    async fn delete(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        let write = self.fenced(lease, |shard, _| {
            if shard.records.remove(&lease.identity).is_some() {
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
            shard.streams.remove(&lease.identity);
        });
        self.signals.notify(&lease.identity);
        Ok(write)
    }

    async fn evict(
        &self,
        identity: &IdentityDigest,
        mode: EvictMode,
    ) -> Result<Eviction, StoreError> {
        let now = Timestamp::now();
        let eviction = {
            let mut shard = self.lock(Self::shard_of(identity));
            match shard.records.get(identity).filter(|r| r.expires_at > now) {
                None => Eviction::Absent,
                Some(record) => match record.locked_until().filter(|until| *until > now) {
                    Some(locked_until) if mode == EvictMode::UnlessRunning => {
                        Eviction::RefusedLiveLease { locked_until, now }
                    }
                    _ => {
                        let status = record.status();
                        shard.records.remove(identity);
                        shard.streams.remove(identity);
                        self.len.fetch_sub(1, Ordering::Relaxed);
                        Eviction::Evicted { status }
                    }
                },
            }
        };
        if matches!(eviction, Eviction::Evicted { .. }) {
            self.signals.notify(identity);
        }
        Ok(eviction)
    }

    async fn get(&self, identity: &IdentityDigest) -> Result<Option<Snapshot>, StoreError> {
        let now = Timestamp::now();
        let shard = self.lock(Self::shard_of(identity));
        Ok(shard
            .records
            .get(identity)
            .filter(|record| record.expires_at > now)
            .map(|record| Snapshot {
                record: record.clone(),
                now,
            }))
    }

    async fn acquire_resource_lease(
        &self,
        resource: &ResourceId,
        ttl: Duration,
    ) -> Result<LeaseAcquisition, StoreError> {
        let now = Timestamp::now();
        let mut leases = self.resource_leases();
        if leases.len() >= RESOURCE_LEASE_SWEEP_AT {
            leases.retain(|_, (_, until)| *until > now);
        }
        if let Some((_, until)) = leases.get(resource).filter(|(_, until)| *until > now) {
            return Ok(LeaseAcquisition::Held { until: *until, now });
        }
        let lease = ResourceLease {
            resource: *resource,
            token: LeaseToken::random(),
            until: now.saturating_add(ttl),
        };
        leases.insert(*resource, (lease.token, lease.until));
        Ok(LeaseAcquisition::Acquired(lease))
    }

    async fn release_resource_lease(
        &self,
        lease: &ResourceLease,
    ) -> Result<FencedWrite, StoreError> {
        let now = Timestamp::now();
        let mut leases = self.resource_leases();
        let Some((token, until)) = leases.get(&lease.resource).copied() else {
            return Ok(FencedWrite::Refused);
        };
        if token != lease.token {
            return Ok(FencedWrite::Refused);
        }
        // Its own, lapsed or not: gone either way; applied only while it was live.
        leases.remove(&lease.resource);
        Ok(if until > now {
            FencedWrite::Applied
        } else {
            FencedWrite::Refused
        })
    }

    async fn append_audit(&self, records: &[AuditRecord]) -> Result<(), StoreError> {
        let mut journal = self.journal();
        let now = Timestamp::now();
        let first = journal.next_seq;
        let sealed = seal_all(&mut journal.heads, first, now, records);
        journal.next_seq += sealed.len() as u64;
        journal.entries.extend(sealed);
        Ok(())
    }

    async fn read_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        let journal = self.journal();
        Ok(journal
            .entries
            .iter()
            .filter(|entry| query.admits(entry))
            .take(query.limit)
            .cloned()
            .collect())
    }

    async fn audit_partitions(&self) -> Result<Vec<AuditPartition>, StoreError> {
        let journal = self.journal();
        let mut partitions: Vec<AuditPartition> = journal
            .heads
            .iter()
            .map(|(instance, head)| AuditPartition {
                instance: instance.clone(),
                head: *head,
                anchor: journal
                    .anchors
                    .get(instance)
                    .copied()
                    .unwrap_or(ChainHash::GENESIS),
                entries: journal
                    .entries
                    .iter()
                    .filter(|entry| entry.record.instance == *instance)
                    .count() as u64,
            })
            .collect();
        partitions.sort_by(|a, b| a.instance.cmp(&b.instance));
        Ok(partitions)
    }

    async fn trim_audit(
        &self,
        instance: Option<&str>,
        before: Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        let mut journal = self.journal();
        let mut removed = 0;
        let mut index = 0;
        while removed < limit && index < journal.entries.len() {
            let entry = &journal.entries[index];
            if entry.at >= before {
                break;
            }
            if instance.is_some_and(|instance| entry.record.instance != instance) {
                index += 1;
                continue;
            }
            let Some(entry) = journal.entries.remove(index) else {
                break;
            };
            journal
                .anchors
                .insert(entry.record.instance.clone(), entry.hash);
            removed += 1;
        }
        Ok(removed as u64)
    }

    async fn audit_secret(&self) -> Result<AuditSecret, StoreError> {
        Ok(self.journal().secret.clone())
    }

    async fn record_duration(&self, route: &str, duration: Duration) -> Result<(), StoreError> {
        let route = crate::estimate::route_key(route);
        let mut durations = self
            .durations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !durations.routes.contains_key(route)
            && durations.routes.len() >= crate::estimate::MAX_ROUTES
        {
            let stalest = durations
                .routes
                .iter()
                .min_by_key(|(_, (last, _))| *last)
                .map(|(stalest, _)| stalest.clone());
            if let Some(stalest) = stalest {
                durations.routes.remove(&stalest);
            }
        }
        durations.recorded += 1;
        let recorded = durations.recorded;
        let (last, window) = durations.routes.entry(route.to_owned()).or_default();
        *last = recorded;
        if window.len() == crate::estimate::WINDOW {
            window.pop_front();
        }
        window.push_back(duration);
        Ok(())
    }

    async fn route_durations(&self, route: &str) -> Result<Vec<Duration>, StoreError> {
        let route = crate::estimate::route_key(route);
        let durations = self
            .durations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(durations
            .routes
            .get(route)
            .map(|(_, window)| window.iter().copied().collect())
            .unwrap_or_default())
    }

    async fn wait_for_change(&self, identity: &IdentityDigest, timeout: Duration) {
        self.signals.wait(identity, timeout).await;
    }
}
