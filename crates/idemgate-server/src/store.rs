//! Opening an idempotency store from its [`StoreUrl`]: the one opener `serve`,
//! `proxy` and `keys` share. A store opened to serve from is migrated, checked
//! and (the SQL stores) purged of expired records in the background; one opened
//! for an operator's look is taken as it is.

use std::sync::Arc;
use std::time::Duration;

use idemgate::{MemoryStore, Store};
use idemgate_postgres::PostgresStore;
use idemgate_redis::{PersistenceCheck, RedisStore, RedisStoreError};
use idemgate_sqlite::SqliteStore;
use idemgate_sqlx::{PurgeTask, SetupError};
use sqlx::{PgPool, SqlitePool};

use crate::config::{RedisPersistence, RedisSafety, StoreUrl};
use crate::database::{connect_postgres, connect_sqlite, sqlite_path};

/// How often expired idempotency records are purged from the SQL stores.
const PURGE_EVERY: Duration = Duration::from_secs(60);
/// How many expired records one purge statement deletes.
const PURGE_BATCH: usize = 1_000;

/// What opening a store prepares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// A store to serve from: the SQL stores migrated, with their purge task;
    /// Redis checked per [`RedisSafety`].
    Serve,
    /// An operator's look at a store as it is: no migration (a store never set
    /// up answers `Misconfigured`), no purge task, a SQLite file that must exist,
    /// Redis only warned about.
    Inspect,
}

/// An open store, and the SQL stores' purge task (running until it drops).
pub struct OpenedStore {
    /// The store.
    pub store: Arc<dyn Store>,
    /// The purge task, for a SQL store opened to serve from.
    pub purge: Option<PurgeTask>,
}

impl std::fmt::Debug for OpenedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedStore")
            .field("purge", &self.purge.is_some())
            .finish_non_exhaustive()
    }
}

/// Why a store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// `Opening::Inspect` of a SQLite file that does not exist (opening would
    /// create an empty one).
    #[error("no SQLite file at {0}")]
    NoSqliteFile(String),
    /// The SQL database is unreachable or refused the connection.
    #[error("{0}")]
    Connect(#[source] sqlx::Error),
    /// The SQLite or PostgreSQL store could not be migrated or its purge started.
    #[error("{0}")]
    Setup(#[from] SetupError),
    /// Redis is unreachable or unsafe (eviction policy, persistence).
    #[error("{0}")]
    Redis(#[from] RedisStoreError),
}

impl OpenError {
    /// What failed, for a message that names it: `SQL idempotency store`, …
    pub fn what(&self) -> &'static str {
        match self {
            Self::NoSqliteFile(_) => "idempotency store",
            Self::Connect(_) => "idempotency store database",
            Self::Setup(_) => "SQL idempotency store",
            Self::Redis(_) => "Redis idempotency store",
        }
    }
}

/// Opens the store at `url`, every call bounded by `timeout` where the backend
/// has its own bound (pool checkout, statement, Redis response).
pub async fn open(
    url: &StoreUrl,
    opening: Opening,
    timeout: Duration,
    redis: RedisSafety,
) -> Result<OpenedStore, OpenError> {
    let serve = opening == Opening::Serve;
    Ok(match url {
        StoreUrl::Memory => OpenedStore {
            store: Arc::new(MemoryStore::new()),
            purge: None,
        },
        StoreUrl::Sqlite(url) => {
            let path = sqlite_path(url);
            if !serve && !std::path::Path::new(path).exists() {
                return Err(OpenError::NoSqliteFile(path.to_owned()));
            }
            let pool = connect_sqlite(url, timeout)
                .await
                .map_err(OpenError::Connect)?;
            if serve {
                let (store, purge) = sqlite_on(pool).await?;
                OpenedStore {
                    store: Arc::new(store),
                    purge: Some(purge),
                }
            } else {
                OpenedStore {
                    store: Arc::new(SqliteStore::new(pool)),
                    purge: None,
                }
            }
        }
        StoreUrl::Postgres(url) => {
            let pool = connect_postgres(url, timeout)
                .await
                .map_err(OpenError::Connect)?;
            if serve {
                let (store, purge) = postgres_on(pool).await?;
                OpenedStore {
                    store: Arc::new(store),
                    purge: Some(purge),
                }
            } else {
                OpenedStore {
                    store: Arc::new(PostgresStore::new(pool)),
                    purge: None,
                }
            }
        }
        StoreUrl::Redis(url) => {
            let redis = if serve { redis } else { RedisSafety::default() };
            OpenedStore {
                store: Arc::new(connect_redis(url, timeout, redis).await?),
                purge: None,
            }
        }
    })
}

/// The SQLite store on an open `pool` (serve's orders database, in the
/// transactional mode), migrated, and its purge task.
pub async fn sqlite_on(pool: SqlitePool) -> Result<(SqliteStore, PurgeTask), SetupError> {
    let store = SqliteStore::new(pool);
    store.migrate().await?;
    let purge = store.spawn_purge(PURGE_EVERY, PURGE_BATCH)?;
    Ok((store, purge))
}

/// The PostgreSQL store on an open `pool`, migrated, and its purge task.
pub async fn postgres_on(pool: PgPool) -> Result<(PostgresStore, PurgeTask), SetupError> {
    let store = PostgresStore::new(pool);
    store.migrate().await?;
    let purge = store.spawn_purge(PURGE_EVERY, PURGE_BATCH)?;
    Ok((store, purge))
}

/// The Redis store at `url`: every command bounded by `timeout`, the
/// persistence check, and the replication wait when `wait_replicas > 0`.
pub async fn connect_redis(
    url: &str,
    timeout: Duration,
    safety: RedisSafety,
) -> Result<RedisStore, RedisStoreError> {
    let mut builder = RedisStore::builder()
        .with_response_timeout(timeout)
        .with_persistence_check(match safety.persistence {
            RedisPersistence::Warn => PersistenceCheck::Warn,
            RedisPersistence::Refuse => PersistenceCheck::Refuse,
        });
    if safety.wait_replicas > 0 {
        builder = builder.with_replication_wait(safety.wait_replicas, timeout / 2);
    }
    builder.connect(url).await
}
