//! The orders database: SQLite or PostgreSQL.
//!
//! Every order row carries the operation id it was created by, under a UNIQUE
//! constraint (PROTOCOL §11): whatever the idempotency store, one operation cannot
//! insert two orders.
//!
//! The schema is `sqlx::migrate!`'s, one directory per dialect
//! (`migrations/orders/{sqlite,postgres}/`: `0001_orders.sql`, then the
//! ledger's `0002_ledger.sql`). A table's statements live in the module that owns
//! the table — the orders' here, the accounts' and transfers' in
//! [`ledger`](super::ledger) — each as one `Dialects`, SQLite's and
//! PostgreSQL's text side by side, run with the same binds by `on_dialect!`.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use idemgate::StoreError;
use idemgate_sqlite::{SqliteStore, WriterTransaction};
use idemgate_sqlx::{BusinessTransaction, SqlStore};
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{
    ColumnIndex, Decode, PgConnection, PgPool, Row, Sqlite, SqliteConnection, SqlitePool, Type,
};
use uuid::Uuid;

use crate::config::DatabaseUrl;
use crate::database::{connect_postgres, connect_sqlite};
use crate::orders::order::{Item, NewOrder, Order, OrderChange};

/// One statement in both dialects, side by side. SQLite's placeholders are
/// numbered (`?1`) like PostgreSQL's (`$1`), so both take the same binds in the
/// same order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dialects {
    /// SQLite's text.
    pub(crate) sqlite: &'static str,
    /// PostgreSQL's text.
    pub(crate) postgres: &'static str,
}

/// Runs a [`Dialects`] statement on an `&mut OrdersConn`, the Rust around it
/// written once: `$make` builds the query (`sqlx::query`, `sqlx::query_scalar`)
/// from the connection's dialect, and `$body` binds and runs `$query` on `$on`
/// (that dialect's `&mut` connection).
macro_rules! on_dialect {
    ($conn:expr, $make:path, $statement:expr, |$query:ident, $on:ident| $body:expr) => {
        match $conn {
            $crate::orders::db::OrdersConn::Sqlite(conn) => {
                let ($query, $on) = ($make($statement.sqlite), &mut **conn);
                $body
            }
            $crate::orders::db::OrdersConn::Postgres(conn) => {
                let ($query, $on) = ($make($statement.postgres), &mut **conn);
                $body
            }
        }
    };
}
pub(crate) use on_dialect;

/// Where the migrations applied to the orders database are recorded. Not sqlx's
/// default `_sqlx_migrations`: the orders database may be shared (the SQLite
/// file holds the idempotency records; `--database` may name an application's
/// own database, whose sqlx migrations would then be taken for ours).
pub const MIGRATIONS_TABLE: &str = "orders_migrations";

/// A dialect's migrations (`sqlx::migrate!`), recorded in [`MIGRATIONS_TABLE`].
fn migrator(mut migrations: Migrator) -> Migrator {
    migrations.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrations
}

/// The columns later releases added to the orders table before it was
/// migrated by `sqlx::migrate!`, with the SQLite statement that adds each: a
/// table such a release made may lack them, and SQLite has no `ADD COLUMN IF
/// NOT EXISTS` (PostgreSQL's `0001_orders.sql` adds them itself).
const SQLITE_LATER_COLUMNS: [(&str, &str); 4] = [
    (
        "client_order_id",
        "ALTER TABLE orders ADD COLUMN client_order_id TEXT",
    ),
    ("note", "ALTER TABLE orders ADD COLUMN note TEXT"),
    (
        "shipping_address",
        "ALTER TABLE orders ADD COLUMN shipping_address TEXT",
    ),
    (
        "version",
        "ALTER TABLE orders ADD COLUMN version BIGINT NOT NULL DEFAULT 1",
    ),
];

/// Adopts a SQLite database a release before `sqlx::migrate!` created: adds
/// the [`SQLITE_LATER_COLUMNS`] its orders table lacks, so that the idempotent
/// `0001_orders.sql` then finds it complete. Only where no migration has run
/// yet (no [`MIGRATIONS_TABLE`]) and an orders table exists; in the caller's
/// IMMEDIATE transaction, so no other instance adds a column meanwhile.
async fn adopt_sqlite(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    let migrated: bool = sqlx::query_scalar(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1",
    )
    .bind(MIGRATIONS_TABLE)
    .fetch_one(&mut *conn)
    .await?;
    if migrated {
        return Ok(());
    }
    let columns: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_table_info('orders')")
        .fetch_all(&mut *conn)
        .await?;
    if columns.is_empty() {
        return Ok(()); // a fresh database: the migrations create the table
    }
    for (column, add) in SQLITE_LATER_COLUMNS {
        if !columns.iter().any(|present| present == column) {
            sqlx::query(add).execute(&mut *conn).await?;
        }
    }
    Ok(())
}

/// Whether `error` is SQLite's `SQLITE_BUSY`, also from inside the migrator.
fn is_busy(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Migrate(error) => match &**error {
            MigrateError::Execute(error) | MigrateError::ExecuteMigration(error, _) => {
                idemgate_sqlite::is_busy(error)
            }
            _ => false,
        },
        error => idemgate_sqlite::is_busy(error),
    }
}

/// The columns an [`Order`] is read from, in every query that reads one.
macro_rules! columns {
    () => {
        "id, amount, currency, status, items, client_order_id, note, shipping_address, version, \
         payment_confirmed_at, payment_event_id"
    };
}

/// A read of orders: the columns every read selects, then `$tail` (a literal,
/// so the statement stays static SQL).
macro_rules! select_orders {
    ($tail:literal) => {
        concat!("SELECT ", columns!(), " FROM orders ", $tail)
    };
}

/// The principal's orders, oldest first.
const LIST: Dialects = Dialects {
    sqlite: select_orders!("WHERE principal = ?1 ORDER BY id"),
    postgres: select_orders!("WHERE principal = $1 ORDER BY id"),
};

/// One of the principal's orders, by the server's number.
const GET: Dialects = Dialects {
    sqlite: select_orders!("WHERE principal = ?1 AND id = ?2"),
    postgres: select_orders!("WHERE principal = $1 AND id = $2"),
};

/// One of the principal's orders, by the client-chosen id.
const GET_BY_CLIENT_ID: Dialects = Dialects {
    sqlite: select_orders!("WHERE principal = ?1 AND client_order_id = ?2"),
    postgres: select_orders!("WHERE principal = $1 AND client_order_id = $2"),
};

/// The order an operation created.
const BY_OPERATION: Dialects = Dialects {
    sqlite: select_orders!("WHERE operation_id = ?1"),
    postgres: select_orders!("WHERE operation_id = $1"),
};

/// A new order, nothing if its operation already made one; its state (`paid`,
/// version 1, no note or address) is the one `Order::as_created` restates. PostgreSQL's
/// returns the new row (one round trip); SQLite's does not: there an `INSERT …
/// RETURNING` read with `fetch_optional` keeps its statement, and so the write
/// lock, open longer, which measured slower.
const INSERT: Dialects = Dialects {
    sqlite: "INSERT INTO orders (operation_id, principal, amount, currency, items, charge_id, status, client_order_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'paid', ?7) ON CONFLICT (operation_id) DO NOTHING",
    postgres: concat!(
        "INSERT INTO orders (operation_id, principal, amount, currency, items, charge_id, status, client_order_id)
         VALUES ($1, $2, $3, $4, $5, $6, 'paid', $7) ON CONFLICT (operation_id) DO NOTHING
         RETURNING ",
        columns!()
    ),
};

/// The compare-and-set edit (PROTOCOL §17): the mutable fields, if the order is
/// still at the version read, and the next version.
const UPDATE_IF_VERSION: Dialects = Dialects {
    sqlite: "UPDATE orders SET note = ?1, shipping_address = ?2, status = ?3, version = version + 1
         WHERE principal = ?4 AND id = ?5 AND version = ?6",
    postgres:
        "UPDATE orders SET note = $1, shipping_address = $2, status = $3, version = version + 1
         WHERE principal = $4 AND id = $5 AND version = $6",
};

/// The gateway's confirmation of the charge of the order an operation
/// created (`POST /webhooks/payments`, [`webhook`](super::webhook)): when, by
/// which event, and the next version. Deliberately unconditional: it runs only
/// in the transaction that completes the event's idempotency record, and that
/// record is what makes an event mark its order once (the inbox pattern) — the
/// version counts every run that committed, which is what the tests count.
const CONFIRM_PAYMENT: Dialects = Dialects {
    sqlite:
        "UPDATE orders SET payment_confirmed_at = ?1, payment_event_id = ?2, version = version + 1
         WHERE operation_id = ?3",
    postgres:
        "UPDATE orders SET payment_confirmed_at = $1, payment_event_id = $2, version = version + 1
         WHERE operation_id = $3::uuid",
};

/// The order an operation created, on a connection (SQLite's column holds the
/// id as text, PostgreSQL's as a UUID: bound as text, cast there).
const BY_OPERATION_TEXT: Dialects = Dialects {
    sqlite: select_orders!("WHERE operation_id = ?1"),
    postgres: select_orders!("WHERE operation_id = $1::uuid"),
};

/// The orders database.
#[derive(Debug, Clone)]
pub enum OrdersDb {
    /// An embedded SQLite file.
    Sqlite(SqliteOrders),
    /// A PostgreSQL server.
    Postgres(PgPool),
}

/// The orders' SQLite file: its pool, and how this process's writes take
/// their turn on it.
///
/// SQLite has one writer at a time, and a connection that finds the write
/// lock taken waits in SQLite's busy handler, which sleeps (1, 2, 5, 10, …
/// 100 ms) instead of waking when the lock is freed. Thirty-two concurrent
/// orders on one pool spent most of their time asleep there, beside a free
/// lock: a p99 of 40–500 ms against a 140 µs `fsync`, and throughput that
/// swung by 2× from run to run (docs/benchmarks.md, "The SQLite orders file's
/// busy handler"). And when the idempotency records share the file, the
/// store's writer commits batch after batch, so a keyless order waiting in
/// the busy handler between them starved: 9–50 req/s, a p99 of 1.7–2 s and
/// failed requests beside keyed orders (docs/benchmarks.md, "Keyless and
/// keyed orders on one file"). So every write of this process reaches SQLite
/// through one queue — the store's writer where there is one, else a turn of
/// the process — and the busy handler is left to other processes on the
/// file.
#[derive(Debug, Clone)]
pub struct SqliteOrders {
    pool: SqlitePool,
    writes: Writes,
}

/// Where this process's writes to the orders' file queue.
#[derive(Debug, Clone)]
enum Writes {
    /// A FIFO turn of the process, taken before a pool connection: the
    /// records live elsewhere (memory, Redis) or there are none
    /// (`--no-idempotency`).
    Turn(Arc<tokio::sync::Mutex<()>>),
    /// The idempotency store's writer, which owns the file's writes when the
    /// records share it: a write is a turn in its batch (a savepoint of its
    /// transaction), committed with the batch's claims and completions in one
    /// `fsync`.
    StoreWriter(SqliteStore),
}

/// This process's turn to write the orders' SQLite file: held until the write
/// (its transaction, committed or rolled back) is over.
type WriteTurn = tokio::sync::OwnedMutexGuard<()>;

/// A write transaction on the orders' SQLite file, in this process's turn. It
/// dereferences to its connection; [`SqliteWrite::commit`] commits it, and a
/// drop rolls it back.
#[derive(Debug)]
pub struct SqliteWrite(WriteTransaction);

#[derive(Debug)]
enum WriteTransaction {
    /// An `IMMEDIATE` transaction on a pool connection, in the process's turn.
    Pooled {
        tx: sqlx::Transaction<'static, Sqlite>,
        _turn: WriteTurn,
    },
    /// A turn of the store's writer.
    StoreWriter(WriterTransaction),
}

impl SqliteWrite {
    /// Commits: `Ok` once the write is durable (for a turn of the store's
    /// writer, once its batch committed).
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        match self.0 {
            WriteTransaction::Pooled { tx, _turn } => tx.commit().await,
            WriteTransaction::StoreWriter(turn) => BusinessTransaction::<SqliteStore>::commit(turn)
                .await
                .map_err(writer_failed),
        }
    }
}

impl Deref for SqliteWrite {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        match &self.0 {
            WriteTransaction::Pooled { tx, .. } => tx,
            WriteTransaction::StoreWriter(turn) => turn,
        }
    }
}

impl DerefMut for SqliteWrite {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        match &mut self.0 {
            WriteTransaction::Pooled { tx, .. } => tx,
            WriteTransaction::StoreWriter(turn) => turn,
        }
    }
}

/// A write transaction a handler began itself (no idempotency layer lent it
/// one), committed when its outcome wrote and rolled back when dropped: a
/// write on the orders' SQLite file, or a PostgreSQL transaction.
pub trait OwnTransaction {
    /// Commits; `Ok` once the write is durable.
    fn commit(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

impl OwnTransaction for SqliteWrite {
    fn commit(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        SqliteWrite::commit(self)
    }
}

impl OwnTransaction for sqlx::Transaction<'_, sqlx::Postgres> {
    fn commit(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        sqlx::Transaction::commit(self)
    }
}

/// The store's writer could not lend its connection or commit its batch (it
/// waited past its patience, or its batch failed): nothing of the write
/// committed. Reported as a timed-out I/O error, which the handlers answer
/// 503 with `Retry-After`, as for a busy database.
fn writer_failed(error: StoreError) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, error))
}

impl SqliteOrders {
    fn new(pool: SqlitePool) -> Self {
        Self {
            pool,
            writes: Writes::Turn(Arc::default()),
        }
    }

    /// The same file, its writes queued on `store`'s writer: the idempotency
    /// records share the file, and every write of this process must reach it
    /// through one queue.
    pub fn writing_through(self, store: SqliteStore) -> Self {
        Self {
            writes: Writes::StoreWriter(store),
            ..self
        }
    }

    /// The pool: reads, and what shares the file (the idempotency store).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Waits for this process's turn to write, as long as a connection
    /// checkout may take (the pool's acquire timeout: the server's store
    /// timeout), then fails as a checkout that timed out does.
    ///
    /// Taken before the write's connection, never while holding one: writers
    /// holding the pool's connections while they wait for the turn, and the
    /// turn's holder waiting for a connection, would wait on each other. The
    /// checkout that follows has its own acquire timeout, so a write may wait
    /// up to twice the store timeout before it starts; the turn's holder needs
    /// one connection of the pool, so the second wait is short unless readers
    /// hold every connection.
    async fn write_turn(
        turn: &Arc<tokio::sync::Mutex<()>>,
        pool: &SqlitePool,
    ) -> Result<WriteTurn, sqlx::Error> {
        let waits = pool.options().get_acquire_timeout();
        tokio::time::timeout(waits, Arc::clone(turn).lock_owned())
            .await
            .map_err(|_elapsed| sqlx::Error::PoolTimedOut)
    }

    /// A write transaction in this process's turn: `IMMEDIATE` on a pool
    /// connection (the write lock from the start, so a read before the write
    /// cannot fail to upgrade), or a turn of the store's writer, whose batch
    /// holds the write lock already.
    pub async fn begin_immediate(&self) -> Result<SqliteWrite, sqlx::Error> {
        Ok(SqliteWrite(match &self.writes {
            Writes::Turn(turn) => {
                let turn = Self::write_turn(turn, &self.pool).await?;
                let tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
                WriteTransaction::Pooled { tx, _turn: turn }
            }
            Writes::StoreWriter(store) => {
                WriteTransaction::StoreWriter(SqlStore::begin(store).await.map_err(writer_failed)?)
            }
        }))
    }

    /// Inserts `order` (as [`OrdersDb::insert`]): one autocommitted statement in
    /// the process's turn, or a turn of the store's writer.
    async fn insert(
        &self,
        placement: Placement<'_>,
        order: &NewOrder,
    ) -> Result<Order, sqlx::Error> {
        match &self.writes {
            Writes::Turn(turn) => {
                let _turn = Self::write_turn(turn, &self.pool).await?;
                insert_sqlite(&mut *self.pool.acquire().await?, placement, order).await
            }
            Writes::StoreWriter(_) => {
                let mut write = self.begin_immediate().await?;
                let inserted = insert_sqlite(&mut write, placement, order).await?;
                write.commit().await?;
                Ok(inserted)
            }
        }
    }
}

/// The orders database did not finish a write within the store timeout
/// ([`OrdersDb::bounded`]); it fails as a timed-out I/O error, which the
/// handlers answer 503 with `Retry-After`.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the orders database did not answer within {0:?}")]
pub struct TimedOut(pub Duration);

impl From<TimedOut> for sqlx::Error {
    fn from(timed_out: TimedOut) -> Self {
        sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, timed_out))
    }
}

/// Who placed an order and under which operation.
#[derive(Debug, Clone, Copy)]
pub struct Placement<'a> {
    /// The principal (a digest of the bearer token).
    pub principal: &'a str,
    /// The operation that creates the order.
    pub operation_id: Uuid,
    /// The gateway's charge id.
    pub charge_id: Option<&'a str>,
    /// The client-chosen id of `PUT /api/v1/orders/{order_id}`: unique per
    /// principal, the order's durable natural key (PROTOCOL §15).
    pub client_order_id: Option<&'a str>,
}

impl OrdersDb {
    /// Connects (creating the SQLite file if missing). `timeout` bounds a
    /// connection checkout and a PostgreSQL statement, and a SQLite lock wait when
    /// it is longer than the SQLite store's default, so a frozen or locked database
    /// answers an error (503) instead of holding the request.
    pub async fn connect(url: &DatabaseUrl, timeout: Duration) -> Result<Self, sqlx::Error> {
        Ok(match url {
            DatabaseUrl::Sqlite(url) => {
                Self::Sqlite(SqliteOrders::new(connect_sqlite(url, timeout).await?))
            }
            DatabaseUrl::Postgres(url) => Self::Postgres(connect_postgres(url, timeout).await?),
        })
    }

    /// Connects and migrates: what a starting server does. Two processes that open
    /// one fresh SQLite file at once race to switch it to WAL and to create its
    /// tables, and the loser can get `SQLITE_BUSY` at once, whatever the busy
    /// timeout (SQLite does not wait on a journal-mode change or a stale
    /// snapshot); that is retried, briefly, until `timeout` (at least 5 s) has
    /// passed. Any other error, or the last busy one, is returned.
    pub async fn open(url: &DatabaseUrl, timeout: Duration) -> Result<Self, sqlx::Error> {
        let deadline = tokio::time::Instant::now() + timeout.max(Duration::from_secs(5));
        loop {
            let opened = async {
                let db = Self::connect(url, timeout).await?;
                db.migrate().await?;
                Ok(db)
            }
            .await;
            match opened {
                Err(error) if is_busy(&error) && tokio::time::Instant::now() < deadline => {
                    tracing::debug!(%error, "the orders database is busy at startup; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                opened => return opened,
            }
        }
    }

    /// Brings the schema up to date with `sqlx::migrate!`: the migrations of
    /// the database's dialect (`migrations/orders/{sqlite,postgres}/`), recorded
    /// in their own table ([`MIGRATIONS_TABLE`]). Safe to run from several
    /// instances at once: they migrate in turn, and the later ones find nothing
    /// to do. A database a release before these migrations created is adopted
    /// as it is: the first migrations are idempotent, and on SQLite the columns
    /// its orders table may lack are added first (`adopt_sqlite`).
    pub async fn migrate(&self) -> Result<(), sqlx::Error> {
        match self {
            Self::Sqlite(db) => {
                // sqlx takes no lock on SQLite (its `lock` does nothing), so two
                // servers on one fresh file would both apply a migration and the
                // second would fail on the migrations table's key. One IMMEDIATE
                // transaction takes the write lock first: they migrate in turn,
                // and each migration's own transaction is a savepoint in it.
                let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await?;
                adopt_sqlite(&mut tx).await?;
                migrator(sqlx::migrate!("migrations/orders/sqlite"))
                    .run(&mut *tx)
                    .await?;
                tx.commit().await
            }
            // sqlx holds a session advisory lock on PostgreSQL while it migrates.
            Self::Postgres(pool) => Ok(migrator(sqlx::migrate!("migrations/orders/postgres"))
                .run(pool)
                .await?),
        }
    }

    /// Runs `run` on a connection of the pool.
    pub(crate) async fn on_connection<T>(
        &self,
        run: impl AsyncFnOnce(&mut OrdersConn<'_>) -> Result<T, sqlx::Error>,
    ) -> Result<T, sqlx::Error> {
        match self {
            Self::Sqlite(db) => run(&mut OrdersConn::Sqlite(&mut *db.pool.acquire().await?)).await,
            Self::Postgres(pool) => {
                run(&mut OrdersConn::Postgres(&mut *pool.acquire().await?)).await
            }
        }
    }

    /// Inserts an order outside any idempotency transaction. A second insert for the
    /// same operation inserts nothing and returns the first one's order, as its
    /// create answered it ([`Order::as_created`]).
    pub async fn insert(
        &self,
        placement: Placement<'_>,
        order: &NewOrder,
    ) -> Result<Order, sqlx::Error> {
        match self {
            Self::Sqlite(db) => db.insert(placement, order).await,
            Self::Postgres(pool) => {
                insert_postgres(&mut *pool.acquire().await?, placement, order).await
            }
        }
    }

    /// The order an operation created, as it is now; `None` if it created none.
    pub async fn by_operation(&self, operation_id: Uuid) -> Result<Option<Order>, sqlx::Error> {
        // SQLite's column holds the id as text, PostgreSQL's as a UUID.
        let row = match self {
            Self::Sqlite(db) => sqlx::query(BY_OPERATION.sqlite)
                .bind(operation_id.to_string())
                .fetch_optional(&db.pool)
                .await?
                .as_ref()
                .map(order_from),
            Self::Postgres(pool) => sqlx::query(BY_OPERATION.postgres)
                .bind(operation_id)
                .fetch_optional(pool)
                .await?
                .as_ref()
                .map(order_from),
        };
        row.transpose()
    }

    /// The principal's orders, oldest first.
    pub async fn list(&self, principal: &str) -> Result<Vec<Order>, sqlx::Error> {
        self.on_connection(async |conn| {
            on_dialect!(conn, sqlx::query, LIST, |query, on| query
                .bind(principal)
                .fetch_all(on)
                .await?
                .iter()
                .map(order_from)
                .collect())
        })
        .await
    }

    /// One of the principal's orders; `None` if it does not exist or is someone
    /// else's.
    pub async fn get(&self, principal: &str, id: i64) -> Result<Option<Order>, sqlx::Error> {
        self.on_connection(async |conn| conn.get(principal, id).await)
            .await
    }

    /// The principal's order under its client-chosen id; `None` if there is none
    /// (another principal's order of that id is never found).
    pub async fn get_by_client_id(
        &self,
        principal: &str,
        client_order_id: &str,
    ) -> Result<Option<Order>, sqlx::Error> {
        self.on_connection(async |conn| {
            on_dialect!(conn, sqlx::query, GET_BY_CLIENT_ID, |query, on| query
                .bind(principal)
                .bind(client_order_id)
                .fetch_optional(on)
                .await?
                .as_ref()
                .map(order_from)
                .transpose())
        })
        .await
    }

    /// `write` (a transaction and its statements), given the store timeout to
    /// finish when the database is PostgreSQL. Its pool pings only connections
    /// that sat idle (`crate::database::connect_postgres`), so nothing else
    /// bounds a `BEGIN` or a statement sent to a frozen server:
    /// `statement_timeout` is enforced by the server itself. Cut short, `write`
    /// is dropped, which rolls its transaction back. SQLite runs in process and
    /// its busy timeout bounds its waits: `write` runs as it is.
    pub async fn bounded<F: Future>(&self, write: F) -> Result<F::Output, TimedOut> {
        match self {
            Self::Sqlite(_) => Ok(write.await),
            Self::Postgres(pool) => {
                let timeout = pool.options().get_acquire_timeout();
                tokio::time::timeout(timeout, write)
                    .await
                    .map_err(|_elapsed| TimedOut(timeout))
            }
        }
    }

    /// `sqlite` or `postgres`, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> Result<(), sqlx::Error> {
        match self {
            Self::Sqlite(db) => sqlx::query("SELECT 1").execute(&db.pool).await.map(drop),
            Self::Postgres(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop),
        }
    }

    /// Closes the pool, waiting for connections to be returned.
    pub async fn close(&self) {
        match self {
            Self::Sqlite(db) => db.pool.close().await,
            Self::Postgres(pool) => pool.close().await,
        }
    }
}

/// A connection to the orders database, whichever it is: the pool's, or the
/// idempotency layer's transaction.
#[derive(Debug)]
pub enum OrdersConn<'a> {
    /// SQLite.
    Sqlite(&'a mut SqliteConnection),
    /// PostgreSQL.
    Postgres(&'a mut PgConnection),
}

impl OrdersConn<'_> {
    /// One of the principal's orders.
    pub async fn get(&mut self, principal: &str, id: i64) -> Result<Option<Order>, sqlx::Error> {
        on_dialect!(self, sqlx::query, GET, |query, on| query
            .bind(principal)
            .bind(id)
            .fetch_optional(on)
            .await?
            .as_ref()
            .map(order_from)
            .transpose())
    }

    /// Marks the order `operation_id` created as confirmed by the gateway's
    /// event `event_id` at `at_ms` (`CONFIRM_PAYMENT`); the order as it is
    /// now, `None` when that operation created no order (not yet committed,
    /// or none at all).
    pub async fn confirm_payment(
        &mut self,
        operation_id: Uuid,
        event_id: &str,
        at_ms: i64,
    ) -> Result<Option<Order>, sqlx::Error> {
        let id = operation_id.to_string();
        let updated = on_dialect!(self, sqlx::query, CONFIRM_PAYMENT, |query, on| query
            .bind(at_ms)
            .bind(event_id)
            .bind(&id)
            .execute(on)
            .await?
            .rows_affected());
        if updated == 0 {
            return Ok(None);
        }
        on_dialect!(self, sqlx::query, BY_OPERATION_TEXT, |query, on| query
            .bind(&id)
            .fetch_optional(on)
            .await?
            .as_ref()
            .map(order_from)
            .transpose())
    }

    /// Writes `change` if the order is still at `version` (compare-and-set: of
    /// two writers that read one version, exactly one updates), incrementing it.
    /// Whether it was written.
    pub async fn update_if_version(
        &mut self,
        principal: &str,
        id: i64,
        version: i64,
        change: &OrderChange,
    ) -> Result<bool, sqlx::Error> {
        let address = change
            .shipping_address
            .as_ref()
            .map(serde_json::Value::to_string);
        let updated = on_dialect!(self, sqlx::query, UPDATE_IF_VERSION, |query, on| query
            .bind(&change.note)
            .bind(&address)
            .bind(&change.status)
            .bind(principal)
            .bind(id)
            .bind(version)
            .execute(on)
            .await?
            .rows_affected());
        Ok(updated == 1)
    }
}

fn items_json(order: &NewOrder) -> String {
    serde_json::to_string(&order.items).unwrap_or_else(|_| "[]".to_owned())
}

/// Inserts on a SQLite connection: the pool's, or a transactional `Tx`.
pub async fn insert_sqlite(
    conn: &mut SqliteConnection,
    placement: Placement<'_>,
    order: &NewOrder,
) -> Result<Order, sqlx::Error> {
    let operation_id = placement.operation_id.to_string();
    sqlx::query(INSERT.sqlite)
        .bind(&operation_id)
        .bind(placement.principal)
        .bind(order.amount)
        .bind(&order.currency)
        .bind(items_json(order))
        .bind(placement.charge_id)
        .bind(placement.client_order_id)
        .execute(&mut *conn)
        .await?;
    let row = sqlx::query(BY_OPERATION.sqlite)
        .bind(&operation_id)
        .fetch_one(&mut *conn)
        .await?;
    // Just inserted, or this operation's order from an earlier run: either way
    // answered as its create answered it.
    Ok(order_from(&row)?.as_created())
}

/// Inserts on a PostgreSQL connection: the pool's, or a transactional `Tx`.
pub async fn insert_postgres(
    conn: &mut PgConnection,
    placement: Placement<'_>,
    order: &NewOrder,
) -> Result<Order, sqlx::Error> {
    // The new row comes back from the insert itself; only when this operation's
    // order already exists (a second run) is it read separately.
    let inserted = sqlx::query(INSERT.postgres)
        .bind(placement.operation_id)
        .bind(placement.principal)
        .bind(order.amount)
        .bind(&order.currency)
        .bind(items_json(order))
        .bind(placement.charge_id)
        .bind(placement.client_order_id)
        .fetch_optional(&mut *conn)
        .await?;
    match inserted {
        Some(row) => order_from(&row),
        // An earlier run's order, answered as its create answered it.
        None => Ok(order_from(
            &sqlx::query(BY_OPERATION.postgres)
                .bind(placement.operation_id)
                .fetch_one(&mut *conn)
                .await?,
        )?
        .as_created()),
    }
}

fn decode_items(text: &str) -> Result<Vec<Item>, sqlx::Error> {
    serde_json::from_str(text).map_err(|error| sqlx::Error::Decode(Box::new(error)))
}

fn decode_address(text: Option<&str>) -> Result<Option<serde_json::Value>, sqlx::Error> {
    text.map(serde_json::from_str)
        .transpose()
        .map_err(|error| sqlx::Error::Decode(Box::new(error)))
}

/// An order from a row of either database.
fn order_from<R: Row>(row: &R) -> Result<Order, sqlx::Error>
where
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> &'r str: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(Order {
        order_id: row.try_get("id")?,
        amount: row.try_get("amount")?,
        currency: row.try_get::<&str, _>("currency")?.to_owned(),
        status: row.try_get::<&str, _>("status")?.to_owned(),
        items: decode_items(row.try_get("items")?)?,
        client_order_id: row
            .try_get::<Option<&str>, _>("client_order_id")?
            .map(str::to_owned),
        note: row.try_get::<Option<&str>, _>("note")?.map(str::to_owned),
        shipping_address: decode_address(row.try_get("shipping_address")?)?,
        version: row.try_get("version")?,
        payment_confirmed_at: row.try_get("payment_confirmed_at")?,
        payment_event_id: row
            .try_get::<Option<&str>, _>("payment_event_id")?
            .map(str::to_owned),
    })
}

#[cfg(test)]
mod tests;
