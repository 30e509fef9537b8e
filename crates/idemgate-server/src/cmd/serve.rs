//! `idemgate serve`: the orders service ([`crate::orders`]) on its database, behind
//! the idempotency layer, with an optional admin listener.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use idemgate::{MemoryStore, Store};
use idemgate_listener::{ListenerOptions, raise_fd_limit};
use idemgate_sqlx::PurgeTask;

use crate::admin::{self, AdminState};
use crate::cli::ServeArgs;
use crate::config::{
    AdminToken, ConfigError, DatabaseUrl, LayerSettings, RedisSafety, StoreUrl, TelemetrySettings,
};
use crate::idempotency::{self, UNAVAILABLE_RETRY_AFTER, with_replay_cache};
use crate::monitoring::install_metrics;
use crate::orders::db::OrdersDb;
use crate::orders::payment::PaymentGateway;
use crate::orders::{self, OrderWrites, OrdersState};
use crate::process::{self, Served, StartupError, bind, serve_until_signal};
use crate::store::{self, OpenError, Opening};

/// Where `serve` keeps its idempotency records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordStore {
    /// The orders database itself: each order commits in the same transaction
    /// as its record (`--idempotency-store database`, the default).
    OrdersDatabase,
    /// A store of their own: `memory` or a `redis://` URL; orders are then
    /// written directly, keyed by operation id.
    Separate(StoreUrl),
}

/// `serve`'s settings, checked.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    /// Listen address.
    pub listen: SocketAddr,
    /// Admin listen address; `None`: no admin listener.
    pub admin_listen: Option<SocketAddr>,
    /// The admin key API's token; `None`: the key API is off.
    pub admin_token: Option<AdminToken>,
    /// Orders database.
    pub database: DatabaseUrl,
    /// Where idempotency records live.
    pub idempotency_store: RecordStore,
    /// Payment gateway base URL; `None` for the simulated one.
    pub gateway_url: Option<reqwest::Url>,
    /// Gateway timeout.
    pub gateway_timeout: Duration,
    /// How long each simulated charge takes.
    pub simulated_gateway_delay: Duration,
    /// The idempotency layer: record timing and the replay cache.
    pub layer: LayerSettings,
    /// Redis safety checks: persistence policy, replicas to wait for.
    pub redis: RedisSafety,
    /// Graceful shutdown deadline.
    pub shutdown_timeout: Duration,
    /// Logs and span export.
    pub telemetry: TelemetrySettings,
    /// Connection limits of the listener.
    pub connections: ListenerOptions,
    /// The hidden benchmark baseline: no idempotency layer at all.
    pub no_idempotency: bool,
    /// The hidden benchmark comparison: transfers claimed in two phases.
    pub two_phase_transfers: bool,
    /// Keyless POST/PATCH on the orders routes answer 400 `missing-key`.
    pub require_key: bool,
    /// Tests only: `IDEMGATE_TEST_FAULT_AFTER_EDIT` (`orders::fault`).
    pub edit_fault: Option<orders::fault::EditFault>,
    /// The payment webhook (`--payment-webhook-secret`, `orders::webhook`).
    pub payment_webhook: Option<orders::webhook::PaymentWebhook>,
}

impl ServeSettings {
    /// Checks the flags and resolves the defaults.
    pub fn from_args(args: &ServeArgs) -> Result<Self, ConfigError> {
        let layer = args.layer.settings()?;
        // The listener's own refusals carry the operator's problem type base too.
        let connections = args
            .connections
            .options()?
            .with_problem_type_base(layer.problem_style.base());
        let database = if args.database.starts_with("sqlite:") {
            DatabaseUrl::Sqlite(args.database.clone())
        } else if args.database.starts_with("postgres://")
            || args.database.starts_with("postgresql://")
        {
            DatabaseUrl::Postgres(args.database.clone())
        } else {
            return Err(ConfigError::new(
                "--database",
                "DATABASE_URL",
                format!(
                    "expected sqlite://PATH or postgres://…, got {:?}",
                    args.database
                ),
            ));
        };
        let idempotency_store = match args.idempotency_store.as_str() {
            "database" => RecordStore::OrdersDatabase,
            other => match other.parse::<StoreUrl>() {
                Ok(url @ (StoreUrl::Memory | StoreUrl::Redis(_))) => RecordStore::Separate(url),
                _ => {
                    return Err(ConfigError::new(
                        "--idempotency-store",
                        "IDEMGATE_IDEMPOTENCY_STORE",
                        format!("expected database, memory or redis://…, got {other:?}"),
                    ));
                }
            },
        };
        let gateway_url = match &args.gateway_url {
            None => None,
            Some(url) => Some(
                reqwest::Url::parse(url)
                    .ok()
                    .filter(|u| matches!(u.scheme(), "http" | "https"))
                    .ok_or_else(|| {
                        ConfigError::new(
                            "--gateway-url",
                            "PAYMENT_GATEWAY_URL",
                            format!("not an http(s) URL: {url:?}"),
                        )
                    })?,
            ),
        };
        if args.gateway_timeout_ms == 0 {
            return Err(ConfigError::new(
                "--gateway-timeout-ms",
                "PAYMENT_GATEWAY_TIMEOUT_MS",
                "must be at least 1",
            ));
        }
        let payment_webhook = match &args.payment_webhook_secret {
            None => None,
            Some(secret) => {
                let secret = orders::webhook::WebhookSecret::parse(secret).map_err(|error| {
                    ConfigError::new(
                        "--payment-webhook-secret",
                        orders::webhook::SECRET_VARIABLE,
                        error.to_string(),
                    )
                })?;
                // The event id and the order's change commit in one transaction.
                if idempotency_store != RecordStore::OrdersDatabase {
                    return Err(ConfigError::new(
                        "--payment-webhook-secret",
                        orders::webhook::SECRET_VARIABLE,
                        "needs --idempotency-store database: the event's record and the order's confirmation commit in one transaction",
                    ));
                }
                let fault = orders::webhook::WebhookFault::from_env().map_err(|reason| {
                    ConfigError::new("(test only)", orders::webhook::FAULT_VARIABLE, reason)
                })?;
                Some(orders::webhook::PaymentWebhook { secret, fault })
            }
        };
        Ok(Self {
            listen: args.address.address(),
            admin_listen: args.admin_listen,
            admin_token: args.admin.token(),
            database,
            idempotency_store,
            gateway_url,
            gateway_timeout: Duration::from_millis(args.gateway_timeout_ms),
            simulated_gateway_delay: Duration::from_millis(args.simulated_gateway_delay_ms),
            layer,
            redis: args.redis.safety(),
            shutdown_timeout: args.process.shutdown_timeout(),
            telemetry: args.process.telemetry(),
            connections,
            no_idempotency: args.no_idempotency,
            two_phase_transfers: args.two_phase_transfers,
            require_key: args.require_key,
            edit_fault: orders::fault::EditFault::from_env().map_err(|reason| {
                ConfigError::new("(test only)", orders::fault::VARIABLE, reason)
            })?,
            payment_webhook,
        })
    }

    fn idempotency_store_kind(&self) -> &'static str {
        if self.no_idempotency {
            return "none";
        }
        match &self.idempotency_store {
            RecordStore::OrdersDatabase => "database",
            RecordStore::Separate(url) => url.kind(),
        }
    }
}

/// `idemgate serve`: checks the flags (exit 2 when they cannot work), then serves
/// until SIGINT or SIGTERM.
pub async fn main(args: &ServeArgs) -> ExitCode {
    match ServeSettings::from_args(args) {
        Ok(settings) => process::run_service(settings.telemetry, run(settings)).await,
        Err(error) => process::config_error(&error),
    }
}

/// The idempotency store, how orders are written with it, and the SQL stores'
/// purge task, which runs until the returned handle drops.
async fn idempotency_store(
    settings: &ServeSettings,
    orders: &OrdersDb,
) -> Result<(Arc<dyn Store>, OrderWrites, Option<PurgeTask>), OpenError> {
    Ok(match (&settings.idempotency_store, orders) {
        (RecordStore::OrdersDatabase, OrdersDb::Sqlite(db)) => {
            let (store, purge) = store::sqlite_on(db.pool().clone()).await?;
            (
                Arc::new(store.clone()),
                OrderWrites::SqliteTransaction(store),
                Some(purge),
            )
        }
        (RecordStore::OrdersDatabase, OrdersDb::Postgres(pool)) => {
            let (store, purge) = store::postgres_on(pool.clone()).await?;
            (
                Arc::new(store.clone()),
                OrderWrites::PostgresTransaction(store),
                Some(purge),
            )
        }
        (RecordStore::Separate(url), _) => {
            let opened = store::open(
                url,
                Opening::Serve,
                settings.layer.store_timeout,
                settings.redis,
            )
            .await?;
            (opened.store, OrderWrites::Direct, opened.purge)
        }
    })
}

/// Runs the service until SIGINT or SIGTERM, then shuts down gracefully: stop
/// accepting, let open requests finish, wait for detached handlers to store their
/// results, all within `settings.shutdown_timeout`.
pub async fn run(settings: ServeSettings) -> Result<(), StartupError> {
    let metrics = install_metrics();
    let orders = OrdersDb::open(&settings.database, settings.layer.store_timeout).await?;
    let mut journal_handle = None;
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
        let memory = matches!(
            &settings.idempotency_store,
            RecordStore::Separate(StoreUrl::Memory)
        );
        let store = with_replay_cache(store, settings.layer.replay_cache.for_store(memory));
        let store = match crate::audit::journal(Arc::clone(&store), &settings.layer.audit, memory)
            .await
            .map_err(StartupError::Journal)?
        {
            Some(journal) => {
                journal_handle = Some(Arc::clone(&journal));
                journal as Arc<dyn Store>
            }
            None => store,
        };
        (store, writes, purge)
    };
    // The records share the orders' SQLite file: every write of this process
    // to it, keyless orders' too, queues on the store's one writer.
    let orders = match (orders, &writes) {
        (OrdersDb::Sqlite(db), OrderWrites::SqliteTransaction(store)) => {
            OrdersDb::Sqlite(db.writing_through(store.clone()))
        }
        (orders, _) => orders,
    };
    // The simulated gateway confirms its charges to the payment webhook.
    let confirmations = match &settings.payment_webhook {
        Some(webhook) if settings.gateway_url.is_none() && !settings.no_idempotency => {
            Some(orders::webhook::Confirmations::new(&webhook.secret)?)
        }
        _ => None,
    };
    let gateway = match &settings.gateway_url {
        Some(url) => PaymentGateway::http(url, settings.gateway_timeout)?,
        None => {
            tracing::info!(
                "no payment gateway configured: using the built-in simulated gateway (approves every charge)"
            );
            PaymentGateway::Simulated {
                delay: settings.simulated_gateway_delay,
                confirmations: confirmations.clone(),
            }
        }
    };
    let layer = idempotency::layer(Arc::clone(&store), &settings.layer)
        .with_require_key(settings.require_key);
    let tasks = layer.detached_tasks();
    let admin = settings.admin_listen.map(|addr| {
        let state = AdminState::new(
            store,
            settings.layer.store_timeout,
            metrics.clone(),
            tasks.clone(),
            settings.admin_token.clone(),
        );
        (addr, admin::router(state))
    });
    if admin.is_none() && settings.admin_token.is_some() {
        tracing::warn!(
            "IDEMGATE_ADMIN_TOKEN is set but --admin-listen is not: the admin key API is not served"
        );
    }
    let state = OrdersState {
        orders: orders.clone(),
        writes,
        gateway,
        metrics,
        tasks: tasks.clone(),
        unavailable_retry_after: UNAVAILABLE_RETRY_AFTER,
        outcome_retention: settings.layer.ttl,
        edit_fault: settings.edit_fault,
        payment_webhook: settings.payment_webhook.clone(),
        two_phase_transfers: settings.two_phase_transfers,
    };
    let router = if settings.no_idempotency {
        orders::router_without_idempotency(state)
    } else {
        orders::router(state, layer)
    };

    let open_files = raise_fd_limit();
    let listener = bind(settings.listen, settings.connections.clone()).await?;
    let addr = listener.local_addr().map_err(StartupError::Serve)?;
    if let Some(confirmations) = &confirmations {
        // Its own endpoint, over loopback when it listens on every address.
        let own = match addr.ip() {
            std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
                SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
            }
            std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
                SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), addr.port())
            }
            _ => addr,
        };
        if let Ok(url) = format!("http://{own}{}", orders::webhook::PATH).parse() {
            confirmations.deliver_to(url);
        }
    }
    let mut servers: Vec<Served> = Vec::new();
    if let Some((admin_addr, admin_router)) = admin {
        let admin_listener = bind(admin_addr, settings.connections.clone()).await?;
        let admin_addr = admin_listener.local_addr().map_err(StartupError::Serve)?;
        tracing::info!(%admin_addr, "admin listening on http://{admin_addr}");
        servers.push(Served::Here(admin_listener, admin_router));
    }
    tracing::info!(
        %addr,
        database = orders.kind(),
        store = ?settings.idempotency_store_kind(),
        max_connections = listener.max_connections(),
        open_files,
        "idemgate listening on http://{addr}"
    );
    servers.insert(0, Served::Here(listener, router));
    serve_until_signal(servers, tasks, settings.shutdown_timeout).await;
    if let Some(journal) = journal_handle {
        journal.flush().await;
    }
    orders.close().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use idemgate::cache::ReplayCacheConfig;

    use super::*;
    use crate::cli::{Cli, Command};
    use crate::config::RedisPersistence;

    fn args(extra: &[&str]) -> Result<ServeSettings, ConfigError> {
        let mut argv = vec!["idemgate", "serve"];
        argv.extend_from_slice(extra);
        let Command::Serve(args) = Cli::try_parse_from(argv).expect("parses").command else {
            panic!("serve parses as serve");
        };
        ServeSettings::from_args(&args)
    }

    #[test]
    fn defaults_follow_the_contract() {
        // Run without the variables set in this process (they may be set by CI).
        let s = args(&[
            "--database",
            "sqlite://./x.db",
            "--idempotency-store",
            "database",
        ])
        .unwrap();
        assert_eq!(s.layer.ttl, Duration::from_secs(86_400));
        assert_eq!(s.layer.lease, Duration::from_secs(30));
        assert_eq!(s.idempotency_store, RecordStore::OrdersDatabase);
        // Issue 36: a duplicate in flight waits for the outcome by default.
        assert_eq!(s.layer.wait, Some(idemgate::DEFAULT_WAIT));
        assert!(!s.no_idempotency);
        assert_eq!(s.layer.store_timeout, Duration::from_secs(2));
        assert_eq!(s.redis.persistence, RedisPersistence::Warn);
        assert_eq!(s.redis.wait_replicas, 0);
        assert_eq!(s.connections, ListenerOptions::default());
    }

    #[test]
    fn the_benchmark_baseline_flag_is_hidden() {
        let s = args(&["--no-idempotency"]).unwrap();
        assert!(s.no_idempotency);
        let mut command = <Cli as clap::CommandFactory>::command();
        let serve = command
            .find_subcommand_mut("serve")
            .expect("serve subcommand");
        let help = serve.render_long_help().to_string();
        assert!(!help.contains("no-idempotency"), "{help}");
    }

    #[test]
    fn the_replay_cache_is_on_by_default_and_zero_entries_turn_it_off() {
        let unset = args(&[]).unwrap().layer.replay_cache;
        assert_eq!(
            unset.for_store(false),
            Some(ReplayCacheConfig::default()),
            "on by default"
        );
        assert_eq!(
            unset.for_store(true),
            None,
            "none in front of the memory store, unless asked for"
        );
        let sized = args(&[
            "--replay-cache-entries",
            "5",
            "--replay-cache-bytes",
            "4096",
            "--replay-cache-max-age-ms",
            "250",
        ])
        .unwrap();
        let asked = Some(ReplayCacheConfig {
            entries: 5,
            bytes: 4096,
            max_age: Duration::from_millis(250),
        });
        assert_eq!(sized.layer.replay_cache.for_store(false), asked);
        assert_eq!(
            sized.layer.replay_cache.for_store(true),
            asked,
            "asked for: in front of the memory store too"
        );
        let off = args(&["--replay-cache-entries", "0"])
            .unwrap()
            .layer
            .replay_cache;
        assert_eq!((off.for_store(false), off.for_store(true)), (None, None));
        let err = args(&["--replay-cache-bytes", "0"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("IDEMGATE_REPLAY_CACHE_BYTES"), "{err}");
        let err = args(&["--replay-cache-max-age-ms", "0"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("IDEMGATE_REPLAY_CACHE_MAX_AGE_MS"), "{err}");
    }

    #[test]
    fn listen_beats_port_beats_default() {
        let s = args(&["--listen", "127.0.0.1:0", "--port", "9999"]).unwrap();
        assert_eq!(s.listen.port(), 0);
        let s = args(&["--port", "9999"]).unwrap();
        assert_eq!(s.listen, "127.0.0.1:9999".parse().unwrap());
    }

    #[test]
    fn errors_name_the_flag_and_the_variable() {
        let err = args(&["--database", "mysql://x"]).unwrap_err().to_string();
        assert!(
            err.contains("--database") && err.contains("DATABASE_URL"),
            "{err}"
        );
        let err = args(&["--idempotency-store", "etcd://x"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("IDEMGATE_IDEMPOTENCY_STORE"), "{err}");
        let err = args(&["--ttl", "5", "--lease", "10"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("IDEMPOTENCY_TTL_SECONDS"), "{err}");
        let err = args(&["--gateway-url", "ftp://x"]).unwrap_err().to_string();
        assert!(err.contains("PAYMENT_GATEWAY_URL"), "{err}");
    }
}
