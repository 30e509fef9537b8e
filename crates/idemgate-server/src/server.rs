//! Starting and stopping the service.

use std::sync::Arc;
use std::time::Duration;

use idemgate::{IdempotencyLayer, MemoryStore, Store};
use idemgate_redis::PersistenceCheck;
use idemgate_sqlx::PurgeTask;
use metrics_exporter_prometheus::PrometheusBuilder;

use crate::cli::{IdempotencyStore, RedisPersistence, Settings};
use crate::gateway::Gateway;
use crate::http::{AppState, OrderWrites, app, app_without_idempotency};
use crate::listener::{Listener, raise_fd_limit};
use crate::repository::OrdersDb;

/// How often expired idempotency records are purged from the SQL stores.
const PURGE_EVERY: Duration = Duration::from_secs(60);
/// How many expired records one purge statement deletes.
const PURGE_BATCH: usize = 1_000;
/// The `Retry-After` of every 503 for a store that failed: the idempotency
/// layer's, and the orders handler's when its order could not be stored.
const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The orders database is unreachable or refused its migration.
    #[error("orders database: {0}")]
    Database(#[from] sqlx::Error),
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
/// purge task, which runs until the returned handle drops. Both SQL stores name
/// the same [`PurgeTask`].
async fn idempotency_store(
    settings: &Settings,
    orders: &OrdersDb,
) -> Result<(Arc<dyn Store>, OrderWrites, Option<PurgeTask>), StartupError> {
    Ok(match (&settings.idempotency_store, orders) {
        (IdempotencyStore::Database, OrdersDb::Sqlite(pool)) => {
            let store = idemgate_sqlite::SqliteStore::new(pool.clone());
            store.migrate().await?;
            let purge = store.spawn_purge(PURGE_EVERY, PURGE_BATCH)?;
            (
                Arc::new(store.clone()),
                OrderWrites::SqliteTransaction(store),
                Some(purge),
            )
        }
        (IdempotencyStore::Database, OrdersDb::Postgres(pool)) => {
            let store = idemgate_postgres::PostgresStore::new(pool.clone());
            store.migrate().await?;
            let purge = store.spawn_purge(PURGE_EVERY, PURGE_BATCH)?;
            (
                Arc::new(store.clone()),
                OrderWrites::PostgresTransaction(store),
                Some(purge),
            )
        }
        (IdempotencyStore::Memory, _) => (Arc::new(MemoryStore::new()), OrderWrites::Direct, None),
        (IdempotencyStore::Redis(url), _) => {
            let mut builder = idemgate_redis::RedisStore::builder()
                .with_response_timeout(settings.store_timeout)
                .with_persistence_check(match settings.redis_persistence {
                    RedisPersistence::Warn => PersistenceCheck::Warn,
                    RedisPersistence::Refuse => PersistenceCheck::Refuse,
                });
            if settings.redis_wait_replicas > 0 {
                builder = builder.with_replication_wait(
                    settings.redis_wait_replicas,
                    settings.store_timeout / 2,
                );
            }
            let store = builder.connect(url).await?;
            (Arc::new(store), OrderWrites::Direct, None)
        }
    })
}

/// Runs the service until SIGINT or SIGTERM, then shuts down gracefully: stop
/// accepting, let open requests finish, wait for detached handlers to store their
/// results, all within `settings.shutdown_timeout`.
pub async fn run(settings: Settings) -> Result<(), StartupError> {
    let metrics = match PrometheusBuilder::new().install_recorder() {
        Ok(handle) => Some(handle),
        Err(error) => {
            tracing::warn!(%error, "metrics recorder not installed; /metrics answers 404");
            None
        }
    };
    let orders = OrdersDb::connect(&settings.database, settings.store_timeout).await?;
    orders.migrate().await?;
    let (store, writes, _purge) = if settings.no_idempotency {
        // The benchmark baseline: the layer below is built (for its task handle)
        // but never installed, so its unused in-memory store sees no request.
        tracing::warn!(
            "--no-idempotency: serving without the idempotency layer (a benchmark baseline); retries run twice"
        );
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        (store, OrderWrites::Direct, None)
    } else {
        idempotency_store(&settings, &orders).await?
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
    let mut layer = IdempotencyLayer::from_arc(store)
        .with_ttl(settings.ttl)
        .with_lease(settings.lease)
        .with_store_timeout(settings.store_timeout)
        .with_unavailable_retry_after(UNAVAILABLE_RETRY_AFTER);
    if let Some(wait) = settings.wait {
        layer = layer.with_wait(wait);
    }
    let tasks = layer.detached_tasks();
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
    let listener = Listener::bind(settings.listen, settings.connections)
        .await
        .map_err(|source| StartupError::Listen {
            addr: settings.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(StartupError::Serve)?;
    tracing::info!(
        %addr,
        database = database_kind(&orders),
        store = ?settings.idempotency_store_kind(),
        max_connections = listener.max_connections(),
        open_files,
        "idemgate listening on http://{addr}"
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(async move {
        let mut stop_rx = stop_rx;
        listener
            .serve(router, async move {
                let _ = stop_rx.wait_for(|stop| *stop).await;
            })
            .await;
    });
    shutdown_signal().await;
    tracing::info!(deadline = ?settings.shutdown_timeout, "shutting down: no new connections; finishing in-flight requests");
    let _ = stop_tx.send(true);
    let deadline = tokio::time::Instant::now() + settings.shutdown_timeout;
    match tokio::time::timeout_at(deadline, server).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::error!(%error, "server task failed"),
        Err(_) => tracing::warn!("open connections did not finish before the deadline"),
    }
    let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
    if tasks.shutdown(remaining).await {
        tracing::info!("all in-flight requests finished and stored their results");
    } else {
        tracing::warn!(
            running = tasks.running(),
            "shutdown deadline passed with handlers still running; their records stay PROCESSING and are taken over after the lease"
        );
    }
    orders.close().await;
    Ok(())
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

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM; only SIGINT stops the server");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}
