//! Streams recorded in pieces (`Store::append_stream_piece`, PROTOCOL §20):
//! `<table>_stream_pieces`, one row per (record identity, operation id,
//! token, index). An append is one fenced `INSERT … SELECT` through the
//! writer (the record row must still hold the lease); a read is one `SELECT`
//! on the readers' pool joined to the record row, so it sees nothing once the
//! record no longer names the run.
//!
//! Pieces go with their record: triggers delete a record's pieces when its
//! row is deleted (purge, eviction, deletion) and an earlier run's pieces when
//! a claim gives the row a new token (a takeover, or a new operation on an
//! expired record). Triggers rather than a foreign key, so they hold on a pool
//! of the application's own whose connections have `foreign_keys` off.

use bytes::Bytes;
use idemgate_core::StoreError;
use idemgate_core::stream::StreamId;
use idemgate_sqlx::token_param;
use sqlx::{AssertSqlSafe, SqlitePool};

use crate::error::store_error;
use crate::sql::{NOW, quote};
use crate::writer::Statement;

/// The statements over the pieces table of one record table.
#[derive(Debug)]
pub(crate) struct PieceStatements {
    append: String,
    read: String,
}

impl PieceStatements {
    pub(crate) fn new(table: &str) -> Self {
        let t = quote(table);
        let p = quote(&pieces_table(table));
        Self {
            append: format!(
                "INSERT INTO {p} (identity, operation_id, token, idx, piece) \
                 SELECT identity, operation_id, token, ?4, ?5 FROM {t} \
                 WHERE identity = ?1 AND operation_id = ?2 AND token = ?3 \
                     AND status = 'PROCESSING' AND expires_at > {NOW} \
                 ON CONFLICT (identity, operation_id, token, idx) \
                 DO UPDATE SET piece = excluded.piece"
            ),
            read: format!(
                "SELECT p.piece FROM {p} p JOIN {t} r \
                     ON r.identity = p.identity AND r.operation_id = p.operation_id \
                     AND r.token = p.token \
                 WHERE p.identity = ?1 AND p.operation_id = ?2 AND p.token = ?3 \
                     AND p.idx >= ?4 AND p.idx < ?4 + ?5 AND r.expires_at > {NOW} \
                 ORDER BY p.idx"
            ),
        }
    }

    /// The fenced append of piece `index` of `stream`, for the writer; `None`
    /// for a token no record can hold.
    pub(crate) fn append(&self, stream: &StreamId, index: u32, piece: &Bytes) -> Option<Statement> {
        Some(
            sqlx::query(AssertSqlSafe(self.append.clone()))
                .bind(stream.identity.as_bytes().to_vec())
                .bind(stream.operation_id.as_uuid())
                .bind(token_param(stream.token)?)
                .bind(i64::from(index))
                .bind(piece.to_vec()),
        )
    }

    /// Pieces `from..from + limit` of `stream` that are there, in order,
    /// stopping at the first missing one.
    pub(crate) async fn read(
        &self,
        pool: &SqlitePool,
        stream: &StreamId,
        from: u32,
        limit: u32,
    ) -> Result<Vec<Bytes>, StoreError> {
        let Some(token) = token_param(stream.token) else {
            return Ok(Vec::new());
        };
        let rows: Vec<Vec<u8>> = sqlx::query_scalar(AssertSqlSafe(self.read.clone()))
            .bind(stream.identity.as_bytes().to_vec())
            .bind(stream.operation_id.as_uuid())
            .bind(token)
            .bind(i64::from(from))
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await
            .map_err(store_error)?;
        // Appended densely, so a short read is the end of what is there.
        Ok(rows.into_iter().map(Bytes::from).collect())
    }
}

fn pieces_table(table: &str) -> String {
    format!("{table}_stream_pieces")
}

/// The statements that take schema version 5 to 6: the pieces table and the
/// triggers that remove pieces with their record or their run.
pub(crate) fn schema(table: &str) -> Vec<String> {
    let t = quote(table);
    let p = quote(&pieces_table(table));
    let gone = quote(&format!("{table}_stream_pieces_gone"));
    let superseded = quote(&format!("{table}_stream_pieces_superseded"));
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {p} ( \
                 identity     BLOB    NOT NULL CHECK (length(identity) = 32), \
                 operation_id BLOB    NOT NULL CHECK (length(operation_id) = 16), \
                 token        INTEGER NOT NULL, \
                 idx          INTEGER NOT NULL CHECK (idx >= 0), \
                 piece        BLOB    NOT NULL, \
                 PRIMARY KEY (identity, operation_id, token, idx) \
             ) STRICT, WITHOUT ROWID"
        ),
        format!(
            "CREATE TRIGGER IF NOT EXISTS {gone} AFTER DELETE ON {t} \
             BEGIN DELETE FROM {p} WHERE identity = OLD.identity; END"
        ),
        format!(
            "CREATE TRIGGER IF NOT EXISTS {superseded} AFTER UPDATE OF token ON {t} \
             WHEN NEW.token <> OLD.token \
             BEGIN DELETE FROM {p} WHERE identity = OLD.identity \
                 AND operation_id = OLD.operation_id AND token = OLD.token; END"
        ),
    ]
}
