//! The command line: `idemgate serve` and `idemgate proxy` (its flags in
//! [`crate::proxy`]), every flag with its environment variable.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use idemgate::cache::ReplayCacheConfig;

use crate::listener::{ListenerArgs, ListenerOptions};
use crate::telemetry::TelemetrySettings;

/// idemgate: `serve` runs the orders service (POST /api/v1/orders charges a payment
/// gateway and stores an order exactly once per Idempotency-Key); `proxy` puts the
/// Idempotency-Key protocol in front of any HTTP API.
#[derive(Debug, Parser)]
#[command(name = "idemgate", version = env!("IDEMGATE_VERSION"), propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands. Parsed once at startup, so the size difference between the two
/// argument sets costs nothing worth a box.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Run the HTTP service.
    Serve(ServeArgs),
    /// Put the Idempotency-Key protocol in front of any HTTP API: a reverse proxy
    /// to --upstream.
    Proxy(crate::proxy::ProxyArgs),
    /// Inspect or evict one key's record, straight on the store.
    Keys(crate::keys_cli::KeysArgs),
}

/// Where log lines go and how they look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Pretty,
    /// One JSON object per line.
    Json,
}

/// What a Redis idempotency store that persists nothing means for startup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RedisPersistence {
    /// Log a warning and start: a restart of Redis forgets completed keys.
    Warn,
    /// Refuse to start until Redis has AOF or snapshots.
    Refuse,
}

/// The safety flags of a redis:// idempotency store, flattened into every
/// subcommand that can use one (`serve`, `proxy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct RedisArgs {
    /// With a redis:// store: what to do when Redis persists nothing (no AOF, no
    /// snapshots), so a Redis restart would forget completed keys and let their
    /// retries run again: `warn` (log it and start) or `refuse` (do not start).
    #[arg(
        long,
        env = "IDEMGATE_REDIS_PERSISTENCE",
        value_enum,
        default_value_t = RedisPersistence::Warn,
        value_name = "POLICY"
    )]
    pub redis_persistence: RedisPersistence,

    /// With a redis:// store: after each claim, completion and renewal, wait until
    /// this many replicas have it (Redis WAIT, for up to half the store timeout),
    /// so a failover cannot lose a claim whose handler runs; a claim that did not
    /// replicate answers 503. 0 (the default) does not wait.
    #[arg(
        long,
        env = "IDEMGATE_REDIS_WAIT_REPLICAS",
        default_value_t = 0,
        value_name = "N"
    )]
    pub redis_wait_replicas: u32,
}

/// The admin key API's token, flattened into `serve` and `proxy`.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminTokenArgs {
    /// The bearer token of the admin key API (GET and DELETE /v1/keys on the
    /// admin listener). Unset or empty: the key API is off. Prefer the variable
    /// (a flag shows in the process list).
    #[arg(
        long,
        env = "IDEMGATE_ADMIN_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub admin_token: Option<String>,
}

impl AdminTokenArgs {
    /// The token; `None` when the key API is off.
    pub fn token(&self) -> Option<crate::admin::AdminToken> {
        crate::admin::AdminToken::new(self.admin_token.as_deref())
    }
}

/// `idemgate serve` flags. Every flag can also come from the environment variable
/// named in its help; a flag wins over its variable.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The public listen address.
    #[command(flatten)]
    pub address: ListenAddressArgs,

    /// Admin address: /healthz, /readyz, /metrics, and /v1/keys when
    /// IDEMGATE_ADMIN_TOKEN is set. Off unless given.
    #[arg(long, env = "IDEMGATE_ADMIN_LISTEN", value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,

    /// The admin key API's bearer token.
    #[command(flatten)]
    pub admin: AdminTokenArgs,

    /// Orders database: sqlite://PATH (created on first run) or postgres://…
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "sqlite://./idemgate.db",
        value_name = "URL"
    )]
    pub database: String,

    /// Where idempotency records live: `database` (the orders database, with each
    /// order committed in the same transaction as its record), `memory` (this
    /// process only), or a redis:// URL.
    #[arg(
        long,
        env = "IDEMGATE_IDEMPOTENCY_STORE",
        default_value = "database",
        value_name = "STORE"
    )]
    pub idempotency_store: String,

    /// Payment gateway base URL (POST {URL}/charges). Without it, a built-in
    /// simulated gateway approves every charge.
    #[arg(long, env = "PAYMENT_GATEWAY_URL", value_name = "URL")]
    pub gateway_url: Option<String>,

    /// How long to wait for the payment gateway, in milliseconds; past it the
    /// request answers 504 and can be retried with the same key.
    #[arg(
        long,
        env = "PAYMENT_GATEWAY_TIMEOUT_MS",
        default_value_t = 10_000,
        value_name = "MS"
    )]
    pub gateway_timeout_ms: u64,

    /// Without --gateway-url: how long the simulated gateway takes per charge, in
    /// milliseconds (0 by default). A few seconds let you watch a duplicate get 409.
    #[arg(
        long,
        env = "IDEMGATE_SIMULATED_GATEWAY_DELAY_MS",
        default_value_t = 0,
        value_name = "MS"
    )]
    pub simulated_gateway_delay_ms: u64,

    /// Record timing: TTL, lease, wait mode, store timeout.
    #[command(flatten)]
    pub layer: LayerArgs,

    /// Safety checks of a redis:// store.
    #[command(flatten)]
    pub redis: RedisArgs,

    /// Shutdown deadline and log format.
    #[command(flatten)]
    pub process: ProcessArgs,

    /// Connection limits: header, body and idle timeouts, the connection bound.
    #[command(flatten)]
    pub connections: ListenerArgs,

    /// Benchmarks only: serve the same routes and handlers with no idempotency
    /// layer, so `idemgate-bench` can measure what the layer costs against this
    /// `bare` baseline. Hidden from `--help`, no environment variable: without the
    /// layer a retried POST charges and stores twice.
    #[arg(long, hide = true)]
    pub no_idempotency: bool,
}

/// The idempotency layer's timing flags, flattened into `serve` and `proxy`.
#[derive(Debug, Clone, clap::Args)]
pub struct LayerArgs {
    /// How long a completed idempotency record is kept, in seconds; after it the
    /// key is new.
    #[arg(
        long,
        env = "IDEMPOTENCY_TTL_SECONDS",
        default_value_t = 86_400,
        value_name = "SECONDS"
    )]
    pub ttl: u64,

    /// How long a running request holds its key before a retry may take it over,
    /// in seconds (renewed while the request runs).
    #[arg(
        long,
        env = "IDEMPOTENCY_LEASE_SECONDS",
        default_value_t = 30,
        value_name = "SECONDS"
    )]
    pub lease: u64,

    /// How long a duplicate of a running request waits for its outcome before
    /// answering 409, in milliseconds (0: answer 409 at once).
    #[arg(
        long,
        env = "IDEMPOTENCY_WAIT_MS",
        default_value_t = 0,
        value_name = "MS"
    )]
    pub wait_ms: u64,

    /// The longest one idempotency-store operation (and one orders-database
    /// statement or connection checkout) may take, in milliseconds. Past it the
    /// request answers 503 with Retry-After and nothing runs: a frozen or
    /// unreachable store does not hold requests until clients give up.
    #[arg(
        long,
        env = "IDEMGATE_STORE_TIMEOUT_MS",
        default_value_t = 2_000,
        value_name = "MS"
    )]
    pub store_timeout_ms: u64,

    /// How many completed records this process keeps in memory to answer replays
    /// without a store round trip (0: no replay cache).
    #[arg(
        long,
        env = "IDEMGATE_REPLAY_CACHE_ENTRIES",
        default_value_t = ReplayCacheConfig::DEFAULT_ENTRIES,
        value_name = "N"
    )]
    pub replay_cache_entries: usize,

    /// The replay cache's bound in bytes (bodies, headers and a fixed overhead per
    /// record).
    #[arg(
        long,
        env = "IDEMGATE_REPLAY_CACHE_BYTES",
        default_value_t = ReplayCacheConfig::DEFAULT_BYTES,
        value_name = "BYTES"
    )]
    pub replay_cache_bytes: u64,

    /// How long a cached record answers after it was read, in milliseconds: an
    /// operator eviction on another instance takes effect here within this time.
    #[arg(
        long,
        env = "IDEMGATE_REPLAY_CACHE_MAX_AGE_MS",
        default_value_t = 5_000,
        value_name = "MS"
    )]
    pub replay_cache_max_age_ms: u64,
}

/// The layer's timing and replay cache, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerTiming {
    /// Record TTL.
    pub ttl: Duration,
    /// Lease length.
    pub lease: Duration,
    /// Wait-mode bound; `None` answers 409 at once.
    pub wait: Option<Duration>,
    /// Bound on one store operation, statement or connection checkout.
    pub store_timeout: Duration,
    /// The replay cache's bounds; `None`: off.
    pub replay_cache: Option<ReplayCacheConfig>,
}

impl LayerArgs {
    /// Checks the flags: a lease and a store timeout of at least 1, a TTL longer
    /// than the lease.
    pub fn timing(&self) -> Result<LayerTiming, ConfigError> {
        if self.store_timeout_ms == 0 {
            return Err(ConfigError::new(
                "--store-timeout-ms",
                "IDEMGATE_STORE_TIMEOUT_MS",
                "must be at least 1",
            ));
        }
        if self.lease == 0 {
            return Err(ConfigError::new(
                "--lease",
                "IDEMPOTENCY_LEASE_SECONDS",
                "must be at least 1 second",
            ));
        }
        if self.ttl <= self.lease {
            return Err(ConfigError::new(
                "--ttl",
                "IDEMPOTENCY_TTL_SECONDS",
                format!(
                    "the TTL ({} s) must be longer than the lease ({} s)",
                    self.ttl, self.lease
                ),
            ));
        }
        if self.replay_cache_entries > 0 && self.replay_cache_bytes == 0 {
            return Err(ConfigError::new(
                "--replay-cache-bytes",
                "IDEMGATE_REPLAY_CACHE_BYTES",
                "must be at least 1 (turn the cache off with --replay-cache-entries 0)",
            ));
        }
        if self.replay_cache_entries > 0 && self.replay_cache_max_age_ms == 0 {
            return Err(ConfigError::new(
                "--replay-cache-max-age-ms",
                "IDEMGATE_REPLAY_CACHE_MAX_AGE_MS",
                "must be at least 1 (turn the cache off with --replay-cache-entries 0)",
            ));
        }
        Ok(LayerTiming {
            ttl: Duration::from_secs(self.ttl),
            lease: Duration::from_secs(self.lease),
            wait: (self.wait_ms > 0).then(|| Duration::from_millis(self.wait_ms)),
            store_timeout: Duration::from_millis(self.store_timeout_ms),
            replay_cache: (self.replay_cache_entries > 0).then(|| ReplayCacheConfig {
                entries: self.replay_cache_entries,
                bytes: self.replay_cache_bytes,
                max_age: Duration::from_millis(self.replay_cache_max_age_ms),
            }),
        })
    }
}

/// How the process stops and logs, flattened into `serve` and `proxy`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProcessArgs {
    /// On SIGINT/SIGTERM, how long to let in-flight requests (detached ones
    /// included) finish and store their results, in seconds.
    #[arg(
        long,
        env = "IDEMGATE_SHUTDOWN_TIMEOUT_SECONDS",
        default_value_t = 30,
        value_name = "SECONDS"
    )]
    pub shutdown_timeout: u64,

    /// Log format.
    #[arg(long, env = "IDEMGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Pretty)]
    pub log_format: LogFormat,

    /// Export the tracing spans (outcome, key digest, operation id) over
    /// OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318;
    /// /v1/traces is appended). Off by default.
    #[arg(
        long,
        env = "IDEMGATE_OTLP",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub otlp: bool,
}

impl ProcessArgs {
    /// Where logs and spans go.
    pub fn telemetry(&self) -> TelemetrySettings {
        TelemetrySettings {
            log_format: self.log_format,
            otlp: self.otlp,
        }
    }
}

/// The public listener's address, flattened into every subcommand that serves
/// (`serve`, `proxy`): `--listen`, else `PORT` on 127.0.0.1, else 127.0.0.1:8080.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct ListenAddressArgs {
    /// Public address, e.g. 127.0.0.1:8080; port 0 picks a free port (the bound
    /// address is logged). Without it, the port comes from PORT on 127.0.0.1,
    /// else 127.0.0.1:8080.
    #[arg(long, env = "IDEMGATE_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Port to listen on at 127.0.0.1 when --listen / IDEMGATE_LISTEN is not set.
    #[arg(long = "port", env = "PORT", value_name = "PORT", hide = true)]
    pub port: Option<u16>,
}

impl ListenAddressArgs {
    /// `--listen`, else `PORT` on 127.0.0.1, else 127.0.0.1:8080.
    pub fn address(&self) -> SocketAddr {
        match (self.listen, self.port) {
            (Some(addr), _) => addr,
            (None, Some(port)) => SocketAddr::from(([127, 0, 0, 1], port)),
            (None, None) => SocketAddr::from(([127, 0, 0, 1], 8080)),
        }
    }
}

/// A setting that cannot work, naming the flag and the variable to fix.
#[derive(Debug, thiserror::Error)]
#[error("invalid {flag} / {env}: {reason}")]
pub struct ConfigError {
    /// The flag.
    pub flag: &'static str,
    /// Its environment variable.
    pub env: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl ConfigError {
    pub(crate) fn new(flag: &'static str, env: &'static str, reason: impl Into<String>) -> Self {
        Self {
            flag,
            env,
            reason: reason.into(),
        }
    }
}

/// Where the orders live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// A SQLite file.
    Sqlite(String),
    /// A PostgreSQL server.
    Postgres(String),
}

/// Where the idempotency records live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotencyStore {
    /// The orders database, transactional mode.
    Database,
    /// Process memory.
    Memory,
    /// A Redis server.
    Redis(String),
}

/// `serve`'s settings, checked.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Listen address.
    pub listen: SocketAddr,
    /// Admin listen address; `None`: no admin listener.
    pub admin_listen: Option<SocketAddr>,
    /// The admin key API's token; `None`: the key API is off.
    pub admin_token: Option<crate::admin::AdminToken>,
    /// Orders database.
    pub database: DatabaseUrl,
    /// Idempotency store.
    pub idempotency_store: IdempotencyStore,
    /// Payment gateway base URL; `None` for the simulated one.
    pub gateway_url: Option<reqwest::Url>,
    /// Gateway timeout.
    pub gateway_timeout: Duration,
    /// How long each simulated charge takes.
    pub simulated_gateway_delay: Duration,
    /// Record TTL.
    pub ttl: Duration,
    /// Lease length.
    pub lease: Duration,
    /// Wait-mode bound; `None` answers 409 at once.
    pub wait: Option<Duration>,
    /// Bound on one store operation, statement or connection checkout.
    pub store_timeout: Duration,
    /// The replay cache's bounds; `None`: off.
    pub replay_cache: Option<ReplayCacheConfig>,
    /// Redis safety checks: persistence policy, replicas to wait for.
    pub redis: RedisArgs,
    /// Graceful shutdown deadline.
    pub shutdown_timeout: Duration,
    /// Logs and span export.
    pub telemetry: TelemetrySettings,
    /// Connection limits of the listener.
    pub connections: ListenerOptions,
    /// The hidden benchmark baseline: no idempotency layer at all.
    pub no_idempotency: bool,
}

impl ServeArgs {
    /// Checks the flags and resolves the defaults.
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let listen = self.address.address();
        let timing = self.layer.timing()?;
        let database = if self.database.starts_with("sqlite:") {
            DatabaseUrl::Sqlite(self.database.clone())
        } else if self.database.starts_with("postgres://")
            || self.database.starts_with("postgresql://")
        {
            DatabaseUrl::Postgres(self.database.clone())
        } else {
            return Err(ConfigError::new(
                "--database",
                "DATABASE_URL",
                format!(
                    "expected sqlite://PATH or postgres://…, got {:?}",
                    self.database
                ),
            ));
        };
        let idempotency_store = match self.idempotency_store.as_str() {
            "database" => IdempotencyStore::Database,
            "memory" => IdempotencyStore::Memory,
            url if url.starts_with("redis://") || url.starts_with("rediss://") => {
                IdempotencyStore::Redis(url.to_owned())
            }
            other => {
                return Err(ConfigError::new(
                    "--idempotency-store",
                    "IDEMGATE_IDEMPOTENCY_STORE",
                    format!("expected database, memory or redis://…, got {other:?}"),
                ));
            }
        };
        let gateway_url = match &self.gateway_url {
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
        if self.gateway_timeout_ms == 0 {
            return Err(ConfigError::new(
                "--gateway-timeout-ms",
                "PAYMENT_GATEWAY_TIMEOUT_MS",
                "must be at least 1",
            ));
        }
        Ok(Settings {
            listen,
            admin_listen: self.admin_listen,
            admin_token: self.admin.token(),
            database,
            idempotency_store,
            gateway_url,
            gateway_timeout: Duration::from_millis(self.gateway_timeout_ms),
            simulated_gateway_delay: Duration::from_millis(self.simulated_gateway_delay_ms),
            ttl: timing.ttl,
            lease: timing.lease,
            wait: timing.wait,
            store_timeout: timing.store_timeout,
            replay_cache: timing.replay_cache,
            redis: self.redis,
            shutdown_timeout: Duration::from_secs(self.process.shutdown_timeout),
            telemetry: self.process.telemetry(),
            connections: self.connections.options()?,
            no_idempotency: self.no_idempotency,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Result<Settings, ConfigError> {
        let mut argv = vec!["idemgate", "serve"];
        argv.extend_from_slice(extra);
        let Command::Serve(args) = Cli::try_parse_from(argv).expect("parses").command else {
            panic!("serve parses as serve");
        };
        args.settings()
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
        assert_eq!(s.ttl, Duration::from_secs(86_400));
        assert_eq!(s.lease, Duration::from_secs(30));
        assert_eq!(s.idempotency_store, IdempotencyStore::Database);
        assert!(s.wait.is_none());
        assert!(!s.no_idempotency);
        assert_eq!(s.store_timeout, Duration::from_secs(2));
        assert_eq!(s.redis.redis_persistence, RedisPersistence::Warn);
        assert_eq!(s.redis.redis_wait_replicas, 0);
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
        let on = args(&[]).unwrap().replay_cache.expect("on by default");
        assert_eq!(on, ReplayCacheConfig::default());
        let sized = args(&[
            "--replay-cache-entries",
            "5",
            "--replay-cache-bytes",
            "4096",
            "--replay-cache-max-age-ms",
            "250",
        ])
        .unwrap();
        assert_eq!(
            sized.replay_cache,
            Some(ReplayCacheConfig {
                entries: 5,
                bytes: 4096,
                max_age: Duration::from_millis(250),
            })
        );
        assert_eq!(
            args(&["--replay-cache-entries", "0"]).unwrap().replay_cache,
            None
        );
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
