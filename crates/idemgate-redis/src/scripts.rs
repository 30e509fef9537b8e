//! The Lua scripts: each store operation is one `EVALSHA` of one of these, so it is
//! one round trip and atomic (Redis runs a script to the end before anything else).
//!
//! A record's scripts touch its hash, `KEYS[1]`, and at most the list of a run's
//! stream pieces beside it (`KEYS[2]`, or built from the record's fields by
//! `pieces_key` where the run is known only inside the script), whose key carries
//! the record's hash tag: one slot, so they run unchanged on Redis Cluster. (The
//! one exception, the journal's keys a claim may be given to append its entry
//! with, is given only on one server.) Times
//! come from the server's `TIME`, in milliseconds. Numbers are written with
//! `%.0f`, which prints every integer below 2^53 exactly (Lua numbers are
//! doubles; `tostring` could switch to exponent notation).
//!
//! Only Redis 7.0 commands: `HGET HGETALL HMGET HSET HDEL HINCRBY PEXPIREAT DEL
//! PUBLISH TIME`, for stream pieces `LLEN LSET RPUSH LRANGE PEXPIRETIME`, and for
//! resource leases `SET NX PXAT`, `GET`, for a claim's journal entry `INCR XADD`.
//!
//! # Announcements only when someone waits
//!
//! A write that ends a run (complete, release, delete, evict) `PUBLISH`es the
//! record's digest only when the record carries the waiter mark `w`, which
//! `MARK_WAITING` sets for a waiter (on any instance) while the record is in
//! progress; the announcing write clears it. A key nobody waits for — every new
//! key of ordinary traffic — costs no `PUBLISH`, and no subscribed instance reads
//! a message for it. The mark is a hint beside the record, never read by the
//! protocol: claims, fencing and decoding ignore it.
//!
//! An appended stream piece (`APPEND_PIECE`) is announced the same way, when the
//! record is marked, but leaves the mark in place: the run goes on, and a reader
//! of its stream waits again for the next piece. The message is the same digest
//! (a hint to look again, whatever changed), so subscribers need not tell them
//! apart.

use redis::Script;

/// Shared helpers, prepended to every script.
const PRELUDE: &str = r"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function num(n)
  return string.format('%.0f', n)
end
-- The record's waiter mark when (op, tk) holds its `P` lease ('' when unmarked),
-- or false when it does not hold it.
local function held(key, op, tk)
  local h = redis.call('HMGET', key, 'op', 'tk', 'st', 'w')
  if h[1] == op and h[2] == tk and h[3] == 'P' then return h[4] or '' end
  return false
end
-- Announces a change on `channel` when a waiter marked the record.
local function announce(mark, channel, digest)
  if mark and mark ~= '' then redis.call('PUBLISH', channel, digest) end
end
-- The list of the stream pieces of the run (op, tk) of the record at `key`:
-- `<record key>:pieces:<op, 32 lowercase hex>:<tk>`, as
-- `RedisStore::stream_pieces_key` builds it; the record's hash tag, so its slot.
local function pieces_key(key, op, tk)
  local hex = string.gsub(op, '.', function(c) return string.format('%02x', string.byte(c)) end)
  return key .. ':pieces:' .. hex .. ':' .. tk
end
";

/// `KEYS[1]` record; `ARGV`: fingerprint, new operation id (used only when creating),
/// lease ms, ttl ms, format version, field digests (`FieldDigests::encode`, empty
/// when the body has none; written only when creating, as `fd`: a take-over has
/// the same fingerprint, so the same digests).
///
/// Its take-over test restates `Record::claim_origin` (PROTOCOL §6.2) in Lua.
/// Returns `{origin, now, op, token, locked_until}` with origin `N` (created), `R`
/// (released record claimed again) or `T` (lapsed lease taken over), or
/// `{'E', now, {HGETALL…}}` for an existing record left as it was.
///
/// With the journal's `KEYS[2..4]` (heads, seq, the claim chain's stream; one
/// Redis server only) and `ARGV[7..]` (the chain, the head the entry was
/// sealed after, the entry's hash, its fields: `SealedClaim::add_to`), a new
/// record's claim also appends its journal entry if the chain's head is still
/// the expected one, and `N`'s reply gains a sixth item: 1 when it did, or
/// the head as it is. The entry is the journal's `APPEND` of one entry, inlined.
const CLAIM: &str = r"
local key = KEYS[1]
local fp, op, lease, ttl, version = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local fd = ARGV[6]
local now = now_ms()
local fields = redis.call('HGETALL', key)
if #fields == 0 then
  local until_ms, expires = now + lease, now + ttl
  redis.call('HSET', key, 'v', version, 'fp', fp, 'op', op, 'tk', 1, 'st', 'P',
    'lu', num(until_ms), 'ca', num(now), 'ea', num(expires))
  if fd ~= '' then redis.call('HSET', key, 'fd', fd) end
  redis.call('PEXPIREAT', key, num(expires))
  local journaled = nil
  if #KEYS == 4 then
    local head = redis.call('HGET', KEYS[2], ARGV[7]) or ''
    if head == ARGV[8] then
      local seq = redis.call('INCR', KEYS[3])
      redis.call('XADD', KEYS[4], '0-' .. num(seq), unpack(ARGV, 10))
      redis.call('HSET', KEYS[2], ARGV[7], ARGV[9])
      journaled = 1
    else
      journaled = head
    end
  end
  return {'N', num(now), op, 1, num(until_ms), journaled}
end
local h = {}
for i = 1, #fields, 2 do h[fields[i]] = fields[i + 1] end
if h.fp == fp and h.op then
  local origin = false
  local lu = tonumber(h.lu)
  if h.st == 'R' then
    origin = 'R'
  elseif h.st == 'P' and lu ~= nil and lu <= now then
    origin = 'T'
  end
  if origin then
    local tk = redis.call('HINCRBY', key, 'tk', 1)
    local until_ms = now + lease
    -- Outlive the new run: a record taken up near its end must not expire mid-run.
    local expires = math.max(tonumber(h.ea) or 0, now + ttl)
    redis.call('HSET', key, 'st', 'P', 'lu', num(until_ms), 'ea', num(expires))
    redis.call('PEXPIREAT', key, num(expires))
    return {origin, num(now), h.op, tk, num(until_ms)}
  end
end
return {'E', num(now), fields}
";

/// `KEYS[1]` record, `KEYS[2]` the run's stream pieces; `ARGV`: operation id,
/// token, `C` or `F`, encoded response, ttl ms, channel, identity digest. Returns
/// 1 when applied, 0 when refused. The run's pieces, if it streamed, now expire
/// with the completed record (a no-op on a list that does not exist).
const COMPLETE: &str = r"
local key = KEYS[1]
local mark = held(key, ARGV[1], ARGV[2])
if not mark then return 0 end
local expires = now_ms() + tonumber(ARGV[5])
redis.call('HSET', key, 'st', ARGV[3], 'rs', ARGV[4], 'ea', num(expires))
redis.call('HDEL', key, 'lu', 'w')
redis.call('PEXPIREAT', key, num(expires))
redis.call('PEXPIREAT', KEYS[2], num(expires))
announce(mark, ARGV[6], ARGV[7])
return 1
";

/// `KEYS[1]` record; `ARGV`: operation id, token, channel, identity digest.
const RELEASE: &str = r"
local key = KEYS[1]
local mark = held(key, ARGV[1], ARGV[2])
if not mark then return 0 end
redis.call('HSET', key, 'st', 'R')
redis.call('HDEL', key, 'lu', 'w')
announce(mark, ARGV[3], ARGV[4])
return 1
";

/// `KEYS[1]` record; `ARGV`: operation id, token, lease ms.
const RENEW: &str = r"
local key = KEYS[1]
if not held(key, ARGV[1], ARGV[2]) then return 0 end
redis.call('HSET', key, 'lu', num(now_ms() + tonumber(ARGV[3])))
return 1
";

/// `KEYS[1]` record, `KEYS[2]` the run's stream pieces; `ARGV`: operation id,
/// token, channel, identity digest. The pieces go with the record.
const DELETE: &str = r"
local key = KEYS[1]
local mark = held(key, ARGV[1], ARGV[2])
if not mark then return 0 end
redis.call('DEL', key, KEYS[2])
announce(mark, ARGV[3], ARGV[4])
return 1
";

/// `KEYS[1]` record; `ARGV`: `1` to force, channel, identity digest. The operator's
/// unfenced delete: refuses a live lease unless forced. Returns `{'A', now}` (no
/// record), `{'L', now, locked_until}` (a live lease, left alone) or
/// `{'E', now, status}` (deleted). The stream pieces of the run the record names
/// go with it: their key is known only once the record is read, so it is built
/// here (`pieces_key`, the record's hash tag: the same slot).
const EVICT: &str = r"
local key = KEYS[1]
local now = now_ms()
local h = redis.call('HMGET', key, 'st', 'lu', 'w', 'op', 'tk')
if not h[1] then return {'A', num(now)} end
local lu = tonumber(h[2])
if ARGV[1] ~= '1' and h[1] == 'P' and lu ~= nil and lu > now then
  return {'L', num(now), num(lu)}
end
redis.call('DEL', key)
if h[4] and h[5] then redis.call('DEL', pieces_key(key, h[4], h[5])) end
announce(h[3], ARGV[2], ARGV[3])
return {'E', num(now), h[1]}
";

/// `KEYS[1]` record, `KEYS[2]` the list of the run's stream pieces; `ARGV`:
/// operation id, token, piece index, piece, channel, identity digest. Fenced as
/// `COMPLETE` is (the record held by this run, in progress): returns 0, nothing
/// kept, when it is not. Otherwise an index below the list's length replaces that
/// piece (a write retried), the next index is pushed — returns 1 — and a later
/// one — a gap: an in-order writer leaves none, so the list lost its earlier
/// pieces (evicted under `maxmemory`) — is not kept and returns 2, which the
/// store reports as corrupt so the recording stops rather than count pieces
/// that are gone. The list expires when the record does (`PEXPIRETIME`, exact),
/// and the append is announced when a waiter marked the record, the mark kept for
/// the pieces to come.
const APPEND_PIECE: &str = r"
local key, pieces = KEYS[1], KEYS[2]
local mark = held(key, ARGV[1], ARGV[2])
if not mark then return 0 end
local index = tonumber(ARGV[3])
local len = redis.call('LLEN', pieces)
if index < len then
  redis.call('LSET', pieces, ARGV[3], ARGV[4])
elseif index == len then
  redis.call('RPUSH', pieces, ARGV[4])
else
  return 2
end
local expires = redis.call('PEXPIRETIME', key)
if expires > 0 then redis.call('PEXPIREAT', pieces, expires) end
announce(mark, ARGV[5], ARGV[6])
return 1
";

/// `KEYS[1]` record, `KEYS[2]` the list of the run's stream pieces; `ARGV`:
/// operation id, token, first index, last index (inclusive). The pieces in that
/// range while the record names the run (same operation id and token, whatever its
/// status); none when it does not (gone, expired, or another run's record).
const READ_PIECES: &str = r"
local h = redis.call('HMGET', KEYS[1], 'op', 'tk')
if h[1] ~= ARGV[1] or h[2] ~= ARGV[2] then return {} end
return redis.call('LRANGE', KEYS[2], ARGV[3], ARGV[4])
";

/// `KEYS[1]` record. A waiter's mark: when the record is in progress (`P`, whatever
/// its lease), sets `w` so that the write ending the run announces it, and returns
/// 1 (wait); otherwise returns 0 (absent, released or final: it changed already, so
/// re-read now). Marking and the test are one step, so a completion cannot slip
/// between the waiter's last read and its mark unannounced.
const MARK_WAITING: &str = r"
if redis.call('HGET', KEYS[1], 'st') ~= 'P' then return 0 end
redis.call('HSET', KEYS[1], 'w', '1')
return 1
";

/// `KEYS[1]` record. Returns `{now, {HGETALL…}}`: a read with the server's clock.
const GET: &str = r"
return {num(now_ms()), redis.call('HGETALL', KEYS[1])}
";

/// `KEYS[1]` resource lease; `ARGV`: proposed token (16 bytes), ttl ms. The
/// lease is a string: the holder's token followed by its end in decimal ms,
/// which is also the key's expiry (`PXAT`), so a holder's end reads back exact.
/// `SET NX` is the atomic step. Returns `{1, now, until}` (acquired, the proposed
/// token stored) or `{0, now, until}` (held by another token, nothing changed).
const ACQUIRE_RESOURCE_LEASE: &str = r"
local now = now_ms()
local until_ms = now + tonumber(ARGV[2])
if redis.call('SET', KEYS[1], ARGV[1] .. num(until_ms), 'NX', 'PXAT', num(until_ms)) then
  return {1, num(now), num(until_ms)}
end
local held = redis.call('GET', KEYS[1])
return {0, num(now), string.sub(held, 17)}
";

/// `KEYS[1]` resource lease; `ARGV`: token. Compare-and-delete: deletes the
/// lease only while it holds this token. Returns 1 when released, 0 when the
/// lease lapsed (Redis expired the key) or another token holds it.
const RELEASE_RESOURCE_LEASE: &str = r"
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, 16) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
";

/// Adds a duration to a route's history (`Store::record_duration`): KEYS[1] the
/// sorted set of routes with history, scored by when each was last recorded
/// (server time, µs), KEYS[2] the route's list (newest first); ARGV the
/// route, the duration in microseconds, the most routes, the most durations
/// per route, the routes' list key prefix. A new route when the set is full
/// takes the place of the least recently recorded one, whose list goes (its
/// key carries the same hash tag, so on a cluster it is in this slot).
const RECORD_DURATION: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  while redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) do
    local stalest = redis.call('ZPOPMIN', KEYS[1])
    redis.call('DEL', ARGV[5] .. stalest[1])
  end
end
redis.call('ZADD', KEYS[1], string.format('%.0f', now), ARGV[1])
redis.call('LPUSH', KEYS[2], ARGV[2])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[4]) - 1)
return 1
";

/// A route's history, as integers (microseconds).
const ROUTE_DURATIONS: &str = r"
local out = {}
for i, v in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do out[i] = tonumber(v) end
return out
";

/// The scripts, hashed once per store.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) claim: Script,
    pub(crate) complete: Script,
    pub(crate) release: Script,
    pub(crate) renew: Script,
    pub(crate) delete: Script,
    pub(crate) evict: Script,
    pub(crate) mark_waiting: Script,
    pub(crate) get: Script,
    pub(crate) append_piece: Script,
    pub(crate) read_pieces: Script,
    pub(crate) acquire_resource_lease: Script,
    pub(crate) release_resource_lease: Script,
    pub(crate) record_duration: Script,
    pub(crate) route_durations: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let script = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
        Self {
            claim: script(CLAIM),
            complete: script(COMPLETE),
            release: script(RELEASE),
            renew: script(RENEW),
            delete: script(DELETE),
            evict: script(EVICT),
            mark_waiting: script(MARK_WAITING),
            get: script(GET),
            append_piece: script(APPEND_PIECE),
            read_pieces: script(READ_PIECES),
            acquire_resource_lease: script(ACQUIRE_RESOURCE_LEASE),
            release_resource_lease: script(RELEASE_RESOURCE_LEASE),
            record_duration: Script::new(RECORD_DURATION),
            route_durations: Script::new(ROUTE_DURATIONS),
        }
    }
}
