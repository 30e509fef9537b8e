//! The SQL the store runs, built once per store from its (quoted) table name.

use std::sync::Arc;

/// The default record table.
pub(crate) const DEFAULT_TABLE: &str = "idemgate_records";

/// The table that keeps the schema version of each idemgate record table.
pub(crate) const VERSION_TABLE: &str = "idemgate_schema_versions";

/// The store's clock: SQLite's `'now'` in whole milliseconds since the Unix epoch.
/// SQLite reads the machine's clock, and every connection to a WAL database runs on
/// that one machine, so all instances share it. Within one statement step it has one
/// value.
pub(crate) const NOW: &str = "CAST(round(unixepoch('subsec') * 1000) AS INTEGER)";

/// What a write transaction begins with: it takes the write lock at once, so a
/// transaction never has to upgrade a read lock (which fails at once with
/// `SQLITE_BUSY` instead of waiting). The store, its migration and [`crate::Tx`]
/// all begin with it.
pub(crate) const BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";

/// Quotes an identifier, so any name is safe to splice into SQL.
pub(crate) fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// The fence every write after the claim carries: `?1` identity, `?2` operation id,
/// `?3` token.
fn fence() -> String {
    format!(
        "identity = ?1 AND operation_id = ?2 AND token = ?3 \
         AND status = 'PROCESSING' AND expires_at > {NOW}"
    )
}

/// The statements of one store.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) now: Arc<str>,
    pub(crate) claim: Arc<str>,
    pub(crate) read_at: Arc<str>,
    pub(crate) read: Arc<str>,
    pub(crate) complete: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) delete: Arc<str>,
    pub(crate) evict: Arc<str>,
    pub(crate) evict_refused: Arc<str>,
    pub(crate) purge: Arc<str>,
    pub(crate) acquire_resource_lease: Arc<str>,
    pub(crate) release_resource_lease: Arc<str>,
}

/// The resource lease table of record table `table` (`<table>_resource_leases`).
pub(crate) fn resource_lease_table(table: &str) -> String {
    format!("{table}_resource_leases")
}

/// What a read selects, named as `idemgate_sqlx::decode_snapshot` reads them.
const RECORD_COLUMNS: &str = "fingerprint, field_digests, format_version, operation_id, token, status, \
     locked_until AS locked_until_ms, response_status, response_headers, response_body, \
     body_retained, created_at AS created_ms, expires_at AS expires_ms";

impl Statements {
    pub(crate) fn new(table: &str) -> Self {
        let t = quote(table);
        let fence = fence();
        // `?9` is the clock reading taken inside the claim's IMMEDIATE transaction.
        let expired = "r.expires_at <= ?9";
        // The upsert's `WHERE` restates `Record::claim_origin` (PROTOCOL §6.2) in
        // SQL: same fingerprint, and `RELEASED` or a lapsed lease (or expired).
        let claim = format!(
            "INSERT INTO {t} AS r (identity, principal, method, path, idempotency_key, \
                 fingerprint, format_version, operation_id, token, status, lease_origin, \
                 locked_until, created_at, expires_at, field_digests) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 1, 'PROCESSING', 'NEW', \
                 ?9 + ?10, ?9, ?9 + ?11, ?12) \
             ON CONFLICT (identity) DO UPDATE SET \
                 fingerprint = excluded.fingerprint, \
                 field_digests = excluded.field_digests, \
                 format_version = CASE WHEN {expired} THEN excluded.format_version \
                     ELSE r.format_version END, \
                 operation_id = CASE WHEN {expired} THEN excluded.operation_id \
                     ELSE r.operation_id END, \
                 token = r.token + 1, \
                 status = 'PROCESSING', \
                 lease_origin = CASE WHEN {expired} THEN 'NEW' \
                     WHEN r.status = 'RELEASED' THEN 'RELEASED' ELSE 'TAKEN_OVER' END, \
                 locked_until = excluded.locked_until, \
                 response_status = NULL, response_headers = NULL, response_body = NULL, \
                 body_retained = NULL, \
                 created_at = CASE WHEN {expired} THEN excluded.created_at \
                     ELSE r.created_at END, \
                 expires_at = CASE WHEN {expired} THEN excluded.expires_at \
                     ELSE max(r.expires_at, excluded.expires_at) END \
             WHERE {expired} \
                OR (r.fingerprint = excluded.fingerprint AND (r.status = 'RELEASED' \
                    OR (r.status = 'PROCESSING' AND (r.locked_until IS NULL \
                        OR r.locked_until <= ?9)))) \
             RETURNING operation_id, token, lease_origin, locked_until AS locked_until_ms"
        );
        let read_at = format!(
            "SELECT {RECORD_COLUMNS}, ?2 AS now_ms FROM {t} WHERE identity = ?1 AND expires_at > ?2"
        );
        let read = format!(
            "SELECT {RECORD_COLUMNS}, {NOW} AS now_ms FROM {t} \
             WHERE identity = ?1 AND expires_at > {NOW}"
        );
        let complete = format!(
            "UPDATE {t} SET status = ?4, locked_until = NULL, response_status = ?5, \
                 response_headers = ?6, response_body = ?7, body_retained = ?8, \
                 expires_at = {NOW} + ?9 \
             WHERE {fence}"
        );
        let release =
            format!("UPDATE {t} SET status = 'RELEASED', locked_until = NULL WHERE {fence}");
        let renew = format!("UPDATE {t} SET locked_until = {NOW} + ?4 WHERE {fence}");
        let delete = format!("DELETE FROM {t} WHERE {fence}");
        // The operator's eviction runs in an IMMEDIATE transaction (the write lock
        // held from the start, `?2` its clock reading): the delete removes the live
        // record unless `?3` (force) is false and its lease is live; when it removed
        // nothing, `evict_refused` reports the live lease that stopped it, if any.
        let evict = format!(
            "DELETE FROM {t} WHERE identity = ?1 AND expires_at > ?2 \
                 AND (?3 OR status <> 'PROCESSING' OR locked_until IS NULL \
                     OR locked_until <= ?2) \
             RETURNING status, locked_until AS locked_until_ms, ?2 AS now_ms, 1 AS evicted"
        );
        let evict_refused = format!(
            "SELECT status, locked_until AS locked_until_ms, ?2 AS now_ms, 0 AS evicted \
             FROM {t} WHERE identity = ?1 AND expires_at > ?2"
        );
        let purge = format!(
            "DELETE FROM {t} WHERE rowid IN ( \
                 SELECT rowid FROM {t} WHERE expires_at <= {NOW} LIMIT ?1)"
        );
        let leases = quote(&resource_lease_table(table));
        // The resource lease's acquisition, one statement that always returns the
        // row: the proposed token (`?2`) replaces a lapsed lease, a live one stays
        // (every `CASE` reads the row as it was). The caller compares the
        // returned token with its own (`idemgate_sqlx::decode_lease_acquisition`).
        // `NOW` has one value within the statement's one step.
        let lapsed = "l.expires_at <= excluded.acquired_at";
        let acquire_resource_lease = format!(
            "INSERT INTO {leases} AS l (resource, token, acquired_at, expires_at) \
             VALUES (?1, ?2, {NOW}, {NOW} + ?3) \
             ON CONFLICT (resource) DO UPDATE SET \
                 token = CASE WHEN {lapsed} THEN excluded.token ELSE l.token END, \
                 acquired_at = CASE WHEN {lapsed} THEN excluded.acquired_at \
                     ELSE l.acquired_at END, \
                 expires_at = CASE WHEN {lapsed} THEN excluded.expires_at \
                     ELSE l.expires_at END \
             RETURNING token, expires_at AS until_ms, {NOW} AS now_ms"
        );
        // Fenced by the token, and only while live: a lapsed row stays until the
        // next acquisition replaces it.
        let release_resource_lease = format!(
            "DELETE FROM {leases} WHERE resource = ?1 AND token = ?2 AND expires_at > {NOW}"
        );
        Self {
            now: format!("SELECT {NOW}").into(),
            claim: claim.into(),
            read_at: read_at.into(),
            read: read.into(),
            complete: complete.into(),
            release: release.into(),
            renew: renew.into(),
            delete: delete.into(),
            evict: evict.into(),
            evict_refused: evict_refused.into(),
            purge: purge.into(),
            acquire_resource_lease: acquire_resource_lease.into(),
            release_resource_lease: release_resource_lease.into(),
        }
    }
}

/// The schema version this build writes: 1 the record table, 2 its resource
/// lease table, 3 the records' `field_digests`, 4 the journal's tables
/// (`crate::audit`), 5 the routes' execution histories (`crate::durations`),
/// 6 the streams recorded in pieces (`crate::pieces`), 7 the journal's chain
/// kept by triggers (`crate::audit`).
pub const SCHEMA_VERSION: i64 = 7;

/// The statements that create schema version 1, in order.
pub(crate) fn schema_v1(table: &str) -> Vec<String> {
    let t = quote(table);
    let index = quote(&format!("{table}_expires_at_idx"));
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {t} ( \
                 identity         BLOB    NOT NULL PRIMARY KEY CHECK (length(identity) = 32), \
                 principal        TEXT    NOT NULL, \
                 method           TEXT    NOT NULL, \
                 path             TEXT    NOT NULL, \
                 idempotency_key  TEXT    NOT NULL, \
                 fingerprint      BLOB    NOT NULL CHECK (length(fingerprint) = 32), \
                 format_version   INTEGER NOT NULL, \
                 operation_id     BLOB    NOT NULL CHECK (length(operation_id) = 16), \
                 token            INTEGER NOT NULL, \
                 status           TEXT    NOT NULL CHECK (status IN \
                                      ('PROCESSING', 'COMPLETED', 'FAILED', 'RELEASED')), \
                 lease_origin     TEXT    NOT NULL CHECK (lease_origin IN \
                                      ('NEW', 'RELEASED', 'TAKEN_OVER')), \
                 locked_until     INTEGER, \
                 response_status  INTEGER, \
                 response_headers BLOB, \
                 response_body    BLOB, \
                 body_retained    INTEGER CHECK (body_retained IN (0, 1)), \
                 created_at       INTEGER NOT NULL, \
                 expires_at       INTEGER NOT NULL, \
                 CHECK (status NOT IN ('COMPLETED', 'FAILED') OR (response_status IS NOT NULL \
                     AND response_headers IS NOT NULL AND body_retained IS NOT NULL)), \
                 CHECK (body_retained IS NOT 1 OR response_body IS NOT NULL) \
             ) STRICT"
        ),
        format!("CREATE INDEX IF NOT EXISTS {index} ON {t} (expires_at)"),
    ]
}

/// The statements that take schema version 1 to 2: the resource lease table
/// (`Store::acquire_resource_lease`), one row per resource whose lease was
/// taken; a lapsed row is replaced by the next acquisition.
pub(crate) fn schema_v2(table: &str) -> Vec<String> {
    let leases = quote(&resource_lease_table(table));
    vec![format!(
        "CREATE TABLE IF NOT EXISTS {leases} ( \
             resource    BLOB    NOT NULL PRIMARY KEY CHECK (length(resource) = 32), \
             token       BLOB    NOT NULL CHECK (length(token) = 16), \
             acquired_at INTEGER NOT NULL, \
             expires_at  INTEGER NOT NULL \
         ) STRICT"
    )]
}

/// The column schema version 3 adds: the first request's per-field digests
/// (`idemgate_core::fingerprint::FieldDigests::encode`), so a 422 can name the
/// fields another body changed; `NULL` for a body that is not JSON and for the
/// records of earlier builds. Added only where missing (SQLite has no
/// `ADD COLUMN IF NOT EXISTS`): see `migrate::run`.
pub(crate) const FIELD_DIGESTS_COLUMN: &str = "field_digests";

/// The statement that takes schema version 2 to 3.
pub(crate) fn schema_v3(table: &str) -> String {
    format!(
        "ALTER TABLE {} ADD COLUMN {FIELD_DIGESTS_COLUMN} BLOB",
        quote(table)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
        assert!(
            Statements::new("t")
                .claim
                .contains("INSERT INTO \"t\" AS r")
        );
    }
}
