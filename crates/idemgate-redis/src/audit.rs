//! The journal in Redis (`idemgate_core::audit`).
//!
//! # Keys
//! Every journal key of a store carries one hash tag, `{<prefix>audit}`, so they
//! all live in one slot on Cluster and one script may touch several:
//!
//! - `<prefix>{<prefix>audit}:stream:<instance>`: one stream per partition
//!   (instance), its entries' IDs `0-<seq>`, so a stream is in `seq` order and
//!   `XRANGE` pages by `seq`;
//! - `…:seq`: the counter `seq` comes from (`INCRBY`, once per append), shared by the partitions;
//! - `…:heads` and `…:anchors`: hashes of each partition's head and anchor (hex);
//! - `…:secret`: the key digest's secret, set once (`SET NX`).
//!
//! On Cluster the journal is therefore one slot's load: every append of every
//! instance goes to the node holding it. That is the price of one `seq` across
//! partitions; the records themselves stay spread over all slots.
//!
//! # Appending
//! SHA-256 is not in Redis' Lua, so the chain is computed here: one script reads
//! the partitions' heads and the server's clock, the entries are sealed after
//! them, and a second script writes them only if every head is still what was
//! read (a compare-and-set), numbering them with `INCR`; a lost race reads again.
//! One process's appends take turns (a lock), so only processes sharing an
//! instance name ever race.
//!
//! The read is needed only once in a while ([`Appending`]): the heads an
//! append wrote are the next append's expected heads, and the server's clock,
//! read with them, is carried forward on this process's monotonic clock
//! ([`StoreClock`], for a second). An append within that is one round trip, the
//! compare-and-set; a refused one (another process wrote as the same instance,
//! or the heads were edited) reads again.
//!
//! # A claim's entry
//! On one server a new key's claim carries its own entry: the claim script
//! appends it to one of the instance's claim chains (`{instance}/claimN`,
//! taken in turn: [`claim_partition`]) if that chain's head is still the one
//! it was sealed after ([`Journal::seal_claim`]). The claim is then one round
//! trip with its entry, and does not wait for the writer (measured with
//! `wrk -c32` on new keys, 2026-12-06: that wait and its batch were 50 µs of
//! the server's CPU and 40 µs of Redis's per new key). A takeover's entry,
//! a claim whose chain is carried by another claim in flight or whose head
//! moved, and every claim on Cluster (the record's slot is not the
//! journal's) go through the writer as before.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Instant;

use idemgate_core::StoreError;
use idemgate_core::audit::{
    AuditEntry, AuditEvent, AuditPartition, AuditQuery, AuditRecord, AuditSecret, ChainHash,
    StoreClock, chain_hash, claim_partition,
};
use idemgate_core::time::Timestamp;
use redis::{Script, Value};

use crate::codec::{array_of, bytes_of, int_of};
use crate::error::RedisStoreError;

/// How often an append reads the heads again after another writer of the same
/// partition moved one (only instances sharing a name race).
const APPEND_ATTEMPTS: usize = 8;

/// Reads the server's clock and the heads of `ARGV` (instances); an absent head
/// is an empty string.
const HEADS: &str = r"
local t = redis.call('TIME')
local out = { string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)) }
for i = 1, #ARGV do
  out[#out + 1] = redis.call('HGET', KEYS[1], ARGV[i]) or ''
end
return out
";

/// `KEYS`: heads, seq, then one stream per partition. `ARGV[1]`: n partitions,
/// then per partition (instance, expected head, new head), then the number of
/// entries, and per entry: its partition's index (1-based), its field count k,
/// 2k field/value strings. Writes nothing and answers 0 if a head moved.
///
/// Each `XADD` takes its field/value strings straight from `ARGV` (`unpack` of
/// the entry's range): copied into a table of their own first, a 150-entry
/// batch ran 25–30 % longer in Redis (`INFO commandstats`, 2026-12-05).
const APPEND: &str = r"
local n = tonumber(ARGV[1])
local i = 2
for p = 1, n do
  local current = redis.call('HGET', KEYS[1], ARGV[i]) or ''
  if current ~= ARGV[i + 1] then return 0 end
  i = i + 3
end
local m = tonumber(ARGV[i]); i = i + 1
local seq = redis.call('INCRBY', KEYS[2], m) - m
for e = 1, m do
  seq = seq + 1
  local k = tonumber(ARGV[i + 1])
  redis.call('XADD', KEYS[2 + tonumber(ARGV[i])], '0-' .. string.format('%.0f', seq),
    unpack(ARGV, i + 2, i + 1 + 2 * k))
  i = i + 2 + 2 * k
end
i = 2
for p = 1, n do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
  i = i + 3
end
return 1
";

/// `KEYS`: streams. `ARGV`: first ID, count. The streams' first `count`
/// entries from that ID, merged by `seq` (their IDs' sequence part): each
/// stream is read 64 entries at a time as the merge reaches it, so a page
/// costs about its own size however many streams there are (an instance has
/// its own, 128 claim chains, and maybe others').
const READ: &str = r"
local count = tonumber(ARGV[2])
local buffers, at, seqs = {}, {}, {}
local function seq_of(entry)
  return tonumber(string.match(entry[1], '%-(%d+)$'))
end
local function fill(s, from)
  buffers[s] = redis.call('XRANGE', KEYS[s], from, '+', 'COUNT', 64)
  at[s] = 1
  local first = buffers[s][1]
  seqs[s] = first and seq_of(first) or false
end
for s = 1, #KEYS do fill(s, ARGV[1]) end
local out = {}
while #out < count do
  local best = nil
  for s = 1, #KEYS do
    if seqs[s] and (best == nil or seqs[s] < seqs[best]) then best = s end
  end
  if best == nil then break end
  local buffer = buffers[best]
  local entry = buffer[at[best]]
  out[#out + 1] = entry
  at[best] = at[best] + 1
  local following = buffer[at[best]]
  if following then
    seqs[best] = seq_of(following)
  elseif #buffer == 64 then
    fill(best, '(' .. entry[1])
  else
    seqs[best] = false
  end
end
return out
";

/// `KEYS`: heads, anchors. Both hashes.
const PARTITIONS: &str = r"
return { redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]) }
";

/// `KEYS`: partitions' streams. Their lengths, in order.
const LENGTHS: &str = r"
local out = {}
for s = 1, #KEYS do
  out[s] = redis.call('XLEN', KEYS[s])
end
return out
";

/// `KEYS`: a partition's stream, anchors. `ARGV`: before (ms), limit, instance.
/// Removes the stream's oldest entries written before `before`, at most `limit`,
/// and moves the anchor to the last one's hash; a stream left empty goes too
/// (the next append makes it again: `seq` comes from the shared counter, not
/// from the stream's last ID).
const TRIM: &str = r"
local before = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local removed = 0
local last = nil
while removed < limit do
  local batch = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', math.min(limit - removed, 500))
  if #batch == 0 then break end
  local stop = false
  for _, entry in ipairs(batch) do
    local fields = entry[2]
    local at, hash = nil, nil
    for j = 1, #fields, 2 do
      if fields[j] == 'at' then at = tonumber(fields[j + 1])
      elseif fields[j] == 'hash' then hash = fields[j + 1] end
    end
    if at == nil or at >= before then stop = true; break end
    redis.call('XDEL', KEYS[1], entry[1])
    last = hash
    removed = removed + 1
  end
  if stop then break end
end
if last then redis.call('HSET', KEYS[2], ARGV[3], last) end
if redis.call('XLEN', KEYS[1]) == 0 then redis.call('DEL', KEYS[1]) end
return removed
";

/// `KEYS`: secret. `ARGV`: a proposed secret. The secret, made once.
const SECRET: &str = r"
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
";

/// The journal's scripts and key names.
pub(crate) struct Journal {
    heads_script: Script,
    append_script: Script,
    read_script: Script,
    partitions_script: Script,
    lengths_script: Script,
    trim_script: Script,
    secret_script: Script,
    base: String,
    /// This process's appends, one at a time (they would only lose the
    /// compare-and-set to each other), and what the last one learned.
    appending: tokio::sync::Mutex<Appending>,
    /// The chains claims write their entries on, one server only
    /// ([`Journal::seal_claim`]).
    claims: std::sync::Mutex<ClaimChains>,
}

/// What one process's appends carry from one to the next: the partitions'
/// heads as it last wrote or read them, and the server's clock, enough to
/// seal and append the next batch without reading either again.
#[derive(Default)]
struct Appending {
    /// Each partition's head, as the heads hash holds it (`""` for none yet);
    /// emptied by a refused append.
    heads: HashMap<String, String>,
    /// The server's clock, read with the heads.
    clock: StoreClock,
}

impl Appending {
    /// The expected heads of `instances` and the `at` to seal with, if every
    /// head is known and the clock was read recently enough.
    fn known(&self, instances: &[&str]) -> Option<(Vec<String>, i64)> {
        let at_ms = self.clock.estimate()?;
        let heads = instances
            .iter()
            .map(|instance| self.heads.get(*instance).cloned())
            .collect::<Option<Vec<_>>>()?;
        Some((heads, at_ms))
    }
}

/// What this process knows of the chains its claims write their entries on,
/// one Redis server only (`{instance}/claimN`, [`claim_partition`]): each
/// one's head, and the server's clock as the claims' replies carry it.
#[derive(Default)]
struct ClaimChains {
    /// How many claims were sealed: the next one's chain.
    turns: u64,
    /// The chains this process sealed an entry on or learned the head of. A
    /// chain not here is taken to be empty: a wrong guess (a restarted
    /// instance's chains) costs one claim its entry in the claim script, and
    /// the script's reply tells the head.
    chains: HashMap<String, ClaimChain>,
    /// The server's clock, read by every claim's script.
    clock: StoreClock,
}

/// One claim chain, as this process knows it.
enum ClaimChain {
    /// Its head, as this process last wrote or learned it.
    At(ChainHash),
    /// A claim in flight carries an entry sealed after its head.
    Carried,
}

/// What a claim script did with the entry it carried.
#[derive(Debug)]
pub(crate) enum ClaimEntryReply {
    /// Appended with a new record.
    Written,
    /// Not appended: the chain's head was not the one the entry was sealed
    /// after (another process writes as the same instance). The head as the
    /// heads hash holds it (`""` for none).
    HeadMoved(String),
    /// Not appended: the claim found a record, so it made none (a takeover's
    /// entry names the record's operation, which only the reply tells).
    NoNewRecord,
}

/// A claim's entry, sealed for the claim script ([`Journal::seal_claim`]):
/// its chain is carried until [`SealedClaim::settle`] says what the script
/// did. Dropped unsettled (the claim's call failed or was cancelled), the
/// chain is left at the head the entry would have made; if the script did not
/// write it, the next claim on the chain learns the head from its reply.
pub(crate) struct SealedClaim<'a> {
    journal: &'a Journal,
    /// The entry; its instance is its chain.
    record: AuditRecord,
    /// The instance it is a claim of, whose own chain the writer appends to.
    instance: String,
    at: Timestamp,
    prev: ChainHash,
    hash: ChainHash,
    settled: bool,
}

impl SealedClaim<'_> {
    /// The claim script's journal arguments: the heads hash, the `seq`
    /// counter and the chain's stream as `KEYS[2..4]`; the chain, its
    /// expected and its new head, and the entry's fields after the claim's own
    /// `ARGV`.
    pub(crate) fn add_to(&self, invocation: &mut redis::ScriptInvocation<'_>) {
        let chain = self.record.instance.as_str();
        invocation
            .key(self.journal.key("heads"))
            .key(self.journal.key("seq"))
            .key(self.journal.stream(chain));
        invocation
            .arg(chain)
            .arg(head_text(&self.prev))
            .arg(self.hash.to_hex());
        for (name, value) in fields(&self.record, self.at, self.prev, self.hash) {
            invocation.arg(name).arg(value.as_ref());
        }
    }

    /// The entry that follows it when its claim, written, is released at once
    /// (not replicated in time): `released`, on the instance's own chain.
    pub(crate) fn released(&self) -> AuditRecord {
        AuditRecord {
            event: Some(AuditEvent::Released),
            instance: self.instance.clone(),
            ..self.record.clone()
        }
    }

    /// Records what the script did with the entry; whether it wrote it.
    pub(crate) fn settle(mut self, reply: &ClaimEntryReply) -> bool {
        self.settled = true;
        let head = match reply {
            ClaimEntryReply::Written => self.hash,
            ClaimEntryReply::NoNewRecord => self.prev,
            // A head that is not a hash (an edited journal) is left unknown:
            // every claim on this chain then leaves its entry to the writer.
            ClaimEntryReply::HeadMoved(head) => parse_head(head).unwrap_or(ChainHash::GENESIS),
        };
        self.journal.put_claim_chain(&self.record.instance, head);
        matches!(reply, ClaimEntryReply::Written)
    }
}

impl Drop for SealedClaim<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.journal
                .put_claim_chain(&self.record.instance, self.hash);
        }
    }
}

/// A head as the heads hash holds it: hex, or `""` before the first entry.
fn head_text(head: &ChainHash) -> String {
    if *head == ChainHash::GENESIS {
        String::new()
    } else {
        head.to_hex()
    }
}

/// The head the heads hash holds as `text`; `None` for what is not a hash.
fn parse_head(text: &str) -> Option<ChainHash> {
    if text.is_empty() {
        Some(ChainHash::GENESIS)
    } else {
        ChainHash::from_hex(text)
    }
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// What the store lends the journal: one script call, bounded and classified
/// as every store call.
pub(crate) trait Runner {
    /// Runs one invocation.
    fn run<'a>(
        &'a self,
        invocation: &'a redis::ScriptInvocation<'a>,
    ) -> impl Future<Output = Result<Value, StoreError>> + Send + 'a;
}

impl Journal {
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            heads_script: Script::new(HEADS),
            append_script: Script::new(APPEND),
            read_script: Script::new(READ),
            partitions_script: Script::new(PARTITIONS),
            lengths_script: Script::new(LENGTHS),
            trim_script: Script::new(TRIM),
            secret_script: Script::new(SECRET),
            base: format!("{prefix}{{{prefix}audit}}"),
            appending: tokio::sync::Mutex::default(),
            claims: std::sync::Mutex::default(),
        }
    }

    fn key(&self, what: &str) -> String {
        format!("{}:{what}", self.base)
    }

    fn stream(&self, instance: &str) -> String {
        format!("{}:stream:{instance}", self.base)
    }

    /// Seals a claim's entry — `record`, the claim of a new record under the
    /// operation id the claim will create it with — on its instance's next
    /// claim chain, for the claim script to write with the record (one Redis
    /// server: the record's key and the journal's need not share a slot).
    ///
    /// `None` when that chain is carried by a claim still in flight, or when
    /// no claim's reply read the server's clock within the last second (an
    /// idle process's first claim): the journal's writer appends the entry
    /// then, as it does on Cluster.
    pub(crate) fn seal_claim(&self, mut record: AuditRecord) -> Option<SealedClaim<'_>> {
        let mut claims = self.claims();
        let at_ms = claims.clock.estimate()?;
        let chain = claim_partition(&record.instance, claims.turns);
        claims.turns += 1;
        let prev = match claims.chains.insert(chain.clone(), ClaimChain::Carried) {
            None => ChainHash::GENESIS,
            Some(ClaimChain::At(head)) => head,
            Some(ClaimChain::Carried) => return None,
        };
        // `at` never goes back on a claim chain, whichever claim lands first.
        claims.clock.wrote(at_ms);
        drop(claims);
        let instance = std::mem::replace(&mut record.instance, chain);
        let at = Timestamp::from_millis(at_ms);
        let hash = chain_hash(&prev, at, &record);
        Some(SealedClaim {
            journal: self,
            record,
            instance,
            at,
            prev,
            hash,
            settled: false,
        })
    }

    /// The server's clock as a claim's script read it, `now`.
    pub(crate) fn claim_read_clock(&self, now: Timestamp) {
        self.claims().clock.read(now.as_millis(), Instant::now());
    }

    fn put_claim_chain(&self, chain: &str, head: ChainHash) {
        self.claims()
            .chains
            .insert(chain.to_owned(), ClaimChain::At(head));
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, ClaimChains> {
        // Each update is one insert or one field: nothing half-done to poison.
        self.claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) async fn append(
        &self,
        runner: &impl Runner,
        records: &[AuditRecord],
    ) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut instances: Vec<&str> = Vec::new();
        for record in records {
            if !instances.contains(&record.instance.as_str()) {
                instances.push(&record.instance);
            }
        }
        let mut appending = self.appending.lock().await;
        for _ in 0..APPEND_ATTEMPTS {
            let (read, at_ms) = match appending.known(&instances) {
                Some(known) => known,
                None => {
                    let (read, now) = self.read_heads(runner, &instances).await?;
                    appending.clock.read(now, Instant::now());
                    // The heads known of other partitions stay: a stale one
                    // is refused by the compare-and-set, which forgets all.
                    for (instance, head) in instances.iter().zip(&read) {
                        appending.heads.insert((*instance).to_owned(), head.clone());
                    }
                    (read, appending.clock.stamp(now))
                }
            };
            let mut heads: HashMap<&str, ChainHash> = HashMap::new();
            for (instance, head) in instances.iter().zip(&read) {
                let head = parse_head(head).ok_or_else(|| {
                    StoreError::corrupt(RedisStoreError::UnexpectedReply(
                        "a journal head is not a hash",
                    ))
                })?;
                heads.insert(instance, head);
            }
            // Sealed after them, at the server's clock.
            let at = Timestamp::from_millis(at_ms);
            let mut entries: Vec<(usize, Fields<'_>)> = Vec::with_capacity(records.len());
            for record in records {
                let index = instances
                    .iter()
                    .position(|i| *i == record.instance)
                    .unwrap_or(0);
                let prev = heads[record.instance.as_str()];
                let hash = chain_hash(&prev, at, record);
                heads.insert(&record.instance, hash);
                entries.push((index + 1, fields(record, at, prev, hash)));
            }
            let mut invocation = self.append_script.key(self.key("heads"));
            invocation.key(self.key("seq"));
            for instance in &instances {
                invocation.key(self.stream(instance));
            }
            invocation.arg(instances.len());
            for (instance, expected) in instances.iter().zip(&read) {
                invocation
                    .arg(*instance)
                    .arg(expected.as_str())
                    .arg(heads[instance].to_hex());
            }
            invocation.arg(entries.len());
            for (index, fields) in &entries {
                invocation.arg(*index).arg(fields.len());
                for (name, value) in fields {
                    invocation.arg(*name).arg(value.as_ref());
                }
            }
            let written = int_of(runner.run(&invocation).await?).map_err(StoreError::corrupt)?;
            if written == 1 {
                appending.clock.wrote(at_ms);
                for instance in &instances {
                    appending
                        .heads
                        .insert((*instance).to_owned(), heads[instance].to_hex());
                }
                return Ok(());
            }
            // A head moved under us: what we knew is stale.
            appending.heads.clear();
        }
        Err(StoreError::unavailable(RedisStoreError::UnexpectedReply(
            "the journal's head kept moving: another process writes as the same instance",
        )))
    }

    /// The server's clock (milliseconds) and the heads of `instances`, as the
    /// heads hash holds them (`""` for a partition without one).
    async fn read_heads(
        &self,
        runner: &impl Runner,
        instances: &[&str],
    ) -> Result<(Vec<String>, i64), StoreError> {
        let mut invocation = self.heads_script.key(self.key("heads"));
        for instance in instances {
            invocation.arg(*instance);
        }
        let reply = array_of(runner.run(&invocation).await?).map_err(StoreError::corrupt)?;
        let mut reply = reply.into_iter();
        let now = int_of(
            reply
                .next()
                .ok_or_else(|| short("a short journal heads reply"))?,
        )
        .map_err(StoreError::corrupt)?;
        let mut read: Vec<String> = Vec::with_capacity(instances.len());
        for value in reply {
            read.push(text(value)?);
        }
        if read.len() != instances.len() {
            return Err(short("a short journal heads reply"));
        }
        Ok((read, now))
    }

    pub(crate) async fn partitions(
        &self,
        runner: &impl Runner,
    ) -> Result<Vec<AuditPartition>, StoreError> {
        let mut invocation = self.partitions_script.key(self.key("heads"));
        invocation.key(self.key("anchors"));
        let reply = array_of(runner.run(&invocation).await?).map_err(StoreError::corrupt)?;
        let mut reply = reply.into_iter();
        let heads = pairs(reply.next().unwrap_or(Value::Nil))?;
        let anchors: HashMap<String, String> = pairs(reply.next().unwrap_or(Value::Nil))?
            .into_iter()
            .collect();
        let mut partitions = heads
            .into_iter()
            .map(|(instance, head)| {
                let anchor = anchors
                    .get(&instance)
                    .map_or(Ok(ChainHash::GENESIS), |a| hash(a))?;
                Ok(AuditPartition {
                    head: hash(&head)?,
                    anchor,
                    instance,
                    entries: 0,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        partitions.sort_by(|a, b| a.instance.cmp(&b.instance));
        if partitions.is_empty() {
            return Ok(partitions);
        }
        // A second call, each stream named: every key a script touches is one
        // it was given (Redis Cluster's rule; they share one slot anyway).
        let mut invocation = self.lengths_script.prepare_invoke();
        for partition in &partitions {
            invocation.key(self.stream(&partition.instance));
        }
        let lengths = array_of(runner.run(&invocation).await?).map_err(StoreError::corrupt)?;
        for (partition, length) in partitions.iter_mut().zip(lengths) {
            partition.entries = match length {
                Value::Int(n) => u64::try_from(n).unwrap_or(0),
                _ => {
                    return Err(StoreError::corrupt(RedisStoreError::UnexpectedReply(
                        "XLEN",
                    )));
                }
            };
        }
        Ok(partitions)
    }

    /// Every partition's entries after `query.after`, merged by `seq`; time is
    /// filtered here (the streams are ordered by `seq`, not by time).
    pub(crate) async fn read(
        &self,
        runner: &impl Runner,
        query: &AuditQuery,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let partitions = self.partitions(runner).await?;
        if partitions.is_empty() || query.limit == 0 {
            return Ok(Vec::new());
        }
        let mut out: Vec<AuditEntry> = Vec::new();
        let mut after = query.after.unwrap_or(0);
        // Pages until `limit` entries pass the time filter or the streams end.
        loop {
            let page = query.limit.clamp(100, 1_000);
            let mut invocation = self.read_script.prepare_invoke();
            for partition in &partitions {
                invocation.key(self.stream(&partition.instance));
            }
            invocation
                .arg(format!("0-{}", after.saturating_add(1)))
                .arg(page);
            let items = array_of(runner.run(&invocation).await?).map_err(StoreError::corrupt)?;
            let complete = items.len() < page;
            for item in items {
                let entry = decode(item)?;
                after = entry.seq;
                if query.admits(&entry) {
                    out.push(entry);
                    if out.len() == query.limit {
                        return Ok(out);
                    }
                }
            }
            if complete {
                return Ok(out);
            }
        }
    }

    pub(crate) async fn trim(
        &self,
        runner: &impl Runner,
        instance: Option<&str>,
        before: Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        let instances: Vec<String> = match instance {
            Some(instance) => vec![instance.to_owned()],
            None => self
                .partitions(runner)
                .await?
                .into_iter()
                .map(|p| p.instance)
                .collect(),
        };
        let mut removed = 0u64;
        for instance in instances {
            let left = limit.saturating_sub(usize::try_from(removed).unwrap_or(usize::MAX));
            if left == 0 {
                break;
            }
            let mut invocation = self.trim_script.key(self.stream(&instance));
            invocation
                .key(self.key("anchors"))
                .arg(before.as_millis())
                .arg(left)
                .arg(instance.as_str());
            let n = int_of(runner.run(&invocation).await?).map_err(StoreError::corrupt)?;
            removed += u64::try_from(n).unwrap_or(0);
        }
        Ok(removed)
    }

    pub(crate) async fn secret(&self, runner: &impl Runner) -> Result<AuditSecret, StoreError> {
        let mut invocation = self.secret_script.key(self.key("secret"));
        invocation.arg(AuditSecret::random().as_bytes().as_slice());
        let bytes = bytes_of(runner.run(&invocation).await?).map_err(StoreError::corrupt)?;
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| {
            StoreError::corrupt(RedisStoreError::UnexpectedReply(
                "the journal secret is not 32 bytes",
            ))
        })?;
        Ok(AuditSecret::from_bytes(bytes))
    }
}

/// An entry's stream fields: name and value pairs, in `XADD` order.
type Fields<'a> = Vec<(&'static str, Cow<'a, str>)>;

/// An entry's stream fields, `record` sealed at `at` after `prev` into
/// `hash`; absent optional fields are left out. The record's text is
/// borrowed, not copied: an append sends it once, into the script's
/// arguments.
fn fields<'a>(
    record: &'a AuditRecord,
    at: Timestamp,
    prev: ChainHash,
    hash: ChainHash,
) -> Fields<'a> {
    let text = |value: &'a str| Cow::Borrowed(value);
    let mut fields = vec![
        ("at", Cow::Owned(at.as_millis().to_string())),
        ("event", text(record.event().as_str())),
        ("method", text(&record.method)),
        ("route", text(&record.route)),
        ("principal", text(&record.principal)),
        ("key_digest", text(&record.key_digest)),
        ("instance", text(&record.instance)),
        ("prev", Cow::Owned(prev.to_hex())),
        ("hash", Cow::Owned(hash.to_hex())),
    ];
    if let Some(op) = &record.operation_id {
        fields.push(("operation_id", text(op)));
    }
    if let Some(fp) = &record.fingerprint {
        fields.push(("fingerprint", text(fp)));
    }
    if let Some(status) = record.status {
        fields.push(("status", Cow::Owned(status.to_string())));
    }
    if let Some(duration) = record.duration_ms {
        fields.push(("duration_ms", Cow::Owned(duration.to_string())));
    }
    fields
}

/// One `XRANGE` item: `[id, [field, value, …]]`.
fn decode(item: Value) -> Result<AuditEntry, StoreError> {
    let corrupt = |what: &'static str| StoreError::corrupt(RedisStoreError::UnexpectedReply(what));
    let mut parts = array_of(item).map_err(StoreError::corrupt)?.into_iter();
    let id = text(
        parts
            .next()
            .ok_or_else(|| corrupt("a journal entry without an id"))?,
    )?;
    let seq = id
        .strip_prefix("0-")
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| corrupt("a journal entry id is not 0-<seq>"))?;
    let fields: HashMap<String, String> = pairs(parts.next().unwrap_or(Value::Nil))?
        .into_iter()
        .collect();
    let get = |name: &str| fields.get(name).cloned();
    let need =
        |name: &'static str| get(name).ok_or_else(|| corrupt("a journal entry lacks a field"));
    let number = |name: &'static str| -> Result<Option<u64>, StoreError> {
        get(name)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| corrupt("a journal number does not parse"))
            })
            .transpose()
    };
    let at: i64 = need("at")?
        .parse()
        .map_err(|_| corrupt("a journal time does not parse"))?;
    let event: AuditEvent = need("event")?.parse().map_err(StoreError::corrupt)?;
    Ok(AuditEntry {
        seq,
        at: Timestamp::from_millis(at),
        record: AuditRecord {
            event: Some(event),
            operation_id: get("operation_id"),
            method: need("method")?,
            route: need("route")?,
            principal: need("principal")?,
            key_digest: need("key_digest")?,
            fingerprint: get("fingerprint"),
            status: number("status")?
                .map(|s| u16::try_from(s).map_err(|_| corrupt("a journal status out of range")))
                .transpose()?,
            duration_ms: number("duration_ms")?,
            instance: need("instance")?,
        },
        prev: hash(&need("prev")?)?,
        hash: hash(&need("hash")?)?,
    })
}

fn hash(hex_text: &str) -> Result<ChainHash, StoreError> {
    ChainHash::from_hex(hex_text).ok_or_else(|| {
        StoreError::corrupt(RedisStoreError::UnexpectedReply(
            "a journal hash is not 64 hex digits",
        ))
    })
}

fn text(value: Value) -> Result<String, StoreError> {
    String::from_utf8(bytes_of(value).map_err(StoreError::corrupt)?).map_err(StoreError::corrupt)
}

/// A flat `[k, v, k, v …]` (or a RESP3 map) as pairs.
fn pairs(value: Value) -> Result<Vec<(String, String)>, StoreError> {
    let items = array_of(value).map_err(StoreError::corrupt)?;
    let mut out = Vec::with_capacity(items.len() / 2);
    let mut items = items.into_iter();
    while let (Some(k), Some(v)) = (items.next(), items.next()) {
        out.push((text(k)?, text(v)?));
    }
    Ok(out)
}

fn short(what: &'static str) -> StoreError {
    StoreError::corrupt(RedisStoreError::UnexpectedReply(what))
}
