//! The idempotency record (PROTOCOL §5) and its stored response.

use std::fmt;
use std::str::FromStr;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderName, HeaderValue, StatusCode};

use crate::fingerprint::{Differing, FieldDigests, Fingerprint};
use crate::time::Timestamp;

/// The record layout this build writes. Readers accept this version and older ones,
/// so a rolling upgrade never answers false 422s for records an older build wrote.
pub const RECORD_FORMAT_VERSION: u16 = 1;

/// One operation's id: made at its first claim, kept through releases and takeovers,
/// new once the record expired. Business writes and downstream keys derive from it
/// (PROTOCOL §11).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OperationId(uuid::Uuid);

impl OperationId {
    /// A fresh id: a UUIDv7 (RFC 9562), its first 48 bits the time in
    /// milliseconds and the rest random. Time-ordered on purpose: every index
    /// on it (the journal's `operation_id`) then grows at its end instead of
    /// writing a random page per operation — measured on SQLite, part of a
    /// third more new keys per second with the journal on. What it tells
    /// beyond a random id, the millisecond of the first claim, the journal
    /// records anyway.
    pub fn generate() -> Self {
        Self(uuid::Uuid::now_v7())
    }

    /// An id from its 16 bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(uuid::Uuid::from_bytes(bytes))
    }

    /// The 16 bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }

    /// The id as a UUID.
    pub const fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }
}

impl From<uuid::Uuid> for OperationId {
    fn from(uuid: uuid::Uuid) -> Self {
        Self(uuid)
    }
}

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OperationId({})", self.0)
    }
}

impl FromStr for OperationId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        uuid::Uuid::parse_str(s).map(Self)
    }
}

/// Changes at every claim and takeover of a record. Writes carry the token they
/// claimed with, and the store refuses them once the token moved on, so a holder
/// whose lease was taken over cannot overwrite the new holder (PITFALLS 3).
///
/// A token is unique only together with its [`OperationId`]: some stores count per
/// record and start again at 1 when an expired key starts a new operation. Fence on
/// the pair, never on the token alone.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct FencingToken(pub u64);

/// Where an operation stands: the name of a [`RecordState`], as stores persist it.
///
/// Exhaustive on purpose: every store writes and reads back each status.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum RecordStatus {
    /// Claimed; a holder runs it until `locked_until`.
    Processing,
    /// A final result is stored.
    Completed,
    /// A 5xx stored under the `store` policy; replayed like `Completed`.
    Failed,
    /// A retryable failure: claimable again by the same fingerprint, with the same
    /// operation id.
    Released,
}

impl RecordStatus {
    /// The name stores persist.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "PROCESSING",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::Released => "RELEASED",
        }
    }

    /// Whether a stored response is replayed.
    pub const fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed)
    }
}

impl FromStr for RecordStatus {
    type Err = DecodeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "PROCESSING" => Ok(Self::Processing),
            "COMPLETED" => Ok(Self::Completed),
            "FAILED" => Ok(Self::Failed),
            "RELEASED" => Ok(Self::Released),
            _ => Err(DecodeError("unknown record status")),
        }
    }
}

/// A stored body, where it is kept, or the fact that it was too large to keep
/// (PROTOCOL §8).
///
/// Exhaustive on purpose: a replay must handle each.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum StoredBody {
    /// The body, byte for byte.
    Retained(Bytes),
    /// The response exceeded the stored-response limit; it was streamed to the first
    /// client and replays as status + headers only.
    NotRetained,
    /// A stream recorded as it flowed (PROTOCOL §20): the body is the `n` body
    /// pieces of the run's stream in the store ([`crate::stream`]), replayed
    /// piece by piece, never loaded whole.
    InPieces(u32),
}

/// The response a replay gives back.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StoredResponse {
    /// HTTP status.
    pub status: StatusCode,
    /// Headers in the order the handler produced them, repeats kept.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body.
    pub body: StoredBody,
    /// Trailer fields sent after the body, in order, repeats kept: a gRPC
    /// call's outcome (`grpc-status`, `grpc-message`, trailing metadata) lives
    /// here (PROTOCOL §22). Empty for nearly every HTTP answer.
    pub trailers: Vec<(HeaderName, HeaderValue)>,
}

/// A header or trailer section as it is encoded: its fields in order.
pub type FieldList = Vec<(HeaderName, HeaderValue)>;

/// `fields` with each value copied out of whatever buffer it is a view of
/// ([`StoredResponse::detached`]).
fn detached_fields(fields: FieldList) -> FieldList {
    fields
        .into_iter()
        .map(|(name, value)| {
            // The bytes of a valid value are a valid value: the fallback (the
            // value itself) is never taken.
            let mut copy =
                HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
            copy.set_sensitive(value.is_sensitive());
            (name, copy)
        })
        .collect()
}

pub use crate::decode::DecodeError;

impl StoredResponse {
    /// This response with its body and field values copied into allocations
    /// of their own.
    ///
    /// A response read off a connection is made of views into that
    /// connection's read buffer (hyper slices header values and a one-frame
    /// body out of it), and each view keeps the whole buffer alive. Kept in
    /// memory as it came (the memory store, a replay cache), a 3-byte answer
    /// through the proxy pinned 8.8 KiB, and zeroing the fresh pages that took
    /// was a fifth of a new key's CPU. A copy of what is stored costs far less.
    pub fn detached(self) -> Self {
        Self {
            status: self.status,
            headers: detached_fields(self.headers),
            body: match self.body {
                StoredBody::Retained(body) => StoredBody::Retained(Bytes::copy_from_slice(&body)),
                other => other,
            },
            trailers: detached_fields(self.trailers),
        }
    }

    /// Encodes the header list, then the trailer list when there are trailers
    /// (the column SQL stores keep): each list is `count:u16`, then per field
    /// `name_len:u16 name value_len:u32 value`. Values are bytes, so obs-text
    /// survives. A response without trailers encodes as the header list alone,
    /// byte for byte what builds before trailers wrote and read.
    pub fn encode_fields(&self) -> Vec<u8> {
        let mut out = BytesMut::new();
        put_fields(&mut out, &self.headers);
        if !self.trailers.is_empty() {
            put_fields(&mut out, &self.trailers);
        }
        out.to_vec()
    }

    /// Reverses [`StoredResponse::encode_fields`]: the headers and the trailers.
    pub fn decode_fields(mut bytes: &[u8]) -> Result<(FieldList, FieldList), DecodeError> {
        let headers = get_fields(&mut bytes)?;
        let trailers = match bytes.has_remaining() {
            true => get_fields(&mut bytes)?,
            false => Vec::new(),
        };
        if bytes.has_remaining() {
            return Err(DecodeError("trailing bytes after trailers"));
        }
        Ok((headers, trailers))
    }

    /// Encodes the whole response into one binary value (for key-value stores):
    /// `version:u8 status:u16 headers [trailers] body_tag:u8 [body | pieces:u32]`.
    /// Version 1 has no trailers and is what a response without them is
    /// written as, so builds before trailers still read it; version 2 carries
    /// the trailer list after the headers.
    pub fn encode(&self) -> Bytes {
        let body_len = match &self.body {
            StoredBody::Retained(body) => body.len(),
            StoredBody::NotRetained | StoredBody::InPieces(_) => 0,
        };
        let mut out = BytesMut::with_capacity(8 + body_len + 64 * self.headers.len());
        let version = if self.trailers.is_empty() { 1 } else { 2 };
        out.put_u8(version);
        out.put_u16(self.status.as_u16());
        put_fields(&mut out, &self.headers);
        if version == 2 {
            put_fields(&mut out, &self.trailers);
        }
        match &self.body {
            StoredBody::Retained(body) => {
                out.put_u8(1);
                out.put_slice(body);
            }
            StoredBody::NotRetained => out.put_u8(0),
            StoredBody::InPieces(count) => {
                out.put_u8(2);
                out.put_u32(*count);
            }
        }
        out.freeze()
    }

    /// Reverses [`StoredResponse::encode`]. The body shares `bytes`' buffer.
    pub fn decode(mut bytes: Bytes) -> Result<Self, DecodeError> {
        if bytes.remaining() < 3 {
            return Err(DecodeError("unknown response encoding"));
        }
        let with_trailers = match bytes.get_u8() {
            1 => false,
            2 => true,
            _ => return Err(DecodeError("unknown response encoding")),
        };
        let status =
            StatusCode::from_u16(bytes.get_u16()).map_err(|_| DecodeError("invalid status"))?;
        let mut cursor = &bytes[..];
        let headers = get_fields(&mut cursor)?;
        let trailers = match with_trailers {
            true => get_fields(&mut cursor)?,
            false => Vec::new(),
        };
        let consumed = bytes.len() - cursor.len();
        bytes.advance(consumed);
        if !bytes.has_remaining() {
            return Err(DecodeError("missing body tag"));
        }
        let body = match bytes.get_u8() {
            0 if !bytes.has_remaining() => StoredBody::NotRetained,
            1 => StoredBody::Retained(bytes),
            2 if bytes.remaining() == 4 => StoredBody::InPieces(bytes.get_u32()),
            _ => return Err(DecodeError("invalid body tag")),
        };
        Ok(Self {
            status,
            headers,
            body,
            trailers,
        })
    }
}

fn put_fields(out: &mut BytesMut, fields: &[(HeaderName, HeaderValue)]) {
    // HTTP/1 and h2 servers refuse far fewer fields than u16::MAX, and names
    // are capped by `http` well below u16::MAX, so the casts cannot truncate.
    out.put_u16(fields.len() as u16);
    for (name, value) in fields {
        out.put_u16(name.as_str().len() as u16);
        out.put_slice(name.as_str().as_bytes());
        out.put_u32(value.as_bytes().len() as u32);
        out.put_slice(value.as_bytes());
    }
}

fn get_fields(bytes: &mut &[u8]) -> Result<Vec<(HeaderName, HeaderValue)>, DecodeError> {
    let truncated = DecodeError("truncated headers");
    if bytes.remaining() < 2 {
        return Err(truncated);
    }
    let count = bytes.get_u16() as usize;
    let mut headers = Vec::with_capacity(count);
    for _ in 0..count {
        if bytes.remaining() < 2 {
            return Err(truncated);
        }
        let name_len = bytes.get_u16() as usize;
        if bytes.remaining() < name_len + 4 {
            return Err(truncated);
        }
        let name = HeaderName::from_bytes(&bytes[..name_len])
            .map_err(|_| DecodeError("invalid header name"))?;
        bytes.advance(name_len);
        let value_len = bytes.get_u32() as usize;
        if bytes.remaining() < value_len {
            return Err(truncated);
        }
        let value = HeaderValue::from_bytes(&bytes[..value_len])
            .map_err(|_| DecodeError("invalid header value"))?;
        bytes.advance(value_len);
        headers.push((name, value));
    }
    Ok(headers)
}

/// How a claim came about.
///
/// Exhaustive on purpose: every store maps each origin to and from its stored
/// form, and must handle every one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseOrigin {
    /// A new operation.
    New,
    /// A `Released` record claimed again.
    Released,
    /// A `Processing` record whose holder's lease lapsed.
    TakenOver,
}

impl LeaseOrigin {
    /// The name stores persist (`NEW`, `RELEASED`, `TAKEN_OVER`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::New => "NEW",
            Self::Released => "RELEASED",
            Self::TakenOver => "TAKEN_OVER",
        }
    }
}

impl FromStr for LeaseOrigin {
    type Err = DecodeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "NEW" => Ok(Self::New),
            "RELEASED" => Ok(Self::Released),
            "TAKEN_OVER" => Ok(Self::TakenOver),
            _ => Err(DecodeError("unknown lease origin")),
        }
    }
}

/// Where an operation stands, with exactly what that state carries: a lease end
/// while it runs, a response once it is final. A final record without a response,
/// or a running one without a lease, cannot be built, so neither [`crate::decide()`]
/// nor a store decoder has to guess what one would mean.
///
/// Exhaustive on purpose: a store must handle every state.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum RecordState {
    /// Claimed; a holder runs it until `locked_until` (store clock).
    Processing {
        /// End of the current lease.
        locked_until: Timestamp,
    },
    /// A retryable failure: claimable again by the same fingerprint, with the same
    /// operation id.
    Released,
    /// A final result is stored and replayed.
    Completed(StoredResponse),
    /// A 5xx stored under the `store` policy; replayed like `Completed`.
    Failed(StoredResponse),
}

impl RecordState {
    /// Builds the state from the columns or fields a store keeps: the status, the
    /// lease end and the response. Fails when the status needs a part that is
    /// missing (a running record without a lease end, a final one without a
    /// response) or carries a response it must not have. A lease end on a record
    /// that is not running is ignored: stores clear it, but it means nothing there.
    pub fn from_parts(
        status: RecordStatus,
        locked_until: Option<Timestamp>,
        response: Option<StoredResponse>,
    ) -> Result<Self, DecodeError> {
        match (status, response) {
            (RecordStatus::Processing, None) => locked_until
                .map(|locked_until| Self::Processing { locked_until })
                .ok_or(DecodeError("processing record without a lease")),
            (RecordStatus::Released, None) => Ok(Self::Released),
            (RecordStatus::Completed, Some(response)) => Ok(Self::Completed(response)),
            (RecordStatus::Failed, Some(response)) => Ok(Self::Failed(response)),
            (RecordStatus::Completed | RecordStatus::Failed, None) => {
                Err(DecodeError("final record without a response"))
            }
            (RecordStatus::Processing | RecordStatus::Released, Some(_)) => {
                Err(DecodeError("response on a record that is not final"))
            }
        }
    }

    /// The status name stores persist for this state.
    pub const fn status(&self) -> RecordStatus {
        match self {
            Self::Processing { .. } => RecordStatus::Processing,
            Self::Released => RecordStatus::Released,
            Self::Completed(_) => RecordStatus::Completed,
            Self::Failed(_) => RecordStatus::Failed,
        }
    }

    /// End of the lease; `None` unless `Processing`.
    pub const fn locked_until(&self) -> Option<Timestamp> {
        match self {
            Self::Processing { locked_until } => Some(*locked_until),
            _ => None,
        }
    }

    /// The response a replay gives back; `Some` exactly when final.
    pub const fn response(&self) -> Option<&StoredResponse> {
        match self {
            Self::Completed(response) | Self::Failed(response) => Some(response),
            Self::Processing { .. } | Self::Released => None,
        }
    }
}

/// One operation as a store holds it (PROTOCOL §5). The identity is the key the
/// store found it under, so it is not repeated here.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Record {
    /// What the first request asked for.
    pub fingerprint: Fingerprint,
    /// The first request's per-field digests ([`FieldDigests`]): what lets a
    /// 422 name the fields another request under the key changed. `None` for a
    /// body that is not JSON, and for records written before they were kept.
    pub field_digests: Option<FieldDigests>,
    /// The layout version the record was written with.
    pub format_version: u16,
    /// The operation's id.
    pub operation_id: OperationId,
    /// The current holder's token.
    pub token: FencingToken,
    /// Where it stands, with its lease end or its response.
    pub state: RecordState,
    /// First claim.
    pub created_at: Timestamp,
    /// After this instant the record is absent, purged or not.
    pub expires_at: Timestamp,
}

impl Record {
    /// Where it stands, as the name stores persist.
    pub const fn status(&self) -> RecordStatus {
        self.state.status()
    }

    /// End of the current lease; `None` unless `Processing`.
    pub const fn locked_until(&self) -> Option<Timestamp> {
        self.state.locked_until()
    }

    /// The stored response; `Some` exactly when final.
    pub const fn response(&self) -> Option<&StoredResponse> {
        self.state.response()
    }

    /// Whether a `Processing` record's holder may still be running it at `now`.
    pub fn lease_is_live(&self, now: Timestamp) -> bool {
        self.locked_until().is_some_and(|until| until > now)
    }

    /// Whether a write fenced by (`operation_id`, `token`) — `complete`, `release`,
    /// `renew`, `delete` — may change this record at `now` (store clock; PROTOCOL
    /// §8, "Fencing"): only while the record is live, still `Processing`, and still
    /// holds that operation and that token. A holder whose lease was taken over, or
    /// whose operation was settled, expired or deleted, is refused. The one place
    /// this rule is written in Rust; stores whose writes run inside the database
    /// restate it in their dialect.
    pub fn admits_fenced_write(
        &self,
        operation_id: OperationId,
        token: FencingToken,
        now: Timestamp,
    ) -> bool {
        self.expires_at > now
            && matches!(self.state, RecordState::Processing { .. })
            && self.operation_id == operation_id
            && self.token == token
    }

    /// The fields a request with another fingerprint under this record's key
    /// differs in (PROTOCOL §6.3), from the two requests' [`FieldDigests`];
    /// `None` when either has none (a body that is not JSON, a record written
    /// before digests were kept): the 422 then names nothing.
    pub fn differing(&self, later: Option<&FieldDigests>) -> Option<Differing> {
        Some(self.field_digests.as_ref()?.differing(later?))
    }

    /// Whether a claim with `fingerprint` at `now` (store clock) may take this
    /// live record up again, and how (PROTOCOL §6.2): a `Released` record, or a
    /// `Processing` one whose lease lapsed, by the fingerprint it was made for.
    /// `None` for every other request. The one place this rule is written in Rust;
    /// stores whose claim runs inside the database restate it in their dialect.
    pub fn claim_origin(&self, fingerprint: &Fingerprint, now: Timestamp) -> Option<LeaseOrigin> {
        if self.fingerprint != *fingerprint {
            return None;
        }
        match self.state {
            RecordState::Released => Some(LeaseOrigin::Released),
            RecordState::Processing { locked_until } if locked_until <= now => {
                Some(LeaseOrigin::TakenOver)
            }
            RecordState::Processing { .. } | RecordState::Completed(_) | RecordState::Failed(_) => {
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detached_response_is_equal_and_holds_no_view_of_its_source() {
        let buffer = Bytes::from(vec![b'a'; 4096]);
        let mut secret = HeaderValue::from_maybe_shared(buffer.slice(10..20)).unwrap();
        secret.set_sensitive(true);
        let response = StoredResponse {
            status: StatusCode::OK,
            headers: vec![(HeaderName::from_static("x-secret"), secret)],
            body: StoredBody::Retained(buffer.slice(0..3)),
            trailers: vec![(
                HeaderName::from_static("grpc-status"),
                HeaderValue::from_maybe_shared(buffer.slice(30..31)).unwrap(),
            )],
        };
        let detached = response.clone().detached();
        assert_eq!(detached, response);
        assert!(detached.headers[0].1.is_sensitive(), "sensitivity kept");
        drop(response);
        assert!(
            buffer.is_unique(),
            "the detached copy still shares the buffer"
        );
    }

    fn sample(body: StoredBody) -> StoredResponse {
        StoredResponse {
            trailers: Vec::new(),
            status: StatusCode::CREATED,
            headers: vec![
                (
                    HeaderName::from_static("location"),
                    HeaderValue::from_static("/orders/1"),
                ),
                (
                    HeaderName::from_static("x-a"),
                    HeaderValue::from_static("1"),
                ),
                (
                    HeaderName::from_static("x-a"),
                    HeaderValue::from_static("2"),
                ),
                (
                    HeaderName::from_static("x-bin"),
                    HeaderValue::from_bytes(b"caf\xe9").unwrap(),
                ),
            ],
            body,
        }
    }

    #[test]
    fn responses_round_trip_byte_exact() {
        for body in [
            StoredBody::Retained(Bytes::from_static(b"\x00\x01\xffbinary\r\n")),
            StoredBody::Retained(Bytes::new()),
            StoredBody::NotRetained,
            StoredBody::InPieces(0),
            StoredBody::InPieces(70_000),
        ] {
            let mut response = sample(body);
            for trailers in [Vec::new(), grpc_trailers()] {
                response.trailers = trailers;
                assert_eq!(StoredResponse::decode(response.encode()).unwrap(), response);
                assert_eq!(
                    StoredResponse::decode_fields(&response.encode_fields()).unwrap(),
                    (response.headers.clone(), response.trailers.clone())
                );
            }
        }
    }

    fn grpc_trailers() -> FieldList {
        vec![
            (
                HeaderName::from_static("grpc-status"),
                HeaderValue::from_static("0"),
            ),
            (
                HeaderName::from_static("x-trace-bin"),
                HeaderValue::from_static("AAEC"),
            ),
        ]
    }

    #[test]
    fn a_response_without_trailers_encodes_as_before_trailers() {
        // Builds that predate trailers read version 1 and a bare header list;
        // records without trailers stay readable by them during an upgrade.
        let plain = sample(StoredBody::NotRetained);
        assert_eq!(plain.encode()[0], 1);
        let mut with = plain.clone();
        with.trailers = grpc_trailers();
        assert_eq!(with.encode()[0], 2);
        assert_eq!(
            with.encode_fields()[..plain.encode_fields().len()],
            plain.encode_fields()[..]
        );
    }

    #[test]
    fn corrupt_encodings_are_errors_not_panics() {
        let encoded = sample(StoredBody::Retained(Bytes::from_static(b"body"))).encode();
        for len in 0..encoded.len() - 4 {
            assert!(
                StoredResponse::decode(encoded.slice(..len)).is_err(),
                "prefix of {len}"
            );
        }
        assert!(StoredResponse::decode(Bytes::from_static(b"\x02\x00\xc8\x00\x00\x00")).is_err());
        assert!(StoredResponse::decode_fields(b"\x00\x01\x00\x02a").is_err());
        assert!(StoredResponse::decode(Bytes::from_static(b"\x03\x00\xc8\x00\x00\x00")).is_err());
    }

    fn record(state: RecordState) -> Record {
        Record {
            fingerprint: Fingerprint::from_bytes([1; 32]),
            field_digests: None,
            format_version: RECORD_FORMAT_VERSION,
            operation_id: OperationId::generate(),
            token: FencingToken(1),
            state,
            created_at: Timestamp::from_millis(0),
            expires_at: Timestamp::from_millis(1_000_000),
        }
    }

    #[test]
    fn claimable_by_the_same_fingerprint_when_released_or_lapsed() {
        let same = Fingerprint::from_bytes([1; 32]);
        let other = Fingerprint::from_bytes([2; 32]);
        let now = Timestamp::from_millis(1_000);
        let lapsed = record(RecordState::Processing {
            locked_until: Timestamp::from_millis(1_000),
        });
        let live = record(RecordState::Processing {
            locked_until: Timestamp::from_millis(1_001),
        });
        let released = record(RecordState::Released);
        let done = record(RecordState::Completed(sample(StoredBody::NotRetained)));
        assert_eq!(
            lapsed.claim_origin(&same, now),
            Some(LeaseOrigin::TakenOver)
        );
        assert_eq!(
            released.claim_origin(&same, now),
            Some(LeaseOrigin::Released)
        );
        assert_eq!(live.claim_origin(&same, now), None);
        assert_eq!(done.claim_origin(&same, now), None);
        for record in [&lapsed, &live, &released, &done] {
            assert_eq!(record.claim_origin(&other, now), None, "{:?}", record.state);
        }
    }

    #[test]
    fn states_need_their_parts() {
        let response = || Some(sample(StoredBody::NotRetained));
        let until = Some(Timestamp::from_millis(5));
        assert!(RecordState::from_parts(RecordStatus::Processing, None, None).is_err());
        assert!(RecordState::from_parts(RecordStatus::Completed, None, None).is_err());
        assert!(RecordState::from_parts(RecordStatus::Failed, until, None).is_err());
        assert!(RecordState::from_parts(RecordStatus::Released, None, response()).is_err());
        assert!(RecordState::from_parts(RecordStatus::Processing, until, response()).is_err());
        let completed = RecordState::from_parts(RecordStatus::Completed, until, response());
        assert_eq!(completed.unwrap().locked_until(), None);
        assert_eq!(
            RecordState::from_parts(RecordStatus::Released, until, None),
            Ok(RecordState::Released)
        );
    }

    #[test]
    fn lease_origins_round_trip() {
        for origin in [
            LeaseOrigin::New,
            LeaseOrigin::Released,
            LeaseOrigin::TakenOver,
        ] {
            assert_eq!(origin.as_str().parse::<LeaseOrigin>().unwrap(), origin);
        }
        assert!("TAKEN".parse::<LeaseOrigin>().is_err());
    }

    #[test]
    fn statuses_round_trip() {
        for status in [
            RecordStatus::Processing,
            RecordStatus::Completed,
            RecordStatus::Failed,
            RecordStatus::Released,
        ] {
            assert_eq!(status.as_str().parse::<RecordStatus>().unwrap(), status);
        }
        assert!("DONE".parse::<RecordStatus>().is_err());
    }
}
