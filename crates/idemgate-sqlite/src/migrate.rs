//! The store's own schema migration, versioned in its own table.

use sqlx::{AssertSqlSafe, SqlitePool};

use idemgate_sqlx::SchemaStep;

use crate::error::Error;
use crate::sql::{self, BEGIN_IMMEDIATE, SCHEMA_VERSION, VERSION_TABLE};

pub(crate) async fn run(pool: &SqlitePool, table: &str) -> Result<(), Error> {
    // IMMEDIATE takes the write lock first: concurrent migrators queue on the busy
    // timeout instead of racing between "is it there?" and "create it".
    let mut tx = pool
        .begin_with(BEGIN_IMMEDIATE)
        .await
        .map_err(Error::Migrate)?;
    let versions = sql::quote(VERSION_TABLE);
    let create_versions = format!(
        "CREATE TABLE IF NOT EXISTS {versions} ( \
             table_name  TEXT    NOT NULL PRIMARY KEY, \
             version     INTEGER NOT NULL, \
             migrated_at INTEGER NOT NULL \
         ) STRICT"
    );
    sqlx::query(AssertSqlSafe(create_versions))
        .execute(&mut *tx)
        .await
        .map_err(Error::Migrate)?;
    let found: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT version FROM {versions} WHERE table_name = ?1"
    )))
    .bind(table.to_owned())
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::Migrate)?;
    if idemgate_sqlx::schema_step(found, SCHEMA_VERSION)? == SchemaStep::UpToDate {
        return tx.commit().await.map_err(Error::Migrate);
    }
    // Version 1 is the only one so far; later versions add their steps here,
    // guarded by `found`.
    for statement in sql::schema_v1(table) {
        sqlx::query(AssertSqlSafe(statement))
            .execute(&mut *tx)
            .await
            .map_err(Error::Migrate)?;
    }
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {versions} (table_name, version, migrated_at) VALUES (?1, ?2, {now}) \
         ON CONFLICT (table_name) DO UPDATE \
         SET version = excluded.version, migrated_at = excluded.migrated_at",
        now = sql::NOW,
    )))
    .bind(table.to_owned())
    .bind(SCHEMA_VERSION)
    .execute(&mut *tx)
    .await
    .map_err(Error::Migrate)?;
    tx.commit().await.map_err(Error::Migrate)
}
