//! A streamed answer's record in pieces (`idemgate_core::stream`):
//! `<table>_stream_pieces`, one row per (identity, operation id, token, index),
//! each row a piece of the run that the operation id and token name.
//!
//! - **Append** (`Store::append_stream_piece`): one statement. It reads the
//!   record under the same fence as a completion (identity, operation id, token,
//!   `PROCESSING`, not expired) `FOR SHARE`, and inserts the piece from that row
//!   (`ON CONFLICT … DO UPDATE`: an index appended again is replaced). The share
//!   lock orders the append with the run's end, a takeover, a delete and a
//!   waiter's mark, which all update that row: an append that meets one of them
//!   in flight waits for it and re-checks the fence on the row's newest version
//!   (zero rows: [`FencedWrite::Refused`]), and one that ends the run waits for
//!   the append. (The foreign key would take a `FOR KEY SHARE` lock on that row
//!   anyway; the share lock costs nothing more.) The statement announces the
//!   piece like the end of a run when the record is marked `waited`
//!   (`crate::changes`), with a payload that says "a piece", so it wakes other
//!   instances' waiters without ending their mark.
//! - **Read** (`Store::read_stream_pieces`): one statement joining the record,
//!   so pieces come back only while the record still names their run (same
//!   operation id and token, not expired), in index order, from `from`, at most
//!   `limit`; the first missing index ends what is returned.
//! - **Lifetime**: the pieces reference their record (`ON DELETE CASCADE`), so
//!   they go with the row: purge, eviction, deletion. A claim that reuses the
//!   row — a takeover (new token) or the replacement of an expired record (new
//!   operation id) — leaves the earlier run's pieces in place until the row is
//!   deleted; no read ever returns them (the record no longer names their run).
//!   Removing them in the claim statement would add a write to every claim of a
//!   reused row, the hot path, for rows that mostly have no pieces at all.

use bytes::Bytes;
use idemgate_core::stream::StreamId;
use idemgate_core::{FencedWrite, Lease, StoreError};
use idemgate_sqlx::{applied, token_param};
use sqlx::{AssertSqlSafe, PgPool, Row};

use crate::changes;
use crate::error::store_error;
use crate::sql::{FENCE, Names};

/// The statements over the pieces table of one record table.
#[derive(Debug)]
pub(crate) struct PieceStatements {
    /// `$1`–`$3` the fence, `$4` the index, `$5` the piece: one row when
    /// appended, none when the fence refused it.
    append: String,
    /// `$1`–`$3` the run, `$4` the first index, `$5` the most pieces (both
    /// `bigint`): `(idx, piece)` rows in index order.
    read: String,
}

impl PieceStatements {
    pub(crate) fn new(names: &Names) -> Self {
        let t = names.table();
        let p = names.suffixed("stream_pieces");
        let channel = changes::channel(&t);
        let piece = changes::PIECE_SUFFIX;
        Self {
            append: format!(
                "WITH run AS MATERIALIZED ( \
                     SELECT identity, operation_id, token, waited FROM {t} \
                     WHERE {FENCE} FOR SHARE), \
                 added AS ( \
                     INSERT INTO {p} (identity, operation_id, token, idx, piece) \
                     SELECT identity, operation_id, token, $4, $5 FROM run \
                     ON CONFLICT (identity, operation_id, token, idx) \
                     DO UPDATE SET piece = EXCLUDED.piece \
                     RETURNING 1) \
                 SELECT CASE WHEN run.waited \
                     THEN pg_notify('{channel}', encode(run.identity, 'hex') || '{piece}') END \
                 FROM run, added"
            ),
            read: format!(
                "SELECT p.idx, p.piece FROM {t} r \
                 JOIN {p} p ON p.identity = r.identity AND p.operation_id = r.operation_id \
                     AND p.token = r.token \
                 WHERE r.identity = $1 AND r.operation_id = $2 AND r.token = $3 \
                     AND r.expires_at > clock_timestamp() \
                     AND p.idx >= $4 AND p.idx < $4 + $5 \
                 ORDER BY p.idx LIMIT $5"
            ),
        }
    }
}

/// The statements that take schema version 6 to 7: the pieces table.
pub(crate) fn schema(names: &Names) -> Vec<String> {
    vec![format!(
        "CREATE TABLE IF NOT EXISTS {} ( \
             identity     BYTEA   NOT NULL, \
             operation_id UUID    NOT NULL, \
             token        BIGINT  NOT NULL, \
             idx          INTEGER NOT NULL CHECK (idx >= 0), \
             piece        BYTEA   NOT NULL, \
             PRIMARY KEY (identity, operation_id, token, idx), \
             FOREIGN KEY (identity) REFERENCES {} (identity) ON DELETE CASCADE \
         )",
        names.suffixed("stream_pieces"),
        names.table()
    )]
}

/// Appends piece `index` of `lease`'s run; see the module docs. An index or a
/// token beyond the columns' range is refused: nothing is kept.
pub(crate) async fn append(
    pool: &PgPool,
    statements: &PieceStatements,
    lease: &Lease,
    index: u32,
    piece: &Bytes,
) -> Result<FencedWrite, StoreError> {
    let (Some(token), Ok(index)) = (token_param(lease.token), i32::try_from(index)) else {
        return Ok(FencedWrite::Refused);
    };
    let done = sqlx::query(AssertSqlSafe(statements.append.as_str()))
        .bind(lease.identity.as_bytes().as_slice())
        .bind(lease.operation_id.as_uuid())
        .bind(token)
        .bind(index)
        .bind(piece.as_ref())
        .execute(pool)
        .await
        .map_err(store_error)?;
    Ok(applied(done.rows_affected()))
}

/// At most `limit` pieces of `stream` from `from` on; see the module docs.
pub(crate) async fn read(
    pool: &PgPool,
    statements: &PieceStatements,
    stream: &StreamId,
    from: u32,
    limit: u32,
) -> Result<Vec<Bytes>, StoreError> {
    let Some(token) = token_param(stream.token) else {
        return Ok(Vec::new());
    };
    if limit == 0 {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(AssertSqlSafe(statements.read.as_str()))
        .bind(stream.identity.as_bytes().as_slice())
        .bind(stream.operation_id.as_uuid())
        .bind(token)
        .bind(i64::from(from))
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await
        .map_err(store_error)?;
    let mut pieces = Vec::with_capacity(rows.len());
    for (expected, row) in (i64::from(from)..).zip(&rows) {
        let index: i32 = row.try_get("idx").map_err(StoreError::corrupt)?;
        // Pieces are appended in order: a missing one ends the stream so far.
        if i64::from(index) != expected {
            break;
        }
        let piece: Vec<u8> = row.try_get("piece").map_err(StoreError::corrupt)?;
        pieces.push(Bytes::from(piece));
    }
    Ok(pieces)
}
