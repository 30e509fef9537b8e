//! The store's own schema migration, versioned in its own table.

use sqlx::{AssertSqlSafe, PgPool};

use idemgate_sqlx::SchemaStep;

use crate::audit;
use crate::durations;
use crate::error::Error;
use crate::pieces;
use crate::sql::{self, Names, SCHEMA_VERSION};

/// Every idemgate migrator takes this transaction-scoped advisory lock, so concurrent
/// `migrate()` calls run one after the other. It is derived from a fixed string, so
/// it does not depend on any application's advisory-lock numbering scheme.
const LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended('idemgate.migrate', 0))";

pub(crate) async fn run(pool: &PgPool, names: &Names) -> Result<(), Error> {
    let mut tx = pool.begin().await.map_err(Error::Migrate)?;
    sqlx::query(LOCK)
        .execute(&mut *tx)
        .await
        .map_err(Error::Migrate)?;
    let versions = names.versions();
    // Look before creating anything: once the schema is current, `migrate()` runs no
    // DDL at all, so a role without CREATE privileges can call it on every start.
    let found = current_version(&mut tx, names).await?;
    if idemgate_sqlx::schema_step(found, SCHEMA_VERSION)? == SchemaStep::UpToDate {
        return tx.commit().await.map_err(Error::Migrate);
    }
    // Nothing yet, or an older version: each version's steps below run from the
    // one after the version found on.
    if let Some(schema) = &names.schema {
        let create = format!("CREATE SCHEMA IF NOT EXISTS {}", sql::quote(schema));
        sqlx::raw_sql(AssertSqlSafe(create))
            .execute(&mut *tx)
            .await
            .map_err(Error::Migrate)?;
    }
    let create_versions = format!(
        "CREATE TABLE IF NOT EXISTS {versions} ( \
             table_name  TEXT        NOT NULL PRIMARY KEY, \
             version     BIGINT      NOT NULL, \
             migrated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp() \
         )"
    );
    sqlx::raw_sql(AssertSqlSafe(create_versions))
        .execute(&mut *tx)
        .await
        .map_err(Error::Migrate)?;
    let steps = [
        (1, sql::schema_v1(names)),
        (2, sql::schema_v2(names)),
        (3, sql::schema_v3(names)),
        (4, sql::schema_v4(names)),
        (5, audit::schema(names)),
        (6, durations::schema(names)),
        (7, pieces::schema(names)),
        (8, audit::schema_v8(names)),
    ];
    for (version, statements) in steps {
        if found.is_some_and(|found| found >= version) {
            continue;
        }
        for statement in statements {
            sqlx::raw_sql(AssertSqlSafe(statement))
                .execute(&mut *tx)
                .await
                .map_err(Error::Migrate)?;
        }
    }
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {versions} (table_name, version) VALUES ($1, $2) \
         ON CONFLICT (table_name) DO UPDATE \
         SET version = EXCLUDED.version, migrated_at = clock_timestamp()"
    )))
    .bind(&names.table)
    .bind(SCHEMA_VERSION)
    .execute(&mut *tx)
    .await
    .map_err(Error::Migrate)?;
    tx.commit().await.map_err(Error::Migrate)
}

/// The version recorded for the record table, `None` if there is none (or no
/// version table yet).
async fn current_version(tx: &mut sqlx::PgConnection, names: &Names) -> Result<Option<i64>, Error> {
    let versions = names.versions();
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&versions)
        .fetch_one(&mut *tx)
        .await
        .map_err(Error::Migrate)?;
    if !exists {
        return Ok(None);
    }
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT version FROM {versions} WHERE table_name = $1"
    )))
    .bind(&names.table)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::Migrate)
}
