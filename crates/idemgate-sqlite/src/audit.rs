//! The journal in SQLite (`idemgate_core::audit`): three tables named after the
//! record table — `<table>_audit` (the entries: `seq` an `AUTOINCREMENT` key, so
//! a removed entry's number is never reused; indexed on time and operation),
//! `<table>_audit_partitions` (each instance's head and anchor) and
//! `<table>_audit_secret` (the key digest's secret, one row). Schema version 7
//! drops the key digest's index: no query of idemgate's reads by it (`audit
//! export --key` filters the time range it reads), and each entry paid for it
//! with a write to a random page (`docs/audit.md`).
//!
//! Appends and trims run through the writer like every write (one connection,
//! group commit), each that writes more than one statement inside a savepoint
//! of its batch so that it stands or falls whole; an entry of a business transaction is appended in that
//! transaction. The writer's one connection is what serialises a partition's
//! appends in this process, and `BEGIN IMMEDIATE` across processes.
//!
//! An append is one statement, because every statement on the writer is a hop
//! to SQLite's thread and back that the whole store waits for (the journal
//! doubled a new key's server CPU when an append was four). The chain is kept
//! by two triggers (schema version 7) rather than by reads and writes of the
//! head around the insert: one refuses an entry whose `prev` is not its
//! partition's head, the other moves the head to each entry inserted. The
//! `prev` to send comes from this process's [`HeadHints`]: right unless
//! another process (or a rolled-back transaction) moved the head since, in
//! which case the insert is refused, the heads are read, and it is sent again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

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

/// The message of the trigger that refuses an entry whose `prev` is not its
/// partition's head.
const STALE_HEAD: &str = "idemgate: stale journal head";

/// The journal's table names, quoted, and this process's hints of their heads.
/// Cheap to clone (the store, its writer and every journal write share them).
#[derive(Debug, Clone)]
pub(crate) struct AuditNames {
    entries: Arc<str>,
    partitions: Arc<str>,
    secret: Arc<str>,
    heads: Arc<HeadHints>,
}

/// Each partition's head as this process last appended it: what the next
/// append links to without reading it first. Only a hint — the chain trigger
/// checks it against the table.
#[derive(Debug, Default)]
struct HeadHints(Mutex<HashMap<String, ChainHash>>);

impl HeadHints {
    fn get(&self, instance: &str) -> Option<ChainHash> {
        self.lock().get(instance).copied()
    }

    fn remember(&self, heads: &HashMap<&str, ChainHash>) {
        let mut hints = self.lock();
        for (instance, head) in heads {
            hints.insert((*instance).to_owned(), *head);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, ChainHash>> {
        // Each update is whole map inserts: nothing half-done to poison.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl AuditNames {
    pub(crate) fn new(table: &str) -> Self {
        Self {
            entries: quote(&format!("{table}_audit")).into(),
            partitions: quote(&format!("{table}_audit_partitions")).into(),
            secret: quote(&format!("{table}_audit_secret")).into(),
            heads: Arc::default(),
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

/// The statements of schema version 7: the chain kept by triggers (the
/// module docs). An older build's append (read the head, insert, move the
/// head) still passes them.
/// Version 7 also drops the key digest's index (the module docs).
pub(crate) fn chain_triggers(table: &str) -> Vec<String> {
    let names = AuditNames::new(table);
    let trigger = |what: &str| quote(&format!("{table}_audit_{what}"));
    vec![
        format!(
            "DROP INDEX IF EXISTS {}",
            quote(&format!("{table}_audit_key_idx"))
        ),
        format!(
            "CREATE TRIGGER IF NOT EXISTS {} BEFORE INSERT ON {} \
             WHEN NEW.prev IS NOT coalesce( \
                 (SELECT head FROM {} WHERE instance = NEW.instance), zeroblob(32)) \
             BEGIN SELECT RAISE(ABORT, '{STALE_HEAD}'); END",
            trigger("links_to_head"),
            names.entries,
            names.partitions
        ),
        format!(
            "CREATE TRIGGER IF NOT EXISTS {} AFTER INSERT ON {} \
             BEGIN \
                 INSERT INTO {} (instance, head, anchor) \
                 VALUES (NEW.instance, NEW.hash, zeroblob(32)) \
                 ON CONFLICT (instance) DO UPDATE SET head = excluded.head; \
             END",
            trigger("moves_head"),
            names.entries,
            names.partitions
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
    /// Whether all it writes is one statement (an append of at most one
    /// insert's rows: the head reads write nothing, and a refused insert is
    /// undone before it is sent again), so that it needs no savepoint.
    pub(crate) fn writes_in_one_statement(&self) -> bool {
        matches!(self, Self::Append { records, .. } if records.len() <= AUDIT_ROWS_PER_INSERT)
    }

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

/// Appends `records` on `connection` at `now`; the triggers move each
/// partition's head. One statement when the hinted heads are right (per
/// [`AUDIT_ROWS_PER_INSERT`] entries); when another writer moved one, the
/// refused insert (undone whole) is sent again linked to the heads read.
pub(crate) async fn append(
    connection: &mut SqliteConnection,
    names: &AuditNames,
    records: &[AuditRecord],
    now: i64,
) -> Result<u64, sqlx::Error> {
    match append_linked(connection, names, records, now, Heads::Hinted).await {
        Err(err) if is_stale_head(&err) => {
            append_linked(connection, names, records, now, Heads::Read).await
        }
        appended => appended,
    }
}

/// Where an append takes each partition's head from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Heads {
    /// This process's hint, read only where there is none.
    Hinted,
    /// The table.
    Read,
}

async fn append_linked(
    connection: &mut SqliteConnection,
    names: &AuditNames,
    records: &[AuditRecord],
    now: i64,
    from: Heads,
) -> Result<u64, sqlx::Error> {
    let mut heads: HashMap<&str, ChainHash> = HashMap::new();
    let mut rows = Vec::with_capacity(records.len());
    for record in records {
        let instance = record.instance.as_str();
        let hint = match from {
            Heads::Hinted => names.heads.get(instance),
            Heads::Read => None,
        };
        let prev = match heads.get(instance).copied().or(hint) {
            Some(head) => head,
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
    // A hint even if the transaction later rolls back: the trigger then
    // refuses the next append once, which reads the heads.
    names.heads.remember(&heads);
    Ok(records.len() as u64)
}

/// The chain trigger refused an entry: its partition's head moved.
fn is_stale_head(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .is_some_and(|db| db.message().contains(STALE_HEAD))
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
