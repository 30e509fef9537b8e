//! The proxy's own problem types (documented in `docs/problems.md`).

use std::time::Duration;

use http::StatusCode;
use idemgate::ProblemDetails;

/// 502: the upstream refused or did not accept the connection; nothing was sent,
/// so nothing ran and the key is released for a retry.
pub fn upstream_unreachable(upstream: &str) -> ProblemDetails {
    ProblemDetails::new(
        StatusCode::BAD_GATEWAY,
        "upstream-unreachable",
        "Upstream unreachable",
        format!(
            "could not connect to the upstream {upstream}; nothing was sent, retry with the same key"
        ),
    )
}

/// 502: the connection broke after the request was sent; whether it ran is
/// unknown, so (by default) this answer is stored and replayed.
pub fn upstream_failed(upstream: &str) -> ProblemDetails {
    ProblemDetails::new(
        StatusCode::BAD_GATEWAY,
        "upstream-failed",
        "Upstream failed",
        format!(
            "the exchange with the upstream {upstream} broke after the request was sent; it may have run"
        ),
    )
}

/// 504: no response head within the upstream timeout; whether it ran is
/// unknown, so (by default) this answer is stored and replayed.
pub fn upstream_timeout(timeout: Duration) -> ProblemDetails {
    ProblemDetails::new(
        StatusCode::GATEWAY_TIMEOUT,
        "upstream-timeout",
        "Upstream timeout",
        format!(
            "the upstream did not answer within {} ms; it may have run",
            timeout.as_millis()
        ),
    )
}
