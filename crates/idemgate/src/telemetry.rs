//! Metrics (through the `metrics` facade) and outcome names (PROTOCOL §12).
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `idemgate_requests_total` | counter | `outcome` ([`Outcome::as_str`]) |
//! | `idemgate_store_seconds` | histogram | `op`: claim, complete, release, renew, delete, get, commit |
//! | `idemgate_store_errors_total` | counter | `op` |
//! | `idemgate_lease_takeovers_total` | counter | — |
//! | `idemgate_fenced_completions_total` | counter | — |
//! | `idemgate_not_retained_total` | counter | — |
//! | `idemgate_renewals_lost_total` | counter | — |
//! | `idemgate_in_flight` | gauge | — (this process's keyed operations running) |
//! | `idemgate_oldest_in_flight_seconds` | gauge | — (age of this process's oldest `PROCESSING` operation) |
//!
//! No metric carries a key, a principal or a path: their cardinality is unbounded.

use std::time::Instant;

/// How a request left the layer. New outcomes may be added: match with a `_` arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran under a claim.
    Executed,
    /// A stored response was replayed.
    Replayed,
    /// 409: the first request still runs.
    Conflict,
    /// 422: the key was used with another request.
    Mismatch,
    /// 400: malformed key.
    InvalidKey,
    /// 400: no key where one is required.
    MissingKey,
    /// 413.
    TooLarge,
    /// 401.
    Unauthenticated,
    /// 503: the store failed or is full; nothing ran.
    StoreUnavailable,
    /// 503: too many keyed requests in flight.
    Overloaded,
    /// No key (or a method the layer does not cover): passed through.
    PassedThrough,
    /// Anything else refused before a claim (an unreadable body, a corrupt record).
    Rejected,
}

impl Outcome {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::Conflict => "conflict",
            Self::Mismatch => "mismatch",
            Self::InvalidKey => "invalid_key",
            Self::MissingKey => "missing_key",
            Self::TooLarge => "too_large",
            Self::Unauthenticated => "unauthenticated",
            Self::StoreUnavailable => "store_unavailable",
            Self::Overloaded => "overloaded",
            Self::PassedThrough => "passed_through",
            Self::Rejected => "rejected",
        }
    }
}

pub(crate) fn count_outcome(outcome: Outcome) {
    metrics::counter!("idemgate_requests_total", "outcome" => outcome.as_str()).increment(1);
    tracing::Span::current().record("outcome", outcome.as_str());
}

pub(crate) fn count(name: &'static str) {
    metrics::counter!(name).increment(1);
}

/// Times one store call into `idemgate_store_seconds{op}` and counts its errors.
pub(crate) async fn timed<T, E>(
    op: &'static str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let start = Instant::now();
    let result = call.await;
    metrics::histogram!("idemgate_store_seconds", "op" => op).record(start.elapsed().as_secs_f64());
    if result.is_err() {
        metrics::counter!("idemgate_store_errors_total", "op" => op).increment(1);
    }
    result
}
