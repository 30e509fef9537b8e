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

use idemgate::Store;
use idemgate::audit::{AuditQuery, key_digest};
use idemgate::deadline::WithDeadline;

use super::operator::{self, FailureCodes, OperatorError};
use crate::audit::{EntryView, Filter, Verified, export, parse_time, verify};
use crate::cli::{AuditArgs, AuditCommand, AuditPrincipalArgs};

/// Exit code: the journal is not intact.
pub const EXIT_BROKEN: u8 = 1;
/// Exit code: bad flags.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the store could not be opened or read.
pub const EXIT_STORE_FAILED: u8 = 3;

/// Each store call's bound.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `idemgate audit …` and returns the process's exit code.
pub async fn main(args: AuditArgs) -> ExitCode {
    let codes = FailureCodes {
        usage: EXIT_USAGE,
        store_failed: EXIT_STORE_FAILED,
    };
    match execute(args).await {
        Ok(code) => ExitCode::from(code),
        Err(error) => error.exit("audit", &codes),
    }
}

async fn execute(args: AuditArgs) -> Result<u8, OperatorError> {
    match args.command {
        AuditCommand::Export {
            store,
            since,
            until,
            whose,
            key,
        } => {
            let time = |flag: &'static str, text: Option<String>| {
                text.map(|t| parse_time(&t).map_err(|reason| OperatorError::Usage(flag, reason)))
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
                return Err(OperatorError::Usage("stdout", error.to_string()));
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

/// The principal the flags name (the forms of `idemgate keys`), when one was.
fn principal(whose: &AuditPrincipalArgs) -> Result<Option<String>, OperatorError> {
    whose
        .principal_args()
        .map(|whose| operator::principal(&whose).map(|p| p.as_str().to_owned()))
        .transpose()
}

/// The store at `url`, as it is (no migration, no purge), each call bounded.
async fn open(url: &str) -> Result<Arc<dyn Store>, OperatorError> {
    let memory =
        "a `memory` journal lives inside the serving process; use its admin API (GET /v1/audit)";
    let store = operator::open_as_is(url, TIMEOUT, memory).await?;
    Ok(Arc::new(WithDeadline::new(store, TIMEOUT)))
}
