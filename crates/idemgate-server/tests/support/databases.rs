//! PostgreSQL databases of a test's own, on the test server
//! (`IDEMGATE_TEST_POSTGRES_URL`): a test that tampers with its tables, counts
//! its rows or reaches it through a relay gets one, and drops it at the end.

use std::net::SocketAddr;

use sqlx::Connection;
use sqlx::postgres::PgConnectOptions;

use crate::support::server::postgres_url;

/// A database created for one test, dropped by [`OwnDatabase::drop_it`].
pub struct OwnDatabase {
    admin: sqlx::PgConnection,
    name: String,
}

impl OwnDatabase {
    /// A fresh database named `idemgate_<purpose>_<uuid>`.
    pub async fn create(purpose: &str) -> Self {
        let base = postgres_url();
        let mut admin = sqlx::PgConnection::connect(&base)
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "PostgreSQL at {base} is unreachable ({error}): start it with \
                     `scripts/services.sh postgres` or set IDEMGATE_TEST_POSTGRES_URL"
                )
            });
        let name = format!("idemgate_{purpose}_{}", uuid::Uuid::new_v4().simple());
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .expect("create the database");
        Self { admin, name }
    }

    /// Its URL, direct.
    pub fn url(&self) -> String {
        let base = postgres_url();
        let (prefix, _) = base.rsplit_once('/').expect("a database in the URL");
        format!("{prefix}/{}", self.name)
    }

    /// Its URL through a relay listening on `relay` (a counting or freezing
    /// tap in front of the test server).
    pub fn url_through(&self, relay: SocketAddr) -> String {
        let options: PgConnectOptions = postgres_url().parse().expect("url");
        format!(
            "postgres://{}@{relay}/{}",
            options.get_username(),
            self.name
        )
    }

    /// Drops it, closing whatever still holds connections to it.
    pub async fn drop_it(mut self) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE {} WITH (FORCE)",
            self.name
        )))
        .execute(&mut self.admin)
        .await
        .expect("drop the database");
    }
}
