//! `idemgate proxy`: the `idemgate-proxy` router in front of `--upstream` on the
//! public listener, health, metrics and the key API on a separate admin listener;
//! `SIGHUP` reloads the route file. `--check-config FILE` only checks a route
//! file, through the same loader ([`route_file::load`]), and starts nothing.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderName;
use idemgate::path::PathPolicy;
use idemgate_listener::tls::{self, TlsFile};
use idemgate_listener::{Listener, ListenerOptions, raise_fd_limit};
use idemgate_proxy::{
    HostHeader, JwtPrincipal, Policy, PrincipalSource, ProxyConfig, Routes, UnderscoreHeaders,
    Upstream, UpstreamProtocol,
};
use std::path::Path;
use tokio_rustls::rustls::ServerConfig;

use crate::admin::{self, AdminState};
use crate::cli::{ProxyArgs, read_file};
use crate::config::{
    AdminToken, ConfigError, LayerSettings, RedisSafety, StoreUrl, TelemetrySettings,
};
use crate::idempotency::{self, with_replay_cache};
use crate::monitoring::install_metrics;
use crate::process::{self, EXIT_CONFIG, Served, StartupError, bind, serve_until_signal};
use crate::route_file::{self, RouteFile, RouteFileInfo};
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
    /// Which requests go to the upstream in HTTP/2.
    pub upstream_protocol: UpstreamProtocol,
    /// The default route: every route-overridable setting as the flags set it.
    pub policy: Policy,
    /// Per-route policies (empty without --config), checked over `policy`.
    pub routes: Routes,
    /// The --config file they came from (`None` without one), reloaded on SIGHUP.
    pub route_file: Option<RouteFileInfo>,
    /// The public listener's TLS, when it terminates TLS itself.
    pub tls: Option<Arc<ServerConfig>>,
    /// The idempotency layer: record timing and the replay cache.
    pub layer: LayerSettings,
    /// Graceful shutdown deadline.
    pub shutdown_timeout: Duration,
    /// Worker threads of the public listener.
    pub workers: NonZeroUsize,
    /// Logs and span export.
    pub telemetry: TelemetrySettings,
    /// Connection limits of both listeners.
    pub connections: ListenerOptions,
    /// Redis safety checks: persistence policy, replicas to wait for.
    pub redis: RedisSafety,
    /// Which path spellings are refused and how the others are read.
    pub path_policy: PathPolicy,
    /// Request headers whose names hold `_`.
    pub underscore_headers: UnderscoreHeaders,
}

impl ProxySettings {
    /// Checks the flags, reads the secret and key files, resolves the defaults.
    pub fn from_args(args: &ProxyArgs) -> Result<Self, ConfigError> {
        // clap requires it unless --check-config, which never gets here.
        let Some(upstream) = &args.upstream else {
            return Err(ConfigError::new(
                "--upstream",
                "IDEMGATE_UPSTREAM",
                "is required to serve",
            ));
        };
        let upstream = upstream.parse::<Upstream>().map_err(|error| {
            ConfigError::new(
                "--upstream",
                "IDEMGATE_UPSTREAM",
                format!("{error}: {upstream:?}"),
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
        let policy = args.policy(&layer)?;
        // The listener's own refusals carry the operator's problem type base too.
        let connections = args
            .connections
            .options()?
            .with_problem_type_base(layer.problem_style.base());
        let (routes, route_file) = match &args.config {
            Some(path) => {
                let (routes, info) = route_file::load(path, &policy).map_err(|error| {
                    ConfigError::new("--config", "IDEMGATE_CONFIG", error.to_string())
                })?;
                (routes, Some(info))
            }
            None => (Routes::default(), None),
        };
        Ok(Self {
            listen: args.address.address(),
            admin_listen: args.admin_listen,
            admin_token: args.admin.token(),
            upstream,
            store,
            principal: principal_source(args)?,
            upstream_timeout: Duration::from_millis(args.upstream_timeout_ms),
            host_header: args.upstream_host_header,
            upstream_protocol: args.upstream_protocol,
            policy,
            routes,
            route_file,
            tls: tls(args)?,
            layer,
            shutdown_timeout: args.process.shutdown_timeout(),
            workers: NonZeroUsize::new(args.workers).unwrap_or_else(|| {
                std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN)
            }),
            telemetry: args.process.telemetry(),
            connections,
            redis: args.redis.safety(),
            path_policy: args.guard.path_policy(),
            underscore_headers: args.guard.underscore_headers,
        })
    }

    /// The forwarding service's configuration: the upstream, the guard, the
    /// principal (for the layer and the guard alike), the default route and
    /// the route file's routes.
    pub fn proxy_config(&self) -> ProxyConfig {
        ProxyConfig::new(self.upstream.clone())
            .with_upstream_timeout(self.upstream_timeout)
            .with_host_header(self.host_header)
            .with_upstream_protocol(self.upstream_protocol)
            .with_https_clients(self.tls.is_some())
            .with_path_policy(self.path_policy)
            .with_underscore_headers(self.underscore_headers)
            .with_principal(self.principal.clone())
            .with_defaults(self.policy.clone())
            .with_routes(self.routes.clone())
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
/// until SIGINT or SIGTERM. With `--check-config FILE`, only checks that file.
pub async fn main(args: &ProxyArgs) -> ExitCode {
    if let Some(path) = &args.check_config {
        return check_config(args, path);
    }
    match ProxySettings::from_args(args) {
        Ok(settings) => process::run_service(settings.telemetry, run(settings)).await,
        Err(error) => process::config_error(&error),
    }
}

/// `--check-config FILE`: the route file through the loader startup and reload
/// use, checked against the record timing flags it inherits. Exit 0 with a
/// summary on stdout, or the problem on stderr (`FILE:LINE:COL: problem`) and
/// exit 2. Needs neither --upstream nor a store: it opens nothing.
fn check_config(args: &ProxyArgs, path: &Path) -> ExitCode {
    let policy = match args.layer.settings().and_then(|layer| args.policy(&layer)) {
        Ok(policy) => policy,
        Err(error) => return process::config_error(&error),
    };
    match route_file::load(path, &policy) {
        Ok((_, info)) => {
            println!(
                "{}: OK: {} route{}, sha256 {}",
                path.display(),
                info.routes,
                if info.routes == 1 { "" } else { "s" },
                info.sha256
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

/// SIGHUP, listened for from the first moment of [`run`]: from then on a SIGHUP
/// no longer has its default action (ending the process), even while the store
/// is still being opened; one that arrives before the routes serve waits in the
/// stream and reloads them as soon as they do.
struct Hangups(#[cfg(unix)] tokio::signal::unix::Signal);

impl Hangups {
    fn listen() -> Result<Self, StartupError> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            signal(SignalKind::hangup())
                .map(Self)
                .map_err(StartupError::Serve)
        }
        #[cfg(not(unix))]
        Ok(Self())
    }

    /// Reloads `file` on every SIGHUP until the process ends.
    fn reload(self, file: RouteFile) {
        #[cfg(unix)]
        {
            let mut hangups = self.0;
            tokio::spawn(async move {
                while hangups.recv().await.is_some() {
                    // Logged and counted inside; the old routes stay on an error.
                    let _ = file.reload().await;
                }
            });
        }
        #[cfg(not(unix))]
        let _ = (self, file);
    }
}

/// Runs the proxy until SIGINT or SIGTERM, then drains like `serve`.
pub async fn run(settings: ProxySettings) -> Result<(), StartupError> {
    let hangups = Hangups::listen()?;
    let metrics = install_metrics();
    let opened = store::open(
        &settings.store,
        Opening::Serve,
        settings.layer.store_timeout,
        settings.redis,
    )
    .await?;
    // The resource leases of `conditional = "enforce"` routes go to the store
    // itself, past the replay cache: every instance must see every lease. Each
    // call bounded by the store timeout, as the layer's are.
    let lock_store: Arc<dyn idemgate::Store> = Arc::new(idemgate::deadline::WithDeadline::new(
        Arc::clone(&opened.store),
        settings.layer.store_timeout,
    ));
    let memory = settings.store == crate::config::StoreUrl::Memory;
    let store = with_replay_cache(opened.store, settings.layer.replay_cache.for_store(memory));
    let journal = crate::audit::journal(Arc::clone(&store), &settings.layer.audit, memory)
        .await
        .map_err(StartupError::Journal)?;
    let store: Arc<dyn idemgate::Store> = match &journal {
        Some(journal) => Arc::clone(journal) as Arc<dyn idemgate::Store>,
        None => store,
    };
    let layer = idempotency::layer(Arc::clone(&store), &settings.layer);
    let tasks = layer.detached_tasks();
    let (public, table) =
        idemgate_proxy::reloadable_app(settings.proxy_config().with_lock_store(lock_store), layer);
    let route_file = RouteFile::new(table, settings.route_file.clone());
    hangups.reload(route_file.clone());
    let admin = admin::router(
        AdminState::new(
            store,
            settings.layer.store_timeout,
            metrics,
            tasks.clone(),
            settings.admin_token.clone(),
        )
        .with_route_file(route_file),
    );

    let open_files = raise_fd_limit();
    let mut workers = Listener::bind_group(
        settings.listen,
        settings.connections.clone(),
        settings.workers.get(),
    )
    .await
    .map_err(|source| StartupError::Listen {
        addr: settings.listen,
        source,
    })?;
    if let Some(tls) = &settings.tls {
        workers = workers
            .into_iter()
            .map(|listener| listener.with_tls(Arc::clone(tls)))
            .collect();
    }
    let scheme = if settings.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let admin_listener = bind(settings.admin_listen, settings.connections).await?;
    let admin_addr = admin_listener.local_addr().map_err(StartupError::Serve)?;
    let addr = workers[0].local_addr().map_err(StartupError::Serve)?;
    tracing::info!(%admin_addr, "admin listening on http://{admin_addr}");
    tracing::info!(
        %addr,
        upstream = settings.upstream.authority(),
        store = settings.store.kind(),
        workers = settings.workers.get(),
        max_connections = workers[0].max_connections(),
        open_files,
        "idemgate proxy listening on {scheme}://{addr}"
    );
    serve_until_signal(
        vec![
            Served::OnWorkers(workers, public),
            Served::Here(admin_listener, admin),
        ],
        tasks,
        settings.shutdown_timeout,
    )
    .await;
    if let Some(journal) = journal {
        journal.flush().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use idemgate::path::{
        AboveRoot, ControlOrNonAscii, EncodedDotSegment, EncodedSlash, PathParameters,
    };
    use idemgate_proxy::{MethodOverride, SafeMethodBodies};

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
        // Issue 36: a duplicate in flight waits for the outcome by default.
        assert_eq!(s.layer.wait, Some(idemgate::DEFAULT_WAIT));
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
    fn guard_flags_default_to_the_safe_choices_and_each_parses() {
        let p = ["--principal", "header:x-user"];
        let s = settings(&p).unwrap();
        assert_eq!(s.path_policy, PathPolicy::STRICT);
        assert!(!s.policy.case_insensitive && !s.policy.require_key);
        assert_eq!(s.underscore_headers, UnderscoreHeaders::Drop);
        assert_eq!(s.policy.method_override, MethodOverride::Refuse);
        assert_eq!(s.policy.safe_method_bodies, SafeMethodBodies::Refuse);
        assert_eq!(s.policy.upstream_idle_timeout, None);
        assert_eq!(s.policy.upstream_response_timeout, None);
        let s = settings(&[
            p[0],
            p[1],
            "--path-encoded-slash",
            "decode",
            "--path-encoded-dot-segment",
            "resolve",
            "--path-parameters",
            "strip",
            "--path-control-or-non-ascii",
            "encode",
            "--path-above-root",
            "clamp",
            "--case-insensitive-paths",
            "--require-key",
            "true",
            "--underscore-headers",
            "reject",
            "--method-override",
            "honour",
            "--safe-method-body",
            "forward",
            "--upstream-idle-timeout-ms",
            "250",
            "--upstream-response-timeout-ms",
            "900",
        ])
        .unwrap();
        assert_eq!(
            s.path_policy,
            PathPolicy {
                encoded_slash: EncodedSlash::Decode,
                encoded_dot_segment: EncodedDotSegment::Resolve,
                path_parameters: PathParameters::Strip,
                control_or_non_ascii: ControlOrNonAscii::Encode,
                above_root: AboveRoot::Clamp,
            }
        );
        assert!(s.policy.case_insensitive && s.policy.require_key);
        assert_eq!(s.underscore_headers, UnderscoreHeaders::Reject);
        assert_eq!(s.policy.method_override, MethodOverride::Honour);
        assert_eq!(s.policy.safe_method_bodies, SafeMethodBodies::Forward);
        assert_eq!(
            s.policy.upstream_idle_timeout,
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            s.policy.upstream_response_timeout,
            Some(Duration::from_millis(900))
        );
        for (flag, env) in [
            (
                "--upstream-idle-timeout-ms",
                "IDEMGATE_UPSTREAM_IDLE_TIMEOUT_MS",
            ),
            (
                "--upstream-response-timeout-ms",
                "IDEMGATE_UPSTREAM_RESPONSE_TIMEOUT_MS",
            ),
        ] {
            let err = settings(&[p[0], p[1], flag, "0"]).unwrap_err().to_string();
            assert!(err.contains(env), "{err}");
        }
    }

    #[test]
    fn the_secret_never_shows_in_debug_output() {
        let s = settings(&["--principal-secret", "hunter2"]).unwrap();
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
