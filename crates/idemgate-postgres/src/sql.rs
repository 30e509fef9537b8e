//! The SQL the store runs, built once per store from its (quoted) table names.

use std::sync::Arc;

/// The default record table.
pub(crate) const DEFAULT_TABLE: &str = "idemgate_records";

/// The table that keeps the schema version of each idemgate record table.
pub(crate) const VERSION_TABLE: &str = "idemgate_schema_versions";

/// Quotes an identifier, so any name is safe to splice into SQL.
pub(crate) fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Where the store's objects live.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    /// The schema, or `None` for the connection's `search_path`.
    pub(crate) schema: Option<String>,
    /// The record table's unqualified name.
    pub(crate) table: String,
}

impl Names {
    fn qualify(&self, name: &str) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", quote(schema), quote(name)),
            None => quote(name),
        }
    }

    pub(crate) fn table(&self) -> String {
        self.qualify(&self.table)
    }

    pub(crate) fn versions(&self) -> String {
        self.qualify(VERSION_TABLE)
    }

    /// The resource lease table of the record table (`<table>_resource_leases`).
    pub(crate) fn resource_leases(&self) -> String {
        self.qualify(&format!("{}_resource_leases", self.table))
    }

    /// A table named after the record table (`<table>_<suffix>`).
    pub(crate) fn suffixed(&self, suffix: &str) -> String {
        self.qualify(&format!("{}_{suffix}", self.table))
    }

    pub(crate) fn sequence(&self) -> String {
        self.qualify(&format!("{}_token_seq", self.table))
    }

    /// Index names are never schema-qualified: an index lives with its table.
    pub(crate) fn expires_index(&self) -> String {
        quote(&format!("{}_expires_at_idx", self.table))
    }
}

/// Milliseconds since the epoch of a `timestamptz` expression, rounded down.
fn ms(expr: &str) -> String {
    format!("floor(extract(epoch FROM {expr}) * 1000)::bigint")
}

/// The fence every write after the claim carries: `$1` identity, `$2` operation id,
/// `$3` token.
pub(crate) const FENCE: &str = "identity = $1 AND operation_id = $2 AND token = $3 \
     AND status = 'PROCESSING' AND expires_at > clock_timestamp()";

/// The custom setting where a one-transaction claim's `BEGIN` keeps the
/// session's `lock_timeout`, for the claim to restore once it holds the record
/// (`crate::tx`).
pub(crate) const OUTER_LOCK_TIMEOUT: &str = "idemgate.outer_lock_timeout";

/// The statements of one store.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) claim: Arc<str>,
    /// The claim as the first statement of a business transaction (the
    /// one-transaction mode, `crate::tx`): the same statement, which also lifts
    /// the transaction's `lock_timeout` once it holds the record, back to what
    /// it was before `BEGIN` ([`OUTER_LOCK_TIMEOUT`]), so the handler's own
    /// statements are not bounded by the claim's wait — in the claim's round
    /// trip, not one of its own.
    pub(crate) claim_in_transaction: Arc<str>,
    pub(crate) read: Arc<str>,
    pub(crate) complete: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) delete: Arc<str>,
    pub(crate) evict: Arc<str>,
    /// Marks a record in progress as waited on (`$1` identity): one row, the
    /// count of rows marked (0: the run ended, or there is no live record).
    pub(crate) mark_waited: Arc<str>,
    pub(crate) purge: Arc<str>,
    pub(crate) acquire_resource_lease: Arc<str>,
    pub(crate) release_resource_lease: Arc<str>,
}

impl Statements {
    pub(crate) fn new(names: &Names) -> Self {
        let t = names.table();
        let seq = names.sequence();
        // How the claim came about is written to `lease_origin` by the statement
        // itself (an insert says 'NEW'), rather than read from `xmax = 0`: system
        // columns cannot be returned from a partitioned table.
        // `expired` is judged against the statement's one clock reading, which the
        // proposed row carries as `EXCLUDED.created_at`.
        let expired = "r.expires_at <= EXCLUDED.created_at";
        // One round trip for every outcome. `blocking` reads, in the statement's
        // snapshot, a live record this request cannot claim (another fingerprint,
        // a final response, a live lease): then nothing is inserted, no row is
        // locked and no transaction id is taken, so a replay, a 409 or a 422 is a
        // plain read (no WAL flush at commit) that returns the record itself.
        // Otherwise the upsert runs as the atomic claim; if it meets a row our
        // snapshot did not see and cannot take it, the statement returns nothing
        // and the caller reads the record separately.
        // The upsert's `WHERE` restates `Record::claim_origin` (PROTOCOL §6.2) in
        // SQL: same fingerprint, and `RELEASED` or a lapsed lease (or expired).
        let claim_statement = |lift: &str| {
            format!(
                "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t), \
             blocking AS MATERIALIZED ( \
                 SELECT r.fingerprint, r.field_digests, r.format_version, r.operation_id, \
                     r.token, r.status, \
                     {locked_until} AS locked_until_ms, r.response_status, r.response_headers, \
                     r.response_body, r.body_retained, {created} AS created_ms, \
                     {expires} AS expires_ms, {now_ms} AS now_ms \
                 FROM now JOIN {t} r ON r.identity = $1 AND r.expires_at > now.t \
                 WHERE NOT (r.fingerprint = $6 AND (r.status = 'RELEASED' \
                     OR (r.status = 'PROCESSING' AND (r.locked_until IS NULL \
                         OR r.locked_until <= now.t))))), \
             claimed AS ( \
             INSERT INTO {t} AS r (identity, principal, method, path, idempotency_key, \
                 fingerprint, format_version, operation_id, token, status, lease_origin, \
                 locked_until, created_at, expires_at, field_digests) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, nextval('{seq_literal}'), 'PROCESSING', 'NEW', \
                 now.t + $9 * interval '1 millisecond', now.t, \
                 now.t + $10 * interval '1 millisecond', $11 \
             FROM now WHERE NOT EXISTS (SELECT 1 FROM blocking) \
             ON CONFLICT (identity) DO UPDATE SET \
                 fingerprint = EXCLUDED.fingerprint, \
                 field_digests = EXCLUDED.field_digests, \
                 format_version = CASE WHEN {expired} THEN EXCLUDED.format_version \
                     ELSE r.format_version END, \
                 operation_id = CASE WHEN {expired} THEN EXCLUDED.operation_id \
                     ELSE r.operation_id END, \
                 token = EXCLUDED.token, \
                 status = 'PROCESSING', \
                 lease_origin = CASE WHEN {expired} THEN 'NEW' \
                     WHEN r.status = 'RELEASED' THEN 'RELEASED' ELSE 'TAKEN_OVER' END, \
                 locked_until = EXCLUDED.locked_until, \
                 response_status = NULL, response_headers = NULL, response_body = NULL, \
                 body_retained = NULL, \
                 created_at = CASE WHEN {expired} THEN EXCLUDED.created_at \
                     ELSE r.created_at END, \
                 expires_at = CASE WHEN {expired} THEN EXCLUDED.expires_at \
                     ELSE GREATEST(r.expires_at, EXCLUDED.expires_at) END \
             WHERE {expired} \
                OR (r.fingerprint = EXCLUDED.fingerprint AND (r.status = 'RELEASED' \
                    OR (r.status = 'PROCESSING' AND (r.locked_until IS NULL \
                        OR r.locked_until <= EXCLUDED.created_at)))) \
             RETURNING r.operation_id, r.token, r.lease_origin{lift} \
                 {locked_until} AS locked_until_ms) \
             SELECT 'claimed' AS outcome, c.operation_id, c.token, c.lease_origin, \
                 c.locked_until_ms, NULL::bytea AS fingerprint, NULL::bytea AS field_digests, \
                 NULL::integer AS format_version, \
                 NULL::text AS status, NULL::integer AS response_status, \
                 NULL::bytea AS response_headers, NULL::bytea AS response_body, \
                 NULL::boolean AS body_retained, NULL::bigint AS created_ms, \
                 NULL::bigint AS expires_ms, NULL::bigint AS now_ms \
             FROM claimed c \
             UNION ALL \
             SELECT 'existing', b.operation_id, b.token, NULL, b.locked_until_ms, \
                 b.fingerprint, b.field_digests, b.format_version, b.status, b.response_status, \
                 b.response_headers, b.response_body, b.body_retained, b.created_ms, \
                 b.expires_ms, b.now_ms \
             FROM blocking b",
                // nextval takes the sequence's name as a string literal.
                seq_literal = seq.replace('\'', "''"),
                locked_until = ms("r.locked_until"),
                created = ms("r.created_at"),
                expires = ms("r.expires_at"),
                now_ms = ms("now.t"),
            )
        };
        let read = format!(
            "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t) \
             SELECT r.fingerprint, r.field_digests, r.format_version, r.operation_id, \
                 r.token, r.status, \
                 {locked_until} AS locked_until_ms, r.response_status, r.response_headers, \
                 r.response_body, r.body_retained, {created} AS created_ms, \
                 {expires} AS expires_ms, {now} AS now_ms \
             FROM now JOIN {t} r ON r.identity = $1 AND r.expires_at > now.t",
            locked_until = ms("r.locked_until"),
            created = ms("r.created_at"),
            expires = ms("r.expires_at"),
            now = ms("now.t"),
        );
        // The statements that end a run announce it when someone waits for it
        // (`crate::changes`): one row per row written, so the rows affected still
        // say whether the fenced write applied.
        let channel = crate::changes::channel(&t);
        let announced = |write: &str| {
            format!(
                "WITH done AS ({write} RETURNING identity, waited) \
                 SELECT CASE WHEN done.waited \
                     THEN pg_notify('{channel}', encode(done.identity, 'hex')) END \
                 FROM done"
            )
        };
        let complete = announced(&complete_update(names));
        let release = announced(&format!(
            "UPDATE {t} SET status = 'RELEASED', locked_until = NULL WHERE {FENCE}"
        ));
        // Only while in progress: a mark that finds the run ended (it waits for a
        // concurrent completion of the row, then re-reads it) marks nothing, and
        // the waiter reads at once.
        let mark_waited = format!(
            "WITH marked AS (UPDATE {t} SET waited = true \
                 WHERE identity = $1 AND status = 'PROCESSING' \
                 AND expires_at > clock_timestamp() RETURNING 1) \
             SELECT count(*) FROM marked"
        );
        let renew = format!(
            "UPDATE {t} SET locked_until = clock_timestamp() + $4 * interval '1 millisecond' \
             WHERE {FENCE}"
        );
        let delete = announced(&format!("DELETE FROM {t} WHERE {FENCE}"));
        // The operator's eviction, one statement: `target` locks the live record
        // (`FOR UPDATE` re-reads a row a concurrent claim or completion just
        // changed, so `evicted` is judged on its newest version) and decides, `gone`
        // deletes it when allowed, and the row says which. `$2` forces. No row: no
        // live record.
        let evict = format!(
            "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t), \
             target AS MATERIALIZED ( \
                 SELECT r.identity, r.status, r.locked_until, \
                     ($2 OR r.status <> 'PROCESSING' OR r.locked_until IS NULL \
                         OR r.locked_until <= now.t) AS evicted \
                 FROM now JOIN {t} r ON r.identity = $1 AND r.expires_at > now.t \
                 FOR UPDATE OF r), \
             gone AS ( \
                 DELETE FROM {t} d USING target \
                 WHERE d.identity = target.identity AND target.evicted \
                 RETURNING d.identity, d.waited) \
             SELECT target.status, {locked_until} AS locked_until_ms, {now} AS now_ms, \
                 EXISTS (SELECT 1 FROM gone) AS evicted, \
                 (SELECT count(CASE WHEN gone.waited THEN \
                     pg_notify('{channel}', encode(gone.identity, 'hex')) END) \
                  FROM gone) AS announced \
             FROM target, now",
            locked_until = ms("target.locked_until"),
            now = ms("now.t"),
        );
        // SKIP LOCKED: rows a claim is replacing right now are left for the next run.
        let purge = format!(
            "DELETE FROM {t} WHERE identity IN ( \
                 SELECT identity FROM {t} WHERE expires_at <= clock_timestamp() \
                 LIMIT $1 FOR UPDATE SKIP LOCKED) \
             AND expires_at <= clock_timestamp()"
        );
        let leases = names.resource_leases();
        // The resource lease's acquisition, one statement that always returns the
        // row: the proposed token (`$2`) replaces a lapsed lease, a live one stays.
        // `ON CONFLICT DO UPDATE` judges the newest committed version of the row
        // (waiting for a concurrent acquisition to commit), so two acquisitions
        // never both see it lapsed. The caller compares the returned token with
        // its own (`idemgate_sqlx::decode_lease_acquisition`).
        let lapsed = "l.expires_at <= EXCLUDED.acquired_at";
        let acquire_resource_lease = format!(
            "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t), \
             up AS ( \
                 INSERT INTO {leases} AS l (resource, token, acquired_at, expires_at) \
                 SELECT $1, $2, now.t, now.t + $3 * interval '1 millisecond' FROM now \
                 ON CONFLICT (resource) DO UPDATE SET \
                     token = CASE WHEN {lapsed} THEN EXCLUDED.token ELSE l.token END, \
                     acquired_at = CASE WHEN {lapsed} THEN EXCLUDED.acquired_at \
                         ELSE l.acquired_at END, \
                     expires_at = CASE WHEN {lapsed} THEN EXCLUDED.expires_at \
                         ELSE l.expires_at END \
                 RETURNING l.token, l.expires_at) \
             SELECT up.token, {until} AS until_ms, {now_ms} AS now_ms FROM up",
            until = ms("up.expires_at"),
            // Read once the insert is through: one that waited for a
            // concurrent acquisition reports a time after it, not the moment
            // it started (before the lease it found even began).
            now_ms = ms("clock_timestamp()"),
        );
        // Fenced by the token, and only while live: a lapsed row stays until the
        // next acquisition replaces it.
        let release_resource_lease = format!(
            "DELETE FROM {leases} WHERE resource = $1 AND token = $2 \
             AND expires_at > clock_timestamp()"
        );
        Self {
            acquire_resource_lease: acquire_resource_lease.into(),
            release_resource_lease: release_resource_lease.into(),
            claim_in_transaction: claim_statement(&format!(
                ", set_config('lock_timeout', current_setting('{OUTER_LOCK_TIMEOUT}'), true) \
                 AS lock_wait_lifted,"
            ))
            .into(),
            claim: claim_statement(",").into(),
            read: read.into(),
            complete: complete.into(),
            release: release.into(),
            renew: renew.into(),
            delete: delete.into(),
            evict: evict.into(),
            mark_waited: mark_waited.into(),
            purge: purge.into(),
        }
    }
}

/// The fenced completion's `UPDATE` (`$1` to `$3` the fence, `$4` to `$9` the
/// outcome), unannounced: `Statements::complete` announces it, and
/// `crate::audit::complete_and_append_statement` adds journal entries to it.
pub(crate) fn complete_update(names: &Names) -> String {
    format!(
        "UPDATE {t} SET status = $4, locked_until = NULL, response_status = $5, \
             response_headers = $6, response_body = $7, body_retained = $8, \
             expires_at = clock_timestamp() + $9 * interval '1 millisecond' \
         WHERE {FENCE}",
        t = names.table()
    )
}

/// The schema version this build writes: 1 the record table, 2 its resource
/// lease table, 3 the record's `waited` mark, 4 its `field_digests`, 5 the
/// journal's tables (`crate::audit`), 6 the routes' execution histories
/// (`crate::durations`), 7 the streams recorded in pieces (`crate::pieces`),
/// 8 the journal without its key digest's index (`crate::audit`).
pub const SCHEMA_VERSION: i64 = 8;

/// The statements that create schema version 1, in order.
pub(crate) fn schema_v1(names: &Names) -> Vec<String> {
    let t = names.table();
    vec![
        format!("CREATE SEQUENCE IF NOT EXISTS {}", names.sequence()),
        format!(
            "CREATE TABLE IF NOT EXISTS {t} ( \
                 identity         BYTEA       NOT NULL PRIMARY KEY \
                                              CHECK (octet_length(identity) = 32), \
                 principal        TEXT        NOT NULL, \
                 method           TEXT        NOT NULL, \
                 path             TEXT        NOT NULL, \
                 idempotency_key  TEXT        NOT NULL, \
                 fingerprint      BYTEA       NOT NULL CHECK (octet_length(fingerprint) = 32), \
                 format_version   INTEGER     NOT NULL, \
                 operation_id     UUID        NOT NULL, \
                 token            BIGINT      NOT NULL, \
                 status           TEXT        NOT NULL CHECK (status IN \
                                      ('PROCESSING', 'COMPLETED', 'FAILED', 'RELEASED')), \
                 lease_origin     TEXT        NOT NULL CHECK (lease_origin IN \
                                      ('NEW', 'RELEASED', 'TAKEN_OVER')), \
                 locked_until     TIMESTAMPTZ, \
                 response_status  INTEGER, \
                 response_headers BYTEA, \
                 response_body    BYTEA, \
                 body_retained    BOOLEAN, \
                 created_at       TIMESTAMPTZ NOT NULL, \
                 expires_at       TIMESTAMPTZ NOT NULL, \
                 CHECK (status NOT IN ('COMPLETED', 'FAILED') OR (response_status IS NOT NULL \
                     AND response_headers IS NOT NULL AND body_retained IS NOT NULL)), \
                 CHECK (body_retained IS NOT TRUE OR response_body IS NOT NULL) \
             )"
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS {} ON {t} (expires_at)",
            names.expires_index()
        ),
    ]
}

/// The statements that take schema version 1 to 2: the resource lease table
/// (`Store::acquire_resource_lease`), one row per resource whose lease was
/// taken; a lapsed row is replaced by the next acquisition.
pub(crate) fn schema_v2(names: &Names) -> Vec<String> {
    vec![format!(
        "CREATE TABLE IF NOT EXISTS {} ( \
             resource    BYTEA       NOT NULL PRIMARY KEY CHECK (octet_length(resource) = 32), \
             token       BYTEA       NOT NULL CHECK (octet_length(token) = 16), \
             acquired_at TIMESTAMPTZ NOT NULL, \
             expires_at  TIMESTAMPTZ NOT NULL \
         )",
        names.resource_leases()
    )]
}

/// The statements that take schema version 2 to 3: `waited`, set by a waiter on
/// a record in progress, so the statement that ends the run announces it
/// (`crate::changes`). A column with a constant default: no table rewrite.
pub(crate) fn schema_v3(names: &Names) -> Vec<String> {
    vec![format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS waited BOOLEAN NOT NULL DEFAULT false",
        names.table()
    )]
}

/// The statements that take schema version 3 to 4: `field_digests`, the first
/// request's per-field digests (`idemgate_core::fingerprint::FieldDigests::encode`),
/// so a 422 can name the fields another body changed; `NULL` for a body that is
/// not JSON and for the records of earlier builds. Nullable without a default:
/// no table rewrite.
pub(crate) fn schema_v4(names: &Names) -> Vec<String> {
    vec![format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS field_digests BYTEA",
        names.table()
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
        let names = Names {
            schema: Some("s".into()),
            table: "t".into(),
        };
        assert_eq!(names.table(), "\"s\".\"t\"");
        assert_eq!(names.sequence(), "\"s\".\"t_token_seq\"");
        assert_eq!(names.resource_leases(), "\"s\".\"t_resource_leases\"");
        assert_eq!(names.suffixed("stream_pieces"), "\"s\".\"t_stream_pieces\"");
        assert_eq!(names.expires_index(), "\"t_expires_at_idx\"");
        assert_eq!(names.versions(), "\"s\".\"idemgate_schema_versions\"");
    }
}
