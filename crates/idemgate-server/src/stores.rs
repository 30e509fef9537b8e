//! Opening the idempotency stores, for `serve` and `proxy` alike: migrated, with
//! their purge task where they need one.

use std::time::Duration;

use idemgate_redis::{PersistenceCheck, RedisStore, RedisStoreError};
use idemgate_sqlx::PurgeTask;
use sqlx::{PgPool, SqlitePool};

use crate::cli::RedisPersistence;

/// How often expired idempotency records are purged from the SQL stores.
const PURGE_EVERY: Duration = Duration::from_secs(60);
/// How many expired records one purge statement deletes.
const PURGE_BATCH: usize = 1_000;

/// The SQLite store on `pool`, migrated, and its purge task (running until the
/// handle drops).
pub(crate) async fn sqlite(
    pool: SqlitePool,
) -> Result<(idemgate_sqlite::SqliteStore, PurgeTask), idemgate_sqlite::Error> {
    let store = idemgate_sqlite::SqliteStore::new(pool);
    store.migrate().await?;
    let purge = store.spawn_purge(PURGE_EVERY, PURGE_BATCH)?;
    Ok((store, purge))
}

/// The PostgreSQL store on `pool`, migrated, and its purge task.
pub(crate) async fn postgres(
    pool: PgPool,
) -> Result<(idemgate_postgres::PostgresStore, PurgeTask), idemgate_postgres::Error> {
    let store = idemgate_postgres::PostgresStore::new(pool);
    store.migrate().await?;
    let purge = store.spawn_purge(PURGE_EVERY, PURGE_BATCH)?;
    Ok((store, purge))
}

/// The Redis store at `url`: every command bounded by `store_timeout`, the
/// persistence check, and the replication wait when `wait_replicas > 0`.
pub(crate) async fn redis(
    url: &str,
    store_timeout: Duration,
    persistence: RedisPersistence,
    wait_replicas: u32,
) -> Result<RedisStore, RedisStoreError> {
    let mut builder = RedisStore::builder()
        .with_response_timeout(store_timeout)
        .with_persistence_check(match persistence {
            RedisPersistence::Warn => PersistenceCheck::Warn,
            RedisPersistence::Refuse => PersistenceCheck::Refuse,
        });
    if wait_replicas > 0 {
        builder = builder.with_replication_wait(wait_replicas, store_timeout / 2);
    }
    builder.connect(url).await
}
