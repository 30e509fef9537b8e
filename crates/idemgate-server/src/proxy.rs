//! `idemgate proxy`: the flags, checked, and the process that serves them — the
//! `idemgate-proxy` router on the public listener, health and metrics on a
//! separate admin listener.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderName;
use idemgate::{DefaultPrincipal, IdempotencyLayer, MemoryStore, Store};
use idemgate_proxy::{HeaderPrincipal, HostHeader, JwtPrincipal, ProxyConfig, Routes, Upstream};
use idemgate_sqlx::PurgeTask;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

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
/// Idempotency-Key is covered, unless a route of --config says otherwise;
/// everything else streams through.
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
    /// --principal-secret-file), `header:NAME` (a header an authenticating proxy
    /// in front sets, trusted as is) or `jwt` (a claim of a bearer JWT verified
    /// with --jwt-secret-file or --jwks-file). A covered request with a key and no
    /// valid principal gets 401 and is not forwarded.
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

    /// `--principal jwt`: the claim that names the principal.
    #[arg(
        long,
        env = "IDEMGATE_JWT_CLAIM",
        default_value = "sub",
        value_name = "CLAIM"
    )]
    pub jwt_claim: String,

    /// `--principal jwt`: a file holding the HS256 secret (trailing newline
    /// ignored).
    #[arg(long, env = "IDEMGATE_JWT_SECRET_FILE", value_name = "PATH")]
    pub jwt_secret_file: Option<PathBuf>,

    /// `--principal jwt`: a JWKS document (JSON) of the RS256/ES256 public keys
    /// tokens are signed with; a token's `kid` picks the key.
    #[arg(long, env = "IDEMGATE_JWKS_FILE", value_name = "PATH")]
    pub jwks_file: Option<PathBuf>,

    /// `--principal jwt`: accept only tokens with this `iss`.
    #[arg(long, env = "IDEMGATE_JWT_ISSUER", value_name = "ISS")]
    pub jwt_issuer: Option<String>,

    /// `--principal jwt`: accept only tokens with this `aud`.
    #[arg(long, env = "IDEMGATE_JWT_AUDIENCE", value_name = "AUD")]
    pub jwt_audience: Option<String>,

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

    /// Per-route policies (TOML; see docs/proxy.md): which routes are covered and
    /// how. Without it every POST and PATCH is covered with the defaults above. A
    /// bad file stops the start, naming its line.
    #[arg(long, env = "IDEMGATE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// The Host header the upstream receives: `client` (as the client sent it) or
    /// `upstream` (the --upstream URL's host:port, for an upstream that routes by
    /// its own name). The client's Host is in X-Forwarded-Host either way.
    #[arg(
        long,
        env = "IDEMGATE_UPSTREAM_HOST_HEADER",
        default_value = "client",
        value_name = "WHICH"
    )]
    pub upstream_host_header: HostHeaderArg,

    /// A PEM file of the certificate chain the public listener presents; with
    /// --tls-key it speaks HTTPS (rustls) instead of plain HTTP. Without both, TLS
    /// is terminated in front.
    #[arg(
        long,
        env = "IDEMGATE_TLS_CERT",
        value_name = "PATH",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,

    /// The PEM file of the private key of --tls-cert.
    #[arg(
        long,
        env = "IDEMGATE_TLS_KEY",
        value_name = "PATH",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,

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
                (Some(path), _) => read_file(
                    path,
                    "--principal-secret-file",
                    "IDEMGATE_PRINCIPAL_SECRET_FILE",
                )?
                .trim_ascii_end()
                .to_vec(),
                (None, Some(secret)) => secret.as_bytes().to_vec(),
                (None, None) => Vec::new(),
            },
        )
    }
}

/// `--upstream-host-header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HostHeaderArg {
    /// The client's Host, as sent.
    Client,
    /// The upstream URL's host:port.
    Upstream,
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
    /// A claim of a verified bearer JWT.
    Jwt(JwtPrincipal),
}

impl std::fmt::Debug for PrincipalSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Authorization(_) => f.write_str("Authorization(<secret>)"),
            Self::Header(name) => f.debug_tuple("Header").field(name).finish(),
            Self::Jwt(jwt) => f.debug_tuple("Jwt").field(jwt).finish(),
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
    /// The Host the upstream receives.
    pub host_header: HostHeader,
    /// Per-route policies (empty without --config).
    pub routes: Routes,
    /// The public listener's TLS, when it terminates TLS itself.
    pub tls: Option<Arc<ServerConfig>>,
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
        let timing = self.layer.timing()?;
        let routes = match &self.config {
            Some(path) => {
                let routes = Routes::load(path).map_err(|error| {
                    ConfigError::new("--config", "IDEMGATE_CONFIG", error.to_string())
                })?;
                routes
                    .check_timing(timing.ttl, timing.lease)
                    .map_err(|error| {
                        ConfigError::new("--config", "IDEMGATE_CONFIG", error.to_string())
                    })?;
                routes
            }
            None => Routes::default(),
        };
        Ok(ProxySettings {
            listen: self.address.address(),
            admin_listen: self.admin_listen,
            admin_token: self.admin.token(),
            upstream,
            store,
            principal: self.principal_source()?,
            upstream_timeout: Duration::from_millis(self.upstream_timeout_ms),
            host_header: match self.upstream_host_header {
                HostHeaderArg::Client => HostHeader::Client,
                HostHeaderArg::Upstream => HostHeader::Upstream,
            },
            routes,
            tls: self.tls()?,
            timing,
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
            "jwt" => self.jwt().map(PrincipalSource::Jwt),
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

    /// `--tls-cert` and `--tls-key` (clap requires both or neither), loaded: an
    /// unreadable or mismatched pair stops the start.
    fn tls(&self) -> Result<Option<Arc<ServerConfig>>, ConfigError> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        let refuse = |flag, env, path: &Path, error: &dyn std::fmt::Display| {
            ConfigError::new(flag, env, format!("{}: {error}", path.display()))
        };
        let chain = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| refuse("--tls-cert", "IDEMGATE_TLS_CERT", cert, &e))?;
        if chain.is_empty() {
            return Err(refuse(
                "--tls-cert",
                "IDEMGATE_TLS_CERT",
                cert,
                &"no certificate in the file",
            ));
        }
        let private = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| refuse("--tls-key", "IDEMGATE_TLS_KEY", key, &e))?;
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|builder| {
                builder
                    .with_no_client_auth()
                    .with_single_cert(chain, private)
            })
            .map_err(|e| refuse("--tls-key", "IDEMGATE_TLS_KEY", key, &e))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Some(Arc::new(config)))
    }

    /// `--principal jwt`: the verifier of exactly one key source.
    fn jwt(&self) -> Result<JwtPrincipal, ConfigError> {
        let principal = match (&self.jwt_secret_file, &self.jwks_file) {
            (Some(path), None) => {
                let secret = read_file(path, "--jwt-secret-file", "IDEMGATE_JWT_SECRET_FILE")?;
                let secret = secret.trim_ascii_end();
                if secret.is_empty() {
                    return Err(ConfigError::new(
                        "--jwt-secret-file",
                        "IDEMGATE_JWT_SECRET_FILE",
                        format!("{} is empty", path.display()),
                    ));
                }
                JwtPrincipal::hs256(secret, self.jwt_claim.clone())
            }
            (None, Some(path)) => {
                let jwks = read_file(path, "--jwks-file", "IDEMGATE_JWKS_FILE")?;
                JwtPrincipal::jwks(&jwks, self.jwt_claim.clone()).map_err(|error| {
                    ConfigError::new(
                        "--jwks-file",
                        "IDEMGATE_JWKS_FILE",
                        format!("{}: {error}", path.display()),
                    )
                })?
            }
            (Some(_), Some(_)) | (None, None) => {
                return Err(ConfigError::new(
                    "--principal",
                    "IDEMGATE_PRINCIPAL",
                    "`jwt` verifies tokens with exactly one of --jwt-secret-file (HS256) or --jwks-file (RS256/ES256)",
                ));
            }
        };
        let principal = match &self.jwt_issuer {
            Some(issuer) => principal.with_issuer(issuer),
            None => principal,
        };
        Ok(match &self.jwt_audience {
            Some(audience) => principal.with_audience(audience),
            None => principal,
        })
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

/// The bytes of a file a flag names; an unreadable one names the flag.
fn read_file(path: &Path, flag: &'static str, env: &'static str) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|error| {
        ConfigError::new(
            flag,
            env,
            format!("cannot read {}: {error}", path.display()),
        )
    })
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
        PrincipalSource::Jwt(jwt) => layer.with_principal(jwt.clone()),
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
            .with_upstream_timeout(settings.upstream_timeout)
            .with_host_header(settings.host_header)
            .with_https_clients(settings.tls.is_some())
            .with_routes(settings.routes.clone()),
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
    let mut public_listener = bind(settings.listen, settings.connections).await?;
    if let Some(tls) = &settings.tls {
        public_listener = public_listener.with_tls(Arc::clone(tls));
    }
    let scheme = if public_listener.is_tls() {
        "https"
    } else {
        "http"
    };
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
        "idemgate proxy listening on {scheme}://{addr}"
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
    fn principal_sources_parse_and_jwt_needs_one_key_source() {
        let s = settings(&["--principal", "header:X-User-Id"]).unwrap();
        assert!(
            matches!(&s.principal, PrincipalSource::Header(name) if name == "x-user-id"),
            "{:?}",
            s.principal
        );
        let err = settings(&["--principal", "jwt"]).unwrap_err().to_string();
        assert!(err.contains("exactly one of --jwt-secret-file"), "{err}");
        let secret = std::env::temp_dir().join(format!("idemgate-jwt-{}", std::process::id()));
        std::fs::write(&secret, "jwt-secret\n").unwrap();
        let secret = secret.to_str().unwrap();
        let s = settings(&["--principal", "jwt", "--jwt-secret-file", secret]).unwrap();
        assert!(matches!(s.principal, PrincipalSource::Jwt(_)));
        let err = settings(&[
            "--principal",
            "jwt",
            "--jwt-secret-file",
            secret,
            "--jwks-file",
            secret,
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("exactly one"), "{err}");
        let err = settings(&["--principal", "jwt", "--jwks-file", secret])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("IDEMGATE_JWKS_FILE") && err.contains("JWKS"),
            "{err}"
        );
        let _ = std::fs::remove_file(secret);
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
    fn tls_needs_a_readable_certificate_and_key_pair() {
        let fixture = |name: &str| {
            format!(
                "{}/tests/e2e/fixtures/tls/{name}",
                env!("CARGO_MANIFEST_DIR")
            )
        };
        let (cert, key) = (fixture("cert.pem"), fixture("key.pem"));
        let p = ["--principal", "header:x-user"];
        let s = settings(&[p[0], p[1], "--tls-cert", &cert, "--tls-key", &key]).unwrap();
        assert!(s.tls.is_some());
        assert!(settings(&[p[0], p[1]]).unwrap().tls.is_none());
        let err = settings(&[p[0], p[1], "--tls-cert", &key, "--tls-key", &key])
            .unwrap_err()
            .to_string();
        assert!(err.contains("IDEMGATE_TLS_CERT"), "{err}");
        let err = settings(&[p[0], p[1], "--tls-cert", &cert, "--tls-key", &cert])
            .unwrap_err()
            .to_string();
        assert!(err.contains("IDEMGATE_TLS_KEY"), "{err}");
        let mut argv = vec!["idemgate", "proxy", "--upstream", "http://h:1"];
        argv.extend(["--tls-cert", &cert]);
        assert!(
            Cli::try_parse_from(argv).is_err(),
            "a certificate needs its key"
        );
    }

    #[test]
    fn the_secret_never_shows_in_debug_output() {
        let s = settings(&["--principal-secret", "hunter2"]).unwrap();
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
