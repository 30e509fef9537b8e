//! The orders database: SQLite or PostgreSQL.
//!
//! Every order row carries the operation id it was created by, under a UNIQUE
//! constraint (PROTOCOL §11): whatever the idempotency store, one operation cannot
//! insert two orders.

use std::time::Duration;

use sqlx::{PgConnection, PgPool, Row, SqliteConnection, SqlitePool};
use uuid::Uuid;

use crate::config::DatabaseUrl;
use crate::database::{connect_postgres, connect_sqlite};
use crate::orders::order::{Item, NewOrder, Order, OrderChange};

/// The columns an [`Order`] is read from, in every query that reads one.
macro_rules! columns {
    () => {
        "id, amount, currency, status, items, client_order_id, note, shipping_address, version"
    };
}

/// The orders database.
#[derive(Debug, Clone)]
pub enum OrdersDb {
    /// An embedded SQLite file.
    Sqlite(SqlitePool),
    /// A PostgreSQL server.
    Postgres(PgPool),
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

/// A read of orders: the columns every read selects, then `$tail` (a literal,
/// so the statement stays static SQL).
macro_rules! select_orders {
    ($tail:literal) => {
        concat!("SELECT ", columns!(), " FROM orders ", $tail)
    };
}

impl OrdersDb {
    /// Connects (creating the SQLite file if missing). `timeout` bounds a
    /// connection checkout and a PostgreSQL statement, and a SQLite lock wait when
    /// it is longer than the SQLite store's default, so a frozen or locked database
    /// answers an error (503) instead of holding the request.
    pub async fn connect(url: &DatabaseUrl, timeout: Duration) -> Result<Self, sqlx::Error> {
        Ok(match url {
            DatabaseUrl::Sqlite(url) => Self::Sqlite(connect_sqlite(url, timeout).await?),
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
                Err(error)
                    if idemgate_sqlite::is_busy(&error)
                        && tokio::time::Instant::now() < deadline =>
                {
                    tracing::debug!(%error, "the orders database is busy at startup; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                opened => return opened,
            }
        }
    }

    /// Creates the orders table if it is missing (idempotent, safe to run from
    /// several instances at once).
    pub async fn migrate(&self) -> Result<(), sqlx::Error> {
        match self {
            Self::Sqlite(pool) => {
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS orders (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        operation_id TEXT NOT NULL UNIQUE,
                        principal TEXT NOT NULL,
                        amount INTEGER NOT NULL CHECK (amount > 0),
                        currency TEXT NOT NULL,
                        items TEXT NOT NULL,
                        charge_id TEXT,
                        status TEXT NOT NULL,
                        client_order_id TEXT,
                        created_at INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))
                    )",
                )
                .execute(pool)
                .await?;
                // A table made before natural keys: add the column (once; a
                // concurrent starter that added it first is not an error).
                let has_column = |pool: &SqlitePool| {
                    let pool = pool.clone();
                    async move {
                        sqlx::query_scalar::<_, i64>(
                            "SELECT COUNT(*) FROM pragma_table_info('orders') WHERE name = 'client_order_id'",
                        )
                        .fetch_one(&pool)
                        .await
                    }
                };
                if has_column(pool).await? == 0 {
                    let added = sqlx::query("ALTER TABLE orders ADD COLUMN client_order_id TEXT")
                        .execute(pool)
                        .await;
                    if let Err(error) = added
                        && has_column(pool).await? == 0
                    {
                        return Err(error);
                    }
                }
                sqlx::query(
                    "CREATE INDEX IF NOT EXISTS orders_by_principal ON orders (principal, id)",
                )
                .execute(pool)
                .await?;
                sqlx::query(
                    "CREATE UNIQUE INDEX IF NOT EXISTS orders_by_client_id ON orders (principal, client_order_id)",
                )
                .execute(pool)
                .await?;
                // The mutable part of an order and its version (PROTOCOL §17),
                // added to a table an older release created. SQLite has no ADD
                // COLUMN IF NOT EXISTS: a column another instance added meanwhile
                // fails with "duplicate column", which is the state wanted.
                for (column, add, _) in EDITABLE_COLUMNS {
                    let present: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM pragma_table_info('orders') WHERE name = ?",
                    )
                    .bind(column)
                    .fetch_one(pool)
                    .await?;
                    if present == 0 {
                        let added = sqlx::query(add).execute(pool).await;
                        match added {
                            Err(sqlx::Error::Database(error))
                                if error.message().contains("duplicate column") => {}
                            added => {
                                added?;
                            }
                        }
                    }
                }
            }
            Self::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                // Concurrent CREATE TABLE IF NOT EXISTS can still collide in the
                // catalog; serialize instances on an advisory lock.
                sqlx::query("SELECT pg_advisory_xact_lock(7305872301)")
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS orders (
                        id BIGSERIAL PRIMARY KEY,
                        operation_id UUID NOT NULL UNIQUE,
                        principal TEXT NOT NULL,
                        amount BIGINT NOT NULL CHECK (amount > 0),
                        currency TEXT NOT NULL,
                        items TEXT NOT NULL,
                        charge_id TEXT,
                        status TEXT NOT NULL,
                        client_order_id TEXT,
                        created_at TIMESTAMPTZ NOT NULL DEFAULT now()
                    )",
                )
                .execute(&mut *tx)
                .await?;
                sqlx::query("ALTER TABLE orders ADD COLUMN IF NOT EXISTS client_order_id TEXT")
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "CREATE UNIQUE INDEX IF NOT EXISTS orders_by_client_id ON orders (principal, client_order_id)",
                )
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "CREATE INDEX IF NOT EXISTS orders_by_principal ON orders (principal, id)",
                )
                .execute(&mut *tx)
                .await?;
                for (_, _, add) in EDITABLE_COLUMNS {
                    sqlx::query(add).execute(&mut *tx).await?;
                }
                tx.commit().await?;
            }
        }
        self.migrate_ledger().await
    }

    /// Creates the ledger's accounts and transfers tables if missing
    /// (idempotent); their statements live in `ledger`.
    async fn migrate_ledger(&self) -> Result<(), sqlx::Error> {
        match self {
            Self::Sqlite(pool) => {
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS accounts (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    operation_id TEXT NOT NULL UNIQUE,
                    principal TEXT NOT NULL,
                    balance INTEGER NOT NULL CHECK (balance >= 0),
                    currency TEXT NOT NULL,
                    version INTEGER NOT NULL DEFAULT 1
                )",
                )
                .execute(pool)
                .await?;
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS transfers (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    from_account INTEGER NOT NULL REFERENCES accounts (id),
                    to_account INTEGER NOT NULL REFERENCES accounts (id),
                    amount INTEGER NOT NULL CHECK (amount > 0),
                    reference_id TEXT NOT NULL,
                    balance_after INTEGER NOT NULL,
                    UNIQUE (from_account, reference_id)
                )",
                )
                .execute(pool)
                .await?;
            }
            Self::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                // The orders migration's lock: concurrent CREATE TABLE IF NOT EXISTS
                // can collide in the catalog.
                sqlx::query("SELECT pg_advisory_xact_lock(7305872301)")
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS accounts (
                    id BIGSERIAL PRIMARY KEY,
                    operation_id UUID NOT NULL UNIQUE,
                    principal TEXT NOT NULL,
                    balance BIGINT NOT NULL CHECK (balance >= 0),
                    currency TEXT NOT NULL,
                    version BIGINT NOT NULL DEFAULT 1
                )",
                )
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS transfers (
                    id BIGSERIAL PRIMARY KEY,
                    from_account BIGINT NOT NULL REFERENCES accounts (id),
                    to_account BIGINT NOT NULL REFERENCES accounts (id),
                    amount BIGINT NOT NULL CHECK (amount > 0),
                    reference_id TEXT NOT NULL,
                    balance_after BIGINT NOT NULL,
                    UNIQUE (from_account, reference_id)
                )",
                )
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }

    /// Inserts an order outside any idempotency transaction. A second insert for the
    /// same operation inserts nothing and returns the first one's order.
    pub async fn insert(
        &self,
        placement: Placement<'_>,
        order: &NewOrder,
    ) -> Result<Order, sqlx::Error> {
        match self {
            Self::Sqlite(pool) => {
                insert_sqlite(&mut *pool.acquire().await?, placement, order).await
            }
            Self::Postgres(pool) => {
                insert_postgres(&mut *pool.acquire().await?, placement, order).await
            }
        }
    }

    /// The principal's orders, oldest first.
    pub async fn list(&self, principal: &str) -> Result<Vec<Order>, sqlx::Error> {
        match self {
            Self::Sqlite(pool) => sqlx::query(select_orders!("WHERE principal = ? ORDER BY id"))
                .bind(principal)
                .fetch_all(pool)
                .await?
                .iter()
                .map(order_from_sqlite)
                .collect(),
            Self::Postgres(pool) => sqlx::query(select_orders!("WHERE principal = $1 ORDER BY id"))
                .bind(principal)
                .fetch_all(pool)
                .await?
                .iter()
                .map(order_from_postgres)
                .collect(),
        }
    }

    /// One of the principal's orders; `None` if it does not exist or is someone
    /// else's.
    pub async fn get(&self, principal: &str, id: i64) -> Result<Option<Order>, sqlx::Error> {
        match self {
            Self::Sqlite(pool) => {
                OrdersConn::Sqlite(&mut *pool.acquire().await?)
                    .get(principal, id)
                    .await
            }
            Self::Postgres(pool) => {
                OrdersConn::Postgres(&mut *pool.acquire().await?)
                    .get(principal, id)
                    .await
            }
        }
    }

    /// The principal's order under its client-chosen id; `None` if there is none
    /// (another principal's order of that id is never found).
    pub async fn get_by_client_id(
        &self,
        principal: &str,
        client_order_id: &str,
    ) -> Result<Option<Order>, sqlx::Error> {
        match self {
            Self::Sqlite(pool) => {
                let row = sqlx::query(select_orders!(
                    "WHERE principal = ? AND client_order_id = ?"
                ))
                .bind(principal)
                .bind(client_order_id)
                .fetch_optional(pool)
                .await?;
                row.as_ref().map(order_from_sqlite).transpose()
            }
            Self::Postgres(pool) => {
                let row = sqlx::query(select_orders!(
                    "WHERE principal = $1 AND client_order_id = $2"
                ))
                .bind(principal)
                .bind(client_order_id)
                .fetch_optional(pool)
                .await?;
                row.as_ref().map(order_from_postgres).transpose()
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
            Self::Sqlite(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop),
            Self::Postgres(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop),
        }
    }

    /// Closes the pool, waiting for connections to be returned.
    pub async fn close(&self) {
        match self {
            Self::Sqlite(pool) => pool.close().await,
            Self::Postgres(pool) => pool.close().await,
        }
    }
}

/// Columns added after the first release, with their definitions (the same on
/// SQLite and PostgreSQL): what a `PATCH` may change, and the version every
/// change increments, which the conditional update compares.
/// Each as (name, SQLite statement, PostgreSQL statement).
const EDITABLE_COLUMNS: [(&str, &str, &str); 3] = [
    (
        "note",
        "ALTER TABLE orders ADD COLUMN note TEXT",
        "ALTER TABLE orders ADD COLUMN IF NOT EXISTS note TEXT",
    ),
    (
        "shipping_address",
        "ALTER TABLE orders ADD COLUMN shipping_address TEXT",
        "ALTER TABLE orders ADD COLUMN IF NOT EXISTS shipping_address TEXT",
    ),
    (
        "version",
        "ALTER TABLE orders ADD COLUMN version BIGINT NOT NULL DEFAULT 1",
        "ALTER TABLE orders ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 1",
    ),
];

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
        match self {
            Self::Sqlite(conn) => {
                let row = sqlx::query(concat!(
                    "SELECT ",
                    columns!(),
                    " FROM orders WHERE principal = ? AND id = ?"
                ))
                .bind(principal)
                .bind(id)
                .fetch_optional(&mut **conn)
                .await?;
                row.as_ref().map(order_from_sqlite).transpose()
            }
            Self::Postgres(conn) => {
                let row = sqlx::query(concat!(
                    "SELECT ",
                    columns!(),
                    " FROM orders WHERE principal = $1 AND id = $2"
                ))
                .bind(principal)
                .bind(id)
                .fetch_optional(&mut **conn)
                .await?;
                row.as_ref().map(order_from_postgres).transpose()
            }
        }
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
        let updated = match self {
            Self::Sqlite(conn) => sqlx::query(
                "UPDATE orders SET note = ?, shipping_address = ?, status = ?, version = version + 1
                 WHERE principal = ? AND id = ? AND version = ?",
            )
            .bind(&change.note)
            .bind(address)
            .bind(&change.status)
            .bind(principal)
            .bind(id)
            .bind(version)
            .execute(&mut **conn)
            .await?
            .rows_affected(),
            Self::Postgres(conn) => sqlx::query(
                "UPDATE orders SET note = $1, shipping_address = $2, status = $3, version = version + 1
                 WHERE principal = $4 AND id = $5 AND version = $6",
            )
            .bind(&change.note)
            .bind(address)
            .bind(&change.status)
            .bind(principal)
            .bind(id)
            .bind(version)
            .execute(&mut **conn)
            .await?
            .rows_affected(),
        };
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
    sqlx::query(
        "INSERT INTO orders (operation_id, principal, amount, currency, items, charge_id, status, client_order_id)
         VALUES (?, ?, ?, ?, ?, ?, 'paid', ?) ON CONFLICT (operation_id) DO NOTHING",
    )
    .bind(&operation_id)
    .bind(placement.principal)
    .bind(order.amount)
    .bind(&order.currency)
    .bind(items_json(order))
    .bind(placement.charge_id)
    .bind(placement.client_order_id)
    .execute(&mut *conn)
    .await?;
    let row = sqlx::query(select_orders!("WHERE operation_id = ?"))
        .bind(&operation_id)
        .fetch_one(&mut *conn)
        .await?;
    order_from_sqlite(&row)
}

/// Inserts on a PostgreSQL connection: the pool's, or a transactional `Tx`.
pub async fn insert_postgres(
    conn: &mut PgConnection,
    placement: Placement<'_>,
    order: &NewOrder,
) -> Result<Order, sqlx::Error> {
    // The new row comes back from the insert itself (one round trip); only when
    // this operation's order already exists (a second run) is it read separately.
    // Not on SQLite: there an INSERT … RETURNING read with fetch_optional keeps its
    // statement, and so the write lock, open longer, which measured slower.
    let inserted = sqlx::query(concat!(
        "INSERT INTO orders (operation_id, principal, amount, currency, items, charge_id, status, client_order_id)
         VALUES ($1, $2, $3, $4, $5, $6, 'paid', $7) ON CONFLICT (operation_id) DO NOTHING
         RETURNING ",
        columns!()
    ))
    .bind(placement.operation_id)
    .bind(placement.principal)
    .bind(order.amount)
    .bind(&order.currency)
    .bind(items_json(order))
    .bind(placement.charge_id)
    .bind(placement.client_order_id)
    .fetch_optional(&mut *conn)
    .await?;
    let row = match inserted {
        Some(row) => row,
        None => {
            sqlx::query(select_orders!("WHERE operation_id = $1"))
                .bind(placement.operation_id)
                .fetch_one(&mut *conn)
                .await?
        }
    };
    order_from_postgres(&row)
}

fn decode_items(text: &str) -> Result<Vec<Item>, sqlx::Error> {
    serde_json::from_str(text).map_err(|error| sqlx::Error::Decode(Box::new(error)))
}

fn decode_address(text: Option<&str>) -> Result<Option<serde_json::Value>, sqlx::Error> {
    text.map(serde_json::from_str)
        .transpose()
        .map_err(|error| sqlx::Error::Decode(Box::new(error)))
}

fn order_from_sqlite(row: &sqlx::sqlite::SqliteRow) -> Result<Order, sqlx::Error> {
    Ok(Order {
        order_id: row.try_get("id")?,
        amount: row.try_get("amount")?,
        currency: row.try_get("currency")?,
        status: row.try_get("status")?,
        items: decode_items(row.try_get("items")?)?,
        client_order_id: row.try_get("client_order_id")?,
        note: row.try_get("note")?,
        shipping_address: decode_address(row.try_get("shipping_address")?)?,
        version: row.try_get("version")?,
    })
}

fn order_from_postgres(row: &sqlx::postgres::PgRow) -> Result<Order, sqlx::Error> {
    Ok(Order {
        order_id: row.try_get("id")?,
        amount: row.try_get("amount")?,
        currency: row.try_get("currency")?,
        status: row.try_get("status")?,
        items: decode_items(row.try_get("items")?)?,
        client_order_id: row.try_get("client_order_id")?,
        note: row.try_get("note")?,
        shipping_address: decode_address(row.try_get("shipping_address")?)?,
        version: row.try_get("version")?,
    })
}
