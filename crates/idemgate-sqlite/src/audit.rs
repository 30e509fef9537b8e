//! The journal in SQLite (`idemgate_core::audit`): three tables named after the
//! record table — `<table>_audit` (the entries: `seq` an `AUTOINCREMENT` key, so
//! a removed entry's number is never reused; indexed on time, operation and key
//! digest), `<table>_audit_partitions` (each instance's head and anchor) and
//! `<table>_audit_secret` (the key digest's secret, one row).
//!
//! Appends and trims are several statements; they run through the writer like
//! every write (one connection, group commit), each inside a savepoint of its
//! batch so that they stand or fall whole. The writer's one connection is what
//! serialises a partition's appends in this process, and `BEGIN IMMEDIATE`
//! across processes: the head is read and moved inside the same transaction.

use std::collections::HashMap;

use idemgate_core::StoreError;
use idemgate_core::audit::{
    AuditEntry, AuditPartition, AuditQuery, AuditRecord, ChainHash, ExpiredRecord, ExpiryJournal,
};
use idemgate_sqlx::{
    AUDIT_COLUMNS, AUDIT_ROWS_PER_INSERT, AuditColumns, chain_hash_of, decode_audit_entry,
    decode_audit_partition, push_audit_rows,
};
use sqlx::{AssertSqlSafe, QueryBuilder, Row, Sqlite, SqliteConnection, SqlitePool};

use crate::error::store_error;
use crate::sql::quote;

/// The journal's table names, quoted.
#[derive(Debug, Clone)]
pub(crate) struct AuditNames {
    entries: String,
    partitions: String,
    secret: String,
}

impl AuditNames {
    pub(crate) fn new(table: &str) -> Self {
        Self {
            entries: quote(&format!("{table}_audit")),
            partitions: quote(&format!("{table}_audit_partitions")),
            secret: quote(&format!("{table}_audit_secret")),
        }
    }

    /// The statement that makes the secret once and returns it: an upsert that
    /// keeps a secret already there.
    pub(crate) fn secret_upsert(&self) -> String {
        format!(
            "INSERT INTO {} (id, secret) VALUES (1, ?1) \
             ON CONFLICT (id) DO UPDATE SET secret = secret RETURNING secret",
            self.secret
        )
    }
}

/// The statements of the journal's schema version (4).
pub(crate) fn schema(table: &str) -> Vec<String> {
    let names = AuditNames::new(table);
    let index = |what: &str| quote(&format!("{table}_audit_{what}_idx"));
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {} ( \
                 seq          INTEGER PRIMARY KEY AUTOINCREMENT, \
                 at_ms        INTEGER NOT NULL, \
                 event        TEXT    NOT NULL, \
                 operation_id TEXT, \
                 method       TEXT    NOT NULL, \
                 route        TEXT    NOT NULL, \
                 principal    TEXT    NOT NULL, \
                 key_digest   TEXT    NOT NULL, \
                 fingerprint  TEXT, \
                 status       INTEGER, \
                 duration_ms  INTEGER, \
                 instance     TEXT    NOT NULL, \
                 prev         BLOB    NOT NULL, \
                 hash         BLOB    NOT NULL \
             ) STRICT",
            names.entries
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} (at_ms)",
            index("at"),
            names.entries
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} (operation_id)",
            index("operation"),
            names.entries
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} (key_digest)",
            index("key"),
            names.entries
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {} ( \
                 instance TEXT NOT NULL PRIMARY KEY, \
                 head     BLOB NOT NULL, \
                 anchor   BLOB NOT NULL \
             ) STRICT",
            names.partitions
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {} ( \
                 id     INTEGER NOT NULL PRIMARY KEY CHECK (id = 1), \
                 secret BLOB    NOT NULL \
             ) STRICT",
            names.secret
        ),
    ]
}

/// A journal write the writer runs in its batch.
#[derive(Debug)]
pub(crate) enum AuditWrite {
    /// `Store::append_audit`.
    Append {
        names: AuditNames,
        records: Vec<AuditRecord>,
    },
    /// `Store::trim_audit`.
    Trim {
        names: AuditNames,
        instance: Option<String>,
        before: i64,
        limit: i64,
    },
    /// A purge batch with the journal on: at most `limit` expired records of
    /// `records` (the quoted table) deleted, each journalled as `expired`, in
    /// one savepoint.
    Expire {
        names: AuditNames,
        records: String,
        journal: ExpiryJournal,
        limit: i64,
    },
}

impl AuditWrite {
    /// Runs the write on the writer's connection at the batch's clock `now`;
    /// the caller wraps it in a savepoint. Answers the rows written or removed.
    pub(crate) async fn run(
        &self,
        connection: &mut SqliteConnection,
        now: i64,
    ) -> Result<u64, sqlx::Error> {
        match self {
            Self::Append { names, records } => append(connection, names, records, now).await,
            Self::Trim {
                names,
                instance,
                before,
                limit,
            } => trim(connection, names, instance.as_deref(), *before, *limit).await,
            Self::Expire {
                names,
                records,
                journal,
                limit,
            } => expire(connection, names, records, journal, *limit, now).await,
        }
    }
}

/// Deletes at most `limit` of `table`'s records expired at `now` and journals
/// each as `expired`; answers how many went.
async fn expire(
    connection: &mut SqliteConnection,
    names: &AuditNames,
    table: &str,
    journal: &ExpiryJournal,
    limit: i64,
    now: i64,
) -> Result<u64, sqlx::Error> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {table} WHERE rowid IN ( \
             SELECT rowid FROM {table} WHERE expires_at <= ?1 LIMIT ?2) \
         RETURNING principal, method, path, idempotency_key, fingerprint, operation_id, \
             response_status"
    )))
    .bind(now)
    .bind(limit)
    .fetch_all(&mut *connection)
    .await?;
    let mut entries = Vec::with_capacity(rows.len());
    for row in &rows {
        let status: Option<i64> = row.try_get("response_status")?;
        entries.push(journal.entry(&ExpiredRecord {
            principal: row.try_get("principal")?,
            method: row.try_get("method")?,
            path: row.try_get("path")?,
            key: row.try_get("idempotency_key")?,
            fingerprint: row.try_get("fingerprint")?,
            operation_id: row.try_get("operation_id")?,
            status: status.and_then(|s| u16::try_from(s).ok()),
        }));
    }
    if !entries.is_empty() {
        append(connection, names, &entries, now).await?;
    }
    Ok(rows.len() as u64)
}

/// Appends `records` on `connection` at `now`, moving each partition's head.
pub(crate) async fn append(
    connection: &mut SqliteConnection,
    names: &AuditNames,
    records: &[AuditRecord],
    now: i64,
) -> Result<u64, sqlx::Error> {
    let mut heads: HashMap<&str, ChainHash> = HashMap::new();
    let mut rows = Vec::with_capacity(records.len());
    for record in records {
        let instance = record.instance.as_str();
        let prev = match heads.get(instance) {
            Some(head) => *head,
            None => head_of(connection, names, instance).await?,
        };
        let (columns, hash) = AuditColumns::seal(record, now, prev);
        rows.push(columns);
        heads.insert(instance, hash);
    }
    let mut rows = rows.into_iter().peekable();
    while rows.peek().is_some() {
        let mut insert = QueryBuilder::<Sqlite>::new("");
        push_audit_rows(
            &mut insert,
            &names.entries,
            rows.by_ref().take(AUDIT_ROWS_PER_INSERT),
        );
        insert.build().execute(&mut *connection).await?;
    }
    let upsert = format!(
        "INSERT INTO {} (instance, head, anchor) VALUES (?1, ?2, ?3) \
         ON CONFLICT (instance) DO UPDATE SET head = excluded.head",
        names.partitions
    );
    for (instance, head) in heads {
        sqlx::query(AssertSqlSafe(upsert.as_str()))
            .bind(instance.to_owned())
            .bind(head.as_bytes().to_vec())
            .bind(ChainHash::GENESIS.as_bytes().to_vec())
            .execute(&mut *connection)
            .await?;
    }
    Ok(records.len() as u64)
}

async fn head_of(
    connection: &mut SqliteConnection,
    names: &AuditNames,
    instance: &str,
) -> Result<ChainHash, sqlx::Error> {
    let head: Option<Vec<u8>> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT head FROM {} WHERE instance = ?1",
        names.partitions
    )))
    .bind(instance.to_owned())
    .fetch_optional(&mut *connection)
    .await?;
    match head {
        None => Ok(ChainHash::GENESIS),
        Some(bytes) => chain_hash_of(bytes).map_err(|e| sqlx::Error::Decode(Box::new(e))),
    }
}

async fn trim(
    connection: &mut SqliteConnection,
    names: &AuditNames,
    instance: Option<&str>,
    before: i64,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let removed = sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {t} WHERE seq IN ( \
             SELECT seq FROM {t} WHERE at_ms < ?1 AND (?2 IS NULL OR instance = ?2) \
             ORDER BY seq LIMIT ?3) \
         RETURNING seq, instance, hash",
        t = names.entries
    )))
    .bind(before)
    .bind(instance.map(str::to_owned))
    .bind(limit)
    .fetch_all(&mut *connection)
    .await?;
    // Each partition's anchor: the hash of its last entry removed.
    let mut anchors: HashMap<String, (i64, Vec<u8>)> = HashMap::new();
    for row in &removed {
        let (seq, instance, hash): (i64, String, Vec<u8>) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        let slot = anchors.entry(instance).or_insert((seq, hash.clone()));
        if seq >= slot.0 {
            *slot = (seq, hash);
        }
    }
    for (instance, (_, anchor)) in anchors {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET anchor = ?2 WHERE instance = ?1",
            names.partitions
        )))
        .bind(instance)
        .bind(anchor)
        .execute(&mut *connection)
        .await?;
    }
    Ok(removed.len() as u64)
}

/// `Store::read_audit`, on the readers' pool.
pub(crate) async fn read(
    pool: &SqlitePool,
    names: &AuditNames,
    query: &AuditQuery,
) -> Result<Vec<AuditEntry>, StoreError> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT {AUDIT_COLUMNS} FROM {} \
         WHERE seq > ?1 AND at_ms >= ?2 AND at_ms < ?3 ORDER BY seq LIMIT ?4",
        names.entries
    )))
    .bind(
        query
            .after
            .map_or(0, |a| i64::try_from(a).unwrap_or(i64::MAX)),
    )
    .bind(query.since.map_or(i64::MIN, |t| t.as_millis()))
    .bind(query.until.map_or(i64::MAX, |t| t.as_millis()))
    .bind(i64::try_from(query.limit).unwrap_or(i64::MAX))
    .fetch_all(pool)
    .await
    .map_err(store_error)?;
    rows.iter().map(decode_audit_entry).collect()
}

/// `Store::audit_partitions`, on the readers' pool.
pub(crate) async fn partitions(
    pool: &SqlitePool,
    names: &AuditNames,
) -> Result<Vec<AuditPartition>, StoreError> {
    let rows = sqlx::query(AssertSqlSafe(idemgate_sqlx::partitions_statement(
        &names.entries,
        &names.partitions,
    )))
    .fetch_all(pool)
    .await
    .map_err(store_error)?;
    rows.iter().map(decode_audit_partition).collect()
}
