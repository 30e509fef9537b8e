//! The stores a fault test runs the server on: SQLite (the default), PostgreSQL (the
//! shared test server: these tests kill and freeze only `idemgate` processes, never
//! it), and Redis for the idempotency records with the orders in PostgreSQL.
//! The memory store is left out: it forgets every record when its process dies, so
//! a retry after `kill -9` runs again by design.

use super::effects::OrdersTable;
use crate::support::server::{Options, TempDir, postgres_url, redis_url, sqlite_url};

/// Which store the records (and the orders) live in.
#[derive(Debug, Clone, Copy)]
pub enum Shared {
    /// One SQLite file, records and orders in one transaction.
    Sqlite,
    /// The shared PostgreSQL, records and orders in one transaction.
    Postgres,
    /// The shared Redis for records; orders in the shared PostgreSQL.
    Redis,
}

/// Where a test's servers keep their records and orders; every server started from
/// it shares them.
pub struct Setup {
    database: String,
    store: String,
    _dir: Option<TempDir>,
}

impl Setup {
    pub fn new(shared: Shared) -> Self {
        let (database, store, dir) = match shared {
            Shared::Sqlite => {
                let (database, dir) = sqlite_url();
                (database, "database".to_owned(), Some(dir))
            }
            Shared::Postgres => (postgres_url(), "database".to_owned(), None),
            Shared::Redis => (postgres_url(), redis_url(), None),
        };
        Self {
            database,
            store,
            _dir: dir,
        }
    }

    /// Server options on this store, charging at `gateway`.
    pub fn options(&self, gateway: String) -> Options {
        Options::new(&self.database)
            .store(&self.store)
            .gateway(gateway)
    }

    /// The orders table the servers write.
    pub fn orders(&self) -> OrdersTable {
        OrdersTable::of(&self.database)
    }
}
