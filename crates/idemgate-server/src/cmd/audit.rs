//! `idemgate audit export|verify`: the journal (`docs/audit.md`), straight on
//! the store (`--store`, the URL syntax of `keys`).
//!
//! `export` prints JSON Lines ([`EntryView`]), oldest first. `verify` recomputes
//! every hash and link: exit 0 and each partition's head on stdout (a line to
//! anchor elsewhere) when intact, exit 1 and the first broken entry on stderr
//! when not. Exit 2: bad flags; 3: the store could not be read.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderName;
use idemgate::audit::{AuditQuery, key_digest};
use idemgate::deadline::WithDeadline;
use idemgate::{Store, StoreError};

use crate::audit::{EntryView, Filter, Verified, export, parse_time, verify};
use crate::cli::{AuditArgs, AuditCommand, AuditPrincipalArgs};
use crate::config::{ConfigError, RedisSafety, StoreUrl};
use crate::principal::{PrincipalSpec, principal_of};
use crate::store::{self, OpenError, Opening};

/// Exit code: the journal is not intact.
pub const EXIT_BROKEN: u8 = 1;
/// Exit code: bad flags.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the store could not be opened or read.
pub const EXIT_STORE_FAILED: u8 = 3;

/// Each store call's bound.
const TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
enum AuditError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("invalid {0}: {1}")]
    Usage(&'static str, String),
    #[error("cannot open the store: {0}")]
    Open(#[from] OpenError),
    #[error("{0}")]
    Store(#[from] StoreError),
}

/// Runs `idemgate audit …` and returns the process's exit code.
pub async fn main(args: AuditArgs) -> ExitCode {
    match execute(args).await {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            let code = match &error {
                AuditError::Config(_) | AuditError::Usage(..) => EXIT_USAGE,
                AuditError::Open(_) | AuditError::Store(_) => EXIT_STORE_FAILED,
            };
            let cause = match &error {
                AuditError::Store(store) => std::error::Error::source(store)
                    .map(|cause| format!(": {cause}"))
                    .unwrap_or_default(),
                _ => String::new(),
            };
            eprintln!("idemgate audit: {error}{cause}");
            ExitCode::from(code)
        }
    }
}

async fn execute(args: AuditArgs) -> Result<u8, AuditError> {
    match args.command {
        AuditCommand::Export {
            store,
            since,
            until,
            whose,
            key,
        } => {
            let time = |flag: &'static str, text: Option<String>| {
                text.map(|t| parse_time(&t).map_err(|reason| AuditError::Usage(flag, reason)))
                    .transpose()
            };
            let range = AuditQuery {
                since: time("--since", since)?,
                until: time("--until", until)?,
                after: None,
                limit: crate::audit::PAGE,
            };
            let principal = principal(&whose)?;
            let store = open(&store).await?;
            let key_digest = match key {
                Some(key) => Some(key_digest(&store.audit_secret().await?, &key)),
                None => None,
            };
            let filter = Filter {
                principal,
                key_digest,
            };
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let mut failed = None;
            export(store.as_ref(), range, &filter, |entry| {
                if failed.is_none()
                    && let Err(error) = out.write_all(EntryView::line(entry).as_bytes())
                {
                    failed = Some(error);
                }
            })
            .await?;
            if let Some(error) = failed.or_else(|| out.flush().err()) {
                return Err(AuditError::Usage("stdout", error.to_string()));
            }
            Ok(0)
        }
        AuditCommand::Verify { store } => {
            let store = open(&store).await?;
            match verify(store.as_ref()).await? {
                Verified::Intact { entries, heads } => {
                    println!("journal intact: {entries} entries");
                    for (instance, head) in heads {
                        println!("head {instance} {head}");
                    }
                    Ok(0)
                }
                Verified::Broken(found) => {
                    eprintln!("idemgate audit: journal broken: {found}");
                    Ok(EXIT_BROKEN)
                }
            }
        }
    }
}

/// The principal the flags name (the forms of `idemgate keys`), made by the
/// layer's own code.
fn principal(whose: &AuditPrincipalArgs) -> Result<Option<String>, AuditError> {
    let Some(whose) = whose.principal_args() else {
        return Ok(None);
    };
    let spec = if let Some(principal) = whose.principal {
        PrincipalSpec::Raw(principal)
    } else if let Some(value) = whose.authorization {
        let secret = whose.secret.read()?;
        if secret.is_empty() {
            return Err(AuditError::Usage(
                "--authorization",
                "needs the proxy's principal secret: set IDEMGATE_PRINCIPAL_SECRET or --principal-secret-file PATH".to_owned(),
            ));
        }
        PrincipalSpec::Authorization { value, secret }
    } else if let Some(token) = whose.bearer {
        PrincipalSpec::Bearer(token)
    } else {
        let header = whose.principal_header.unwrap_or_default();
        let invalid = |reason: &str| AuditError::Usage("--principal-header", reason.to_owned());
        let (name, value) = header
            .split_once(':')
            .ok_or_else(|| invalid("expected `NAME: VALUE`"))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| invalid("not a header name"))?;
        PrincipalSpec::Header(name, value.trim().to_owned())
    };
    principal_of(&spec)
        .map(|p| Some(p.as_str().to_owned()))
        .map_err(|error| AuditError::Usage("principal", error.to_string()))
}

/// The store at `url`, as it is (no migration, no purge), each call bounded.
async fn open(url: &str) -> Result<Arc<dyn Store>, AuditError> {
    let url = url
        .parse::<StoreUrl>()
        .map_err(|reason| AuditError::Usage("--store", reason))?;
    if url == StoreUrl::Memory {
        return Err(AuditError::Usage(
            "--store",
            "a `memory` journal lives inside the serving process; use its admin API (GET /v1/audit)".to_owned(),
        ));
    }
    let opened = store::open(&url, Opening::Inspect, TIMEOUT, RedisSafety::default()).await?;
    Ok(Arc::new(WithDeadline::new(opened.store, TIMEOUT)))
}
