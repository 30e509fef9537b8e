//! Starting and stopping the service.

use std::sync::Arc;

use idemgate::{MemoryStore, Store};
use idemgate_sqlx::PurgeTask;

use crate::admin::{Admin, admin_app};
use crate::cli::{IdempotencyStore, LayerTiming, Settings};
use crate::gateway::Gateway;
use crate::http::{AppState, OrderWrites, app, app_without_idempotency};
use crate::listener::{Listener, ListenerOptions, raise_fd_limit};
use crate::repository::OrdersDb;
use crate::runtime::{
    UNAVAILABLE_RETRY_AFTER, idempotency_layer, install_metrics, serve_until_signal,
    with_replay_cache,
};
use crate::stores;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The orders database is unreachable or refused its migration.
    #[error("orders database: {0}")]
    Database(#[from] sqlx::Error),
    /// The proxy's SQL idempotency store is unreachable.
    #[error("idempotency store database: {0}")]
    StoreDatabase(#[source] sqlx::Error),
    /// The SQLite or PostgreSQL idempotency store could not be prepared.
    #[error("SQL idempotency store: {0}")]
    SqlStore(#[from] idemgate_sqlx::SetupError),
    /// Redis is unreachable or unsafe (eviction policy).
    #[error("Redis idempotency store: {0}")]
    RedisStore(#[from] idemgate_redis::RedisStoreError),
    /// The gateway client could not be built.
    #[error("payment gateway client: {0}")]
    Gateway(#[from] reqwest::Error),
    /// The listen address is taken or not ours.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The HTTP server failed.
    #[error("server: {0}")]
    Serve(std::io::Error),
}

/// The idempotency store, how orders are written with it, and the SQL stores'
/// purge task, which runs until the returned handle drops.
async fn idempotency_store(
    settings: &Settings,
    orders: &OrdersDb,
) -> Result<(Arc<dyn Store>, OrderWrites, Option<PurgeTask>), StartupError> {
    Ok(match (&settings.idempotency_store, orders) {
        (IdempotencyStore::Database, OrdersDb::Sqlite(pool)) => {
            let (store, purge) = stores::sqlite(pool.clone()).await?;
            (
                Arc::new(store.clone()),
                OrderWrites::SqliteTransaction(store),
                Some(purge),
            )
        }
        (IdempotencyStore::Database, OrdersDb::Postgres(pool)) => {
            let (store, purge) = stores::postgres(pool.clone()).await?;
            (
                Arc::new(store.clone()),
                OrderWrites::PostgresTransaction(store),
                Some(purge),
            )
        }
        (IdempotencyStore::Memory, _) => (Arc::new(MemoryStore::new()), OrderWrites::Direct, None),
        (IdempotencyStore::Redis(url), _) => {
            let store = stores::redis(
                url,
                settings.store_timeout,
                settings.redis.redis_persistence,
                settings.redis.redis_wait_replicas,
            )
            .await?;
            (Arc::new(store), OrderWrites::Direct, None)
        }
    })
}

/// Runs the service until SIGINT or SIGTERM, then shuts down gracefully: stop
/// accepting, let open requests finish, wait for detached handlers to store their
/// results, all within `settings.shutdown_timeout`.
pub async fn run(settings: Settings) -> Result<(), StartupError> {
    let metrics = install_metrics();
    let orders = OrdersDb::open(&settings.database, settings.store_timeout).await?;
    let (store, writes, _purge) = if settings.no_idempotency {
        // The benchmark baseline: the layer below is built (for its task handle)
        // but never installed, so its unused in-memory store sees no request.
        tracing::warn!(
            "--no-idempotency: serving without the idempotency layer (a benchmark baseline); retries run twice"
        );
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        (store, OrderWrites::Direct, None)
    } else {
        let (store, writes, purge) = idempotency_store(&settings, &orders).await?;
        (
            with_replay_cache(store, settings.replay_cache),
            writes,
            purge,
        )
    };
    let gateway = match &settings.gateway_url {
        Some(url) => Gateway::http(url, settings.gateway_timeout)?,
        None => {
            tracing::info!(
                "no payment gateway configured: using the built-in simulated gateway (approves every charge)"
            );
            Gateway::Simulated {
                delay: settings.simulated_gateway_delay,
            }
        }
    };
    let layer = idempotency_layer(
        Arc::clone(&store),
        LayerTiming {
            ttl: settings.ttl,
            lease: settings.lease,
            wait: settings.wait,
            store_timeout: settings.store_timeout,
            replay_cache: settings.replay_cache,
        },
    );
    let tasks = layer.detached_tasks();
    let admin = settings.admin_listen.map(|addr| {
        let state = Admin::new(
            store,
            settings.store_timeout,
            metrics.clone(),
            tasks.clone(),
            settings.admin_token.clone(),
        );
        (addr, admin_app(state))
    });
    if admin.is_none() && settings.admin_token.is_some() {
        tracing::warn!(
            "IDEMGATE_ADMIN_TOKEN is set but --admin-listen is not: the admin key API is not served"
        );
    }
    let state = AppState {
        orders: orders.clone(),
        writes,
        gateway,
        metrics,
        tasks: tasks.clone(),
        unavailable_retry_after: UNAVAILABLE_RETRY_AFTER,
    };
    let router = if settings.no_idempotency {
        app_without_idempotency(state)
    } else {
        app(state, layer)
    };

    let open_files = raise_fd_limit();
    let listener = bind(settings.listen, settings.connections).await?;
    let addr = listener.local_addr().map_err(StartupError::Serve)?;
    let mut servers = Vec::new();
    if let Some((admin_addr, admin_router)) = admin {
        let admin_listener = bind(admin_addr, settings.connections).await?;
        let admin_addr = admin_listener.local_addr().map_err(StartupError::Serve)?;
        tracing::info!(%admin_addr, "admin listening on http://{admin_addr}");
        servers.push((admin_listener, admin_router));
    }
    tracing::info!(
        %addr,
        database = database_kind(&orders),
        store = ?settings.idempotency_store_kind(),
        max_connections = listener.max_connections(),
        open_files,
        "idemgate listening on http://{addr}"
    );
    servers.insert(0, (listener, router));
    serve_until_signal(servers, tasks, settings.shutdown_timeout).await;
    orders.close().await;
    Ok(())
}

/// Binds a listener, naming the address when it cannot.
pub(crate) async fn bind(
    addr: std::net::SocketAddr,
    options: ListenerOptions,
) -> Result<Listener, StartupError> {
    Listener::bind(addr, options)
        .await
        .map_err(|source| StartupError::Listen { addr, source })
}

fn database_kind(orders: &OrdersDb) -> &'static str {
    match orders {
        OrdersDb::Sqlite(_) => "sqlite",
        OrdersDb::Postgres(_) => "postgres",
    }
}

impl Settings {
    fn idempotency_store_kind(&self) -> &'static str {
        if self.no_idempotency {
            return "none";
        }
        match self.idempotency_store {
            IdempotencyStore::Database => "database",
            IdempotencyStore::Memory => "memory",
            IdempotencyStore::Redis(_) => "redis",
        }
    }
}
