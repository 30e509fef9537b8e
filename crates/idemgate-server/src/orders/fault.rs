//! A fault the test suites inject between an edit's write and its answer —
//! **for tests only**, never set in production.
//!
//! `IDEMGATE_TEST_FAULT_AFTER_EDIT` (read once when `serve` starts):
//!
//! - `stall`: once an edit (`PATCH`/`DELETE` of an order) has written —
//!   committed, unless it runs in the idempotency layer's transaction, which
//!   commits with the record — the handler waits forever, so its record never
//!   completes. The fault suite then kills the process (`kill -9`): a crash
//!   between the commit and the completion, every time, instead of by chance.
//! - `fail`: the handler answers `503 database-unavailable` (retryable) after
//!   the write, as when a commit's acknowledgement is lost: the layer releases
//!   the record (rolling back its transaction, if it lent one) and the retry
//!   runs the operation again in the same process — the in-process way to the
//!   same question with a store that forgets everything when killed (memory).
//!
//! Unset, empty or `none`: no fault. Anything else stops `serve` at startup.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use idemgate::{Finality, ProblemDetails};

/// The variable that sets it.
pub const VARIABLE: &str = "IDEMGATE_TEST_FAULT_AFTER_EDIT";

/// What happens after an edit's write (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EditFault {
    /// Wait forever.
    Stall,
    /// Answer a retryable 503.
    Fail,
}

impl EditFault {
    /// Parses the variable's value; `None` for no fault.
    pub fn parse(value: &str) -> Result<Option<Self>, String> {
        match value {
            "" | "none" => Ok(None),
            "stall" => Ok(Some(Self::Stall)),
            "fail" => Ok(Some(Self::Fail)),
            other => Err(format!(
                "a test-only fault: expected stall, fail or none, got {other:?}"
            )),
        }
    }

    /// From [`VARIABLE`] in the environment.
    pub fn from_env() -> Result<Option<Self>, String> {
        match std::env::var(VARIABLE) {
            Ok(value) => Self::parse(&value),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err("not UTF-8".to_owned()),
        }
    }

    /// Runs the fault once the edit has written: never returns for
    /// [`EditFault::Stall`], the answer to send for [`EditFault::Fail`].
    pub(crate) async fn strike(fault: Option<Self>) -> Option<Response> {
        match fault? {
            Self::Stall => {
                tracing::warn!(
                    "{VARIABLE}=stall: the edit has written; stalling before its answer"
                );
                loop {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
            }
            Self::Fail => {
                tracing::warn!("{VARIABLE}=fail: the edit has written; answering 503");
                let problem = ProblemDetails::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "database-unavailable",
                    "Database unavailable",
                    "the orders database could not be reached",
                );
                Some((Finality::Retryable, problem).into_response())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_settings_and_refuses_others() {
        assert_eq!(EditFault::parse(""), Ok(None));
        assert_eq!(EditFault::parse("none"), Ok(None));
        assert_eq!(EditFault::parse("stall"), Ok(Some(EditFault::Stall)));
        assert_eq!(EditFault::parse("fail"), Ok(Some(EditFault::Fail)));
        assert!(EditFault::parse("Stall").is_err());
    }
}
