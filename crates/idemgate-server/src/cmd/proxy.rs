//! `idemgate proxy`: the `idemgate-proxy` router in front of `--upstream` on the
//! public listener, health, metrics and the key API on a separate admin listener.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderName;
use idemgate_listener::tls::{self, TlsFile};
use idemgate_listener::{ListenerOptions, raise_fd_limit};
use idemgate_proxy::{HostHeader, JwtPrincipal, PrincipalSource, ProxyConfig, Routes, Upstream};
use tokio_rustls::rustls::ServerConfig;

use crate::admin::{self, AdminState};
use crate::cli::{HostHeaderArg, ProxyArgs, read_file};
use crate::config::{
    AdminToken, ConfigError, LayerSettings, RedisSafety, StoreUrl, TelemetrySettings,
};
use crate::idempotency::{self, with_replay_cache};
use crate::monitoring::install_metrics;
use crate::process::{self, StartupError, bind, serve_until_signal};
use crate::store::{self, Opening};

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
    pub store: StoreUrl,
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
    /// The idempotency layer: record timing and the replay cache.
    pub layer: LayerSettings,
    /// Graceful shutdown deadline.
    pub shutdown_timeout: Duration,
    /// Logs and span export.
    pub telemetry: TelemetrySettings,
    /// Connection limits of both listeners.
    pub connections: ListenerOptions,
    /// Redis safety checks: persistence policy, replicas to wait for.
    pub redis: RedisSafety,
}

impl ProxySettings {
    /// Checks the flags, reads the secret and key files, resolves the defaults.
    pub fn from_args(args: &ProxyArgs) -> Result<Self, ConfigError> {
        let upstream = args.upstream.parse::<Upstream>().map_err(|error| {
            ConfigError::new(
                "--upstream",
                "IDEMGATE_UPSTREAM",
                format!("{error}: {:?}", args.upstream),
            )
        })?;
        if args.upstream_timeout_ms == 0 {
            return Err(ConfigError::new(
                "--upstream-timeout-ms",
                "IDEMGATE_UPSTREAM_TIMEOUT_MS",
                "must be at least 1",
            ));
        }
        let store = args
            .idempotency_store
            .parse::<StoreUrl>()
            .map_err(|reason| {
                ConfigError::new("--idempotency-store", "IDEMGATE_IDEMPOTENCY_STORE", reason)
            })?;
        let layer = args.layer.settings()?;
        let routes = match &args.config {
            Some(path) => {
                let routes = Routes::load(path).map_err(|error| {
                    ConfigError::new("--config", "IDEMGATE_CONFIG", error.to_string())
                })?;
                routes
                    .check_timing(layer.ttl, layer.lease)
                    .map_err(|error| {
                        ConfigError::new("--config", "IDEMGATE_CONFIG", error.to_string())
                    })?;
                routes
            }
            None => Routes::default(),
        };
        Ok(Self {
            listen: args.address.address(),
            admin_listen: args.admin_listen,
            admin_token: args.admin.token(),
            upstream,
            store,
            principal: principal_source(args)?,
            upstream_timeout: Duration::from_millis(args.upstream_timeout_ms),
            host_header: match args.upstream_host_header {
                HostHeaderArg::Client => HostHeader::Client,
                HostHeaderArg::Upstream => HostHeader::Upstream,
            },
            routes,
            tls: tls(args)?,
            layer,
            shutdown_timeout: args.process.shutdown_timeout(),
            telemetry: args.process.telemetry(),
            connections: args.connections.options()?,
            redis: args.redis.safety(),
        })
    }
}

fn principal_source(args: &ProxyArgs) -> Result<PrincipalSource, ConfigError> {
    let refuse = |reason: String| ConfigError::new("--principal", "IDEMGATE_PRINCIPAL", reason);
    match args.principal.as_str() {
        "authorization" => secret(args).map(PrincipalSource::Authorization),
        "jwt" => jwt(args).map(PrincipalSource::Jwt),
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
fn tls(args: &ProxyArgs) -> Result<Option<Arc<ServerConfig>>, ConfigError> {
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Ok(None);
    };
    tls::server_config(cert, key).map(Some).map_err(|error| {
        let (flag, env) = match error.file() {
            TlsFile::Certificate => ("--tls-cert", "IDEMGATE_TLS_CERT"),
            TlsFile::Key => ("--tls-key", "IDEMGATE_TLS_KEY"),
        };
        ConfigError::new(flag, env, error.to_string())
    })
}

/// `--principal jwt`: the verifier of exactly one key source.
fn jwt(args: &ProxyArgs) -> Result<JwtPrincipal, ConfigError> {
    let principal = match (&args.jwt_secret_file, &args.jwks_file) {
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
            JwtPrincipal::hs256(secret, args.jwt_claim.clone())
        }
        (None, Some(path)) => {
            let jwks = read_file(path, "--jwks-file", "IDEMGATE_JWKS_FILE")?;
            JwtPrincipal::jwks(&jwks, args.jwt_claim.clone()).map_err(|error| {
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
    let principal = match &args.jwt_issuer {
        Some(issuer) => principal.with_issuer(issuer),
        None => principal,
    };
    Ok(match &args.jwt_audience {
        Some(audience) => principal.with_audience(audience),
        None => principal,
    })
}

/// The secret of `--principal authorization`; none is a startup error, never
/// a silent random secret (each restart would then forget every key).
fn secret(args: &ProxyArgs) -> Result<Arc<[u8]>, ConfigError> {
    let secret = args.secret.read()?;
    if secret.is_empty() {
        return Err(ConfigError::new(
            "--principal",
            "IDEMGATE_PRINCIPAL",
            "`authorization` scopes keys by an HMAC of the Authorization header and needs a secret: set IDEMGATE_PRINCIPAL_SECRET or --principal-secret-file PATH (or use --principal header:NAME)",
        ));
    }
    Ok(Arc::from(secret))
}

/// `idemgate proxy`: checks the flags (exit 2 when they cannot work), then serves
/// until SIGINT or SIGTERM.
pub async fn main(args: &ProxyArgs) -> ExitCode {
    match ProxySettings::from_args(args) {
        Ok(settings) => process::run_service(settings.telemetry, run(settings)).await,
        Err(error) => process::config_error(&error),
    }
}

/// Runs the proxy until SIGINT or SIGTERM, then drains like `serve`.
pub async fn run(settings: ProxySettings) -> Result<(), StartupError> {
    let metrics = install_metrics();
    let opened = store::open(
        &settings.store,
        Opening::Serve,
        settings.layer.store_timeout,
        settings.redis,
    )
    .await?;
    // The resource leases of `conditional = "enforce"` routes go to the store
    // itself, past the replay cache: every instance must see every lease.
    let lock_store = Arc::clone(&opened.store);
    let store = with_replay_cache(opened.store, settings.layer.replay_cache);
    let layer = settings
        .principal
        .apply_to(idempotency::layer(Arc::clone(&store), &settings.layer));
    let tasks = layer.detached_tasks();
    let public = idemgate_proxy::app(
        ProxyConfig::new(settings.upstream.clone())
            .with_upstream_timeout(settings.upstream_timeout)
            .with_host_header(settings.host_header)
            .with_https_clients(settings.tls.is_some())
            .with_routes(settings.routes.clone())
            .with_lock_store(lock_store),
        layer,
    );
    let admin = admin::router(AdminState::new(
        store,
        settings.layer.store_timeout,
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};
    use crate::config::RedisPersistence;

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
        ProxySettings::from_args(&args)
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
        assert_eq!(s.store, StoreUrl::Sqlite("sqlite://./p.db".to_owned()));
        assert!(matches!(s.principal, PrincipalSource::Authorization(_)));
        assert_eq!(s.layer.ttl, Duration::from_secs(86_400));
        assert_eq!(s.layer.lease, Duration::from_secs(30));
        assert_eq!(s.layer.wait, None);
        assert_eq!(s.layer.store_timeout, Duration::from_secs(2));
        assert_eq!(s.redis.persistence, RedisPersistence::Warn);
        assert_eq!(s.redis.wait_replicas, 0);
        let s = settings(&[
            "--principal-secret",
            "s",
            "--redis-persistence",
            "refuse",
            "--redis-wait-replicas",
            "1",
        ])
        .unwrap();
        assert_eq!(s.redis.persistence, RedisPersistence::Refuse);
        assert_eq!(s.redis.wait_replicas, 1);
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
        let err = ProxySettings::from_args(&args).unwrap_err().to_string();
        assert!(err.contains("IDEMGATE_UPSTREAM"), "{err}");
        let err = settings(&["--principal", "header:x-user", "--upstream-timeout-ms", "0"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("IDEMGATE_UPSTREAM_TIMEOUT_MS"), "{err}");
    }

    #[test]
    fn tls_needs_a_readable_certificate_and_key_pair() {
        let fixture =
            |name: &str| format!("{}/tests/fixtures/tls/{name}", env!("CARGO_MANIFEST_DIR"));
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
