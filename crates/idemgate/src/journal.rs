//! The journal writer: every operation's events, written to the store's journal
//! (`idemgate_core::audit`, `docs/audit.md`).
//!
//! [`Journaled`] is a [`Store`] in front of the layer's store. It sees every
//! claim and every write after it, so it knows each event as the store decided
//! it: a new operation (`claimed`), a takeover (`taken_over`), an existing
//! record's answer (`replayed`, `conflict`, `mismatch`, by [`decide()`] — the rule
//! the layer answers by), the outcome stored (`executed`), a release or a
//! deletion (`released`), a refused write (`fenced`).
//!
//! In the transactional mode the `executed` entry is not queued: the layer
//! asks for it ([`Store::transaction_journal_entries`]) and the SQL store
//! appends it inside the handler's transaction, with the completion and the
//! business writes — so the journal never reports an effect that rolled back
//! and never misses one that committed, even when the process dies right
//! after the commit.
//!
//! A claim (`claimed`, `taken_over`) returns once its entry is appended: the
//! operation is in the journal before it runs, as the seeds' payment platform
//! had it, and before anything its run or its duplicates add — so the journal
//! never shows a run executed, or a duplicate turned away, before it was
//! claimed. A store that can, writes the entry with the claim itself
//! ([`Store::try_claim_journaled`]: SQLite, in the claim's own batch of its
//! writer; one Redis server, a new key's in the claim script); otherwise the
//! claim waits for the journal's writer. That
//! wait is bounded (500 ms): a journal that stopped answering
//! slows new keys, it does not fail them; a claim's entry still queued when
//! its transaction commits goes into that transaction, before `executed`, and
//! should that commit fail, it is queued again before the run's next outcome.
//! A claim made inside the run's transaction (the one-transaction mode)
//! journals inside it too.
//!
//! Every other entry is queued, never awaited on the request path: a task
//! appends them in batches, one store round trip for everything queued
//! meanwhile (group commit), so a replay or a rejection costs no second round
//! trip, and concurrent claims share their batches. The price: an event queued
//! when the process dies is lost (a crash, not a drain — the drain flushes the
//! queue, [`Journaled::flush`]). A full queue drops entries and counts them
//! (`idemgate_audit_dropped_total`) rather than slow requests.
//!
//! Evictions are journalled by whoever evicts (`idemgate keys evict`, the admin
//! API), where the key is known; [`Journaled`] passes `evict` through.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use idemgate_core::audit::{
    AuditEntry, AuditEvent, AuditPartition, AuditQuery, AuditRecord, AuditSecret, ExpiryJournal,
    key_digest, transaction_partition,
};
use idemgate_core::hex_text;
use idemgate_core::record::FencingToken;
use idemgate_core::resource_lease::{LeaseAcquisition, ResourceId, ResourceLease};
use idemgate_core::scope::IdentityDigest;
use idemgate_core::stream::StreamId;
use idemgate_core::time::Timestamp;
use idemgate_core::transaction::ClaimInTransaction;
use idemgate_core::{
    Claim, ClaimRequest, Completion, Decision, EvictMode, Eviction, FencedWrite, Lease, Snapshot,
    Store, StoreError, decide,
};
use tokio::sync::{Notify, mpsc, oneshot};

/// How many entries may wait for the writer; past it entries are dropped and
/// counted, never waited for.
const QUEUE: usize = 65_536;

/// At most this many entries per append.
const BATCH: usize = 512;

/// How many runs the writer remembers (scope and start) between claim and
/// outcome; past it the oldest are forgotten and their outcome is journalled
/// without a route (a bound on memory for leases that never settle).
const RUNS: usize = 100_000;

/// What the journal writes and where.
#[derive(Clone, Debug)]
pub struct JournalConfig {
    /// This instance's name: its chain partition and every entry's `instance`.
    pub instance: String,
    /// The store's journal secret ([`Store::audit_secret`]), the key of the
    /// entries' `key_digest`.
    pub secret: AuditSecret,
}

/// A [`Store`] that journals what happens through it; see the module docs.
pub struct Journaled {
    inner: Arc<dyn Store>,
    config: JournalConfig,
    queue: mpsc::Sender<Message>,
    /// Ends the writer's gathering early: an entry a claim waits on, or a
    /// flush, was queued ([`write`]).
    urgent: Arc<Notify>,
    runs: Mutex<Runs>,
    /// How many business transactions this instance journalled: the next
    /// one's chain ([`transaction_partition`]).
    transactions: AtomicU64,
}

impl std::fmt::Debug for Journaled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journaled")
            .field("instance", &self.config.instance)
            .finish_non_exhaustive()
    }
}

enum Message {
    /// An entry (boxed: the channel's slots stay small).
    Entry(Box<Queued>),
    Flush(oneshot::Sender<()>),
}

/// An entry in the queue.
struct Queued {
    record: AuditRecord,
    at: Instant,
    /// A run's first entry: who takes it, the writer or the run's
    /// transaction ([`ClaimEntry`]).
    claim: Option<Arc<ClaimEntry>>,
}

/// How long a claim waits for the writer to append its entry before the run
/// goes on without it: well under the store timeout (2 s by default), so a
/// journal that stopped answering slows new keys but does not fail them.
const CLAIM_APPEND_WAIT: Duration = Duration::from_millis(500);

/// Where a run's first entry starts out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ClaimEntryStart {
    /// Queued for the journal's writer.
    Queued,
    /// Written by the store with the claim ([`Store::try_claim_journaled`]).
    WrittenWithClaim,
    /// Kept for the run's transaction, the claim having been made in it.
    KeptForTransaction,
}

/// A run's first entry (`claimed`, `taken_over`) is taken once: by the writer
/// from the queue, or by the run's transaction — unless the store wrote it
/// with the claim. A claim of its own (two
/// phases) returns only once the writer has appended it
/// ([`ClaimEntry::until_appended`]), so the operation is in the journal
/// before it runs, and before any entry its run or its duplicates add: a
/// batch still in flight when a short transactional run commits its
/// `executed` entry would otherwise put that entry first. Only when that
/// wait runs out is the entry still queued when the run's transaction
/// commits, and the transaction takes it then. A claim made inside the
/// run's transaction (the one-transaction mode) is kept for that
/// transaction from the start: the writer could not append it before the
/// transaction's commit anyway (the claim is invisible until then, and on
/// SQLite the transaction holds the one writer).
struct ClaimEntry {
    taken: AtomicU8,
    /// Told once the writer's append of it is over, written or given up.
    appended: Notify,
}

impl ClaimEntry {
    const QUEUED: u8 = 0;
    const WRITER: u8 = 1;
    const TRANSACTION: u8 = 2;
    const APPENDED: u8 = 3;

    fn new(start: ClaimEntryStart) -> Self {
        let taken = match start {
            ClaimEntryStart::Queued => Self::QUEUED,
            ClaimEntryStart::WrittenWithClaim => Self::APPENDED,
            ClaimEntryStart::KeptForTransaction => Self::TRANSACTION,
        };
        Self {
            taken: AtomicU8::new(taken),
            appended: Notify::new(),
        }
    }

    /// Takes it for `by`, unless the other one has.
    fn take(&self, by: u8) -> bool {
        self.taken
            .compare_exchange(Self::QUEUED, by, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    fn taken_by_transaction(&self) -> bool {
        self.taken.load(Ordering::SeqCst) == Self::TRANSACTION
    }

    /// The writer's append of it is over (or it was dropped from a full queue).
    fn appended(&self) {
        self.taken.store(Self::APPENDED, Ordering::SeqCst);
        self.appended.notify_waiters();
    }

    /// Waits, at most `bound`, while it is queued or being appended.
    async fn until_appended(&self, bound: Duration) {
        let appended = self.appended.notified();
        tokio::pin!(appended);
        // Registered before the check: an append that ends in between still wakes it.
        appended.as_mut().enable();
        if matches!(
            self.taken.load(Ordering::SeqCst),
            Self::QUEUED | Self::WRITER
        ) && tokio::time::timeout(bound, appended).await.is_err()
        {
            tracing::debug!(
                ?bound,
                "the journal did not append a claim's entry in time; the run goes on"
            );
        }
    }
}

/// A run between its claim and its outcome.
#[derive(Clone)]
struct Run {
    template: AuditRecord,
    started: Instant,
    claim: Arc<ClaimEntry>,
}

#[derive(Default)]
struct Runs {
    by_lease: HashMap<(IdentityDigest, FencingToken), Run>,
    order: std::collections::VecDeque<(IdentityDigest, FencingToken)>,
}

impl Journaled {
    /// Journals what happens through `inner`. Starts the writer task on the
    /// current Tokio runtime.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use idemgate::journal::{JournalConfig, Journaled};
    /// use idemgate::{MemoryStore, Store};
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let secret = store.audit_secret().await.unwrap();
    /// let journaled = Journaled::new(store, JournalConfig { instance: "a".into(), secret });
    /// # }
    /// ```
    pub fn new(inner: Arc<dyn Store>, config: JournalConfig) -> Self {
        // A store that sweeps expired records journals each sweep itself, in
        // the sweep's own transaction.
        inner.journal_expiries(ExpiryJournal {
            instance: config.instance.clone(),
            secret: config.secret.clone(),
        });
        let (queue, receiver) = mpsc::channel(QUEUE);
        let urgent = Arc::new(Notify::new());
        tokio::spawn(write(Arc::clone(&inner), receiver, Arc::clone(&urgent)));
        metrics::counter!("idemgate_audit_entries_total").absolute(0);
        metrics::counter!("idemgate_audit_dropped_total").absolute(0);
        metrics::counter!("idemgate_audit_errors_total").absolute(0);
        metrics::gauge!("idemgate_audit_lag_seconds").set(0.0);
        metrics::gauge!("idemgate_audit_queue").set(0.0);
        Self {
            inner,
            config,
            queue,
            urgent,
            runs: Mutex::default(),
            transactions: AtomicU64::new(0),
        }
    }

    /// Waits until every entry queued so far is written (or given up on): the
    /// drain calls it before the process exits.
    pub async fn flush(&self) {
        let (done, flushed) = oneshot::channel();
        if self.queue.send(Message::Flush(done)).await.is_ok() {
            self.urgent.notify_one();
            let _ = flushed.await;
        }
    }

    fn queue(&self, record: AuditRecord) {
        self.enqueue(record, None);
    }

    fn enqueue(&self, record: AuditRecord, claim: Option<Arc<ClaimEntry>>) {
        let queued = Queued {
            record,
            at: Instant::now(),
            claim: claim.clone(),
        };
        match (self.queue.try_send(Message::Entry(Box::new(queued))), claim) {
            // Waited on: the writer's gathering ends now.
            (Ok(()), Some(_)) => self.urgent.notify_one(),
            (Ok(()), None) => {}
            (Err(_), claim) => {
                metrics::counter!("idemgate_audit_dropped_total").increment(1);
                if let Some(claim) = claim {
                    // Dropped: nothing to wait for.
                    claim.appended();
                }
            }
        }
    }

    /// What every entry of `request` carries: its scope, its key's digest and
    /// its fingerprint. The event (and operation) is set by what the claim found.
    fn request_entry(&self, request: &ClaimRequest) -> AuditRecord {
        let scope = request.identity.scope();
        AuditRecord {
            event: None,
            operation_id: None,
            method: scope.method.clone(),
            route: request.route().to_owned(),
            principal: scope.principal.as_str().to_owned(),
            key_digest: key_digest(&self.config.secret, request.identity.key().as_str()),
            fingerprint: Some(hex_text::encode(request.fingerprint.as_bytes())),
            status: None,
            duration_ms: None,
            instance: self.config.instance.clone(),
        }
    }

    fn runs(&self) -> std::sync::MutexGuard<'_, Runs> {
        // Each update is a map insert or remove: nothing half-done to poison.
        self.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn remember(&self, lease: &Lease, template: AuditRecord, claim: Arc<ClaimEntry>) {
        let key = (lease.identity, lease.token);
        let mut runs = self.runs();
        if runs.by_lease.len() >= RUNS
            && let Some(oldest) = runs.order.pop_front()
        {
            runs.by_lease.remove(&oldest);
        }
        runs.order.push_back(key);
        runs.by_lease.insert(
            key,
            Run {
                template,
                started: Instant::now(),
                claim,
            },
        );
    }

    /// The run's template, forgotten: its outcome is its last event.
    fn settle(&self, lease: &Lease) -> Option<Run> {
        let key = (lease.identity, lease.token);
        let mut runs = self.runs();
        let run = runs.by_lease.remove(&key);
        if run.is_some()
            && let Some(at) = runs.order.iter().position(|k| *k == key)
        {
            runs.order.remove(at);
        }
        run
    }

    /// The outcome of `lease`'s run: `event`, with `status` where one exists.
    fn outcome(&self, lease: &Lease, event: AuditEvent, status: Option<u16>) {
        let run = self.settle(lease);
        // Taken into a transaction that did not commit: queued again, first.
        if let Some(run) = &run
            && run.claim.taken_by_transaction()
        {
            self.queue(run.template.clone());
        }
        self.queue(self.outcome_entry(run, lease, event, status));
    }

    /// The entry of `lease`'s outcome, from its `run` where this instance
    /// remembers it.
    fn outcome_entry(
        &self,
        run: Option<Run>,
        lease: &Lease,
        event: AuditEvent,
        status: Option<u16>,
    ) -> AuditRecord {
        let (mut record, duration) = match run {
            Some(run) => (run.template, Some(run.started.elapsed())),
            // A run this instance did not claim (or forgot): its operation and
            // instance are known, its scope is not.
            None => (
                AuditRecord {
                    instance: self.config.instance.clone(),
                    ..AuditRecord::default()
                },
                None,
            ),
        };
        record.event = Some(event);
        record.operation_id = Some(lease.operation_id.to_string());
        record.status = status;
        record.duration_ms = duration.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        record
    }

    fn written(&self, lease: &Lease, write: FencedWrite, applied: AuditEvent, status: Option<u16>) {
        match write {
            FencedWrite::Applied => self.outcome(lease, applied, status),
            FencedWrite::Refused => {
                // Fenced once per run: later refused writes of the same run
                // (a release after a refused completion) add nothing.
                if self
                    .runs()
                    .by_lease
                    .contains_key(&(lease.identity, lease.token))
                {
                    self.outcome(lease, AuditEvent::Fenced, None);
                }
            }
        }
    }
}

/// How long the writer gathers a batch that nothing waits on before it
/// appends it: replays and rejections come at tens of thousands a second, and
/// each append is a commit (on SQLite, a few pages of its write-ahead log);
/// batches of a few milliseconds' entries make those commits rare. A claim's
/// entry or a flush ends the gathering at once: they are waited on.
const LINGER: Duration = Duration::from_millis(5);

/// The writer task: batches of whatever is queued, appended in one call each.
///
/// While it gathers, it sleeps instead of listening to the queue, so an entry
/// queued meanwhile wakes nobody. Replays are queued from the proxy's worker
/// threads, and waking this task on the shared runtime was a system call per
/// replay. Only what somebody waits on wakes it early, through `urgent`: a
/// claim's entry or a flush.
async fn write(store: Arc<dyn Store>, mut queue: mpsc::Receiver<Message>, urgent: Arc<Notify>) {
    let mut batch = Batch::default();
    while let Some(first) = queue.recv().await {
        batch.take(first);
        batch.take_ready(&mut queue);
        if !batch.is_full() && !batch.is_awaited() {
            // Gathered long enough, or woken for a waited-on entry. A queue
            // closed meanwhile is seen at the next `recv`, after this batch.
            let _ = tokio::time::timeout(LINGER, urgent.notified()).await;
            batch.take_ready(&mut queue);
        }
        // What waits behind this batch: read here, not counted per entry on
        // the request path.
        metrics::gauge!("idemgate_audit_queue").set(queue.len() as f64);
        batch.append(store.as_ref()).await;
    }
}

/// The entries the writer gathers for one append, and who waits on it.
#[derive(Default)]
struct Batch {
    records: Vec<AuditRecord>,
    /// The runs' first entries in `records`: their claims (and, should the
    /// wait run out, their transactions) wait for them.
    claims: Vec<Arc<ClaimEntry>>,
    flushes: Vec<oneshot::Sender<()>>,
    /// When the oldest entry was queued: the journal's lag.
    oldest: Option<Instant>,
}

impl Batch {
    fn take(&mut self, message: Message) {
        match message {
            Message::Entry(queued) => {
                let Queued { record, at, claim } = *queued;
                match claim {
                    Some(claim) if !claim.take(ClaimEntry::WRITER) => {
                        // A run's first entry its transaction took: not written here.
                        return;
                    }
                    Some(claim) => self.claims.push(claim),
                    None => {}
                }
                self.oldest.get_or_insert(at);
                self.records.push(record);
            }
            Message::Flush(done) => self.flushes.push(done),
        }
    }

    /// Takes what is queued already, up to a full batch.
    fn take_ready(&mut self, queue: &mut mpsc::Receiver<Message>) {
        while !self.is_full() {
            match queue.try_recv() {
                Ok(message) => self.take(message),
                Err(_) => break,
            }
        }
    }

    fn is_full(&self) -> bool {
        self.records.len() >= BATCH
    }

    /// A claim or a flush waits on it: appended without gathering more.
    fn is_awaited(&self) -> bool {
        !self.claims.is_empty() || !self.flushes.is_empty()
    }

    /// Appends the entries and tells whoever waits; empties the batch.
    async fn append(&mut self, store: &dyn Store) {
        if !self.records.is_empty() {
            append(store, &self.records).await;
            for claim in self.claims.drain(..) {
                claim.appended();
            }
            if let Some(oldest) = self.oldest.take() {
                metrics::gauge!("idemgate_audit_lag_seconds").set(oldest.elapsed().as_secs_f64());
            }
            self.records.clear();
        }
        for done in self.flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

/// Appends `batch`, retrying a failing store a few times: entries are not kept
/// past that (the queue would grow without bound while the store is down).
async fn append(store: &dyn Store, batch: &[AuditRecord]) {
    let mut backoff = Duration::from_millis(50);
    for attempt in 1..=5 {
        match store.append_audit(batch).await {
            Ok(()) => {
                metrics::counter!("idemgate_audit_entries_total").increment(batch.len() as u64);
                return;
            }
            Err(error) if attempt < 5 => {
                tracing::warn!(%error, attempt, "writing the journal failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
            Err(error) => {
                tracing::error!(%error, entries = batch.len(), "writing the journal failed; these entries are lost");
                metrics::counter!("idemgate_audit_errors_total").increment(1);
                metrics::counter!("idemgate_audit_dropped_total").increment(batch.len() as u64);
            }
        }
    }
}

impl Journaled {
    /// A claim acquired: `claimed`, or `taken_over`, made from the request's
    /// `entry` and remembered for its run's outcome, starting out at `start`.
    /// The entry, for the claim to wait on.
    fn claimed(
        &self,
        entry: AuditRecord,
        lease: &Lease,
        start: ClaimEntryStart,
    ) -> Arc<ClaimEntry> {
        let record = entry.of_claim(lease.origin, lease.operation_id);
        let claim = Arc::new(ClaimEntry::new(start));
        self.remember(lease, record.clone(), Arc::clone(&claim));
        if start == ClaimEntryStart::Queued {
            self.enqueue(record, Some(Arc::clone(&claim)));
        }
        claim
    }

    /// A claim that met a record: `replayed`, `conflict` or `mismatch`, its
    /// entry made from the request's `entry`.
    fn met(&self, request: &ClaimRequest, mut entry: AuditRecord, snapshot: &Snapshot) {
        let (event, status) = match decide(snapshot, &request.fingerprint) {
            Decision::Replay(stored) => (AuditEvent::Replayed, stored.status.as_u16()),
            Decision::InProgress { .. } => (AuditEvent::Conflict, 409),
            Decision::Mismatch => (AuditEvent::Mismatch, 422),
            Decision::Claimable => return,
        };
        entry.event = Some(event);
        entry.operation_id = Some(snapshot.record.operation_id.to_string());
        entry.status = Some(status);
        self.queue(entry);
    }
}

#[async_trait]
impl Store for Journaled {
    async fn try_claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        // A store that writes the entry with the claim (SQLite's writer, in
        // the claim's batch; one Redis server, in the claim script) saves the
        // wait for the journal's own batch.
        let entry = self.request_entry(request);
        let (claim, written) = self.inner.try_claim_journaled(request, &entry).await?;
        match &claim {
            Claim::Acquired(lease) if written => {
                self.claimed(entry, lease, ClaimEntryStart::WrittenWithClaim);
            }
            Claim::Acquired(lease) => {
                self.claimed(entry, lease, ClaimEntryStart::Queued)
                    .until_appended(CLAIM_APPEND_WAIT)
                    .await;
            }
            Claim::Existing(snapshot) => self.met(request, entry, snapshot),
        }
        Ok(claim)
    }

    fn supports_one_transaction(&self) -> bool {
        self.inner.supports_one_transaction()
    }

    /// Journalled as [`Store::try_claim`] is. The `claimed` entry of a claim
    /// that rolls back is followed by `released` (`rolled_back_in_transaction`);
    /// a claim that found another transaction's uncommitted claim is a
    /// `conflict`.
    async fn claim_in_transaction(
        &self,
        request: &ClaimRequest,
        lock_wait: Duration,
    ) -> Result<ClaimInTransaction, StoreError> {
        let claim = self.inner.claim_in_transaction(request, lock_wait).await?;
        let entry = self.request_entry(request);
        match &claim {
            ClaimInTransaction::Acquired { lease, .. } => {
                // Kept for the run's transaction (`transaction_journal_entries`),
                // or queued before the run's outcome if it does not commit.
                self.claimed(entry, lease, ClaimEntryStart::KeptForTransaction);
            }
            ClaimInTransaction::Existing(snapshot) => self.met(request, entry, snapshot),
            ClaimInTransaction::Locked => {
                let mut record = entry;
                record.event = Some(AuditEvent::Conflict);
                record.status = Some(409);
                self.queue(record);
            }
        }
        Ok(claim)
    }

    fn rolled_back_in_transaction(&self, lease: &Lease) {
        self.inner.rolled_back_in_transaction(lease);
        self.written(lease, FencedWrite::Applied, AuditEvent::Released, None);
    }

    async fn complete(
        &self,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<FencedWrite, StoreError> {
        let write = self.inner.complete(lease, completion).await?;
        self.written(
            lease,
            write,
            AuditEvent::Executed,
            Some(completion.response.status.as_u16()),
        );
        Ok(write)
    }

    async fn release(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        let write = self.inner.release(lease).await?;
        self.written(lease, write, AuditEvent::Released, None);
        Ok(write)
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
        let write = self.inner.renew(lease, lease_for).await?;
        if write == FencedWrite::Refused {
            self.written(lease, write, AuditEvent::Fenced, None);
        }
        Ok(write)
    }

    async fn delete(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        let write = self.inner.delete(lease).await?;
        self.written(lease, write, AuditEvent::Released, None);
        Ok(write)
    }

    async fn evict(
        &self,
        identity: &IdentityDigest,
        mode: EvictMode,
    ) -> Result<Eviction, StoreError> {
        self.inner.evict(identity, mode).await
    }

    async fn get(&self, identity: &IdentityDigest) -> Result<Option<Snapshot>, StoreError> {
        self.inner.get(identity).await
    }

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
    ) -> Result<(), idemgate_core::StoreError> {
        self.inner.record_duration(route, duration).await
    }

    async fn route_durations(
        &self,
        route: &str,
    ) -> Result<Vec<std::time::Duration>, idemgate_core::StoreError> {
        self.inner.route_durations(route).await
    }

    fn journal_expiries(&self, journal: ExpiryJournal) {
        self.inner.journal_expiries(journal);
    }

    fn completed_in_transaction(&self, lease: &Lease, completion: &Completion) {
        self.inner.completed_in_transaction(lease, completion);
        // Its `executed` entry committed with it
        // (`Journaled::transaction_journal_entries`): the run is over.
        self.settle(lease);
    }

    async fn transaction_journal_entries(
        &self,
        lease: &Lease,
        completion: &Completion,
    ) -> Vec<AuditRecord> {
        // Not settled yet: a commit that fails leaves the run to be released
        // (or fenced) like any other.
        let run = self
            .runs()
            .by_lease
            .get(&(lease.identity, lease.token))
            .cloned();
        // The instance's next transaction chain, so concurrent business
        // transactions do not commit one at a time behind one head row.
        let turn = self.transactions.fetch_add(1, Ordering::Relaxed);
        let partition = transaction_partition(&self.config.instance, turn);
        let mut entries = Vec::with_capacity(2);
        // The run's first entry, if the writer has not taken it (a claim in
        // this transaction, or a claim whose wait for the writer ran out).
        if let Some(run) = &run
            && (run.claim.take(ClaimEntry::TRANSACTION) || run.claim.taken_by_transaction())
        {
            let mut claimed = run.template.clone();
            claimed.instance = partition.clone();
            entries.push(claimed);
        }
        let mut executed = self.outcome_entry(
            run,
            lease,
            AuditEvent::Executed,
            Some(completion.response.status.as_u16()),
        );
        executed.instance = partition;
        entries.push(executed);
        entries
    }

    async fn wait_for_change(&self, identity: &IdentityDigest, timeout: Duration) {
        self.inner.wait_for_change(identity, timeout).await;
    }
}
