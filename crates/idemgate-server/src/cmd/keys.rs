//! `idemgate keys show|evict|principal`: an operator's look at one key, straight
//! on the store (`--store`, the same URL syntax as the proxy's
//! `--idempotency-store`), and the principal string a credential maps to.
//!
//! JSON goes to stdout ([`KeyView`], [`EvictionView`]), errors to stderr. Exit
//! codes: 0 shown or evicted, 1 the store failed, 2 bad flags, 3 no record under
//! the key, 4 eviction refused (a live `PROCESSING` record; `--force` overrides).

use std::process::ExitCode;
use std::time::Duration;

use idemgate::deadline::WithDeadline;
use idemgate::scope::Identity;
use idemgate::{EvictMode, Eviction, Principal, Store};

use super::operator::{FailureCodes, OperatorError, open_as_is, principal, principal_spec};
use crate::cli::{KeyTarget, KeysArgs, KeysCommand};
use crate::inspect::{EvictionView, KeyQuery, KeyView};
use crate::principal::PrincipalSpec;

/// Exit code: the store failed (unreachable, misconfigured, corrupt record).
pub const EXIT_STORE_FAILED: u8 = 1;
/// Exit code: bad flags.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: no live record under the key.
pub const EXIT_ABSENT: u8 = 3;
/// Exit code: eviction refused, a request may still hold the key.
pub const EXIT_REFUSED: u8 = 4;

/// What to tell an operator whose lookup found nothing: which principal mode
/// the flags used and the principal it made, and why a record written under
/// another mode cannot be found with it. The usual miss is `--bearer` on a
/// proxy's records: the proxy scopes keys by an HMAC of the whole
/// `Authorization` value, which only `--authorization` (with its secret) makes.
fn absent_hint(spec: &PrincipalSpec, principal: &Principal) -> String {
    let looked_up = principal.as_str();
    let mode = match spec {
        PrincipalSpec::Bearer(_) => {
            "--bearer: the principal `idemgate serve`'s orders API stores (the token's SHA-256). \
             Records made through `idemgate proxy --principal authorization` (its default) are \
             keyed by an HMAC-SHA256 of the whole Authorization value under the proxy's secret: \
             look them up with --authorization 'Bearer TOKEN' and that secret \
             (IDEMGATE_PRINCIPAL_SECRET or --principal-secret-file)"
        }
        PrincipalSpec::Authorization { .. } => {
            "--authorization: a proxy with --principal authorization, whose principal is an \
             HMAC-SHA256 of the whole Authorization value under the secret given here; \
             another secret, another spelling of the value (`Bearer` and the token exactly \
             as the client sent them), or a proxy with --principal header:NAME or jwt makes \
             another principal, and `idemgate serve`'s records take --bearer"
        }
        PrincipalSpec::Header(..) => {
            "--principal-header: a proxy with --principal header:NAME, which stores the \
             header's name and value as sent; `idemgate serve`'s records take --bearer, a \
             proxy with --principal authorization takes --authorization"
        }
        PrincipalSpec::Raw(_) => {
            "--principal: the principal string exactly as given (see `idemgate keys principal` \
             or the admin API for the one a credential makes)"
        }
    };
    format!("looked up principal {looked_up} from {mode}")
}

/// The identity the flags name.
fn identity(target: &KeyTarget) -> Result<Identity, OperatorError> {
    KeyQuery {
        principal: principal(&target.whose)?,
        method: target.method.clone(),
        path: target.path.clone(),
        key: target.key.clone(),
    }
    .identity()
    .map_err(|error| OperatorError::Usage("--method/--path/--key", error.to_string()))
}

fn store_timeout(target: &KeyTarget) -> Result<Duration, OperatorError> {
    if target.store_timeout_ms == 0 {
        return Err(OperatorError::Usage(
            "--store-timeout-ms",
            "must be at least 1".to_owned(),
        ));
    }
    Ok(Duration::from_millis(target.store_timeout_ms))
}

/// Runs `idemgate keys …` and returns the process's exit code.
pub async fn main(args: KeysArgs) -> ExitCode {
    let codes = FailureCodes {
        usage: EXIT_USAGE,
        store_failed: EXIT_STORE_FAILED,
    };
    match execute(args).await {
        Ok(code) => ExitCode::from(code),
        Err(error) => error.exit("keys", &codes),
    }
}

async fn execute(args: KeysArgs) -> Result<u8, OperatorError> {
    let (target, action) = match args.command {
        KeysCommand::Show { target, body } => (target, Action::Show { body }),
        KeysCommand::Evict { target, force } => (target, Action::Evict { force }),
        KeysCommand::Principal { whose } => {
            let principal = principal(&whose)?;
            print_json(&serde_json::json!({ "principal": principal.as_str() }));
            return Ok(0);
        }
    };
    let spec = principal_spec(&target.whose)?;
    let identity = identity(&target)?;
    let timeout = store_timeout(&target)?;
    let memory =
        "`memory` records live inside the serving process; use its admin API (GET/DELETE /v1/keys)";
    let store = WithDeadline::new(open_as_is(&target.store, timeout, memory).await?, timeout);
    match action {
        Action::Show { body } => match store.get(identity.digest()).await? {
            Some(snapshot) => {
                print_json(&KeyView::of(&identity, &snapshot, body));
                Ok(0)
            }
            None => {
                eprintln!(
                    "idemgate keys: no live record under this key (never used, expired, evicted, or written under another principal)"
                );
                eprintln!(
                    "idemgate keys: {}",
                    absent_hint(&spec, &identity.scope().principal)
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
            if matches!(eviction, Eviction::Evicted { .. }) {
                // The eviction is itself journalled (docs/audit.md), in the
                // operator tool's own partition.
                let instance = format!("keys@{}", crate::audit::instance_name());
                if let Err(error) =
                    crate::audit::journal_eviction(&store, &identity, instance).await
                {
                    eprintln!(
                        "idemgate keys: the key was evicted, but the journal did not take its entry: {error}"
                    );
                }
            }
            print_json(&EvictionView::of(&identity, eviction));
            if eviction == Eviction::Absent {
                eprintln!(
                    "idemgate keys: {}",
                    absent_hint(&spec, &identity.scope().principal)
                );
            }
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
