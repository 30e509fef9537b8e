//! What the operator commands (`idemgate keys`, `idemgate audit`) share: their
//! error, the principal their flags name, and the store they inspect as it is.
//! Each command keeps its own exit codes and its own words for a `memory` store.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderName;
use idemgate::{Principal, Store, StoreError};

use crate::cli::PrincipalArgs;
use crate::config::{ConfigError, RedisSafety, StoreUrl};
use crate::principal::{PrincipalSpec, principal_of};
use crate::store::{self, OpenError, Opening};

/// Why an operator command stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OperatorError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// A flag's value is unusable: the flag, and why.
    #[error("invalid {0}: {1}")]
    Usage(&'static str, String),
    #[error("cannot open the store: {0}")]
    Open(#[from] OpenError),
    #[error("{0}")]
    Store(#[from] StoreError),
}

/// A command's exit codes for its two kinds of failure.
pub(crate) struct FailureCodes {
    /// Bad flags.
    pub(crate) usage: u8,
    /// The store could not be opened or did not answer.
    pub(crate) store_failed: u8,
}

impl OperatorError {
    /// Prints `idemgate <command>: <error>[: <the store's cause>]` to stderr and
    /// returns the exit code `codes` give it.
    pub(crate) fn exit(&self, command: &str, codes: &FailureCodes) -> ExitCode {
        let code = match self {
            Self::Config(_) | Self::Usage(..) => codes.usage,
            Self::Open(_) | Self::Store(_) => codes.store_failed,
        };
        let cause = match self {
            Self::Store(store) => std::error::Error::source(store)
                .map(|cause| format!(": {cause}"))
                .unwrap_or_default(),
            _ => String::new(),
        };
        eprintln!("idemgate {command}: {self}{cause}");
        ExitCode::from(code)
    }
}

/// Which principal the flags name.
pub(crate) fn principal_spec(whose: &PrincipalArgs) -> Result<PrincipalSpec, OperatorError> {
    if let Some(principal) = &whose.principal {
        return Ok(PrincipalSpec::Raw(principal.clone()));
    }
    if let Some(value) = &whose.authorization {
        let secret = whose.secret.read()?;
        if secret.is_empty() {
            return Err(OperatorError::Usage(
                "--authorization",
                "needs the proxy's principal secret: set IDEMGATE_PRINCIPAL_SECRET or --principal-secret-file PATH".to_owned(),
            ));
        }
        return Ok(PrincipalSpec::Authorization {
            value: value.clone(),
            secret,
        });
    }
    if let Some(token) = &whose.bearer {
        return Ok(PrincipalSpec::Bearer(token.clone()));
    }
    let header = whose.principal_header.as_deref().unwrap_or_default();
    let invalid = |reason: &str| OperatorError::Usage("--principal-header", reason.to_owned());
    let (name, value) = header
        .split_once(':')
        .ok_or_else(|| invalid("expected `NAME: VALUE`"))?;
    let name =
        HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| invalid("not a header name"))?;
    Ok(PrincipalSpec::Header(name, value.trim().to_owned()))
}

/// The principal the flags name, made by the layer's own code.
pub(crate) fn principal(whose: &PrincipalArgs) -> Result<Principal, OperatorError> {
    principal_of(&principal_spec(whose)?)
        .map_err(|error| OperatorError::Usage("principal", error.to_string()))
}

/// The store at `url`, as it is: no migration (a store that was never set up
/// answers `Misconfigured`) and no purge task; a SQLite file must exist. A
/// `memory` store lives inside the serving process: refused with `in_memory`,
/// which names where to look instead.
pub(crate) async fn open_as_is(
    url: &str,
    timeout: Duration,
    in_memory: &str,
) -> Result<Arc<dyn Store>, OperatorError> {
    let url = url
        .parse::<StoreUrl>()
        .map_err(|reason| OperatorError::Usage("--store", reason))?;
    if url == StoreUrl::Memory {
        return Err(OperatorError::Usage("--store", in_memory.to_owned()));
    }
    let opened = store::open(&url, Opening::Inspect, timeout, RedisSafety::default()).await?;
    Ok(opened.store)
}
