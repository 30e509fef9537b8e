//! The command line: every clap type of `idemgate serve`, `idemgate proxy` and
//! `idemgate keys`, each flag with its environment variable, and the checks of the
//! argument groups several subcommands share. It turns text into the checked
//! values of [`crate::config`] and imports nothing else of this crate; each
//! subcommand module (`crate::cmd`) takes its own arguments from here.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{ArgGroup, Parser, Subcommand};
use idemgate::cache::ReplayCacheConfig;
use idemgate::path::{
    AboveRoot, ControlOrNonAscii, EncodedDotSegment, EncodedSlash, PathParameters, PathPolicy,
};
use idemgate::problem::{ProblemShape, ProblemStyle};
use idemgate::{ObservedResponses, ReplayedHeaders, UnlistableHeader};
use idemgate_listener::ListenerOptions;
use idemgate_proxy::{
    HostHeader, MethodOverride, Policy, SafeMethodBodies, UnderscoreHeaders, UpstreamProtocol,
};

use crate::config::{
    AdminToken, AuditSettings, ConfigError, LayerSettings, LogFormat, RedisPersistence,
    RedisSafety, ReplayCacheSettings, TelemetrySettings,
};

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
    Proxy(ProxyArgs),
    /// Inspect or evict one key's record, straight on the store.
    Keys(KeysArgs),
    /// Read the journal (every operation's events) or check that it is intact,
    /// straight on the store.
    Audit(AuditArgs),
    /// Print a shell completion script to stdout (e.g. `idemgate completions
    /// bash > /etc/bash_completion.d/idemgate`).
    Completions(CompletionsArgs),
    /// Print the man page (roff) to stdout (e.g. `idemgate man > idemgate.1`).
    Man,
}

/// `idemgate completions SHELL`.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: CompletionShell,
}

/// The shells `idemgate completions` writes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompletionShell {
    /// Bash (bash-completion).
    Bash,
    /// Zsh (a `#compdef` file for `$fpath`).
    Zsh,
    /// Fish (for `~/.config/fish/completions/`).
    Fish,
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

impl RedisArgs {
    /// The checks these flags ask for.
    pub fn safety(&self) -> RedisSafety {
        RedisSafety {
            persistence: self.redis_persistence,
            wait_replicas: self.redis_wait_replicas,
        }
    }
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
    pub fn token(&self) -> Option<AdminToken> {
        AdminToken::new(self.admin_token.as_deref())
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

    /// The payment gateway's webhook secret (Standard Webhooks, whsec_ +
    /// base64). Set, POST /webhooks/payments marks an order's payment confirmed
    /// exactly once per verified event, and the simulated gateway confirms
    /// each charge there; needs --idempotency-store database. Unset: no webhook.
    #[arg(
        long,
        env = "IDEMGATE_PAYMENT_WEBHOOK_SECRET",
        value_name = "SECRET",
        hide_env_values = true
    )]
    pub payment_webhook_secret: Option<String>,

    /// Refuse a POST or PATCH to the orders routes without an Idempotency-Key:
    /// 400 problem+json `missing-key`, nothing charged or stored. Off by default
    /// (a keyless request then runs every time it is sent).
    #[arg(
        long,
        env = "IDEMGATE_REQUIRE_KEY",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub require_key: bool,

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

    /// Benchmarks only: claim transfers in two phases (the claim committed
    /// before the ledger's transaction) instead of the one-transaction mode, so
    /// `idemgate-bench` can compare the two in one run. Hidden from `--help`.
    #[arg(long, hide = true)]
    pub two_phase_transfers: bool,
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
    /// answering 409, in milliseconds (0: answer 409 at once). Waiters wake the
    /// moment the outcome is recorded, on any instance. The default (10 s) is
    /// longer than the operations keys usually guard and shorter than gateways'
    /// request timeouts, so an SDK's retry gets the replay instead of a 409 it
    /// may raise; a 409's Retry-After estimates the time left from the route's
    /// recent executions.
    #[arg(
        long,
        env = "IDEMPOTENCY_WAIT_MS",
        default_value_t = 10_000,
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

    /// The base of every idemgate problem `type` URI, so types point at your own
    /// documentation of the slugs (docs/problems.md), e.g.
    /// `https://docs.example.com/errors/` (the slug is appended). The default,
    /// /problems/, is relative: it claims no domain.
    #[arg(
        long,
        env = "IDEMGATE_PROBLEM_TYPE_BASE",
        default_value = idemgate::problem::PROBLEM_BASE,
        value_name = "URL"
    )]
    pub problem_type_base: String,

    /// Send `Link: <type URI>; rel="describedby"` with every problem.
    #[arg(
        long,
        env = "IDEMGATE_PROBLEM_LINK",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub problem_link: bool,

    /// The body of error answers: `rfc9457` (application/problem+json) or
    /// `stripe` (Stripe's `{"error": {"type": "idempotency_error", …}}`, a reused
    /// key as 400), so Stripe-shaped SDKs raise their idempotency error.
    #[arg(
        long,
        env = "IDEMGATE_PROBLEM_SHAPE",
        value_enum,
        default_value_t = ProblemShape::Rfc9457,
        value_name = "SHAPE"
    )]
    pub problem_shape: ProblemShape,

    /// A response header to store and replay beyond the default list
    /// (docs/PROTOCOL.md §7: the representation's metadata, Location, ETag,
    /// Link, CORS…; not Date, Server, request ids or rate-limit counters), such
    /// as an API's own X-Order-Ref. Repeat the flag, or separate names with
    /// commas in the variable.
    #[arg(
        long = "replay-header",
        env = "IDEMGATE_REPLAY_HEADERS",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    pub replay_headers: Vec<String>,

    /// Store and replay Set-Cookie too (off by default: a replay would hand the
    /// first request's session cookie to whoever retries with the key).
    #[arg(
        long,
        env = "IDEMGATE_REPLAY_SET_COOKIE",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub replay_set_cookie: bool,

    /// How many completed records this process keeps in memory to answer replays
    /// without a store round trip (0: no replay cache). Default: 10000, and none
    /// in front of the memory store, which keeps every record in this process.
    #[arg(long, env = "IDEMGATE_REPLAY_CACHE_ENTRIES", value_name = "N")]
    pub replay_cache_entries: Option<usize>,

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

    /// The journal (docs/audit.md): every operation's events (claimed, executed,
    /// replayed, conflict, mismatch, released, taken_over, fenced), kept past
    /// the records' TTL in the store, hash-chained so that an edit or a deletion
    /// is found (`idemgate audit verify`). Default: on for SQL and Redis stores,
    /// off for memory.
    #[arg(long, env = "IDEMGATE_AUDIT", value_enum, value_name = "off|on")]
    pub audit: Option<AuditSwitch>,

    /// How long journal entries are kept (`400d`, `90d`, `12h`); a periodic
    /// task removes older ones.
    #[arg(
        long,
        env = "IDEMGATE_AUDIT_RETENTION",
        default_value = "400d",
        value_name = "DURATION"
    )]
    pub audit_retention: String,
}

/// `--audit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuditSwitch {
    /// No journal.
    Off,
    /// Journal every operation's events.
    On,
}

impl LayerArgs {
    /// Checks the flags: a lease and a store timeout of at least 1, a TTL longer
    /// than the lease.
    pub fn settings(&self) -> Result<LayerSettings, ConfigError> {
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
        let replay_cache_entries = self
            .replay_cache_entries
            .unwrap_or(ReplayCacheConfig::DEFAULT_ENTRIES);
        if replay_cache_entries > 0 && self.replay_cache_bytes == 0 {
            return Err(ConfigError::new(
                "--replay-cache-bytes",
                "IDEMGATE_REPLAY_CACHE_BYTES",
                "must be at least 1 (turn the cache off with --replay-cache-entries 0)",
            ));
        }
        if replay_cache_entries > 0 && self.replay_cache_max_age_ms == 0 {
            return Err(ConfigError::new(
                "--replay-cache-max-age-ms",
                "IDEMGATE_REPLAY_CACHE_MAX_AGE_MS",
                "must be at least 1 (turn the cache off with --replay-cache-entries 0)",
            ));
        }
        let base = &self.problem_type_base;
        if base.is_empty()
            || !base
                .bytes()
                .all(|b| b.is_ascii_graphic() && !matches!(b, b'<' | b'>' | b'"'))
        {
            return Err(ConfigError::new(
                "--problem-type-base",
                "IDEMGATE_PROBLEM_TYPE_BASE",
                format!("expected a URI (visible ASCII, no spaces, <, > or \"), got {base:?}"),
            ));
        }
        let retention = humantime::parse_duration(&self.audit_retention)
            .ok()
            .filter(|retention| !retention.is_zero())
            .ok_or_else(|| {
                ConfigError::new(
                    "--audit-retention",
                    "IDEMGATE_AUDIT_RETENTION",
                    format!(
                        "expected a duration such as 400d or 12h, got {:?}",
                        self.audit_retention
                    ),
                )
            })?;
        Ok(LayerSettings {
            audit: AuditSettings {
                requested: self.audit.map(|switch| switch == AuditSwitch::On),
                retention,
            },
            replayed_headers: replayed_headers(&self.replay_headers)?
                .with_set_cookie(self.replay_set_cookie),
            problem_style: ProblemStyle::default()
                .with_base(base.clone())
                .with_link(self.problem_link)
                .with_shape(self.problem_shape),
            ttl: Duration::from_secs(self.ttl),
            lease: Duration::from_secs(self.lease),
            wait: (self.wait_ms > 0).then(|| Duration::from_millis(self.wait_ms)),
            store_timeout: Duration::from_millis(self.store_timeout_ms),
            replay_cache: {
                let config = (replay_cache_entries > 0).then(|| ReplayCacheConfig {
                    entries: replay_cache_entries,
                    bytes: self.replay_cache_bytes,
                    max_age: Duration::from_millis(self.replay_cache_max_age_ms),
                });
                match (self.replay_cache_entries, config) {
                    (None, Some(config)) => ReplayCacheSettings::Default(config),
                    (_, config) => ReplayCacheSettings::Given(config),
                }
            },
        })
    }
}

/// The `--replay-header` names, checked by [`ReplayedHeaders::listable`].
fn replayed_headers(names: &[String]) -> Result<ReplayedHeaders, ConfigError> {
    let checked = names
        .iter()
        .filter(|name| !name.trim().is_empty())
        .map(|name| {
            ReplayedHeaders::listable(name).map_err(|error| {
                let hint = match error {
                    UnlistableHeader::SetCookie => ": --replay-set-cookie",
                    _ => "",
                };
                ConfigError::new(
                    "--replay-header",
                    "IDEMGATE_REPLAY_HEADERS",
                    format!("{error}{hint}"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ReplayedHeaders::default().with_names(checked))
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
    /// The graceful shutdown deadline.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_secs(self.shutdown_timeout)
    }

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

/// `idemgate proxy` flags. Every flag can also come from the environment variable
/// named in its help; a flag wins over its variable. Every POST, PUT, PATCH and
/// DELETE with an Idempotency-Key is covered, unless a route of --config says
/// otherwise; everything else streams through, its key as sent.
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    /// The API to put the protocol in front of: http://host:port[/base]. Request
    /// paths go under the base. Required, except with --check-config.
    #[arg(
        long,
        env = "IDEMGATE_UPSTREAM",
        value_name = "URL",
        required_unless_present = "check_config"
    )]
    pub upstream: Option<String>,

    /// Check the route file FILE as the proxy would load it (TOML, every key,
    /// each route's TTL against the --ttl/--lease it inherits), then exit: 0 and
    /// a one-line summary on stdout, or `FILE:LINE:COL: problem` on stderr and
    /// exit 2. Starts nothing: no listener, no store connection, no upstream
    /// needed. The variable exists for symmetry; never set it on a proxy meant
    /// to serve.
    #[arg(long, env = "IDEMGATE_CHECK_CONFIG", value_name = "FILE")]
    pub check_config: Option<PathBuf>,

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

    /// Worker threads serving the public listener (0: one per CPU). Each has
    /// its own runtime, its own SO_REUSEPORT listener and its own upstream
    /// connections, as nginx's worker processes; the store, the replay cache and
    /// the connection bound are shared.
    #[arg(long, env = "IDEMGATE_WORKERS", default_value_t = 0, value_name = "N")]
    pub workers: usize,

    /// Per-route policies (TOML; see docs/proxy.md): which routes are covered and
    /// how. Without it every POST, PUT, PATCH and DELETE with a key is covered
    /// with the defaults above. A
    /// bad file stops the start, naming its line. SIGHUP reloads it: a bad new
    /// file is refused and the old routes keep serving.
    #[arg(long, env = "IDEMGATE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// The Host header the upstream receives: `client` (as the client sent it) or
    /// `upstream` (the --upstream URL's host:port, for an upstream that routes by
    /// its own name). The client's Host is in X-Forwarded-Host either way.
    #[arg(
        long,
        env = "IDEMGATE_UPSTREAM_HOST_HEADER",
        value_enum,
        default_value_t = HostHeader::Client,
        value_name = "WHICH"
    )]
    pub upstream_host_header: HostHeader,

    /// The protocol spoken to the upstream: `auto` (HTTP/2 with prior
    /// knowledge, h2c, for gRPC calls, which need it; HTTP/1.1 for everything
    /// else), `h2c` (HTTP/2 for every request) or `http1` (HTTP/1.1 only).
    #[arg(
        long,
        env = "IDEMGATE_UPSTREAM_PROTOCOL",
        value_enum,
        default_value_t = UpstreamProtocol::Auto,
        value_name = "PROTOCOL"
    )]
    pub upstream_protocol: UpstreamProtocol,

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

    /// What a route in `mode = "observe"` keeps of an observed first run where
    /// it does not say (`observe_responses`): `discard` (its outcome only, under
    /// a name enforcement never reads: after a switch to enforce, a retry of an
    /// observed operation runs as new) or `keep` (the whole response, as
    /// enforcement stores it: such a retry is replayed).
    #[arg(
        long,
        env = "IDEMGATE_OBSERVE_RESPONSES",
        value_enum,
        default_value_t = ObservedResponses::Discard,
        value_name = "WHAT"
    )]
    pub observe_responses: ObservedResponses,

    /// How the proxy brings a request to one reading before the layer sees it.
    #[command(flatten)]
    pub guard: GuardArgs,
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

/// The bytes of a file a flag names; an unreadable one names the flag.
pub fn read_file(
    path: &Path,
    flag: &'static str,
    env: &'static str,
) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|error| {
        ConfigError::new(
            flag,
            env,
            format!("cannot read {}: {error}", path.display()),
        )
    })
}

/// `idemgate keys`.
#[derive(Debug, clap::Args)]
pub struct KeysArgs {
    /// What to do with the key.
    #[command(subcommand)]
    pub command: KeysCommand,
}

/// `idemgate keys` subcommands.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Print the record under a key as JSON: status, created/expires, the lease's
    /// time left, the response's status and size, the operation id. Exit 3 when
    /// there is none.
    Show {
        /// Which key.
        #[command(flatten)]
        target: KeyTarget,
        /// Also print the stored response's headers and body (they may hold
        /// personal data).
        #[arg(long)]
        body: bool,
    },
    /// Remove the record under a key, so the next request with it runs as a new
    /// operation. DANGEROUS: an operation that already ran runs again on the next
    /// retry. A running (PROCESSING, live lease) record is refused (exit 4)
    /// unless --force.
    Evict {
        /// Which key.
        #[command(flatten)]
        target: KeyTarget,
        /// Evict even a record whose request may still be running: a retry can
        /// then run the operation beside it, and the running request's result is
        /// not stored.
        #[arg(long)]
        force: bool,
    },
    /// Print the principal string the layer stores for a credential, as JSON
    /// (`{"principal": …}`): what the admin API's `principal=` takes.
    Principal {
        /// Whose principal.
        #[command(flatten)]
        whose: PrincipalArgs,
    },
}

/// `idemgate audit`.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// What to do with the journal.
    #[command(subcommand)]
    pub command: AuditCommand,
}

/// `idemgate audit` subcommands.
#[derive(Debug, Subcommand)]
// Parsed once per process: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum AuditCommand {
    /// Print journal entries as JSON Lines, oldest first (exit 0).
    Export {
        /// Where the journal lives: sqlite://PATH, postgres://… or redis://….
        #[arg(long, value_name = "URL")]
        store: String,
        /// Entries written at or after this time (RFC 3339, UTC:
        /// 2026-12-01T00:00:00Z).
        #[arg(long, value_name = "RFC3339")]
        since: Option<String>,
        /// Entries written before this time (RFC 3339, UTC).
        #[arg(long, value_name = "RFC3339")]
        until: Option<String>,
        /// Only one principal's entries: `--principal`, `--authorization`,
        /// `--bearer` or `--principal-header`, as for `idemgate keys`.
        #[command(flatten)]
        whose: AuditPrincipalArgs,
        /// Only the entries of this Idempotency-Key (matched by its keyed
        /// digest; the journal never holds the key).
        #[arg(long, value_name = "K")]
        key: Option<String>,
    },
    /// Check every entry's hash and link: exit 0 and print each partition's
    /// head (anchor it elsewhere) when the journal is intact, exit 1 naming the
    /// first entry that is not.
    Verify {
        /// Where the journal lives.
        #[arg(long, value_name = "URL")]
        store: String,
    },
}

/// The optional principal of `audit export`: at most one of the forms
/// `idemgate keys` takes.
#[derive(Debug, Clone, clap::Args)]
#[command(group(
    ArgGroup::new("audit_whose")
        .multiple(false)
        .args(["principal", "authorization", "bearer", "principal_header"])
))]
pub struct AuditPrincipalArgs {
    /// The principal as the layer stored it (see `idemgate keys --help`).
    #[arg(long, value_name = "P")]
    pub principal: Option<String>,
    /// The client's whole Authorization value, for a proxy with --principal
    /// authorization.
    #[arg(long, value_name = "VALUE")]
    pub authorization: Option<String>,
    /// The bearer token of a request to `idemgate serve`'s orders API.
    #[arg(long, value_name = "TOKEN")]
    pub bearer: Option<String>,
    /// `NAME: VALUE` of the header a proxy with --principal header:NAME trusts.
    #[arg(long, value_name = "NAME: VALUE")]
    pub principal_header: Option<String>,
    /// The proxy's principal secret, for --authorization.
    #[command(flatten)]
    pub secret: PrincipalSecretArgs,
}

impl AuditPrincipalArgs {
    /// As the keys' [`PrincipalArgs`], when one form was given.
    pub fn principal_args(&self) -> Option<PrincipalArgs> {
        (self.principal.is_some()
            || self.authorization.is_some()
            || self.bearer.is_some()
            || self.principal_header.is_some())
        .then(|| PrincipalArgs {
            principal: self.principal.clone(),
            authorization: self.authorization.clone(),
            bearer: self.bearer.clone(),
            principal_header: self.principal_header.clone(),
            secret: self.secret.clone(),
        })
    }
}

/// Whose key: exactly one of `--principal`, `--authorization`, `--bearer` or
/// `--principal-header`.
#[derive(Debug, Clone, clap::Args)]
#[command(group(
    ArgGroup::new("whose")
        .required(true)
        .args(["principal", "authorization", "bearer", "principal_header"])
))]
pub struct PrincipalArgs {
    /// The principal as the layer stored it: `bearer:<sha256 hex>` (serve),
    /// `authz:<hmac hex>` (proxy, --principal authorization),
    /// `header:<name>:<value>` (proxy, --principal header:NAME), or the id an
    /// application's authentication layer set.
    #[arg(long, value_name = "P")]
    pub principal: Option<String>,

    /// The client's whole Authorization value (`Bearer abc…`), for a proxy with
    /// --principal authorization: the principal is its HMAC under the proxy's
    /// secret (IDEMGATE_PRINCIPAL_SECRET or --principal-secret-file).
    #[arg(long, value_name = "VALUE")]
    pub authorization: Option<String>,

    /// The bearer token of a request to `idemgate serve`'s orders API.
    #[arg(long, value_name = "TOKEN")]
    pub bearer: Option<String>,

    /// `NAME: VALUE` of the header a proxy with --principal header:NAME trusts.
    #[arg(long, value_name = "NAME: VALUE")]
    pub principal_header: Option<String>,

    /// The proxy's principal secret, for --authorization.
    #[command(flatten)]
    pub secret: PrincipalSecretArgs,
}

/// The store and the identity parts of one key.
#[derive(Debug, Clone, clap::Args)]
pub struct KeyTarget {
    /// Where the records live: sqlite://PATH, postgres://… or redis://… (for
    /// `serve` in its default `database` mode, its DATABASE_URL).
    #[arg(long, value_name = "URL")]
    pub store: String,

    /// Whose key.
    #[command(flatten)]
    pub whose: PrincipalArgs,

    /// The request method (POST, PATCH; any case).
    #[arg(long, value_name = "M")]
    pub method: String,

    /// The request path as the client sent it (/api/v1/orders); normalized as the
    /// layer normalizes it.
    #[arg(long, value_name = "/x")]
    pub path: String,

    /// The Idempotency-Key value.
    #[arg(long, value_name = "K")]
    pub key: String,

    /// The longest the store may take to answer, in milliseconds.
    #[arg(long, default_value_t = 5_000, value_name = "MS")]
    pub store_timeout_ms: u64,
}

/// Connection limits as flags, flattened into every subcommand that listens
/// (`serve`, `proxy`). Each flag has its environment variable; a flag
/// wins over its variable.
#[derive(Debug, Clone, clap::Args)]
pub struct ListenerArgs {
    /// How long a client has to send a complete request head, in milliseconds:
    /// counted from accept for a new connection (so a client that connects and
    /// sends nothing is closed too) and from the first byte of each later request.
    /// Past it the connection is closed.
    #[arg(
        long,
        env = "IDEMGATE_HEADER_READ_TIMEOUT_MS",
        default_value_t = 10_000,
        value_name = "MS"
    )]
    pub header_read_timeout_ms: u64,

    /// How long a client has to send a whole request body, in milliseconds, from
    /// the end of the head. Past it the answer is 408 (problem+json
    /// `body-timeout`), nothing runs, and the connection is closed.
    #[arg(
        long,
        env = "IDEMGATE_BODY_READ_TIMEOUT_MS",
        default_value_t = 30_000,
        value_name = "MS"
    )]
    pub body_read_timeout_ms: u64,

    /// How long a keep-alive connection may wait for its next request, in
    /// milliseconds; then it is closed. Keep it above the idle timeout of a load
    /// balancer in front (often 60 s).
    #[arg(
        long,
        env = "IDEMGATE_IDLE_TIMEOUT_MS",
        default_value_t = 75_000,
        value_name = "MS"
    )]
    pub idle_timeout_ms: u64,

    /// Most connections open at once. A new connection at the bound closes the one
    /// that has waited longest for a request head (else the longest idle one);
    /// only when every connection is busy with a request does it get an immediate
    /// 503 (problem+json `connection-limit`, `Retry-After: 1`) and is closed.
    /// Capped at the file-descriptor limit minus a reserve of 128 (logged when it
    /// applies).
    #[arg(
        long,
        env = "IDEMGATE_MAX_CONNECTIONS",
        default_value_t = 10_000,
        value_name = "N"
    )]
    pub max_connections: usize,
}

impl ListenerArgs {
    /// Checks the flags: every timeout and the bound must be at least 1.
    pub fn options(&self) -> Result<ListenerOptions, ConfigError> {
        let millis = |value: u64, flag, env| {
            if value == 0 {
                Err(ConfigError::new(flag, env, "must be at least 1"))
            } else {
                Ok(Duration::from_millis(value))
            }
        };
        if self.max_connections == 0 {
            return Err(ConfigError::new(
                "--max-connections",
                "IDEMGATE_MAX_CONNECTIONS",
                "must be at least 1",
            ));
        }
        Ok(ListenerOptions {
            header_read_timeout: millis(
                self.header_read_timeout_ms,
                "--header-read-timeout-ms",
                "IDEMGATE_HEADER_READ_TIMEOUT_MS",
            )?,
            body_read_timeout: millis(
                self.body_read_timeout_ms,
                "--body-read-timeout-ms",
                "IDEMGATE_BODY_READ_TIMEOUT_MS",
            )?,
            idle_timeout: millis(
                self.idle_timeout_ms,
                "--idle-timeout-ms",
                "IDEMGATE_IDLE_TIMEOUT_MS",
            )?,
            max_connections: self.max_connections,
            ..ListenerOptions::default()
        })
    }
}

/// The proxy's guard as flags (`docs/proxy.md`, "One canonical request"): which
/// spellings of a request are refused as ambiguous, how the others are read, and
/// how long the upstream's response body may take. Every default is the safe one.
#[derive(Debug, Clone, clap::Args)]
pub struct GuardArgs {
    /// An encoded slash or backslash (`%2F`, `%5C`) or a raw `\` in the path:
    /// `refuse` (400 ambiguous-path), `keep` (a character of the segment,
    /// forwarded as `%2F`), or `decode` (a segment boundary, for an upstream
    /// that decodes before routing).
    #[arg(
        long,
        env = "IDEMGATE_PATH_ENCODED_SLASH",
        value_enum,
        default_value_t = EncodedSlash::Refuse,
        value_name = "ACTION"
    )]
    pub path_encoded_slash: EncodedSlash,

    /// An encoded dot segment (`/%2e%2e/`, `/.%2E/`): `refuse` (400) or
    /// `resolve` (decoded and resolved, RFC 3986).
    #[arg(
        long,
        env = "IDEMGATE_PATH_ENCODED_DOT_SEGMENT",
        value_enum,
        default_value_t = EncodedDotSegment::Refuse,
        value_name = "ACTION"
    )]
    pub path_encoded_dot_segment: EncodedDotSegment,

    /// `;` path parameters (`/payments;v=1`): `refuse` (400), `keep` (a
    /// character) or `strip` (removed with the rest of the segment, as Tomcat
    /// does; the upstream gets the path without them).
    #[arg(
        long,
        env = "IDEMGATE_PATH_PARAMETERS",
        value_enum,
        default_value_t = PathParameters::Refuse,
        value_name = "ACTION"
    )]
    pub path_parameters: PathParameters,

    /// Raw non-ASCII, escaped control bytes, non-UTF-8 or malformed escapes in
    /// the path: `refuse` (400) or `encode` (`é` → `%C3%A9`, escapes kept).
    #[arg(
        long,
        env = "IDEMGATE_PATH_CONTROL_OR_NON_ASCII",
        value_enum,
        default_value_t = ControlOrNonAscii::Refuse,
        value_name = "ACTION"
    )]
    pub path_control_or_non_ascii: ControlOrNonAscii,

    /// A `..` that climbs above the root (`/../admin`): `refuse` (400) or
    /// `clamp` (dropped, RFC 3986).
    #[arg(
        long,
        env = "IDEMGATE_PATH_ABOVE_ROOT",
        value_enum,
        default_value_t = AboveRoot::Refuse,
        value_name = "ACTION"
    )]
    pub path_above_root: AboveRoot,

    /// Match routes and scope keys with ASCII case folded, for an upstream
    /// router that ignores case (Express); the upstream still gets the client's
    /// case. A route's `case_insensitive` overrides it.
    #[arg(
        long,
        env = "IDEMGATE_CASE_INSENSITIVE_PATHS",
        value_name = "BOOL",
        num_args = 0..=1,
        default_value = "false",
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub case_insensitive_paths: bool,

    /// Require an Idempotency-Key on every covered request (POST, PUT, PATCH and
    /// DELETE, and every route's method) unless a route says `require_key =
    /// false`: keyless, 400 missing-key, nothing forwarded.
    #[arg(
        long,
        env = "IDEMGATE_REQUIRE_KEY",
        value_name = "BOOL",
        num_args = 0..=1,
        default_value = "false",
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub require_key: bool,

    /// Request headers whose names contain `_` (CGI-style frameworks read `_` as
    /// `-`): `drop` them, `reject` the request (400 underscore-header), or
    /// `forward` them (never one that maps onto Idempotency-Key, the principal
    /// header, X-Forwarded-* or another header of ours).
    #[arg(
        long,
        env = "IDEMGATE_UNDERSCORE_HEADERS",
        value_enum,
        default_value_t = UnderscoreHeaders::Drop,
        value_name = "ACTION"
    )]
    pub underscore_headers: UnderscoreHeaders,

    /// X-HTTP-Method-Override, X-HTTP-Method, X-Method-Override where no route
    /// says: `refuse` (400 ambiguous-method) or `honour` (the request is that
    /// method: matched, covered and forwarded as it, the header removed).
    #[arg(
        long,
        env = "IDEMGATE_METHOD_OVERRIDE",
        value_enum,
        default_value_t = MethodOverride::Refuse,
        value_name = "ACTION"
    )]
    pub method_override: MethodOverride,

    /// Content on GET, HEAD and OPTIONS where no route says: `refuse` (400
    /// unexpected-body; an upstream that never reads it would parse it as the
    /// next request) or `forward` (for an upstream known to read it).
    #[arg(
        long,
        env = "IDEMGATE_SAFE_METHOD_BODY",
        value_enum,
        default_value_t = SafeMethodBodies::Refuse,
        value_name = "ACTION"
    )]
    pub safe_method_body: SafeMethodBodies,

    /// The longest pause in the upstream's response body (and between its head
    /// and first byte), in milliseconds; past it 504 upstream-timeout, settled
    /// like a timeout, the upstream connection closed. Default: the value of
    /// --upstream-timeout-ms. A route's `upstream_idle_timeout_ms` overrides it.
    #[arg(long, env = "IDEMGATE_UPSTREAM_IDLE_TIMEOUT_MS", value_name = "MS")]
    pub upstream_idle_timeout_ms: Option<u64>,

    /// The longest a whole upstream response may take, from sending the request
    /// to its last body byte, in milliseconds; past it as for a pause. Default:
    /// unbounded. A route's `upstream_response_timeout_ms` overrides it.
    #[arg(long, env = "IDEMGATE_UPSTREAM_RESPONSE_TIMEOUT_MS", value_name = "MS")]
    pub upstream_response_timeout_ms: Option<u64>,
}

impl GuardArgs {
    /// The path flags: which spellings are refused and how the others are read.
    pub fn path_policy(&self) -> PathPolicy {
        PathPolicy {
            encoded_slash: self.path_encoded_slash,
            encoded_dot_segment: self.path_encoded_dot_segment,
            path_parameters: self.path_parameters,
            control_or_non_ascii: self.path_control_or_non_ascii,
            above_root: self.path_above_root,
        }
    }
}

impl ProxyArgs {
    /// The default route: every route-overridable setting as the flags set it
    /// (`layer`, the record flags checked), which a route file's tables lay
    /// their overrides over. A timeout given must be at least 1 ms.
    pub fn policy(&self, layer: &LayerSettings) -> Result<Policy, ConfigError> {
        let millis = |value: Option<u64>, flag, env| match value {
            Some(0) => Err(ConfigError::new(flag, env, "must be at least 1")),
            other => Ok(other.map(Duration::from_millis)),
        };
        let guard = &self.guard;
        let mut policy = Policy::default();
        policy.require_key = guard.require_key;
        policy.ttl = layer.ttl;
        policy.lease = layer.lease;
        policy.wait = layer.wait.unwrap_or_default();
        policy.problem_shape = layer.problem_style.shape();
        policy.replay_set_cookie = self.layer.replay_set_cookie;
        policy.observe_responses = self.observe_responses;
        policy.case_insensitive = guard.case_insensitive_paths;
        policy.method_override = guard.method_override;
        policy.safe_method_bodies = guard.safe_method_body;
        policy.upstream_idle_timeout = millis(
            guard.upstream_idle_timeout_ms,
            "--upstream-idle-timeout-ms",
            "IDEMGATE_UPSTREAM_IDLE_TIMEOUT_MS",
        )?;
        policy.upstream_response_timeout = millis(
            guard.upstream_response_timeout_ms,
            "--upstream-response-timeout-ms",
            "IDEMGATE_UPSTREAM_RESPONSE_TIMEOUT_MS",
        )?;
        Ok(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_limit_names_its_flag() {
        let args = ListenerArgs {
            header_read_timeout_ms: 0,
            body_read_timeout_ms: 1,
            idle_timeout_ms: 1,
            max_connections: 1,
        };
        let error = args.options().unwrap_err().to_string();
        assert!(error.contains("IDEMGATE_HEADER_READ_TIMEOUT_MS"), "{error}");
    }
}
