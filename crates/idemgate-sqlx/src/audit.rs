//! The journal's rows, as both SQL stores read and write them
//! (`idemgate_core::audit`): the same columns in SQLite and PostgreSQL, so one
//! decoder and one binding.
//!
//! An entry row holds `seq` (the store's own counter), `at_ms`, `event`,
//! `operation_id`, `method`, `route`, `principal`, `key_digest`, `fingerprint`,
//! `status`, `duration_ms`, `instance`, `prev` and `hash` (32 bytes each); a
//! partition row `instance`, `head` and `anchor`.

use idemgate_core::StoreError;
use idemgate_core::audit::{
    AuditEntry, AuditEvent, AuditPartition, AuditRecord, ChainHash, chain_hash,
};
use idemgate_core::time::Timestamp;
use sqlx::{ColumnIndex, Database, Decode, Encode, QueryBuilder, Row, Type};

use crate::record::corrupt;

/// The columns an entry is read with, in the decoder's names.
pub const AUDIT_COLUMNS: &str = "seq, at_ms, event, operation_id, method, route, principal, \
     key_digest, fingerprint, status, duration_ms, instance, prev, hash";

/// One entry, as [`AUDIT_COLUMNS`] selects it. A row that no longer decodes
/// (an unknown event, a hash of the wrong length) is [`StoreError::Corrupt`].
pub fn decode_audit_entry<R>(row: &R) -> Result<AuditEntry, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let get = |name: &str| -> Result<Option<i64>, StoreError> {
        row.try_get(name).map_err(StoreError::corrupt)
    };
    let text = |name: &str| -> Result<Option<String>, StoreError> {
        row.try_get(name).map_err(StoreError::corrupt)
    };
    let required = |name: &str| -> Result<String, StoreError> {
        text(name)?.ok_or_else(|| corrupt("a journal column is NULL"))
    };
    let seq = get("seq")?.ok_or_else(|| corrupt("a journal entry without seq"))?;
    let at = get("at_ms")?.ok_or_else(|| corrupt("a journal entry without at"))?;
    let event: AuditEvent = required("event")?.parse().map_err(StoreError::corrupt)?;
    let status = get("status")?
        .map(|s| u16::try_from(s).map_err(|_| corrupt("a journal status out of range")))
        .transpose()?;
    let duration_ms = get("duration_ms")?
        .map(|d| u64::try_from(d).map_err(|_| corrupt("a negative journal duration")))
        .transpose()?;
    Ok(AuditEntry {
        seq: u64::try_from(seq).map_err(|_| corrupt("a negative journal seq"))?,
        at: Timestamp::from_millis(at),
        record: AuditRecord {
            event: Some(event),
            operation_id: text("operation_id")?,
            method: required("method")?,
            route: required("route")?,
            principal: required("principal")?,
            key_digest: required("key_digest")?,
            fingerprint: text("fingerprint")?,
            status,
            duration_ms,
            instance: required("instance")?,
        },
        prev: hash(row, "prev")?,
        hash: hash(row, "hash")?,
    })
}

/// One partition row: `instance`, `head`, `anchor`, and `entries`, the count
/// of its entries.
pub fn decode_audit_partition<R>(row: &R) -> Result<AuditPartition, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let entries: i64 = row.try_get("entries").map_err(StoreError::corrupt)?;
    Ok(AuditPartition {
        instance: row.try_get("instance").map_err(StoreError::corrupt)?,
        head: hash(row, "head")?,
        anchor: hash(row, "anchor")?,
        entries: u64::try_from(entries).map_err(|_| corrupt("a negative entry count"))?,
    })
}

/// `Store::audit_partitions`' statement: each partition row with the count of
/// its entries (one scan of the entries, grouped).
pub fn partitions_statement(entries: &str, partitions: &str) -> String {
    format!(
        "SELECT p.instance, p.head, p.anchor, COALESCE(c.n, 0) AS entries \
         FROM {partitions} p \
         LEFT JOIN (SELECT instance, count(*) AS n FROM {entries} GROUP BY instance) c \
         ON c.instance = p.instance ORDER BY p.instance"
    )
}

fn hash<R>(row: &R, name: &str) -> Result<ChainHash, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let bytes: Vec<u8> = row.try_get(name).map_err(StoreError::corrupt)?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|_| corrupt("a journal hash is not 32 bytes"))?;
    Ok(ChainHash::from_bytes(bytes))
}

/// An entry's columns as both stores bind them, in [`AUDIT_COLUMNS`] order
/// without `seq` (which the store assigns).
#[derive(Debug)]
pub struct AuditColumns {
    /// `at_ms`.
    pub at_ms: i64,
    /// `event`.
    pub event: &'static str,
    /// `operation_id`.
    pub operation_id: Option<String>,
    /// `method`.
    pub method: String,
    /// `route`.
    pub route: String,
    /// `principal`.
    pub principal: String,
    /// `key_digest`.
    pub key_digest: String,
    /// `fingerprint`.
    pub fingerprint: Option<String>,
    /// `status`.
    pub status: Option<i64>,
    /// `duration_ms`.
    pub duration_ms: Option<i64>,
    /// `instance`.
    pub instance: String,
    /// `prev`.
    pub prev: Vec<u8>,
    /// `hash`.
    pub hash: Vec<u8>,
}

impl AuditColumns {
    /// `record` written at `at_ms`, linked after `prev`: its columns and its
    /// hash, which is the partition's next `prev`.
    pub fn seal(record: &AuditRecord, at_ms: i64, prev: ChainHash) -> (Self, ChainHash) {
        let hash = chain_hash(&prev, Timestamp::from_millis(at_ms), record);
        let columns = Self {
            at_ms,
            event: record.event().as_str(),
            operation_id: record.operation_id.clone(),
            method: record.method.clone(),
            route: record.route.clone(),
            principal: record.principal.clone(),
            key_digest: record.key_digest.clone(),
            fingerprint: record.fingerprint.clone(),
            status: record.status.map(i64::from),
            duration_ms: record
                .duration_ms
                .map(|d| i64::try_from(d).unwrap_or(i64::MAX)),
            instance: record.instance.clone(),
            prev: prev.as_bytes().to_vec(),
            hash: hash.as_bytes().to_vec(),
        };
        (columns, hash)
    }
}

/// At most this many entries per `INSERT` of [`push_audit_rows`]: 13 bound
/// parameters each stays under SQLite's 32,766.
pub const AUDIT_ROWS_PER_INSERT: usize = 1024;

/// One multi-row `INSERT` of `rows` into `table` (at most
/// [`AUDIT_ROWS_PER_INSERT`]), in their order — so the store's `seq` follows
/// the chain — pushed onto `builder` (after a `WITH` clause of the caller's,
/// say). One statement per batch, not one per entry: on SQLite every statement
/// is a trip to sqlx's worker thread. (PostgreSQL binds one array per column
/// instead, so that one statement text serves every batch size.)
pub fn push_audit_rows<DB>(
    builder: &mut QueryBuilder<DB>,
    table: &str,
    rows: impl IntoIterator<Item = AuditColumns>,
) where
    DB: Database,
    DB::Arguments: Default,
    for<'t> i64: Encode<'t, DB> + Type<DB>,
    for<'t> Option<i64>: Encode<'t, DB> + Type<DB>,
    for<'t> String: Encode<'t, DB> + Type<DB>,
    for<'t> Option<String>: Encode<'t, DB> + Type<DB>,
    for<'t> Vec<u8>: Encode<'t, DB> + Type<DB>,
{
    builder.push(format!(
        "INSERT INTO {table} (at_ms, event, operation_id, method, route, principal, \
             key_digest, fingerprint, status, duration_ms, instance, prev, hash) "
    ));
    builder.push_values(rows, |mut row, columns| {
        row.push_bind(columns.at_ms)
            .push_bind(columns.event.to_owned())
            .push_bind(columns.operation_id)
            .push_bind(columns.method)
            .push_bind(columns.route)
            .push_bind(columns.principal)
            .push_bind(columns.key_digest)
            .push_bind(columns.fingerprint)
            .push_bind(columns.status)
            .push_bind(columns.duration_ms)
            .push_bind(columns.instance)
            .push_bind(columns.prev)
            .push_bind(columns.hash);
    });
}

/// A row's `BLOB`/`BYTEA` as a chain hash (a head or anchor read back).
pub fn chain_hash_of(bytes: Vec<u8>) -> Result<ChainHash, StoreError> {
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|_| corrupt("a journal head is not 32 bytes"))?;
    Ok(ChainHash::from_bytes(bytes))
}
