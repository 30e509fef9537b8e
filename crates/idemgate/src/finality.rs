//! Which results are stored, which are released, which are undone (PROTOCOL §8).

use axum::response::{IntoResponseParts, ResponseParts};
use http::StatusCode;

use idemgate_core::FinalStatus;

/// A handler's say on what happens to the record after its response, put in the
/// response extensions. Without it, the status decides (see [`ServerErrorPolicy`]).
///
/// Exhaustive on purpose: the layer must act on every mark, and a new one would
/// change what handlers can ask for.
///
/// With axum, return it beside the response:
///
/// ```
/// use axum::{http::StatusCode, response::IntoResponse};
/// use idemgate::Finality;
///
/// async fn create_order() -> impl IntoResponse {
///     // Validation failed before anything happened: let the client fix the body
///     // and reuse the key.
///     (Finality::Rejected, StatusCode::BAD_REQUEST)
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finality {
    /// Store and replay this response, whatever its status (a 5xx is stored as
    /// `FAILED`).
    Final,
    /// The operation had no effect and may run again (a gateway refusal known to
    /// have charged nothing, a call that carried the propagated key): release the
    /// record, keeping its operation id.
    Retryable,
    /// Rejected before the operation started (malformed body, failed validation):
    /// delete the record, so the client can correct the body and reuse the key.
    Rejected,
}

impl IntoResponseParts for Finality {
    type Error = std::convert::Infallible;

    fn into_response_parts(self, mut res: ResponseParts) -> Result<ResponseParts, Self::Error> {
        res.extensions_mut().insert(self);
        Ok(res)
    }
}

/// What to do with a 5xx (or a panic) the handler did not mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ServerErrorPolicy {
    /// Store it as `FAILED` and replay it: the outcome is not known to be rolled
    /// back, so running again could do it twice (the seeds' rule). The default.
    #[default]
    Store,
    /// Release the record so a retry runs again. Only right when every handler's
    /// 5xx is known to leave no effect.
    Release,
}

/// What the layer does with the record once the handler answered (PROTOCOL §8).
/// Exhaustive: whatever settles a record (the layer, the model of
/// `crates/idemgate-model`) must handle every case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Store the response with this status.
    Complete(FinalStatus),
    /// Release the record.
    Release,
    /// Delete the record.
    Delete,
}

/// The rules of PROTOCOL §8, in order: the handler's mark; 408 and 429 released;
/// other 2xx–4xx final; 5xx released when the effects are known undone (the
/// transaction rolled back), else by policy. Public so the protocol's model runs
/// this rule rather than a copy of it.
///
/// ```
/// use http::StatusCode;
/// use idemgate::finality::{Settlement, settlement_for};
/// use idemgate::{Finality, ServerErrorPolicy};
///
/// let store = ServerErrorPolicy::Store;
/// assert!(matches!(settlement_for(StatusCode::CREATED, None, store, false), Settlement::Complete(_)));
/// assert_eq!(settlement_for(StatusCode::BAD_GATEWAY, Some(Finality::Retryable), store, false), Settlement::Release);
/// ```
#[must_use]
pub fn settlement_for(
    status: StatusCode,
    mark: Option<Finality>,
    policy: ServerErrorPolicy,
    effects_rolled_back: bool,
) -> Settlement {
    let failed_or_completed = if status.is_server_error() {
        FinalStatus::Failed
    } else {
        FinalStatus::Completed
    };
    match mark {
        Some(Finality::Final) => return Settlement::Complete(failed_or_completed),
        Some(Finality::Retryable) => return Settlement::Release,
        Some(Finality::Rejected) => return Settlement::Delete,
        None => {}
    }
    if status == StatusCode::REQUEST_TIMEOUT || status == StatusCode::TOO_MANY_REQUESTS {
        return Settlement::Release;
    }
    if !status.is_server_error() {
        return Settlement::Complete(FinalStatus::Completed);
    }
    if effects_rolled_back {
        return Settlement::Release;
    }
    match policy {
        ServerErrorPolicy::Store => Settlement::Complete(FinalStatus::Failed),
        ServerErrorPolicy::Release => Settlement::Release,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STORE: ServerErrorPolicy = ServerErrorPolicy::Store;

    #[test]
    fn success_and_client_errors_are_final() {
        for status in [200, 201, 204, 302, 400, 402, 404, 409, 422] {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(
                settlement_for(status, None, STORE, false),
                Settlement::Complete(FinalStatus::Completed),
                "{status}"
            );
        }
    }

    #[test]
    fn timeouts_and_rate_limits_are_released() {
        assert_eq!(
            settlement_for(StatusCode::REQUEST_TIMEOUT, None, STORE, false),
            Settlement::Release
        );
        assert_eq!(
            settlement_for(StatusCode::TOO_MANY_REQUESTS, None, STORE, false),
            Settlement::Release
        );
    }

    #[test]
    fn server_errors_follow_the_policy_unless_rolled_back() {
        let s = StatusCode::BAD_GATEWAY;
        assert_eq!(
            settlement_for(s, None, STORE, false),
            Settlement::Complete(FinalStatus::Failed)
        );
        assert_eq!(
            settlement_for(s, None, ServerErrorPolicy::Release, false),
            Settlement::Release
        );
        assert_eq!(settlement_for(s, None, STORE, true), Settlement::Release);
    }

    #[test]
    fn the_handler_mark_wins() {
        let s = StatusCode::BAD_GATEWAY;
        assert_eq!(
            settlement_for(s, Some(Finality::Retryable), STORE, false),
            Settlement::Release
        );
        assert_eq!(
            settlement_for(s, Some(Finality::Final), ServerErrorPolicy::Release, true),
            Settlement::Complete(FinalStatus::Failed)
        );
        assert_eq!(
            settlement_for(
                StatusCode::BAD_REQUEST,
                Some(Finality::Rejected),
                STORE,
                false
            ),
            Settlement::Delete
        );
        assert_eq!(
            settlement_for(
                StatusCode::TOO_MANY_REQUESTS,
                Some(Finality::Final),
                STORE,
                false
            ),
            Settlement::Complete(FinalStatus::Completed)
        );
    }
}
