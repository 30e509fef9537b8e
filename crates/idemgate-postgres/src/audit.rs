//! The journal in PostgreSQL (`idemgate_core::audit`): three tables named after
//! the record table — `<table>_audit` (the entries, `seq` an identity column;
//! indexed on time and operation), `<table>_audit_partitions` (each
//! instance's head and anchor) and `<table>_audit_secret` (one row). Schema
//! version 8 drops the key digest's index, as the SQLite store's version 7
//! does: no query of idemgate's reads by it, and every entry paid for it.
//!
//! An append locks its partition's head row (`SELECT … FOR UPDATE`) in the
//! transaction that inserts the entries and moves the head: two writers of one
//! instance queue on that row and never fork its chain; writers of different
//! instances never meet. In the transactional mode the `executed` entry is
//! appended on the handler's transaction ([`append_in_transaction`]), so it
//! commits or rolls back with the business writes; the head row stays locked
//! only from that append to the commit.
//!
//! Both skip the locking read while they can ([`WriterHint`]): one statement
//! moves the head only if it is still the one this process last wrote, and
//! inserts the entries only if it moved (autocommit for the journal writer's
//! batches ([`append`]); in the business transaction, where it waits on the
//! head row as the read would). Otherwise the head is locked and read first
//! ([`append_on`]: two round trips, which also read the clock).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use idemgate_core::StoreError;
use idemgate_core::audit::{
    AuditEntry, AuditPartition, AuditQuery, AuditRecord, ChainHash, ExpiredRecord, ExpiryJournal,
    StoreClock,
};
use idemgate_sqlx::{
    AUDIT_COLUMNS, AuditColumns, begin_to_the_end, chain_hash_of, decode_audit_entry,
    decode_audit_partition,
};
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

/// A statement with its arguments, as `sqlx::query` builds it.
type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

use crate::error::store_error;
use crate::sql::{Names, quote};

/// The journal's table names, qualified and quoted.
#[derive(Debug, Clone)]
pub(crate) struct AuditNames {
    entries: String,
    partitions: String,
    secret: String,
}

impl AuditNames {
    pub(crate) fn new(names: &Names) -> Self {
        Self {
            entries: names.suffixed("audit"),
            partitions: names.suffixed("audit_partitions"),
            secret: names.suffixed("audit_secret"),
        }
    }
}

/// The statements that take schema version 7 to 8: the key digest's index
/// dropped (the module docs).
pub(crate) fn schema_v8(names: &Names) -> Vec<String> {
    // Dropped in the table's schema: `suffixed` qualifies it.
    vec![format!(
        "DROP INDEX IF EXISTS {}",
        names.suffixed("audit_key_idx")
    )]
}

/// The statements that take schema version 4 to 5: the journal's tables.
pub(crate) fn schema(names: &Names) -> Vec<String> {
    let audit = AuditNames::new(names);
    let index = |what: &str| quote(&format!("{}_audit_{what}_idx", names.table));
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {} ( \
                 seq          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
                 at_ms        BIGINT NOT NULL, \
                 event        TEXT   NOT NULL, \
                 operation_id TEXT, \
                 method       TEXT   NOT NULL, \
                 route        TEXT   NOT NULL, \
                 principal    TEXT   NOT NULL, \
                 key_digest   TEXT   NOT NULL, \
                 fingerprint  TEXT, \
                 status       BIGINT, \
                 duration_ms  BIGINT, \
                 instance     TEXT   NOT NULL, \
                 prev         BYTEA  NOT NULL CHECK (octet_length(prev) = 32), \
                 hash         BYTEA  NOT NULL CHECK (octet_length(hash) = 32) \
             )",
            audit.entries
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} (at_ms)",
            index("at"),
            audit.entries
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} (operation_id)",
            index("operation"),
            audit.entries
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {} ( \
                 instance TEXT  NOT NULL PRIMARY KEY, \
                 head     BYTEA NOT NULL, \
                 anchor   BYTEA NOT NULL \
             )",
            audit.partitions
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {} ( \
                 id     INTEGER NOT NULL PRIMARY KEY CHECK (id = 1), \
                 secret BYTEA   NOT NULL \
             )",
            audit.secret
        ),
    ]
}

/// The store's clock, in milliseconds.
const NOW_MS_EXPRESSION: &str = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Appends `records` on `connection`, which must be inside a transaction: each
/// partition's head row is created if missing, locked and read (one statement
/// per partition, which also reads the clock once the lock is held), then the
/// entries are inserted and the heads moved (one statement). The head row stays
/// locked from the first statement to the commit: in the transactional mode
/// that is the business transaction's end, so the fewer round trips under the
/// lock, the less its concurrent transactions queue behind it.
pub(crate) async fn append_on(
    connection: &mut PgConnection,
    names: &AuditNames,
    records: &[AuditRecord],
) -> Result<(), sqlx::Error> {
    seal_and_insert(connection, names, records, StoreClock::default())
        .await
        .map(drop)
}

/// What [`append_on`] does, the entries stamped by `clock` from the clock it
/// reads; returns the partitions' new heads and that stamp.
async fn seal_and_insert(
    connection: &mut PgConnection,
    names: &AuditNames,
    records: &[AuditRecord],
    clock: StoreClock,
) -> Result<(Vec<(String, ChainHash)>, i64), sqlx::Error> {
    let mut heads: Vec<(&str, ChainHash)> = Vec::new();
    let genesis = ChainHash::GENESIS.as_bytes().to_vec();
    // An entry's `at` is read after the lock: never before its predecessor's.
    let mut now = 0;
    for record in records {
        let instance = record.instance.as_str();
        if heads.iter().any(|(known, _)| *known == instance) {
            continue;
        }
        let row = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (instance, head, anchor) VALUES ($1, $2, $2) \
             ON CONFLICT (instance) DO UPDATE SET instance = EXCLUDED.instance \
             RETURNING head, {NOW_MS_EXPRESSION} AS now_ms",
            names.partitions
        )))
        .bind(instance.to_owned())
        .bind(genesis.clone())
        .fetch_one(&mut *connection)
        .await?;
        let head =
            chain_hash_of(row.try_get("head")?).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        now = row.try_get("now_ms")?;
        heads.push((instance, head));
    }
    let at_ms = clock.stamp(now);
    let read = heads.clone();
    let mut rows = Vec::with_capacity(records.len());
    for record in records {
        let head = heads
            .iter_mut()
            .find(|(instance, _)| *instance == record.instance)
            .map(|(_, head)| head)
            .expect("every record's partition was read above");
        let (columns, hash) = AuditColumns::seal(record, at_ms, *head);
        rows.push(columns);
        *head = hash;
    }
    let moved: Vec<(String, ChainHash)> = heads
        .iter()
        .map(|(instance, head)| ((*instance).to_owned(), *head))
        .collect();
    if let ([(instance, expected)], [(_, head)]) = (read.as_slice(), heads.as_slice()) {
        // One partition, as nearly every batch is: the statement whose generic
        // plan PostgreSQL keeps (the partitions joined with `UNNEST` of a
        // parameter were planned anew at every execution: its generic plan
        // guesses ten rows). Its head was read under the lock, so it matches.
        let sealed = Sealed {
            instance,
            expected: *expected,
            head: *head,
            at_ms,
            rows,
        };
        let (inserted, _) = insert_if_head(&mut *connection, names, sealed).await?;
        if inserted == 0 {
            return Err(sqlx::Error::Protocol(
                "a journal head moved while its row was locked".into(),
            ));
        }
    } else {
        insert(connection, names, heads, rows).await?;
    }
    Ok((moved, at_ms))
}

/// Inserts `rows` in their order and moves each of several partitions to its
/// new head, in one statement whose text is the same for every batch: the columns go
/// as arrays, read back with `UNNEST`, so PostgreSQL parses and plans it once
/// per connection, not once per batch size.
async fn insert(
    connection: &mut PgConnection,
    names: &AuditNames,
    heads: Vec<(&str, ChainHash)>,
    rows: Vec<AuditColumns>,
) -> Result<(), sqlx::Error> {
    let (instances, moved_to): (Vec<String>, Vec<Vec<u8>>) = heads
        .into_iter()
        .map(|(instance, head)| (instance.to_owned(), head.as_bytes().to_vec()))
        .unzip();
    let columns = Columns::of(rows);
    let query = sqlx::query(AssertSqlSafe(format!(
        "WITH moved AS ( \
             UPDATE {partitions} AS p SET head = m.head \
             FROM UNNEST($1::text[], $2::bytea[]) AS m(instance, head) \
             WHERE p.instance = m.instance) \
         INSERT INTO {entries} ({AUDIT_COLUMNS_WRITTEN}) \
         {bound} \
         ORDER BY position",
        partitions = names.partitions,
        entries = names.entries,
        bound = Columns::select_bound(3),
    )))
    .bind(instances)
    .bind(moved_to);
    columns.bind(query).execute(connection).await.map(drop)
}

/// The entries' columns written, in the order of [`insert`]'s arrays.
const AUDIT_COLUMNS_WRITTEN: &str = "at_ms, event, operation_id, method, route, principal, \
    key_digest, fingerprint, status, duration_ms, instance, prev, hash";

/// [`AuditColumns`] of many rows, as one array per column.
#[derive(Default)]
struct Columns {
    at_ms: Vec<i64>,
    event: Vec<&'static str>,
    operation_id: Vec<Option<String>>,
    method: Vec<String>,
    route: Vec<String>,
    principal: Vec<String>,
    key_digest: Vec<String>,
    fingerprint: Vec<Option<String>>,
    status: Vec<Option<i64>>,
    duration_ms: Vec<Option<i64>>,
    instance: Vec<String>,
    prev: Vec<Vec<u8>>,
    hash: Vec<Vec<u8>>,
}

impl Columns {
    /// The SQL types of the arrays [`Columns::bind`] binds, in its order.
    const ARRAY_TYPES: [&'static str; 13] = [
        "bigint", "text", "text", "text", "text", "text", "text", "text", "bigint", "bigint",
        "text", "bytea", "bytea",
    ];

    fn of(rows: Vec<AuditColumns>) -> Self {
        let mut columns = Self::default();
        for row in rows {
            columns.push(row);
        }
        columns
    }

    /// The rows [`Columns::bind`] binds from parameter `$first` on, read back
    /// as [`AUDIT_COLUMNS_WRITTEN`] in their order (`position`): the
    /// `SELECT` an `INSERT` of them ends with.
    fn select_bound(first: usize) -> String {
        let arrays: Vec<String> = Self::ARRAY_TYPES
            .iter()
            .enumerate()
            .map(|(offset, sql_type)| format!("${}::{sql_type}[]", first + offset))
            .collect();
        format!(
            "SELECT {AUDIT_COLUMNS_WRITTEN} FROM UNNEST({}) \
             WITH ORDINALITY AS r({AUDIT_COLUMNS_WRITTEN}, position)",
            arrays.join(", ")
        )
    }

    /// Binds the thirteen arrays, in [`AUDIT_COLUMNS_WRITTEN`]'s order, after
    /// what `query` bound already.
    fn bind(self, query: PgQuery<'_>) -> PgQuery<'_> {
        query
            .bind(self.at_ms)
            .bind(self.event)
            .bind(self.operation_id)
            .bind(self.method)
            .bind(self.route)
            .bind(self.principal)
            .bind(self.key_digest)
            .bind(self.fingerprint)
            .bind(self.status)
            .bind(self.duration_ms)
            .bind(self.instance)
            .bind(self.prev)
            .bind(self.hash)
    }

    fn push(&mut self, row: AuditColumns) {
        self.at_ms.push(row.at_ms);
        self.event.push(row.event);
        self.operation_id.push(row.operation_id);
        self.method.push(row.method);
        self.route.push(row.route);
        self.principal.push(row.principal);
        self.key_digest.push(row.key_digest);
        self.fingerprint.push(row.fingerprint);
        self.status.push(row.status);
        self.duration_ms.push(row.duration_ms);
        self.instance.push(row.instance);
        self.prev.push(row.prev);
        self.hash.push(row.hash);
    }
}

/// What one store's appends ([`append`]) carry from one to the next: the
/// heads they wrote and the store's clock, so that the next batch of one
/// partition is one autocommit statement — the head moved only if it is
/// still the one known, and the entries inserted only if it moved — instead
/// of a transaction that locks and reads the head first (four round trips and
/// a second version of the head row). A claim waits for its entry's append,
/// so this is on every new key's path. Another process writing as the same
/// instance moves the head: the statement then changes nothing, and the
/// append takes the locking path, which reads both again.
#[derive(Debug, Default)]
pub(crate) struct WriterHint(Mutex<Known>);

#[derive(Debug, Default)]
struct Known {
    /// Each partition's head, as this process last wrote it.
    heads: HashMap<String, ChainHash>,
    /// The store's clock, as the locking appends read it.
    clock: StoreClock,
}

impl WriterHint {
    fn known(&self) -> MutexGuard<'_, Known> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This process moved `instance`'s head to `head`, its entries at `at_ms`.
    fn wrote(&self, instance: &str, head: ChainHash, at_ms: i64) {
        let mut known = self.known();
        known.heads.insert(instance.to_owned(), head);
        known.clock.wrote(at_ms);
    }

    /// What a locking append read and wrote: the heads it moved, and the
    /// clock it read at `read_at` (its entries stamped `at_ms`).
    fn read(&self, heads: Vec<(String, ChainHash)>, at_ms: i64, read_at: Instant) {
        let mut known = self.known();
        known.heads.extend(heads);
        known.clock.read(at_ms, read_at);
        known.clock.wrote(at_ms);
    }

    /// What a compare-and-set of `instance`'s head did: moved it to `head`,
    /// its entries at `at_ms`; or found it moved under another writer, and
    /// forgets it.
    fn appended(&self, instance: &str, head: ChainHash, at_ms: i64, moved: bool) {
        if moved {
            self.wrote(instance, head, at_ms);
        } else {
            self.known().heads.remove(instance);
        }
    }

    /// The partition, its head and the `at` for `records`, when they are all
    /// of one partition whose head is known and the clock is fresh.
    fn one_statement<'a>(&self, records: &'a [AuditRecord]) -> Option<(&'a str, ChainHash, i64)> {
        let instance = records.first()?.instance.as_str();
        if records.iter().any(|record| record.instance != instance) {
            return None;
        }
        let known = self.known();
        let at_ms = known.clock.estimate()?;
        Some((instance, *known.heads.get(instance)?, at_ms))
    }
}

/// `Store::append_audit`: one statement while the partition's head and the
/// clock are known ([`WriterHint`]), else [`append_on`] in a transaction of
/// its own.
pub(crate) async fn append(
    pool: &PgPool,
    names: &AuditNames,
    hint: &WriterHint,
    records: &[AuditRecord],
) -> Result<(), StoreError> {
    if records.is_empty() {
        return Ok(());
    }
    if append_if_known(pool, names, hint, records)
        .await
        .map_err(store_error)?
    {
        return Ok(());
    }
    let mut tx = begin_to_the_end(pool, None).await.map_err(store_error)?;
    append_locking(&mut tx, names, hint, records)
        .await
        .map_err(store_error)?;
    tx.commit().await.map_err(store_error)
}

/// Appends `records` inside a business transaction (the transactional mode's
/// `executed` entry, and the one-transaction claim's): while the partition's
/// head is known ([`WriterHint`]), one statement that moves it only if it is
/// still that head — it waits on the head row as the locking read would, and
/// then finds the head a concurrent transaction left — else the locking read.
pub(crate) async fn append_in_transaction(
    connection: &mut PgConnection,
    names: &AuditNames,
    hint: &WriterHint,
    records: &[AuditRecord],
) -> Result<(), sqlx::Error> {
    if append_if_known(&mut *connection, names, hint, records).await? {
        return Ok(());
    }
    append_locking(connection, names, hint, records).await
}

/// The one statement, while `records` are of one partition whose head and
/// the clock are known; whether it appended them. A refusal (another writer
/// moved the head) changes nothing and forgets that head.
async fn append_if_known<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    names: &AuditNames,
    hint: &WriterHint,
    records: &[AuditRecord],
) -> Result<bool, sqlx::Error> {
    let Some(sealed) = Sealed::after_known_head(hint, records) else {
        return Ok(false);
    };
    let (inserted, moved_to) = insert_if_head(executor, names, sealed).await?;
    moved_to.report(hint, inserted > 0);
    Ok(inserted > 0)
}

/// Entries of one partition sealed after the head this process last wrote
/// ([`WriterHint`]), for a statement that appends them only if that is still
/// the head.
pub(crate) struct Sealed<'a> {
    instance: &'a str,
    /// The head they follow.
    expected: ChainHash,
    /// The head they leave: the last one's hash.
    head: ChainHash,
    at_ms: i64,
    rows: Vec<AuditColumns>,
}

impl<'a> Sealed<'a> {
    /// `records` sealed, when they are all of one partition whose head and
    /// the clock are known.
    pub(crate) fn after_known_head(hint: &WriterHint, records: &'a [AuditRecord]) -> Option<Self> {
        let (instance, expected, at_ms) = hint.one_statement(records)?;
        let mut head = expected;
        let mut rows = Vec::with_capacity(records.len());
        for record in records {
            let (columns, hash) = AuditColumns::seal(record, at_ms, head);
            rows.push(columns);
            head = hash;
        }
        Some(Self {
            instance,
            expected,
            head,
            at_ms,
            rows,
        })
    }

    /// Binds, after what `query` bound, the parameters both statements of
    /// sealed entries end with ([`insert_if_head`],
    /// [`complete_and_append_statement`]): the partition, its new head, the
    /// head expected, then the entries' arrays. With it, the head to report
    /// once the statement says whether it moved.
    fn bind<'q>(self, query: PgQuery<'q>) -> (PgQuery<'q>, SealedHead<'a>) {
        let query = query
            .bind(self.instance.to_owned())
            .bind(self.head.as_bytes().to_vec())
            .bind(self.expected.as_bytes().to_vec());
        let head = SealedHead {
            instance: self.instance,
            head: self.head,
            at_ms: self.at_ms,
        };
        (Columns::of(self.rows).bind(query), head)
    }
}

/// The head a statement of [`Sealed`] entries moves its partition to, if the
/// partition's head is still the one they were sealed after.
struct SealedHead<'a> {
    instance: &'a str,
    head: ChainHash,
    at_ms: i64,
}

impl SealedHead<'_> {
    /// Tells `hint` whether the statement `moved` the head (else another
    /// writer had, and the hint forgets it).
    fn report(self, hint: &WriterHint, moved: bool) {
        hint.appended(self.instance, self.head, self.at_ms, moved);
    }
}

/// The statement [`complete_and_append`] sends: the transactional
/// completion `complete` (an `UPDATE` whose parameters are `$1` to `$9`,
/// announced as `crate::sql`'s completion is) and, only if it applied, the
/// entries of [`insert_if_head`] (`$10` the partition, `$11` its new head,
/// `$12` the head expected, then the columns' arrays). One row when the
/// completion applied, with `moved`: whether the entries went in.
pub(crate) fn complete_and_append_statement(
    names: &Names,
    complete: &str,
    channel: &str,
) -> String {
    let audit = AuditNames::new(names);
    format!(
        "WITH done AS ({complete} RETURNING identity, waited), \
         moved AS ( \
             UPDATE {partitions} SET head = $11 \
             WHERE instance = $10 AND head = $12 AND EXISTS (SELECT 1 FROM done) \
             RETURNING instance), \
         appended AS ( \
             INSERT INTO {entries} ({AUDIT_COLUMNS_WRITTEN}) \
             {bound} \
             WHERE EXISTS (SELECT 1 FROM moved) \
             ORDER BY position) \
         SELECT CASE WHEN done.waited \
                    THEN pg_notify('{channel}', encode(done.identity, 'hex')) END AS announced, \
                EXISTS (SELECT 1 FROM moved) AS moved \
         FROM done",
        partitions = audit.partitions,
        entries = audit.entries,
        bound = Columns::select_bound(13),
    )
}

/// What [`complete_and_append`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CompletedAndAppended {
    /// The record no longer holds the lease: nothing changed.
    Refused,
    /// Completed, and the entries appended.
    Both,
    /// Completed, but another writer moved the partition's head: the entries
    /// are still to be appended ([`append_in_transaction`] then locks and
    /// reads the head).
    CompletedOnly,
}

/// Runs `completion` (the [`complete_and_append_statement`], its `$1` to
/// `$9` bound) with `sealed`'s entries, in the business transaction on
/// `connection`: the completion and the `executed` entry in one round trip
/// instead of two.
pub(crate) async fn complete_and_append(
    connection: &mut PgConnection,
    hint: &WriterHint,
    completion: PgQuery<'_>,
    sealed: Sealed<'_>,
) -> Result<CompletedAndAppended, sqlx::Error> {
    let (query, moved_to) = sealed.bind(completion);
    let Some(row) = query.fetch_optional(connection).await? else {
        return Ok(CompletedAndAppended::Refused);
    };
    let moved: bool = row.try_get("moved")?;
    moved_to.report(hint, moved);
    Ok(if moved {
        CompletedAndAppended::Both
    } else {
        CompletedAndAppended::CompletedOnly
    })
}

/// [`append_on`], the entries no earlier than any this process wrote, and
/// what it read and wrote remembered. Remembered before the transaction
/// commits: should it not, the next append finds another head and locks again.
async fn append_locking(
    connection: &mut PgConnection,
    names: &AuditNames,
    hint: &WriterHint,
    records: &[AuditRecord],
) -> Result<(), sqlx::Error> {
    let clock = hint.known().clock;
    let (heads, at_ms) = seal_and_insert(connection, names, records, clock).await?;
    hint.read(heads, at_ms, Instant::now());
    Ok(())
}

/// Inserts `sealed`'s entries and moves their partition's head to theirs in
/// one statement, only if the head is still the one they were sealed after;
/// the number of entries inserted (0: the head had moved, nothing changed),
/// and the head to report.
async fn insert_if_head<'e, 'a>(
    executor: impl sqlx::PgExecutor<'e>,
    names: &AuditNames,
    sealed: Sealed<'a>,
) -> Result<(u64, SealedHead<'a>), sqlx::Error> {
    let (query, moved_to) = sealed.bind(sqlx::query(AssertSqlSafe(format!(
        "WITH moved AS ( \
             UPDATE {partitions} SET head = $2 WHERE instance = $1 AND head = $3 \
             RETURNING instance) \
         INSERT INTO {entries} ({AUDIT_COLUMNS_WRITTEN}) \
         {bound} \
         WHERE EXISTS (SELECT 1 FROM moved) \
         ORDER BY position",
        partitions = names.partitions,
        entries = names.entries,
        bound = Columns::select_bound(4),
    ))));
    let done = query.execute(executor).await?;
    Ok((done.rows_affected(), moved_to))
}

/// `Store::trim_audit`: the oldest entries and the anchors, in one transaction.
pub(crate) async fn trim(
    pool: &PgPool,
    names: &AuditNames,
    instance: Option<&str>,
    before: i64,
    limit: usize,
) -> Result<u64, StoreError> {
    let mut tx = begin_to_the_end(pool, None).await.map_err(store_error)?;
    let removed = sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {t} WHERE seq IN ( \
             SELECT seq FROM {t} WHERE at_ms < $1 AND ($2::text IS NULL OR instance = $2) \
             ORDER BY seq LIMIT $3) \
         RETURNING seq, instance, hash",
        t = names.entries
    )))
    .bind(before)
    .bind(instance.map(str::to_owned))
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_all(&mut *tx)
    .await
    .map_err(store_error)?;
    let mut anchors: HashMap<String, (i64, Vec<u8>)> = HashMap::new();
    for row in &removed {
        let seq: i64 = row.try_get(0).map_err(StoreError::corrupt)?;
        let instance: String = row.try_get(1).map_err(StoreError::corrupt)?;
        let hash: Vec<u8> = row.try_get(2).map_err(StoreError::corrupt)?;
        let slot = anchors.entry(instance).or_insert((seq, hash.clone()));
        if seq >= slot.0 {
            *slot = (seq, hash);
        }
    }
    for (instance, (_, anchor)) in anchors {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET anchor = $2 WHERE instance = $1",
            names.partitions
        )))
        .bind(instance)
        .bind(anchor)
        .execute(&mut *tx)
        .await
        .map_err(store_error)?;
    }
    tx.commit().await.map_err(store_error)?;
    Ok(removed.len() as u64)
}

/// One purge batch with the journal on: at most `limit` of `table`'s expired
/// records deleted (rows a claim holds locked skipped, as the plain purge
/// does) and each journalled as `expired`, in one transaction; answers how
/// many went.
pub(crate) async fn expire(
    pool: &PgPool,
    names: &AuditNames,
    table: &str,
    journal: &ExpiryJournal,
    limit: i64,
) -> Result<u64, StoreError> {
    let mut tx = begin_to_the_end(pool, None).await.map_err(store_error)?;
    let rows = sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {table} WHERE identity IN ( \
             SELECT identity FROM {table} WHERE expires_at <= clock_timestamp() \
             LIMIT $1 FOR UPDATE SKIP LOCKED) \
         AND expires_at <= clock_timestamp() \
         RETURNING principal, method, path, idempotency_key, fingerprint, operation_id, \
             response_status"
    )))
    .bind(limit)
    .fetch_all(&mut *tx)
    .await
    .map_err(store_error)?;
    let mut entries = Vec::with_capacity(rows.len());
    for row in &rows {
        let operation_id: uuid::Uuid = row.try_get("operation_id").map_err(store_error)?;
        let status: Option<i32> = row.try_get("response_status").map_err(store_error)?;
        entries.push(journal.entry(&ExpiredRecord {
            principal: row.try_get("principal").map_err(store_error)?,
            method: row.try_get("method").map_err(store_error)?,
            path: row.try_get("path").map_err(store_error)?,
            key: row.try_get("idempotency_key").map_err(store_error)?,
            fingerprint: row.try_get("fingerprint").map_err(store_error)?,
            operation_id: operation_id.as_bytes(),
            status: status.and_then(|s| u16::try_from(s).ok()),
        }));
    }
    if !entries.is_empty() {
        append_on(&mut tx, names, &entries)
            .await
            .map_err(store_error)?;
    }
    tx.commit().await.map_err(store_error)?;
    Ok(rows.len() as u64)
}

/// `Store::read_audit`.
pub(crate) async fn read(
    pool: &PgPool,
    names: &AuditNames,
    query: &AuditQuery,
) -> Result<Vec<AuditEntry>, StoreError> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT {AUDIT_COLUMNS} FROM {} \
         WHERE seq > $1 AND at_ms >= $2 AND at_ms < $3 ORDER BY seq LIMIT $4",
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

/// `Store::audit_partitions`.
pub(crate) async fn partitions(
    pool: &PgPool,
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

/// `Store::audit_secret`: made by the first caller, kept by every later one.
pub(crate) async fn secret(
    pool: &PgPool,
    names: &AuditNames,
) -> Result<idemgate_core::audit::AuditSecret, StoreError> {
    let proposed = idemgate_core::audit::AuditSecret::random();
    let bytes: Vec<u8> = sqlx::query_scalar(AssertSqlSafe(format!(
        "INSERT INTO {t} AS s (id, secret) VALUES (1, $1) \
         ON CONFLICT (id) DO UPDATE SET secret = s.secret RETURNING secret",
        t = names.secret
    )))
    .bind(proposed.as_bytes().to_vec())
    .fetch_one(pool)
    .await
    .map_err(store_error)?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|_| idemgate_sqlx::corrupt("the journal secret is not 32 bytes"))?;
    Ok(idemgate_core::audit::AuditSecret::from_bytes(bytes))
}
