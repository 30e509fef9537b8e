//! How records and responses are laid out in Redis, and read back.

use bytes::Bytes;
use idemgate_core::fingerprint::{FieldDigests, Fingerprint};
use idemgate_core::record::{
    DecodeError, FencingToken, OperationId, RECORD_FORMAT_VERSION, Record, RecordState,
    RecordStatus, StoredResponse,
};
use idemgate_core::time::Timestamp;
use redis::Value;

use crate::error::RedisStoreError;

/// The first byte of a stored response: the rest is [`StoredResponse::encode`].
const RAW: u8 = 0;
/// The first byte of a stored response: the rest is a zstd frame of
/// [`StoredResponse::encode`].
const ZSTD: u8 = 1;

/// zstd level 1: on JSON responses as small as level 3 (the `compression`
/// benchmark: 11.1% vs 11.8% of a 64 KiB body) and faster to encode, which happens
/// on the request path of every completion.
const DEFAULT_LEVEL: i32 = 1;

/// The most a compressed response may expand to when read back (a corrupt frame
/// must not make the reader allocate without bound).
const MAX_DECOMPRESSED: usize = 512 * 1024 * 1024;

/// How stored responses are encoded: [`StoredResponse::encode`] behind a one-byte
/// codec tag, compressed with zstd when the encoding is larger than a threshold and
/// compression makes it smaller.
///
/// The store uses it internally; it is public so its effect can be measured (see
/// the crate's `compression` benchmark).
///
/// ```
/// use idemgate_redis::ResponseCodec;
/// # use idemgate_core::record::{StoredBody, StoredResponse};
/// let response = StoredResponse {
///     trailers: Vec::new(),
///     status: http::StatusCode::OK,
///     headers: vec![],
///     body: StoredBody::Retained(vec![b'a'; 10_000].into()),
/// };
/// let codec = ResponseCodec::new(1024);
/// let encoded = codec.encode(&response);
/// assert!(encoded.len() < 1_000);
/// assert_eq!(codec.decode(encoded.into()).unwrap(), response);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseCodec {
    threshold: usize,
    level: i32,
}

impl Default for ResponseCodec {
    /// Compresses encodings above 1 KiB at zstd level 1.
    fn default() -> Self {
        Self::new(1024)
    }
}

impl ResponseCodec {
    /// Compresses encodings longer than `threshold` bytes (`usize::MAX`: never).
    pub const fn new(threshold: usize) -> Self {
        Self {
            threshold,
            level: DEFAULT_LEVEL,
        }
    }

    /// The same codec at zstd `level` (1 fastest … 19 smallest; default 1).
    pub const fn with_level(mut self, level: i32) -> Self {
        self.level = level;
        self
    }

    /// The zstd level.
    pub const fn level(&self) -> i32 {
        self.level
    }

    /// The size above which responses are compressed.
    pub const fn threshold(&self) -> usize {
        self.threshold
    }

    /// The value stored in the record's `rs` field.
    pub fn encode(&self, response: &StoredResponse) -> Vec<u8> {
        let plain = response.encode();
        // A body the layer already compressed (idemgate_core::compression, the
        // codec every store shares) is not compressed twice.
        if plain.len() > self.threshold
            && !idemgate_core::compression::is_compressed(response)
            && let Ok(compressed) = zstd::bulk::compress(&plain, self.level)
            && compressed.len() < plain.len()
        {
            let mut out = Vec::with_capacity(1 + compressed.len());
            out.push(ZSTD);
            out.extend_from_slice(&compressed);
            return out;
        }
        let mut out = Vec::with_capacity(1 + plain.len());
        out.push(RAW);
        out.extend_from_slice(&plain);
        out
    }

    /// Reverses [`ResponseCodec::encode`], whatever threshold the writer used.
    pub fn decode(&self, stored: Bytes) -> Result<StoredResponse, RedisStoreError> {
        match stored.first() {
            Some(&RAW) => Ok(StoredResponse::decode(stored.slice(1..))?),
            Some(&ZSTD) => {
                let plain = zstd::bulk::decompress(&stored[1..], MAX_DECOMPRESSED)
                    .map_err(RedisStoreError::Decompress)?;
                Ok(StoredResponse::decode(Bytes::from(plain))?)
            }
            _ => Err(DecodeError("unknown response codec").into()),
        }
    }
}

/// The one-letter status codes records keep.
pub(crate) const fn status_code(status: RecordStatus) -> &'static str {
    match status {
        RecordStatus::Processing => "P",
        RecordStatus::Completed => "C",
        RecordStatus::Failed => "F",
        RecordStatus::Released => "R",
    }
}

pub(crate) fn parse_status(code: &[u8]) -> Result<RecordStatus, DecodeError> {
    match code {
        b"P" => Ok(RecordStatus::Processing),
        b"C" => Ok(RecordStatus::Completed),
        b"F" => Ok(RecordStatus::Failed),
        b"R" => Ok(RecordStatus::Released),
        _ => Err(DecodeError("unknown record status")),
    }
}

/// A reply element as bytes.
pub(crate) fn bytes_of(value: Value) -> Result<Vec<u8>, RedisStoreError> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(n) => Ok(n.to_string().into_bytes()),
        _ => Err(RedisStoreError::UnexpectedReply("expected a string")),
    }
}

/// A reply element as an integer (a Lua number, or a decimal string).
pub(crate) fn int_of(value: Value) -> Result<i64, RedisStoreError> {
    match value {
        Value::Int(n) => Ok(n),
        other => decimal(&bytes_of(other)?)
            .ok_or(RedisStoreError::UnexpectedReply("expected an integer")),
    }
}

/// A reply element as an array.
pub(crate) fn array_of(value: Value) -> Result<Vec<Value>, RedisStoreError> {
    match value {
        Value::Array(items) | Value::Set(items) => Ok(items),
        Value::Map(pairs) => Ok(pairs.into_iter().flat_map(|(k, v)| [k, v]).collect()),
        Value::Nil => Ok(Vec::new()),
        _ => Err(RedisStoreError::UnexpectedReply("expected an array")),
    }
}

fn decimal(bytes: &[u8]) -> Option<i64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// Decodes a record from its `HGETALL` fields; `None` when there are none (absent).
pub(crate) fn decode_record(
    fields: Value,
    codec: &ResponseCodec,
) -> Result<Option<Record>, RedisStoreError> {
    let fields = array_of(fields)?;
    if fields.is_empty() {
        return Ok(None);
    }
    if fields.len() % 2 != 0 {
        return Err(RedisStoreError::UnexpectedReply(
            "odd number of hash fields",
        ));
    }
    let mut version = None;
    let mut fingerprint = None;
    let mut field_digests = None;
    let mut operation_id = None;
    let mut token = None;
    let mut status = None;
    let mut locked_until = None;
    let mut response = None;
    let mut created_at = None;
    let mut expires_at = None;
    let mut items = fields.into_iter();
    while let (Some(name), Some(value)) = (items.next(), items.next()) {
        let name = bytes_of(name)?;
        let value = bytes_of(value)?;
        let number = || decimal(&value).ok_or(DecodeError("invalid number"));
        match name.as_slice() {
            b"v" => {
                version =
                    Some(u16::try_from(number()?).map_err(|_| DecodeError("invalid version"))?)
            }
            b"fp" => {
                let bytes = <[u8; 32]>::try_from(value.as_slice())
                    .map_err(|_| DecodeError("invalid fingerprint"))?;
                fingerprint = Some(Fingerprint::from_bytes(bytes));
            }
            b"fd" => field_digests = Some(FieldDigests::decode(&value)?),
            b"op" => {
                let bytes = <[u8; 16]>::try_from(value.as_slice())
                    .map_err(|_| DecodeError("invalid operation id"))?;
                operation_id = Some(OperationId::from_bytes(bytes));
            }
            b"tk" => {
                token = Some(u64::try_from(number()?).map_err(|_| DecodeError("invalid token"))?)
            }
            b"st" => status = Some(parse_status(&value)?),
            b"lu" => locked_until = Some(Timestamp::from_millis(number()?)),
            b"ca" => created_at = Some(Timestamp::from_millis(number()?)),
            b"ea" => expires_at = Some(Timestamp::from_millis(number()?)),
            b"rs" => response = Some(codec.decode(Bytes::from(value))?),
            // Fields a later format may add are ignored by this reader.
            _ => {}
        }
    }
    let missing = |field| DecodeError(field);
    let format_version = version.ok_or(missing("missing format version"))?;
    if format_version == 0 || format_version > RECORD_FORMAT_VERSION {
        return Err(DecodeError("unknown record format version").into());
    }
    let status = status.ok_or(missing("missing status"))?;
    let state = RecordState::from_parts(status, locked_until, response)?;
    Ok(Some(Record {
        fingerprint: fingerprint.ok_or(missing("missing fingerprint"))?,
        field_digests,
        format_version,
        operation_id: operation_id.ok_or(missing("missing operation id"))?,
        token: FencingToken(token.ok_or(missing("missing token"))?),
        state,
        created_at: created_at.ok_or(missing("missing created_at"))?,
        expires_at: expires_at.ok_or(missing("missing expires_at"))?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_core::record::StoredBody;

    fn response(body: Vec<u8>) -> StoredResponse {
        StoredResponse {
            trailers: Vec::new(),
            status: http::StatusCode::OK,
            headers: vec![(
                http::HeaderName::from_static("content-type"),
                http::HeaderValue::from_static("application/json"),
            )],
            body: StoredBody::Retained(body.into()),
        }
    }

    #[test]
    fn small_responses_stay_raw_and_large_ones_shrink() {
        let codec = ResponseCodec::new(64);
        let small = response(b"{}".to_vec());
        assert_eq!(codec.encode(&small)[0], RAW);
        let large = response(br#"{"item":"widget","qty":1}"#.repeat(200));
        let encoded = codec.encode(&large);
        assert_eq!(encoded[0], ZSTD);
        assert!(encoded.len() < large.encode().len() / 5);
        assert_eq!(codec.decode(encoded.into()).unwrap(), large);
    }

    #[test]
    fn incompressible_bodies_are_kept_raw() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect();
        let codec = ResponseCodec::new(64);
        let encoded = codec.encode(&response(noise.clone()));
        assert_eq!(encoded[0], RAW);
        assert_eq!(codec.decode(encoded.into()).unwrap(), response(noise));
    }

    #[test]
    fn any_reader_decodes_any_writer() {
        let large = response(vec![b'x'; 10_000]);
        let written = ResponseCodec::new(16).encode(&large);
        assert_eq!(
            ResponseCodec::new(usize::MAX)
                .decode(written.into())
                .unwrap(),
            large
        );
    }

    #[test]
    fn corrupt_values_are_errors() {
        let codec = ResponseCodec::default();
        for bad in [&b""[..], b"\x07abc", b"\x01not zstd", b"\x00\x09"] {
            assert!(
                codec.decode(Bytes::copy_from_slice(bad)).is_err(),
                "{bad:?}"
            );
        }
    }

    fn field(name: &str, value: &[u8]) -> [Value; 2] {
        [
            Value::BulkString(name.into()),
            Value::BulkString(value.to_vec()),
        ]
    }

    #[test]
    fn records_decode_and_inconsistent_ones_do_not() {
        let base = [
            field("v", b"1"),
            field("fp", &[3; 32]),
            field("op", &[4; 16]),
            field("tk", b"2"),
            field("st", b"P"),
            field("lu", b"1700000001000"),
            field("ca", b"1700000000000"),
            field("ea", b"1700086400000"),
        ];
        let value =
            |fields: &[[Value; 2]]| Value::Array(fields.iter().flatten().cloned().collect());
        let record = decode_record(value(&base), &ResponseCodec::default())
            .unwrap()
            .unwrap();
        assert_eq!(record.status(), RecordStatus::Processing);
        assert_eq!(record.token, FencingToken(2));
        assert_eq!(
            record.locked_until(),
            Some(Timestamp::from_millis(1_700_000_001_000))
        );
        assert_eq!(
            decode_record(Value::Array(vec![]), &ResponseCodec::default()).unwrap(),
            None
        );

        let mut completed_without_response = base.clone();
        completed_without_response[4] = field("st", b"C");
        let mut bad_fingerprint = base.clone();
        bad_fingerprint[1] = field("fp", b"short");
        let mut future_version = base.clone();
        future_version[0] = field("v", b"999");
        for bad in [
            &base[1..],
            &completed_without_response[..],
            &bad_fingerprint[..],
            &future_version[..],
        ] {
            assert!(decode_record(value(bad), &ResponseCodec::default()).is_err());
        }
    }
}
