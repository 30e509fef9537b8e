//! How a record row becomes a [`Snapshot`] or a [`Lease`], and the values both SQL
//! stores bind: the Rust half of their record I/O, written once. The SQL text that
//! selects and writes those columns stays in each store's crate, in its dialect.
//!
//! Both stores select the same column names (`fingerprint`, `field_digests`
//! (nullable: [`FieldDigests::encode`]), `format_version`,
//! `operation_id`, `token`, `status`, `locked_until_ms`, `response_status`,
//! `response_headers`, `response_body`, `body_retained`, `created_ms`, `expires_ms`,
//! `now_ms`; a claim returns `operation_id`, `token`, `lease_origin`,
//! `locked_until_ms`) and read them as the same Rust types: the operation id as a
//! `uuid::Uuid` (PostgreSQL's `UUID`, SQLite's 16-byte `BLOB`), `format_version`
//! and `response_status` as `i32`, times and tokens as `i64`.

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use idemgate_core::fingerprint::{FieldDigests, Fingerprint};
use idemgate_core::record::{
    FencingToken, LeaseOrigin, OperationId, Record, RecordState, RecordStatus, StoredBody,
    StoredResponse,
};
use idemgate_core::resource_lease::{LeaseAcquisition, LeaseToken, ResourceId, ResourceLease};
use idemgate_core::scope::IdentityDigest;
use idemgate_core::time::Timestamp;
use idemgate_core::{Completion, Eviction, FencedWrite, Lease, Snapshot, StoreError};
use sqlx::{ColumnIndex, Decode, Row, Type};

/// Durations beyond this are clamped (100 years), so millisecond sums in SQL never
/// overflow.
pub const MAX_MILLIS: i64 = 100 * 365 * 86_400_000;

/// A duration as whole milliseconds, clamped to [`MAX_MILLIS`].
pub fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).map_or(MAX_MILLIS, |ms| ms.min(MAX_MILLIS))
}

/// A fencing token as the `BIGINT` the stores keep; `None` for a token no database
/// row can hold, which therefore was never handed out by one (the write is
/// [`FencedWrite::Refused`] without asking).
pub fn token_param(token: FencingToken) -> Option<i64> {
    i64::try_from(token.0).ok()
}

/// A fenced statement's affected-row count as its outcome: exactly one row is the
/// record that still held the lease.
pub fn applied(rows: u64) -> FencedWrite {
    if rows == 1 {
        FencedWrite::Applied
    } else {
        FencedWrite::Refused
    }
}

/// A record read back that breaks the schema's invariants: the cause of a
/// [`StoreError::Corrupt`].
#[derive(Debug, thiserror::Error)]
#[error("corrupt idempotency record: {0}")]
pub struct CorruptRecord(pub &'static str);

/// A [`StoreError::Corrupt`] saying what is wrong.
pub fn corrupt(what: &'static str) -> StoreError {
    StoreError::corrupt(CorruptRecord(what))
}

/// What [`crate::SqlStore::complete_in`]'s statement writes for `completion`, in
/// column order: status, response status, headers, body, whether the body was
/// retained, and the time to live in milliseconds.
#[derive(Debug)]
pub struct CompletionColumns<'a> {
    /// `COMPLETED` or `FAILED`.
    pub status: &'static str,
    /// The response's HTTP status.
    pub response_status: u16,
    /// [`StoredResponse::encode_fields`]: the headers, then any trailers.
    pub headers: Vec<u8>,
    /// The body; `None` when it was not retained. A stream recorded in pieces
    /// keeps their count here instead (`pieces_marker`), with `retained`
    /// false: a build that predates streams reads it as not retained.
    pub body: Option<Cow<'a, [u8]>>,
    /// `false`: the body was too large to keep (replayed without one).
    pub retained: bool,
    /// How long the completed record lives, in milliseconds.
    pub ttl_ms: i64,
}

/// The body column of a stream recorded in pieces (`StoredBody::InPieces`):
/// `P` and the count, big-endian.
fn pieces_marker(count: u32) -> [u8; 5] {
    let mut marker = [b'P', 0, 0, 0, 0];
    marker[1..].copy_from_slice(&count.to_be_bytes());
    marker
}

/// Reverses [`pieces_marker`].
fn pieces_count(marker: &[u8]) -> Option<u32> {
    match marker {
        [b'P', count @ ..] => Some(u32::from_be_bytes(count.try_into().ok()?)),
        _ => None,
    }
}

impl<'a> CompletionColumns<'a> {
    /// The columns of `completion`.
    pub fn of(completion: &'a Completion) -> Self {
        let response = &completion.response;
        let (body, retained) = match &response.body {
            StoredBody::Retained(body) => (Some(Cow::Borrowed(body.as_ref())), true),
            StoredBody::NotRetained => (None, false),
            StoredBody::InPieces(count) => {
                (Some(Cow::Owned(pieces_marker(*count).to_vec())), false)
            }
        };
        Self {
            status: RecordStatus::from(completion.status).as_str(),
            response_status: response.status.as_u16(),
            headers: response.encode_fields(),
            body,
            retained,
            ttl_ms: millis(completion.ttl),
        }
    }
}

fn column<'r, R, T>(row: &'r R, name: &str) -> Result<T, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    T: Decode<'r, R::Database> + Type<R::Database>,
{
    row.try_get(name).map_err(StoreError::corrupt)
}

fn token(token: i64) -> Result<FencingToken, StoreError> {
    u64::try_from(token)
        .map(FencingToken)
        .map_err(|_| corrupt("negative token"))
}

/// The lease a claim statement returned (`operation_id`, `token`, `lease_origin`,
/// `locked_until_ms`), for `identity`.
pub fn decode_lease<R>(row: &R, identity: IdentityDigest) -> Result<Lease, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> uuid::Uuid: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
{
    let origin: String = column(row, "lease_origin")?;
    let locked_until: Option<i64> = column(row, "locked_until_ms")?;
    Ok(Lease {
        identity,
        operation_id: OperationId::from(column::<R, uuid::Uuid>(row, "operation_id")?),
        token: token(column(row, "token")?)?,
        origin: origin.parse::<LeaseOrigin>().map_err(StoreError::corrupt)?,
        locked_until: Timestamp::from_millis(
            locked_until.ok_or_else(|| corrupt("claimed record without a lease"))?,
        ),
    })
}

/// What a resource lease's acquiring upsert returned: the row's `token` (16
/// bytes), `until_ms` and the store's clock `now_ms`. The upsert writes
/// the `proposed` token only over a lapsed lease, so the row holding it means
/// this acquisition won; any other token is the live holder's.
pub fn decode_lease_acquisition<R>(
    row: &R,
    resource: ResourceId,
    proposed: LeaseToken,
) -> Result<LeaseAcquisition, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let token: Vec<u8> = column(row, "token")?;
    let token = LeaseToken::from_bytes(
        token
            .try_into()
            .map_err(|_| corrupt("a resource lease token is not 16 bytes"))?,
    );
    let until = Timestamp::from_millis(column(row, "until_ms")?);
    let now = Timestamp::from_millis(column(row, "now_ms")?);
    Ok(if token == proposed {
        LeaseAcquisition::Acquired(ResourceLease {
            resource,
            token,
            until,
        })
    } else {
        LeaseAcquisition::Held { until, now }
    })
}

/// The record (and the store's clock, `now_ms`) a read selected. A final record
/// without a complete response, or a running one without a lease, is
/// [`StoreError::Corrupt`]: [`RecordState`] cannot hold either.
pub fn decode_snapshot<R>(row: &R) -> Result<Snapshot, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> i32: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> uuid::Uuid: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let fingerprint: Vec<u8> = column(row, "fingerprint")?;
    let field_digests: Option<Vec<u8>> = column(row, "field_digests")?;
    let format_version: i32 = column(row, "format_version")?;
    let status: String = column(row, "status")?;
    let locked_until: Option<i64> = column(row, "locked_until_ms")?;
    let created: i64 = column(row, "created_ms")?;
    let expires: i64 = column(row, "expires_ms")?;
    let now: i64 = column(row, "now_ms")?;

    let status: RecordStatus = status.parse().map_err(StoreError::corrupt)?;
    let fingerprint: [u8; 32] = fingerprint
        .try_into()
        .map_err(|_| corrupt("fingerprint is not 32 bytes"))?;
    // The response columns mean something only once the record is final; a claim
    // clears them, but a reader does not rely on that.
    let response = if status.is_final() {
        Some(decode_response(row)?)
    } else {
        None
    };
    let state = RecordState::from_parts(status, locked_until.map(Timestamp::from_millis), response)
        .map_err(StoreError::corrupt)?;
    Ok(Snapshot {
        record: Record {
            fingerprint: Fingerprint::from_bytes(fingerprint),
            field_digests: field_digests
                .map(|bytes| FieldDigests::decode(&bytes))
                .transpose()
                .map_err(StoreError::corrupt)?,
            format_version: u16::try_from(format_version)
                .map_err(|_| corrupt("format version out of range"))?,
            operation_id: OperationId::from(column::<R, uuid::Uuid>(row, "operation_id")?),
            token: token(column(row, "token")?)?,
            state,
            created_at: Timestamp::from_millis(created),
            expires_at: Timestamp::from_millis(expires),
        },
        now: Timestamp::from_millis(now),
    })
}

/// What an eviction found, from the row its statement returned: `status`,
/// `locked_until_ms`, `now_ms` and `evicted` (whether the row was deleted); no row
/// when no live record was there ([`Eviction::Absent`]).
pub fn decode_eviction<R>(row: Option<&R>) -> Result<Eviction, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
{
    let Some(row) = row else {
        return Ok(Eviction::Absent);
    };
    let status: String = column(row, "status")?;
    let status: RecordStatus = status.parse().map_err(StoreError::corrupt)?;
    if column(row, "evicted")? {
        return Ok(Eviction::Evicted { status });
    }
    let locked_until: Option<i64> = column(row, "locked_until_ms")?;
    match (status, locked_until) {
        (RecordStatus::Processing, Some(locked_until)) => Ok(Eviction::RefusedLiveLease {
            locked_until: Timestamp::from_millis(locked_until),
            now: Timestamp::from_millis(column(row, "now_ms")?),
        }),
        _ => Err(corrupt(
            "eviction refused for a record without a live lease",
        )),
    }
}

fn decode_response<R>(row: &R) -> Result<StoredResponse, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> i32: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let response_status: Option<i32> = column(row, "response_status")?;
    let headers: Option<Vec<u8>> = column(row, "response_headers")?;
    let body: Option<Vec<u8>> = column(row, "response_body")?;
    let retained: Option<bool> = column(row, "body_retained")?;
    let status = response_status
        .and_then(|code| u16::try_from(code).ok())
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or_else(|| corrupt("final record without a valid response status"))?;
    let (headers, trailers) = StoredResponse::decode_fields(
        headers
            .as_deref()
            .ok_or_else(|| corrupt("final record without headers"))?,
    )
    .map_err(StoreError::corrupt)?;
    let body = match (retained, body) {
        (Some(true), Some(body)) => StoredBody::Retained(Bytes::from(body)),
        (Some(false), None) => StoredBody::NotRetained,
        (Some(false), Some(marker)) => StoredBody::InPieces(
            pieces_count(&marker).ok_or_else(|| corrupt("a stream's body without its count"))?,
        ),
        _ => return Err(corrupt("final record without a body")),
    };
    Ok(StoredResponse {
        trailers,
        status,
        headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_clamped() {
        assert_eq!(millis(Duration::from_millis(1_500)), 1_500);
        assert_eq!(millis(Duration::MAX), MAX_MILLIS);
    }

    #[test]
    fn one_affected_row_is_applied() {
        assert_eq!(applied(1), FencedWrite::Applied);
        assert_eq!(applied(0), FencedWrite::Refused);
        assert_eq!(token_param(FencingToken(u64::MAX)), None);
        assert_eq!(token_param(FencingToken(7)), Some(7));
    }
}
