//! The journal: every operation's history, kept past the record's TTL and
//! tamper-evident (issue 38, `docs/audit.md`).
//!
//! An entry is one event of one operation ([`AuditEvent`]): claimed, executed,
//! replayed, answered 409 or 422, released, taken over, fenced out, evicted or
//! expired. What the writer knows is an [`AuditRecord`]; the store gives it a
//! `seq` (its position in the journal), an `at` (the store's clock) and links it
//! into a hash chain, which makes it an [`AuditEntry`].
//!
//! # The chain
//! Entries are chained per **partition**, and a partition is the writing
//! instance (`instance`): each entry's `hash` is the SHA-256 of its `prev` (the
//! hash of the partition's previous entry, [`ChainHash::GENESIS`] for the first)
//! and of every field but `seq` ([`chain_hash`]). One instance's appends are
//! serialised by its store (a head row locked in the appending transaction, a
//! compare-and-set on a Redis head key), so instances never contend with each
//! other, and a partition's chain order is its `seq` order.
//!
//! A store also keeps, per partition, its head (the newest entry's hash) and its
//! anchor (the hash of the last entry retention removed, [`AuditPartition`]).
//! [`Verifier`] recomputes every hash and every link, walking the journal in
//! `seq` order: an edited entry no longer hashes to its `hash`, a deleted or
//! reordered one breaks the next entry's `prev`, a deleted tail no longer ends at
//! the head, a deleted start no longer begins at the anchor.
//!
//! What it does not prove: an operator who can write to the store can rebuild a
//! whole partition, heads included, and it will verify. Anchoring the heads
//! elsewhere (a log line, a metric, a ticket) is the defence: a rebuilt chain
//! ends at another head than the one recorded there.
//!
//! # Privacy
//! No key, body, credential or response enters an entry: the key is a keyed
//! digest ([`key_digest`], an HMAC-SHA256 under the store's own journal secret,
//! [`crate::Store::audit_secret`]), so an exported journal cannot be searched for
//! guessed keys by whoever holds the export but not the store.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::record::{LeaseOrigin, OperationId};
use crate::time::Timestamp;

/// What happened to an operation. The names are the journal's `event` field.
///
/// Exhaustive on purpose: a store and an exporter must handle each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AuditEvent {
    /// A new operation was claimed: it is about to run.
    Claimed,
    /// The operation ran and its outcome was stored (`status` is its answer).
    Executed,
    /// A retry got the stored answer.
    Replayed,
    /// A retry found the operation running (409).
    Conflict,
    /// The key came back with another request (422).
    Mismatch,
    /// The run ended without an outcome to keep (a retryable failure, or a
    /// request rejected before it started): the key may be used again.
    Released,
    /// A run whose holder stopped renewing its lease was taken over.
    TakenOver,
    /// A holder's write was refused: another run had taken the operation over.
    Fenced,
    /// An operator removed the record (`idemgate keys evict`).
    Evicted,
    /// The record reached its TTL and was purged.
    Expired,
}

impl AuditEvent {
    /// Every event, in declaration order.
    pub const ALL: [AuditEvent; 10] = [
        Self::Claimed,
        Self::Executed,
        Self::Replayed,
        Self::Conflict,
        Self::Mismatch,
        Self::Released,
        Self::TakenOver,
        Self::Fenced,
        Self::Evicted,
        Self::Expired,
    ];

    /// The name, as the journal spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Claimed => "claimed",
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::Conflict => "conflict",
            Self::Mismatch => "mismatch",
            Self::Released => "released",
            Self::TakenOver => "taken_over",
            Self::Fenced => "fenced",
            Self::Evicted => "evicted",
            Self::Expired => "expired",
        }
    }
}

impl fmt::Display for AuditEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no [`AuditEvent`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown audit event {0:?}")]
pub struct UnknownEvent(pub String);

impl FromStr for AuditEvent {
    type Err = UnknownEvent;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|event| event.as_str() == s)
            .ok_or_else(|| UnknownEvent(s.to_owned()))
    }
}

/// One event as its writer knows it: an entry before the store numbers,
/// timestamps and chains it. Optional fields are absent where the event has no
/// such thing (an eviction has no fingerprint, a claim no status yet).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditRecord {
    /// What happened.
    pub event: Option<AuditEvent>,
    /// The operation's id (PROTOCOL §5), where a record existed.
    pub operation_id: Option<String>,
    /// The request method.
    pub method: String,
    /// The route template where there is one, else the normalized path.
    pub route: String,
    /// The principal as the record's scope holds it (never a credential).
    pub principal: String,
    /// [`key_digest`] of the key, hex.
    pub key_digest: String,
    /// The request's fingerprint, hex.
    pub fingerprint: Option<String>,
    /// The HTTP (or gRPC) status answered, where one exists.
    pub status: Option<u16>,
    /// How long the run took, for `executed`, `released` and `fenced`.
    pub duration_ms: Option<u64>,
    /// The instance that wrote the entry: its chain partition.
    pub instance: String,
}

impl AuditRecord {
    /// The event; [`AuditEvent::Claimed`] when unset (a record built with
    /// `..Default::default()` always sets it).
    pub fn event(&self) -> AuditEvent {
        self.event.unwrap_or(AuditEvent::Claimed)
    }

    /// The entry of an acquired claim, from its request's entry: `claimed`,
    /// or `taken_over` where the claim took a lapsed lease over, with the
    /// operation's id.
    pub fn of_claim(mut self, origin: LeaseOrigin, operation_id: OperationId) -> Self {
        self.event = Some(match origin {
            LeaseOrigin::TakenOver => AuditEvent::TakenOver,
            LeaseOrigin::New | LeaseOrigin::Released => AuditEvent::Claimed,
        });
        self.operation_id = Some(operation_id.to_string());
        self
    }
}

/// A journal entry as a store keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEntry {
    /// Its position in the journal: increasing, unique, the pagination cursor.
    pub seq: u64,
    /// When the store wrote it (store clock).
    pub at: Timestamp,
    /// What happened.
    pub record: AuditRecord,
    /// The hash of the partition's previous entry.
    pub prev: ChainHash,
    /// This entry's hash ([`chain_hash`]).
    pub hash: ChainHash,
}

impl AuditEntry {
    /// Links `record`, written at `at`, after `prev`: the entry a store keeps
    /// under `seq`. Stores call this once they hold the partition's head.
    pub fn seal(seq: u64, at: Timestamp, record: AuditRecord, prev: ChainHash) -> Self {
        let hash = chain_hash(&prev, at, &record);
        Self {
            seq,
            at,
            record,
            prev,
            hash,
        }
    }
}

/// A SHA-256 in the chain.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChainHash([u8; 32]);

impl ChainHash {
    /// What a partition's first entry links to.
    pub const GENESIS: ChainHash = ChainHash([0; 32]);

    /// A hash from its bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex, 64 characters.
    pub fn to_hex(&self) -> String {
        crate::hex_text::encode(&self.0)
    }

    /// Parses 64 hex characters.
    pub fn from_hex(hex_text: &str) -> Option<Self> {
        let mut bytes = [0; 32];
        hex::decode_to_slice(hex_text, &mut bytes).ok()?;
        Some(Self(bytes))
    }
}

impl fmt::Debug for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChainHash({}…)", &self.to_hex()[..12])
    }
}

impl fmt::Display for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// The store's clock as a journal writer last read it, carried forward on
/// this process's monotonic clock for [`StoreClock::TRUSTED_FOR`]: what lets
/// a writer that knows its partition's head seal a batch and append it in one
/// round trip, without reading the clock first (the Redis and PostgreSQL
/// stores). The estimate is off by at most the reading's one-way delay plus
/// the two clocks' drift over that span — well under the millisecond `at` is
/// kept in — and an `at` it gives never goes back from one this writer
/// already wrote.
///
/// ```
/// use std::time::{Duration, Instant};
/// use idemgate_core::audit::StoreClock;
///
/// let mut clock = StoreClock::default();
/// assert_eq!(clock.estimate(), None, "never read");
/// clock.read(1_000, Instant::now());
/// assert!(clock.estimate().unwrap() >= 1_000);
/// clock.wrote(5_000); // the store's clock had run ahead of this process's
/// assert_eq!(clock.stamp(4_000), 5_000, "never back");
/// clock.read(1_000, Instant::now() - StoreClock::TRUSTED_FOR - Duration::from_millis(1));
/// assert_eq!(clock.estimate(), None, "too old a reading");
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct StoreClock {
    /// The store's clock in milliseconds, and when (on this process's
    /// monotonic clock) it was read.
    reading: Option<(i64, std::time::Instant)>,
    /// The latest `at` written.
    latest_written: i64,
}

impl StoreClock {
    /// How long one reading stamps entries before the clock is read again.
    pub const TRUSTED_FOR: std::time::Duration = std::time::Duration::from_secs(1);

    /// The `at` (milliseconds) for entries sealed now, from the last reading;
    /// `None` without one recent enough.
    pub fn estimate(&self) -> Option<i64> {
        let (clock_ms, read_at) = self.reading?;
        let elapsed = read_at.elapsed();
        if elapsed > Self::TRUSTED_FOR {
            return None;
        }
        let elapsed_ms = i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX);
        Some(self.stamp(clock_ms.saturating_add(elapsed_ms)))
    }

    /// The `at` for entries sealed at `now_ms`, the store's clock just read.
    pub fn stamp(&self, now_ms: i64) -> i64 {
        now_ms.max(self.latest_written)
    }

    /// The store's clock read as `now_ms` at `read_at`.
    pub fn read(&mut self, now_ms: i64, read_at: std::time::Instant) {
        self.reading = Some((now_ms, read_at));
    }

    /// Entries stamped `at_ms` were written.
    pub fn wrote(&mut self, at_ms: i64) {
        self.latest_written = self.latest_written.max(at_ms);
    }
}

/// The hash of an entry: SHA-256 over a domain tag, `prev`, `at` and every
/// field of `record`, each length-prefixed so no two field splits collide;
/// absent optional fields hash differently from empty ones. `seq` is not
/// covered: the store assigns it as it writes, and the chain order is checked
/// by the links instead.
pub fn chain_hash(prev: &ChainHash, at: Timestamp, record: &AuditRecord) -> ChainHash {
    let mut hasher = Sha256::new();
    let mut field = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(bytes);
    };
    field(b"idemgate/audit/v1");
    field(prev.as_bytes());
    field(&at.as_millis().to_be_bytes());
    field(record.event().as_str().as_bytes());
    let optional = |value: Option<&[u8]>, field: &mut dyn FnMut(&[u8])| match value {
        Some(bytes) => {
            field(b"+");
            field(bytes);
        }
        None => field(b"-"),
    };
    optional(
        record.operation_id.as_deref().map(str::as_bytes),
        &mut field,
    );
    field(record.method.as_bytes());
    field(record.route.as_bytes());
    field(record.principal.as_bytes());
    field(record.key_digest.as_bytes());
    optional(record.fingerprint.as_deref().map(str::as_bytes), &mut field);
    optional(
        record.status.map(u16::to_be_bytes).as_ref().map(|b| &b[..]),
        &mut field,
    );
    optional(
        record
            .duration_ms
            .map(u64::to_be_bytes)
            .as_ref()
            .map(|b| &b[..]),
        &mut field,
    );
    field(record.instance.as_bytes());
    ChainHash(hasher.finalize().into())
}

/// The journal's secret: the key of [`key_digest`]. Each store keeps its own,
/// made once ([`crate::Store::audit_secret`]).
#[derive(Clone, PartialEq, Eq)]
pub struct AuditSecret([u8; 32]);

impl AuditSecret {
    /// A secret from its bytes (as a store read them back).
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// A fresh random secret.
    pub fn random() -> Self {
        let mut bytes = [0; 32];
        bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        Self(bytes)
    }

    /// The bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for AuditSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuditSecret(..)")
    }
}

/// How many chains one instance's transactional `executed` entries are spread
/// over ([`transaction_partition`]).
pub const TRANSACTION_PARTITIONS: u64 = 128;

/// The partition — the chain, and the entry's `instance` — of the entries
/// appended inside the `turn`th business transaction an instance journals:
/// `{instance}/tx{n}`, `n` = `turn` modulo [`TRANSACTION_PARTITIONS`].
///
/// Such an append locks its partition's head until the transaction commits.
/// On one partition per instance, every business transaction of the instance
/// would queue on that head, one commit (one fsync) at a time. Taken in turn,
/// a chain comes back to a transaction only after 127 others started, so
/// concurrent transactions (at most the pool's connections) never meet on a
/// head unless one outlives all 127; and the head each append expects is the
/// one the chain's previous transaction committed, long before. Chosen by the
/// operation's identity instead (sixteen chains, until 2026-12-06), two of 32
/// concurrent transactions shared a chain most of the time: the second waited
/// for the first's commit, and its compare-and-set of the head, read before
/// that commit, failed and took the locking path.
///
/// ```
/// use idemgate_core::audit::transaction_partition;
/// assert_eq!(transaction_partition("web-1", 130), "web-1/tx2");
/// ```
pub fn transaction_partition(instance: &str, turn: u64) -> String {
    let n = turn % TRANSACTION_PARTITIONS;
    format!("{instance}/tx{n}")
}

/// How many chains one instance's claim entries are spread over where the
/// store writes each in the claim's own atomic step, outside any transaction
/// (one Redis server: [`claim_partition`]).
pub const CLAIM_PARTITIONS: u64 = 128;

/// The partition of the entry written with the `turn`th claim of an
/// instance, where the store writes it in the claim's own step (one Redis
/// server, the claim script): `{instance}/claim{n}`, `n` = `turn` modulo
/// [`CLAIM_PARTITIONS`].
///
/// The entry is sealed before the claim is sent, after the head its chain
/// will have, so one chain carries one claim at a time; a claim that finds
/// its chain carried leaves its entry to the journal's writer. Taken in turn,
/// a chain comes back to a claim after 127 others started: concurrent claims
/// do not meet on it, as concurrent transactions do not on theirs
/// ([`transaction_partition`]).
///
/// ```
/// use idemgate_core::audit::claim_partition;
/// assert_eq!(claim_partition("web-1", 129), "web-1/claim1");
/// ```
pub fn claim_partition(instance: &str, turn: u64) -> String {
    let n = turn % CLAIM_PARTITIONS;
    format!("{instance}/claim{n}")
}

/// The journal's `key_digest` of an idempotency key: HMAC-SHA256 under the
/// store's [`AuditSecret`], hex. Equal keys give equal digests, so one key's
/// events can be found (`idemgate audit export --key`), and the key cannot be
/// recovered or guessed from an export without the secret.
pub fn key_digest(secret: &AuditSecret, key: &str) -> String {
    // An HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes())
        .expect("HMAC accepts keys of any length");
    mac.update(b"idemgate/audit/key/v1\0");
    mac.update(key.as_bytes());
    crate::hex_text::encode(&mac.finalize().into_bytes())
}

/// What a store that deletes expired records itself needs to journal each as
/// `expired` ([`crate::Store::journal_expiries`]): the instance whose chain
/// the entries join, and the key digests' secret.
#[derive(Clone)]
pub struct ExpiryJournal {
    /// The instance's name: the entries' partition.
    pub instance: String,
    /// The journal's secret ([`key_digest`]).
    pub secret: AuditSecret,
}

impl fmt::Debug for ExpiryJournal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExpiryJournal")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// An expired record, as a store reads it back while deleting it.
#[derive(Clone, Debug)]
pub struct ExpiredRecord<'a> {
    /// The record's principal, as its scope holds it.
    pub principal: &'a str,
    /// The request method.
    pub method: &'a str,
    /// The normalized path.
    pub path: &'a str,
    /// The raw key (digested here, never journalled).
    pub key: &'a str,
    /// The first request's fingerprint.
    pub fingerprint: &'a [u8],
    /// The operation's id (a UUID's 16 bytes).
    pub operation_id: &'a [u8],
    /// The stored answer's status, when it had one.
    pub status: Option<u16>,
}

impl ExpiryJournal {
    /// The `expired` entry of `record`. Its route is the record's path: the
    /// record keeps no template.
    pub fn entry(&self, record: &ExpiredRecord<'_>) -> AuditRecord {
        AuditRecord {
            event: Some(AuditEvent::Expired),
            operation_id: uuid::Uuid::from_slice(record.operation_id)
                .ok()
                .map(|id| id.to_string()),
            method: record.method.to_owned(),
            route: record.path.to_owned(),
            principal: record.principal.to_owned(),
            key_digest: key_digest(&self.secret, record.key),
            fingerprint: Some(crate::hex_text::encode(record.fingerprint)),
            status: record.status,
            duration_ms: None,
            instance: self.instance.clone(),
        }
    }
}

/// Which entries to read: `since <= at < until`, `seq > after`, oldest first,
/// at most `limit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuditQuery {
    /// Entries written at or after this instant.
    pub since: Option<Timestamp>,
    /// Entries written before this instant.
    pub until: Option<Timestamp>,
    /// Entries after this `seq` (the previous page's last).
    pub after: Option<u64>,
    /// At most this many.
    pub limit: usize,
}

impl AuditQuery {
    /// Every entry from the start, `limit` at a time.
    pub const fn all(limit: usize) -> Self {
        Self {
            since: None,
            until: None,
            after: None,
            limit,
        }
    }

    /// Whether `entry` is in the range (the memory store filters with it).
    pub fn admits(&self, entry: &AuditEntry) -> bool {
        self.after.is_none_or(|after| entry.seq > after)
            && self.since.is_none_or(|since| entry.at >= since)
            && self.until.is_none_or(|until| entry.at < until)
    }
}

/// One partition's ends, as the store keeps them beside its entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditPartition {
    /// The instance whose chain it is.
    pub instance: String,
    /// The newest entry's hash ([`ChainHash::GENESIS`] before the first).
    pub head: ChainHash,
    /// The `prev` the oldest kept entry must have: the hash of the last entry
    /// retention removed, [`ChainHash::GENESIS`] while none was.
    pub anchor: ChainHash,
    /// How many entries the partition keeps now: with the others', the
    /// journal's size (`idemgate_audit_journal_entries`).
    pub entries: u64,
}

/// Why an entry breaks the journal, naming it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Break {
    /// The entry's fields or `prev` were changed after it was written.
    #[error(
        "entry seq {seq} (instance {instance:?}): its hash does not match its contents: edited"
    )]
    Edited {
        /// The entry.
        seq: u64,
        /// Its partition.
        instance: String,
    },
    /// The entry does not follow the partition's previous entry: one between
    /// was deleted, or entries were reordered.
    #[error(
        "entry seq {seq} (instance {instance:?}): does not follow {after}: an entry before it was deleted or moved"
    )]
    Unlinked {
        /// The entry.
        seq: u64,
        /// Its partition.
        instance: String,
        /// What it should follow (`seq N`, or the partition's anchor).
        after: String,
    },
    /// `seq` did not increase.
    #[error("entry seq {seq}: out of order after seq {previous}")]
    OutOfOrder {
        /// The entry.
        seq: u64,
        /// The one read before it.
        previous: u64,
    },
    /// The partition's chain ends before its recorded head: its newest entries
    /// were deleted.
    #[error(
        "instance {instance:?}: the journal ends at {last} but its head is {head}: the newest entries were deleted"
    )]
    Truncated {
        /// The partition.
        instance: String,
        /// The last entry present (`seq N`, or `no entry`).
        last: String,
        /// The head the store recorded.
        head: ChainHash,
    },
    /// Entries of an instance the store keeps no head for.
    #[error("entry seq {seq}: instance {instance:?} has no recorded head")]
    UnknownPartition {
        /// The entry.
        seq: u64,
        /// Its partition.
        instance: String,
    },
}

impl Break {
    /// The `seq` of the entry named, where one is.
    pub fn seq(&self) -> Option<u64> {
        match self {
            Self::Edited { seq, .. }
            | Self::Unlinked { seq, .. }
            | Self::OutOfOrder { seq, .. }
            | Self::UnknownPartition { seq, .. } => Some(*seq),
            Self::Truncated { .. } => None,
        }
    }
}

/// Checks a journal entry by entry, in `seq` order, holding only each
/// partition's last hash: a journal of any length verifies page by page.
///
/// ```
/// use idemgate_core::audit::{AuditEntry, AuditEvent, AuditPartition, AuditRecord, ChainHash, Verifier};
/// use idemgate_core::time::Timestamp;
///
/// let record = AuditRecord { event: Some(AuditEvent::Claimed), instance: "a".into(), ..Default::default() };
/// let first = AuditEntry::seal(1, Timestamp::from_millis(1), record.clone(), ChainHash::GENESIS);
/// let second = AuditEntry::seal(2, Timestamp::from_millis(2), record, first.hash);
/// let partitions = [AuditPartition { instance: "a".into(), head: second.hash, anchor: ChainHash::GENESIS, entries: 2 }];
/// let mut verifier = Verifier::new(&partitions);
/// verifier.push(&first).unwrap();
/// verifier.push(&second).unwrap();
/// assert_eq!(verifier.finish().unwrap(), 2);
/// ```
#[derive(Debug)]
pub struct Verifier {
    partitions: HashMap<String, Chain>,
    last_seq: Option<u64>,
    checked: u64,
}

#[derive(Debug)]
struct Chain {
    head: ChainHash,
    /// The last entry's hash and seq, or the anchor before any.
    tail: ChainHash,
    tail_seq: Option<u64>,
}

impl Verifier {
    /// A verifier for a store whose partitions are `partitions`.
    pub fn new(partitions: &[AuditPartition]) -> Self {
        Self {
            partitions: partitions
                .iter()
                .map(|p| {
                    (
                        p.instance.clone(),
                        Chain {
                            head: p.head,
                            tail: p.anchor,
                            tail_seq: None,
                        },
                    )
                })
                .collect(),
            last_seq: None,
            checked: 0,
        }
    }

    /// Checks the next entry.
    pub fn push(&mut self, entry: &AuditEntry) -> Result<(), Break> {
        let instance = &entry.record.instance;
        if let Some(previous) = self.last_seq
            && entry.seq <= previous
        {
            return Err(Break::OutOfOrder {
                seq: entry.seq,
                previous,
            });
        }
        self.last_seq = Some(entry.seq);
        if chain_hash(&entry.prev, entry.at, &entry.record) != entry.hash {
            return Err(Break::Edited {
                seq: entry.seq,
                instance: instance.clone(),
            });
        }
        let Some(chain) = self.partitions.get_mut(instance) else {
            return Err(Break::UnknownPartition {
                seq: entry.seq,
                instance: instance.clone(),
            });
        };
        if entry.prev != chain.tail {
            return Err(Break::Unlinked {
                seq: entry.seq,
                instance: instance.clone(),
                after: chain.tail_seq.map_or_else(
                    || "the partition's anchor".to_owned(),
                    |s| format!("seq {s}"),
                ),
            });
        }
        chain.tail = entry.hash;
        chain.tail_seq = Some(entry.seq);
        self.checked += 1;
        Ok(())
    }

    /// Ends the walk: every partition must end at its head. Returns how many
    /// entries were checked.
    pub fn finish(self) -> Result<u64, Break> {
        let mut partitions: Vec<_> = self.partitions.into_iter().collect();
        partitions.sort_by(|a, b| a.0.cmp(&b.0));
        for (instance, chain) in partitions {
            if chain.tail != chain.head {
                return Err(Break::Truncated {
                    instance,
                    last: chain
                        .tail_seq
                        .map_or_else(|| "no entry".to_owned(), |s| format!("seq {s}")),
                    head: chain.head,
                });
            }
        }
        Ok(self.checked)
    }
}

/// Links `records`, written at `at`, after the partitions' `heads`, numbering
/// them from `first_seq`: what a store that numbers its entries itself (memory,
/// Redis) writes. The heads move to the new entries' hashes.
pub fn seal_all(
    heads: &mut HashMap<String, ChainHash>,
    first_seq: u64,
    at: Timestamp,
    records: &[AuditRecord],
) -> Vec<AuditEntry> {
    records
        .iter()
        .zip(first_seq..)
        .map(|(record, seq)| {
            let head = heads
                .entry(record.instance.clone())
                .or_insert(ChainHash::GENESIS);
            let entry = AuditEntry::seal(seq, at, record.clone(), *head);
            *head = entry.hash;
            entry
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(instance: &str, event: AuditEvent, status: Option<u16>) -> AuditRecord {
        AuditRecord {
            event: Some(event),
            operation_id: Some("0b9c6f0e-1f0a-4c53-9a56-1b7d7b1d2f10".into()),
            method: "POST".into(),
            route: "/orders".into(),
            principal: "user:42".into(),
            key_digest: "ab".repeat(32),
            fingerprint: Some("cd".repeat(32)),
            status,
            duration_ms: status.map(|_| 12),
            instance: instance.into(),
        }
    }

    fn journal(instances: &[&str], count: usize) -> (Vec<AuditEntry>, Vec<AuditPartition>) {
        let mut heads = HashMap::new();
        let mut entries = Vec::new();
        for i in 0..count {
            let instance = instances[i % instances.len()];
            let event = AuditEvent::ALL[i % AuditEvent::ALL.len()];
            entries.extend(seal_all(
                &mut heads,
                (i as u64 + 1) * 3,
                Timestamp::from_millis(1_000 + i as i64),
                &[record(instance, event, Some(200))],
            ));
        }
        let partitions = instances
            .iter()
            .map(|i| AuditPartition {
                instance: (*i).into(),
                head: heads.get(*i).copied().unwrap_or(ChainHash::GENESIS),
                anchor: ChainHash::GENESIS,
                entries: 0,
            })
            .collect();
        (entries, partitions)
    }

    fn verify(entries: &[AuditEntry], partitions: &[AuditPartition]) -> Result<u64, Break> {
        let mut verifier = Verifier::new(partitions);
        for entry in entries {
            verifier.push(entry)?;
        }
        verifier.finish()
    }

    #[test]
    fn event_names_round_trip() {
        for event in AuditEvent::ALL {
            assert_eq!(event.as_str().parse::<AuditEvent>(), Ok(event));
        }
        assert!("deleted".parse::<AuditEvent>().is_err());
    }

    #[test]
    fn an_intact_journal_verifies() {
        let (entries, partitions) = journal(&["a", "b", "c"], 30);
        assert_eq!(verify(&entries, &partitions), Ok(30));
        assert_eq!(verify(&[], &journal(&["a"], 0).1), Ok(0));
    }

    #[test]
    fn every_field_is_covered_by_the_hash() {
        let base = record("a", AuditEvent::Executed, Some(201));
        let at = Timestamp::from_millis(5);
        let hash = chain_hash(&ChainHash::GENESIS, at, &base);
        type Edit = Box<dyn Fn(&mut AuditRecord)>;
        let edits: Vec<Edit> = vec![
            Box::new(|r| r.event = Some(AuditEvent::Replayed)),
            Box::new(|r| r.operation_id = None),
            Box::new(|r| r.method = "PUT".into()),
            Box::new(|r| r.route = "/order".into()),
            Box::new(|r| r.principal = "user:43".into()),
            Box::new(|r| r.key_digest = "00".into()),
            Box::new(|r| r.fingerprint = Some(String::new())),
            Box::new(|r| r.status = Some(200)),
            Box::new(|r| r.duration_ms = None),
            Box::new(|r| r.instance = "b".into()),
        ];
        for edit in edits {
            let mut edited = base.clone();
            edit(&mut edited);
            assert_ne!(chain_hash(&ChainHash::GENESIS, at, &edited), hash);
        }
        assert_ne!(
            chain_hash(&ChainHash::GENESIS, Timestamp::from_millis(6), &base),
            hash
        );
        assert_ne!(chain_hash(&ChainHash::from_bytes([1; 32]), at, &base), hash);
        // Field boundaries: ("a", "bc") is not ("ab", "c").
        let mut split = base.clone();
        split.method = "POST/".into();
        split.route = "orders".into();
        assert_ne!(chain_hash(&ChainHash::GENESIS, at, &split), hash);
    }

    #[test]
    fn the_key_digest_is_keyed() {
        let one = AuditSecret::from_bytes([1; 32]);
        let two = AuditSecret::from_bytes([2; 32]);
        assert_eq!(key_digest(&one, "k"), key_digest(&one, "k"));
        assert_ne!(key_digest(&one, "k"), key_digest(&two, "k"));
        assert_ne!(key_digest(&one, "k"), key_digest(&one, "l"));
        assert_eq!(key_digest(&one, "k").len(), 64);
        assert!(!key_digest(&one, "secret-key").contains("secret-key"));
    }

    #[test]
    fn a_trimmed_start_verifies_from_its_anchor() {
        let (entries, mut partitions) = journal(&["a"], 10);
        partitions[0].anchor = entries[3].hash;
        assert_eq!(verify(&entries[4..], &partitions), Ok(6));
        // Without the anchor, the cut start is found.
        partitions[0].anchor = ChainHash::GENESIS;
        assert!(matches!(
            verify(&entries[4..], &partitions),
            Err(Break::Unlinked { seq, .. }) if seq == entries[4].seq
        ));
    }

    #[test]
    fn a_deleted_tail_is_found_by_the_head() {
        let (entries, partitions) = journal(&["a", "b"], 10);
        let err = verify(&entries[..9], &partitions).unwrap_err();
        assert!(
            matches!(err, Break::Truncated { ref instance, .. } if instance == "b"),
            "{err}"
        );
        assert!(err.to_string().contains("seq"), "{err}");
    }

    #[derive(Debug, Clone)]
    enum Tamper {
        Edit(usize),
        Delete(usize),
        Swap(usize),
        Relink(usize),
    }

    proptest! {
        /// Any single edit, deletion (but the very last, which the head finds
        /// as a truncation), swap of two neighbours' contents, or a relink of
        /// an edited entry is found, and the break names the entry.
        #[test]
        fn any_tampering_is_found(count in 2usize..40, instances in 1usize..4, tamper in prop_oneof![
            (0usize..1000).prop_map(Tamper::Edit),
            (0usize..1000).prop_map(Tamper::Delete),
            (0usize..1000).prop_map(Tamper::Swap),
            (0usize..1000).prop_map(Tamper::Relink),
        ]) {
            let names = ["a", "b", "c"];
            let (mut entries, partitions) = journal(&names[..instances], count);
            let named = match tamper {
                Tamper::Edit(i) => {
                    let i = i % count;
                    entries[i].record.status = Some(500);
                    Some(entries[i].seq)
                }
                Tamper::Delete(i) => {
                    let i = i % count;
                    let removed = entries.remove(i);
                    // The partition's next entry, if any, is named.
                    entries.iter().find(|e| e.seq > removed.seq && e.record.instance == removed.record.instance).map(|e| e.seq)
                }
                Tamper::Swap(i) => {
                    // Two entries of one partition trade places (and seqs);
                    // order across partitions is not what a chain claims.
                    prop_assume!(count > instances);
                    let i = i % (count - instances);
                    let j = i + instances;
                    let (a, b) = (entries[i].seq, entries[j].seq);
                    entries.swap(i, j);
                    entries[i].seq = a;
                    entries[j].seq = b;
                    None
                }
                Tamper::Relink(i) => {
                    // Edited and re-hashed in place: the next entry no longer links.
                    let i = i % count;
                    entries[i].record.principal = "mallory".into();
                    entries[i].hash = chain_hash(&entries[i].prev, entries[i].at, &entries[i].record);
                    entries.iter().find(|e| e.seq > entries[i].seq && e.record.instance == entries[i].record.instance).map(|e| e.seq)
                }
            };
            let err = verify(&entries, &partitions);
            prop_assert!(err.is_err(), "tampering {:?} went unnoticed", tamper);
            let err = err.unwrap_err();
            if let Some(seq) = named {
                prop_assert_eq!(err.seq(), Some(seq), "{}", err);
            }
        }

        #[test]
        fn chain_hex_round_trips(bytes in any::<[u8; 32]>()) {
            let hash = ChainHash::from_bytes(bytes);
            prop_assert_eq!(ChainHash::from_hex(&hash.to_hex()), Some(hash));
        }
    }
}
