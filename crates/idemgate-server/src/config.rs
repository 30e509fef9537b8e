//! Checked values that several parts of the binary share: what the command line
//! turns text into, and what the subcommands and services take. A leaf: it
//! imports nothing from this crate, so anything may import it.

use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use idemgate::ReplayedHeaders;
use idemgate::cache::ReplayCacheConfig;
use idemgate::problem::ProblemStyle;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

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
    /// The error for `flag` (and its variable `env`).
    pub fn new(flag: &'static str, env: &'static str, reason: impl Into<String>) -> Self {
        Self {
            flag,
            env,
            reason: reason.into(),
        }
    }
}

/// Where log lines go and how they look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Pretty,
    /// One JSON object per line.
    Json,
}

/// Where logs and spans go.
#[derive(Debug, Clone, Copy)]
pub struct TelemetrySettings {
    /// Human or JSON log lines on stderr.
    pub log_format: LogFormat,
    /// Export spans over OTLP/HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub otlp: bool,
}

/// What a Redis idempotency store that persists nothing means for startup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RedisPersistence {
    /// Log a warning and start: a restart of Redis forgets completed keys.
    Warn,
    /// Refuse to start until Redis has AOF or snapshots.
    Refuse,
}

/// The safety checks of a `redis://` idempotency store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisSafety {
    /// What a Redis that persists nothing means for startup.
    pub persistence: RedisPersistence,
    /// Replicas each claim, completion and renewal waits for (`WAIT`); 0: none.
    pub wait_replicas: u32,
}

impl Default for RedisSafety {
    /// Warn about a Redis that persists nothing; wait for no replica.
    fn default() -> Self {
        Self {
            persistence: RedisPersistence::Warn,
            wait_replicas: 0,
        }
    }
}

/// Where idempotency records live: one syntax for every subcommand that names a
/// store (`proxy --idempotency-store`, `keys --store`, `serve
/// --idempotency-store` beside its `database` mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// Process memory (`memory`).
    Memory,
    /// A SQLite file (`sqlite://PATH`, the whole URL kept).
    Sqlite(String),
    /// A PostgreSQL server (`postgres://…` or `postgresql://…`).
    Postgres(String),
    /// A Redis server or cluster (`redis://…` or `rediss://…`).
    Redis(String),
}

impl StoreUrl {
    /// `memory`, `sqlite`, `postgres` or `redis`, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
            Self::Redis(_) => "redis",
        }
    }
}

impl std::str::FromStr for StoreUrl {
    type Err = String;

    /// `sqlite://PATH`, `postgres://…`, `redis://…` or `memory`; anything else is
    /// refused with the list of what is accepted.
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

/// Where the orders service keeps its orders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// A SQLite file.
    Sqlite(String),
    /// A PostgreSQL server.
    Postgres(String),
}

/// How the idempotency layer runs, from the flags every serving subcommand shares:
/// record timing and the replay cache in front of the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSettings {
    /// Record TTL.
    pub ttl: Duration,
    /// Lease length.
    pub lease: Duration,
    /// Wait-mode bound; `None` answers 409 at once.
    pub wait: Option<Duration>,
    /// Bound on one store operation, statement or connection checkout.
    pub store_timeout: Duration,
    /// The replay cache as the flags ask for it ([`ReplayCacheSettings::for_store`]).
    pub replay_cache: ReplayCacheSettings,
    /// How problems are sent: type base, `Link`, body shape.
    pub problem_style: ProblemStyle,
    /// Which response headers replays repeat.
    pub replayed_headers: ReplayedHeaders,
    /// The journal (`--audit`, `--audit-retention`).
    pub audit: AuditSettings,
}

/// The replay cache as the flags ask for it; unset, the store decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayCacheSettings {
    /// `--replay-cache-entries` unset: this cache in front of a store in
    /// another process, none in front of the memory store.
    Default(ReplayCacheConfig),
    /// `--replay-cache-entries` set: this cache (`None` for 0) whatever the store.
    Given(Option<ReplayCacheConfig>),
}

impl ReplayCacheSettings {
    /// The cache to put in front of the store. The memory store keeps every
    /// record in this process already and answers a replay without a round
    /// trip: a cache in front of it saves nothing, and costs a second copy of
    /// each answer and, measured through the proxy, 2–8 µs of CPU per new key.
    pub fn for_store(self, memory: bool) -> Option<ReplayCacheConfig> {
        match self {
            Self::Default(_) if memory => None,
            Self::Default(config) => Some(config),
            Self::Given(config) => config,
        }
    }
}

/// The journal's settings (`docs/audit.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditSettings {
    /// `--audit`; `None`: the store's default.
    pub requested: Option<bool>,
    /// `--audit-retention`.
    pub retention: Duration,
}

impl AuditSettings {
    /// Whether the journal is on: as `--audit` says, else on for every store
    /// but memory (whose journal would die with the process).
    pub fn enabled(&self, memory_store: bool) -> bool {
        self.requested.unwrap_or(!memory_store)
    }
}

/// The bearer token of the admin key API, kept as its SHA-256 so that comparing a
/// presented token takes the same time whatever its length or content.
#[derive(Clone)]
pub struct AdminToken(Arc<[u8; 32]>);

impl AdminToken {
    /// The token from `IDEMGATE_ADMIN_TOKEN`; `None` (the key API off) when it is
    /// unset or empty.
    pub fn new(token: Option<&str>) -> Option<Self> {
        token
            .filter(|token| !token.is_empty())
            .map(|token| Self(Arc::new(Sha256::digest(token.as_bytes()).into())))
    }

    /// Whether `presented` is the token, compared in constant time.
    pub fn admits(&self, presented: &[u8]) -> bool {
        let presented: [u8; 32] = Sha256::digest(presented).into();
        presented.ct_eq(&*self.0).into()
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_admits_only_itself_and_none_means_off() {
        let token = AdminToken::new(Some("s3cret")).expect("a token");
        assert!(token.admits(b"s3cret"));
        assert!(!token.admits(b"s3cre"));
        assert!(!token.admits(b"s3crett"));
        assert!(!token.admits(b""));
        assert!(AdminToken::new(None).is_none());
        assert!(AdminToken::new(Some("")).is_none(), "an empty token is off");
        assert!(!format!("{token:?}").contains("s3cret"));
    }
}
