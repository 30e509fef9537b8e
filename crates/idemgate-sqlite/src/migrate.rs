//! The store's own schema migration, versioned in its own table.

use sqlx::{AssertSqlSafe, SqlitePool};

use idemgate_sqlx::SchemaStep;

use crate::audit;
use crate::durations;
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
    // Each version's steps, from the one after `found` on.
    let early = [(1, sql::schema_v1(table)), (2, sql::schema_v2(table))];
    run_steps(&mut tx, found, early).await?;
    // Version 3: the records' `field_digests`, added where it is missing (a
    // table recorded at an older version may already have it).
    if found.is_none_or(|found| found < 3) {
        let present: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2")
                .bind(table.to_owned())
                .bind(sql::FIELD_DIGESTS_COLUMN)
                .fetch_one(&mut *tx)
                .await
                .map_err(Error::Migrate)?;
        if present == 0 {
            sqlx::query(AssertSqlSafe(sql::schema_v3(table)))
                .execute(&mut *tx)
                .await
                .map_err(Error::Migrate)?;
        }
    }
    let later = [
        // The journal's tables (`crate::audit`).
        (4, audit::schema(table)),
        // The routes' execution histories (`crate::durations`).
        (5, durations::schema(table)),
        // The streams recorded in pieces (`crate::pieces`).
        (6, crate::pieces::schema(table)),
        // The journal's chain kept by triggers, without the key digest's
        // index (`crate::audit`).
        (7, audit::chain_triggers(table)),
    ];
    run_steps(&mut tx, found, later).await?;
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

/// Runs each version's statements, in order, for the versions after `found`.
async fn run_steps<const N: usize>(
    tx: &mut sqlx::SqliteConnection,
    found: Option<i64>,
    steps: [(i64, Vec<String>); N],
) -> Result<(), Error> {
    for (version, statements) in steps {
        if found.is_some_and(|found| found >= version) {
            continue;
        }
        for statement in statements {
            sqlx::query(AssertSqlSafe(statement))
                .execute(&mut *tx)
                .await
                .map_err(Error::Migrate)?;
        }
    }
    Ok(())
}
