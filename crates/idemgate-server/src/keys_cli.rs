//! `idemgate keys show|evict|principal`: an operator's look at one key, straight
//! on the store (`--store`, the same URL syntax as the proxy's
//! `--idempotency-store`), and the principal string a credential maps to.
//!
//! JSON goes to stdout ([`KeyView`], [`EvictionView`]), errors to stderr. Exit
//! codes: 0 shown or evicted, 1 the store failed, 2 bad flags, 3 no record under
//! the key, 4 eviction refused (a live `PROCESSING` record; `--force` overrides).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderName;
use clap::{ArgGroup, Subcommand};
use idemgate::deadline::WithDeadline;
use idemgate::scope::Identity;
use idemgate::{EvictMode, Eviction, Principal, Store, StoreError};

use crate::cli::{ConfigError, RedisPersistence};
use crate::keys::{EvictionView, KeyQuery, KeyView, PrincipalSpec, principal_of};
use crate::proxy::{PrincipalSecretArgs, ProxyStore};
use crate::repository::{connect_postgres, connect_sqlite};
use crate::stores;

/// Exit code: the store failed (unreachable, misconfigured, corrupt record).
pub const EXIT_STORE_FAILED: u8 = 1;
/// Exit code: bad flags.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: no live record under the key.
pub const EXIT_ABSENT: u8 = 3;
/// Exit code: eviction refused, a request may still hold the key.
pub const EXIT_REFUSED: u8 = 4;

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

impl PrincipalArgs {
    /// Which principal the flags name.
    fn spec(&self) -> Result<PrincipalSpec, KeysError> {
        if let Some(principal) = &self.principal {
            return Ok(PrincipalSpec::Raw(principal.clone()));
        }
        if let Some(value) = &self.authorization {
            let secret = self.secret.read()?;
            if secret.is_empty() {
                return Err(KeysError::Usage(
                    "--authorization",
                    "needs the proxy's principal secret: set IDEMGATE_PRINCIPAL_SECRET or --principal-secret-file PATH".to_owned(),
                ));
            }
            return Ok(PrincipalSpec::Authorization {
                value: value.clone(),
                secret,
            });
        }
        if let Some(token) = &self.bearer {
            return Ok(PrincipalSpec::Bearer(token.clone()));
        }
        let header = self.principal_header.as_deref().unwrap_or_default();
        let invalid = |reason: &str| KeysError::Usage("--principal-header", reason.to_owned());
        let (name, value) = header
            .split_once(':')
            .ok_or_else(|| invalid("expected `NAME: VALUE`"))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| invalid("not a header name"))?;
        Ok(PrincipalSpec::Header(name, value.trim().to_owned()))
    }

    /// The principal the flags name, made by the layer's own code.
    fn principal(&self) -> Result<Principal, KeysError> {
        principal_of(&self.spec()?)
            .map_err(|error| KeysError::Usage("principal", error.to_string()))
    }
}

impl KeyTarget {
    /// The identity the flags name.
    fn identity(&self) -> Result<Identity, KeysError> {
        KeyQuery {
            principal: self.whose.principal()?,
            method: self.method.clone(),
            path: self.path.clone(),
            key: self.key.clone(),
        }
        .identity()
        .map_err(|error| KeysError::Usage("--method/--path/--key", error.to_string()))
    }

    fn store_timeout(&self) -> Result<Duration, KeysError> {
        if self.store_timeout_ms == 0 {
            return Err(KeysError::Usage(
                "--store-timeout-ms",
                "must be at least 1".to_owned(),
            ));
        }
        Ok(Duration::from_millis(self.store_timeout_ms))
    }
}

/// Why the store could not be opened or did not answer.
#[derive(Debug, thiserror::Error)]
enum KeysError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("invalid {0}: {1}")]
    Usage(&'static str, String),
    #[error("cannot open the store: {0}")]
    Open(String),
    #[error("{0}")]
    Store(#[from] StoreError),
}

/// Runs `idemgate keys …` and returns the process's exit code.
pub async fn run(args: KeysArgs) -> ExitCode {
    match execute(args).await {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            let code = match &error {
                KeysError::Config(_) | KeysError::Usage(..) => EXIT_USAGE,
                KeysError::Open(_) | KeysError::Store(_) => EXIT_STORE_FAILED,
            };
            let cause = match &error {
                KeysError::Store(store) => std::error::Error::source(store)
                    .map(|cause| format!(": {cause}"))
                    .unwrap_or_default(),
                _ => String::new(),
            };
            eprintln!("idemgate keys: {error}{cause}");
            ExitCode::from(code)
        }
    }
}

async fn execute(args: KeysArgs) -> Result<u8, KeysError> {
    let (target, action) = match args.command {
        KeysCommand::Show { target, body } => (target, Action::Show { body }),
        KeysCommand::Evict { target, force } => (target, Action::Evict { force }),
        KeysCommand::Principal { whose } => {
            let principal = whose.principal()?;
            print_json(&serde_json::json!({ "principal": principal.as_str() }));
            return Ok(0);
        }
    };
    let identity = target.identity()?;
    let timeout = target.store_timeout()?;
    let store = WithDeadline::new(open(&target.store, timeout).await?, timeout);
    match action {
        Action::Show { body } => match store.get(identity.digest()).await? {
            Some(snapshot) => {
                print_json(&KeyView::of(&identity, &snapshot, body));
                Ok(0)
            }
            None => {
                eprintln!(
                    "idemgate keys: no live record under this key (never used, expired or evicted)"
                );
                Ok(EXIT_ABSENT)
            }
        },
        Action::Evict { force } => {
            let mode = if force {
                EvictMode::Force
            } else {
                EvictMode::UnlessRunning
            };
            let eviction = store.evict(identity.digest(), mode).await?;
            print_json(&EvictionView::of(&identity, eviction));
            Ok(match eviction {
                Eviction::Evicted { .. } => 0,
                Eviction::Absent => EXIT_ABSENT,
                Eviction::RefusedLiveLease { .. } => EXIT_REFUSED,
            })
        }
    }
}

enum Action {
    Show { body: bool },
    Evict { force: bool },
}

fn print_json(value: &impl serde::Serialize) {
    match serde_json::to_string_pretty(value) {
        Ok(json) => println!("{json}"),
        Err(error) => eprintln!("idemgate keys: cannot render JSON: {error}"),
    }
}

/// The store at `url`, as it is: no migration (a store that was never set up
/// answers `Misconfigured`) and no purge task; a SQLite file must exist.
async fn open(url: &str, timeout: Duration) -> Result<Arc<dyn Store>, KeysError> {
    let store = url
        .parse::<ProxyStore>()
        .map_err(|reason| KeysError::Usage("--store", reason))?;
    let open_failed = |error: &dyn std::fmt::Display| KeysError::Open(error.to_string());
    Ok(match store {
        ProxyStore::Memory => {
            return Err(KeysError::Usage(
                "--store",
                "`memory` records live inside the serving process; use its admin API (GET/DELETE /v1/keys)".to_owned(),
            ));
        }
        ProxyStore::Sqlite(url) => {
            let path = url
                .trim_start_matches("sqlite://")
                .trim_start_matches("sqlite:");
            if !std::path::Path::new(path).exists() {
                return Err(KeysError::Open(format!("no SQLite file at {path}")));
            }
            let pool = connect_sqlite(&url, timeout)
                .await
                .map_err(|e| open_failed(&e))?;
            Arc::new(idemgate_sqlite::SqliteStore::new(pool))
        }
        ProxyStore::Postgres(url) => {
            let pool = connect_postgres(&url, timeout)
                .await
                .map_err(|e| open_failed(&e))?;
            Arc::new(idemgate_postgres::PostgresStore::new(pool))
        }
        ProxyStore::Redis(url) => Arc::new(
            stores::redis(&url, timeout, RedisPersistence::Warn, 0)
                .await
                .map_err(|e| open_failed(&e))?,
        ),
    })
}
