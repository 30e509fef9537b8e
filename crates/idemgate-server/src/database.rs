//! Connection pools to SQLite and PostgreSQL, bounded by the store timeout: what
//! the orders database and the SQL idempotency stores both open.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{PgPool, SqlitePool};

/// The file path of a `sqlite://PATH` (or `sqlite:PATH`) URL.
pub fn sqlite_path(url: &str) -> &str {
    url.trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:")
}

/// A SQLite pool on `url` (`sqlite://PATH`, the file created if missing).
/// `timeout` bounds a connection checkout, and a lock wait when it is longer than
/// the SQLite store's default, so a locked database answers an error (503)
/// instead of holding the request.
pub async fn connect_sqlite(url: &str, timeout: Duration) -> Result<SqlitePool, sqlx::Error> {
    SqlitePoolOptions::new()
        .max_connections(8)
        .acquire_timeout(timeout)
        // Lock waits at least the crate's default: two processes starting on
        // one file migrate in turn, and a slow disk must not fail that. A
        // request is still bounded by the layer's store timeout.
        .connect_with(
            idemgate_sqlite::SqliteStore::connect_options(sqlite_path(url))
                .busy_timeout(timeout.max(idemgate_sqlite::DEFAULT_BUSY_TIMEOUT)),
        )
        .await
}

/// A PostgreSQL pool on `url`, every statement and connection checkout bounded
/// by `timeout`, so a frozen server answers an error instead of holding requests.
///
/// The store's pool settings: a checkout pings only a connection idle for a
/// while ([`idemgate_postgres::PostgresStore::pool_options`]), for the orders
/// too, and with `--no-idempotency` as well, so the benchmark's baseline pays
/// the same per checkout. What bounds a `BEGIN` on a frozen server is then a
/// deadline on the client's side: the store's `Tx`, and the orders service's
/// writes (`OrdersDb::bounded`).
pub async fn connect_postgres(url: &str, timeout: Duration) -> Result<PgPool, sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?
        .options([("statement_timeout", format!("{}ms", timeout.as_millis()))]);
    idemgate_postgres::PostgresStore::pool_options()
        .max_connections(32)
        .acquire_timeout(timeout)
        .connect_with(options)
        .await
}
