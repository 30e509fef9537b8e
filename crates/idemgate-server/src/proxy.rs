//! `idemgate proxy`: the flags, checked, and the process that serves them — the
//! `idemgate-proxy` router on the public listener, health and metrics on a
//! separate admin listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderName;
use idemgate::{DefaultPrincipal, IdempotencyLayer, MemoryStore, Store};
use idemgate_proxy::{HeaderPrincipal, ProxyConfig, Upstream};
use idemgate_sqlx::PurgeTask;

use crate::admin::{Admin, AdminToken, admin_app};
use crate::cli::{
    AdminTokenArgs, ConfigError, LayerArgs, LayerTiming, ListenAddressArgs, ProcessArgs, RedisArgs,
};
use crate::listener::{ListenerArgs, ListenerOptions, raise_fd_limit};
use crate::repository::{connect_postgres, connect_sqlite};
use crate::runtime::{idempotency_layer, install_metrics, serve_until_signal, with_replay_cache};
use crate::server::{StartupError, bind};
use crate::stores;
use crate::telemetry::TelemetrySettings;

/// `idemgate proxy` flags. Every flag can also come from the environment variable
/// named in its help; a flag wins over its variable. Every POST and PATCH with an
/// Idempotency-Key is covered; everything else streams through.
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    /// The API to put the protocol in front of: http://host:port[/base]. Request
    /// paths go under the base.
    #[arg(long, env = "IDEMGATE_UPSTREAM", value_name = "URL")]
    pub upstream: String,

    /// The public listen address; every path on it belongs to the upstream.
    #[command(flatten)]
    pub address: ListenAddressArgs,

    /// Admin address: /healthz (200 once serving), /readyz (the store answers),
    /// /metrics (Prometheus), and /v1/keys when IDEMGATE_ADMIN_TOKEN is set.
    #[arg(
        long,
        env = "IDEMGATE_ADMIN_LISTEN",
        default_value = "127.0.0.1:9901",
        value_name = "ADDR"
    )]
    pub admin_listen: SocketAddr,

    /// The admin key API's bearer token.
    #[command(flatten)]
    pub admin: AdminTokenArgs,

    /// Where idempotency records live: sqlite://PATH (created on first run),
    /// postgres://…, redis://… or memory (this process only).
    #[arg(
        long,
        env = "IDEMGATE_IDEMPOTENCY_STORE",
        default_value = "sqlite://./idemgate-proxy.db",
        value_name = "STORE"
    )]
    pub idempotency_store: String,

    /// Whom a key belongs to: `authorization` (an HMAC-SHA256 of the whole
    /// Authorization value, under the secret of IDEMGATE_PRINCIPAL_SECRET or
    /// --principal-secret-file) or `header:NAME` (a header an authenticating proxy
    /// in front sets, trusted as is). A covered request with a key and no
    /// principal gets 401 and is not forwarded.
    #[arg(
        long,
        env = "IDEMGATE_PRINCIPAL",
        default_value = "authorization",
        value_name = "SOURCE"
    )]
    pub principal: String,

    /// The secret of `--principal authorization`.
    #[command(flatten)]
    pub secret: PrincipalSecretArgs,

    /// How long to wait for the upstream's response head, connecting included,
    /// in milliseconds. Past it: 504, stored as FAILED (the upstream may have run
    /// the request, so a retry replays the 504 instead of running it again).
    #[arg(
        long,
        env = "IDEMGATE_UPSTREAM_TIMEOUT_MS",
        default_value_t = 30_000,
        value_name = "MS"
    )]
    pub upstream_timeout_ms: u64,

    /// Record timing: TTL, lease, wait mode, store timeout.
    #[command(flatten)]
    pub layer: LayerArgs,

    /// Safety checks of a redis:// store.
    #[command(flatten)]
    pub redis: RedisArgs,

    /// Shutdown deadline and log format.
    #[command(flatten)]
    pub process: ProcessArgs,

    /// Connection limits of both listeners.
    #[command(flatten)]
    pub connections: ListenerArgs,
}

/// The secret that `--principal authorization` HMACs the `Authorization` value
/// under: flattened into `proxy`, and into `keys` to find such a principal's keys.
#[derive(Debug, Clone, clap::Args)]
pub struct PrincipalSecretArgs {
    /// A file holding the secret of `--principal authorization` (trailing newline
    /// ignored). Keep it the same across restarts and instances.
    #[arg(long, env = "IDEMGATE_PRINCIPAL_SECRET_FILE", value_name = "PATH")]
    pub principal_secret_file: Option<PathBuf>,

    /// The secret of `--principal authorization`; prefer the variable (a flag
    /// shows in the process list).
    #[arg(
        long,
        env = "IDEMGATE_PRINCIPAL_SECRET",
        hide_env_values = true,
        value_name = "SECRET"
    )]
    pub principal_secret: Option<String>,
}

impl PrincipalSecretArgs {
    /// The secret: the file's content, else the variable's; empty when neither.
    pub fn read(&self) -> Result<Vec<u8>, ConfigError> {
        Ok(
            match (&self.principal_secret_file, &self.principal_secret) {
                (Some(path), _) => std::fs::read(path)
                    .map_err(|error| {
                        ConfigError::new(
                            "--principal-secret-file",
                            "IDEMGATE_PRINCIPAL_SECRET_FILE",
                            format!("cannot read {}: {error}", path.display()),
                        )
                    })?
                    .trim_ascii_end()
                    .to_vec(),
                (None, Some(secret)) => secret.as_bytes().to_vec(),
                (None, None) => Vec::new(),
            },
        )
    }
}

/// Where the proxy keeps its records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyStore {
    /// A SQLite file (`sqlite://PATH`).
    Sqlite(String),
    /// A PostgreSQL server.
    Postgres(String),
    /// A Redis server or cluster.
    Redis(String),
    /// Process memory.
    Memory,
}

/// How the proxy finds a request's principal.
#[derive(Clone)]
pub enum PrincipalSource {
    /// HMAC-SHA256 of the `Authorization` value under this secret.
    Authorization(Arc<[u8]>),
    /// This header, trusted as is.
    Header(HeaderName),
}

impl std::fmt::Debug for PrincipalSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Authorization(_) => f.write_str("Authorization(<secret>)"),
            Self::Header(name) => f.debug_tuple("Header").field(name).finish(),
        }
    }
}

/// `proxy`'s settings, checked.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// Public listen address.
    pub listen: SocketAddr,
    /// Admin listen address.
    pub admin_listen: SocketAddr,
    /// The admin key API's token; `None`: the key API is off.
    pub admin_token: Option<AdminToken>,
    /// Where requests go.
    pub upstream: Upstream,
    /// Record store.
    pub store: ProxyStore,
    /// Principal source.
    pub principal: PrincipalSource,
    /// Upstream response-head timeout.
    pub upstream_timeout: Duration,
    /// The layer's timing.
    pub timing: LayerTiming,
    /// Graceful shutdown deadline.
    pub shutdown_timeout: Duration,
    /// Logs and span export.
    pub telemetry: TelemetrySettings,
    /// Connection limits of both listeners.
    pub connections: ListenerOptions,
    /// Redis safety checks: persistence policy, replicas to wait for.
    pub redis: RedisArgs,
}

impl ProxyArgs {
    /// Checks the flags, reads the secret file, resolves the defaults.
    pub fn settings(&self) -> Result<ProxySettings, ConfigError> {
        let upstream = self.upstream.parse::<Upstream>().map_err(|error| {
            ConfigError::new(
                "--upstream",
                "IDEMGATE_UPSTREAM",
                format!("{error}: {:?}", self.upstream),
            )
        })?;
        if self.upstream_timeout_ms == 0 {
            return Err(ConfigError::new(
                "--upstream-timeout-ms",
                "IDEMGATE_UPSTREAM_TIMEOUT_MS",
                "must be at least 1",
            ));
        }
        let store = self
            .idempotency_store
            .parse::<ProxyStore>()
            .map_err(|reason| {
                ConfigError::new("--idempotency-store", "IDEMGATE_IDEMPOTENCY_STORE", reason)
            })?;
        Ok(ProxySettings {
            listen: self.address.address(),
            admin_listen: self.admin_listen,
            admin_token: self.admin.token(),
            upstream,
            store,
            principal: self.principal_source()?,
            upstream_timeout: Duration::from_millis(self.upstream_timeout_ms),
            timing: self.layer.timing()?,
            shutdown_timeout: Duration::from_secs(self.process.shutdown_timeout),
            telemetry: self.process.telemetry(),
            connections: self.connections.options()?,
            redis: self.redis,
        })
    }

    fn principal_source(&self) -> Result<PrincipalSource, ConfigError> {
        let refuse = |reason: String| ConfigError::new("--principal", "IDEMGATE_PRINCIPAL", reason);
        match self.principal.as_str() {
            "authorization" => self.secret().map(PrincipalSource::Authorization),
            "jwt" => Err(refuse(
                "jwt is not supported yet; use authorization or header:NAME".to_owned(),
            )),
            other => match other.strip_prefix("header:") {
                Some(name) => HeaderName::from_bytes(name.trim().as_bytes())
                    .map(PrincipalSource::Header)
                    .map_err(|_| refuse(format!("not a header name: {name:?}"))),
                None => Err(refuse(format!(
                    "expected authorization, header:NAME or jwt, got {other:?}"
                ))),
            },
        }
    }

    /// The secret of `--principal authorization`; none is a startup error, never
    /// a silent random secret (each restart would then forget every key).
    fn secret(&self) -> Result<Arc<[u8]>, ConfigError> {
        let secret = self.secret.read()?;
        if secret.is_empty() {
            return Err(ConfigError::new(
                "--principal",
                "IDEMGATE_PRINCIPAL",
                "`authorization` scopes keys by an HMAC of the Authorization header and needs a secret: set IDEMGATE_PRINCIPAL_SECRET or --principal-secret-file PATH (or use --principal header:NAME)",
            ));
        }
        Ok(Arc::from(secret))
    }
}

/// The store, and the SQL stores' purge task (running until the handle drops).
async fn open_store(
    settings: &ProxySettings,
) -> Result<(Arc<dyn Store>, Option<PurgeTask>), StartupError> {
    let timeout = settings.timing.store_timeout;
    Ok(match &settings.store {
        ProxyStore::Memory => (Arc::new(MemoryStore::new()), None),
        ProxyStore::Sqlite(url) => {
            let pool = connect_sqlite(url, timeout)
                .await
                .map_err(StartupError::StoreDatabase)?;
            let (store, purge) = stores::sqlite(pool).await?;
            (Arc::new(store), Some(purge))
        }
        ProxyStore::Postgres(url) => {
            let pool = connect_postgres(url, timeout)
                .await
                .map_err(StartupError::StoreDatabase)?;
            let (store, purge) = stores::postgres(pool).await?;
            (Arc::new(store), Some(purge))
        }
        ProxyStore::Redis(url) => {
            let store = stores::redis(
                url,
                timeout,
                settings.redis.redis_persistence,
                settings.redis.redis_wait_replicas,
            )
            .await?;
            (Arc::new(store), None)
        }
    })
}

fn with_principal(layer: IdempotencyLayer, source: &PrincipalSource) -> IdempotencyLayer {
    match source {
        PrincipalSource::Authorization(secret) => {
            layer.with_principal(DefaultPrincipal::with_authorization_secret(secret))
        }
        PrincipalSource::Header(name) => layer.with_principal(HeaderPrincipal::new(name.clone())),
    }
}

/// Runs the proxy until SIGINT or SIGTERM, then drains like `serve`.
pub async fn run(settings: ProxySettings) -> Result<(), StartupError> {
    let metrics = install_metrics();
    let (store, _purge) = open_store(&settings).await?;
    let store = with_replay_cache(store, settings.timing.replay_cache);
    let layer = with_principal(
        idempotency_layer(Arc::clone(&store), settings.timing),
        &settings.principal,
    );
    let tasks = layer.detached_tasks();
    let public = idemgate_proxy::app(
        ProxyConfig::new(settings.upstream.clone())
            .with_upstream_timeout(settings.upstream_timeout),
        layer,
    );
    let admin = admin_app(Admin::new(
        store,
        settings.timing.store_timeout,
        metrics,
        tasks.clone(),
        settings.admin_token.clone(),
    ));

    let open_files = raise_fd_limit();
    let public_listener = bind(settings.listen, settings.connections).await?;
    let admin_listener = bind(settings.admin_listen, settings.connections).await?;
    let admin_addr = admin_listener.local_addr().map_err(StartupError::Serve)?;
    let addr = public_listener.local_addr().map_err(StartupError::Serve)?;
    tracing::info!(%admin_addr, "admin listening on http://{admin_addr}");
    tracing::info!(
        %addr,
        upstream = settings.upstream.authority(),
        store = settings.store.kind(),
        max_connections = public_listener.max_connections(),
        open_files,
        "idemgate proxy listening on http://{addr}"
    );
    serve_until_signal(
        vec![(public_listener, public), (admin_listener, admin)],
        tasks,
        settings.shutdown_timeout,
    )
    .await;
    Ok(())
}

impl std::str::FromStr for ProxyStore {
    type Err = String;

    /// `sqlite://PATH`, `postgres://…`, `redis://…` or `memory`.
    fn from_str(store: &str) -> Result<Self, Self::Err> {
        Ok(match store {
            "memory" => Self::Memory,
            url if url.starts_with("sqlite:") => Self::Sqlite(url.to_owned()),
            url if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                Self::Postgres(url.to_owned())
            }
            url if url.starts_with("redis://") || url.starts_with("rediss://") => {
                Self::Redis(url.to_owned())
            }
            other => {
                return Err(format!(
                    "expected sqlite://PATH, postgres://…, redis://… or memory, got {other:?}"
                ));
            }
        })
    }
}

impl ProxyStore {
    fn kind(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
            Self::Redis(_) => "redis",
            Self::Memory => "memory",
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn settings(extra: &[&str]) -> Result<ProxySettings, ConfigError> {
        let mut argv = vec![
            "idemgate",
            "proxy",
            "--upstream",
            "http://127.0.0.1:3000/api",
        ];
        argv.extend_from_slice(extra);
        let Command::Proxy(args) = Cli::try_parse_from(argv).expect("parses").command else {
            panic!("proxy parses as proxy");
        };
        args.settings()
    }

    #[test]
    fn defaults_follow_the_contract() {
        let s = settings(&[
            "--principal-secret",
            "s",
            "--idempotency-store",
            "sqlite://./p.db",
        ])
        .unwrap();
        assert_eq!(s.upstream, "http://127.0.0.1:3000/api".parse().unwrap());
        assert_eq!(s.admin_listen, "127.0.0.1:9901".parse().unwrap());
        assert_eq!(s.upstream_timeout, Duration::from_secs(30));
        assert_eq!(s.store, ProxyStore::Sqlite("sqlite://./p.db".to_owned()));
        assert!(matches!(s.principal, PrincipalSource::Authorization(_)));
        assert_eq!(s.timing.ttl, Duration::from_secs(86_400));
        assert_eq!(s.timing.lease, Duration::from_secs(30));
        assert_eq!(s.timing.wait, None);
        assert_eq!(s.timing.store_timeout, Duration::from_secs(2));
        assert_eq!(
            s.redis.redis_persistence,
            crate::cli::RedisPersistence::Warn
        );
        assert_eq!(s.redis.redis_wait_replicas, 0);
        let s = settings(&[
            "--principal-secret",
            "s",
            "--redis-persistence",
            "refuse",
            "--redis-wait-replicas",
            "1",
        ])
        .unwrap();
        assert_eq!(
            s.redis.redis_persistence,
            crate::cli::RedisPersistence::Refuse
        );
        assert_eq!(s.redis.redis_wait_replicas, 1);
        let s = settings(&[
            "--principal-secret",
            "s",
            "--listen",
            "127.0.0.1:0",
            "--port",
            "9",
        ])
        .unwrap();
        assert_eq!(s.listen.port(), 0, "--listen beats PORT");
    }

    #[test]
    fn every_store_kind_parses_and_others_are_refused() {
        for (flag, kind) in [
            ("memory", "memory"),
            ("postgres://u@h/db", "postgres"),
            ("redis://h:6379", "redis"),
            ("sqlite://x.db", "sqlite"),
        ] {
            let s =
                settings(&["--principal", "header:x-user", "--idempotency-store", flag]).unwrap();
            assert_eq!(s.store.kind(), kind);
        }
        let err = settings(&[
            "--principal",
            "header:x-user",
            "--idempotency-store",
            "database",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("IDEMGATE_IDEMPOTENCY_STORE"), "{err}");
    }

    #[test]
    fn the_authorization_principal_needs_a_secret() {
        let err = settings(&[]).unwrap_err().to_string();
        assert!(
            err.contains("IDEMGATE_PRINCIPAL_SECRET") && err.contains("--principal-secret-file"),
            "{err}"
        );
        let dir = std::env::temp_dir().join(format!("idemgate-secret-{}", std::process::id()));
        std::fs::write(&dir, "from-a-file\n").unwrap();
        let s = settings(&["--principal-secret-file", dir.to_str().unwrap()]).unwrap();
        let _ = std::fs::remove_file(&dir);
        let PrincipalSource::Authorization(secret) = s.principal else {
            panic!("authorization");
        };
        assert_eq!(
            &secret[..],
            b"from-a-file",
            "the trailing newline is not the secret"
        );
        let err = settings(&["--principal-secret-file", "/nonexistent/secret"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("IDEMGATE_PRINCIPAL_SECRET_FILE"), "{err}");
    }

    #[test]
    fn principal_sources_parse_and_jwt_is_not_supported_yet() {
        let s = settings(&["--principal", "header:X-User-Id"]).unwrap();
        assert!(
            matches!(&s.principal, PrincipalSource::Header(name) if name == "x-user-id"),
            "{:?}",
            s.principal
        );
        let err = settings(&["--principal", "jwt"]).unwrap_err().to_string();
        assert!(err.contains("not supported yet"), "{err}");
        let err = settings(&["--principal", "header:bad name"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("IDEMGATE_PRINCIPAL"), "{err}");
        let err = settings(&["--principal", "cookie"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("IDEMGATE_PRINCIPAL"), "{err}");
    }

    #[test]
    fn bad_upstreams_and_timeouts_name_their_flag() {
        let mut argv = vec!["idemgate", "proxy", "--upstream", "https://api.example"];
        argv.extend(["--principal", "header:x-user"]);
        let Command::Proxy(args) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("proxy");
        };
        let err = args.settings().unwrap_err().to_string();
        assert!(err.contains("IDEMGATE_UPSTREAM"), "{err}");
        let err = settings(&["--principal", "header:x-user", "--upstream-timeout-ms", "0"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("IDEMGATE_UPSTREAM_TIMEOUT_MS"), "{err}");
    }

    #[test]
    fn the_secret_never_shows_in_debug_output() {
        let s = settings(&["--principal-secret", "hunter2"]).unwrap();
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
