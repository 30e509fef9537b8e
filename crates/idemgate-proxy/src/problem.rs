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

/// 504: the upstream sent its response head, then no body byte for `idle`;
/// whether it ran is unknown, so (by default) this answer is stored and replayed.
pub fn upstream_stalled(idle: Duration) -> ProblemDetails {
    ProblemDetails::new(
        StatusCode::GATEWAY_TIMEOUT,
        "upstream-timeout",
        "Upstream timeout",
        format!(
            "the upstream stopped sending its response body for {} ms; it may have run",
            idle.as_millis()
        ),
    )
}

/// 504: the upstream's whole response did not arrive within `deadline` of the
/// request being sent; whether it ran is unknown.
pub fn upstream_deadline(deadline: Duration) -> ProblemDetails {
    ProblemDetails::new(
        StatusCode::GATEWAY_TIMEOUT,
        "upstream-timeout",
        "Upstream timeout",
        format!(
            "the upstream's response did not complete within {} ms; it may have run",
            deadline.as_millis()
        ),
    )
}

/// 400: the request target is spelled in a way that servers read differently
/// (`reason` names the class); refused before any claim, nothing forwarded.
pub fn ambiguous_path(reason: &dyn std::fmt::Display) -> ProblemDetails {
    ProblemDetails::new(
        StatusCode::BAD_REQUEST,
        "ambiguous-path",
        "Ambiguous request path",
        format!("{reason}; send the path in its plain form"),
    )
}

/// 400: a request target form this reverse proxy does not carry (`CONNECT`'s
/// authority form, `OPTIONS *`).
pub fn unsupported_target(what: &str) -> ProblemDetails {
    ProblemDetails::new(
        StatusCode::BAD_REQUEST,
        "unsupported-target",
        "Unsupported request target",
        format!("{what} is not forwarded by this reverse proxy"),
    )
}

/// 400: the request names its method ambiguously — a method-override header the
/// route does not honour, several of them, or a standard method in lower case.
pub fn ambiguous_method(detail: impl Into<String>) -> ProblemDetails {
    ProblemDetails::new(
        StatusCode::BAD_REQUEST,
        "ambiguous-method",
        "Ambiguous request method",
        detail,
    )
}

/// 400: a header name with `_`, which CGI-style servers read as `-`, refused
/// (`underscore_headers = reject`).
pub fn underscore_header(name: &http::HeaderName) -> ProblemDetails {
    ProblemDetails::new(
        StatusCode::BAD_REQUEST,
        "underscore-header",
        "Header name with an underscore",
        format!(
            "the header {name} has '_' in its name, which some servers read as '-'; send it with '-'"
        ),
    )
}

/// 400: a `GET`, `HEAD` or `OPTIONS` request with content, which an upstream
/// may not read (and then parse as the next request on its connection).
pub fn unexpected_body(method: &http::Method) -> ProblemDetails {
    ProblemDetails::new(
        StatusCode::BAD_REQUEST,
        "unexpected-body",
        "Request body on a safe method",
        format!("a {method} request may not carry content here; send it without a body"),
    )
}

/// 400: the client's request body broke off or was malformed (bad chunked
/// framing) while it was being forwarded: the client's error, not the upstream's.
pub fn client_body_failed() -> ProblemDetails {
    ProblemDetails::unreadable_body()
}

/// 502: the upstream answered `101 Switching Protocols` to a request that did
/// not ask for a WebSocket, or with a handshake that does not answer it.
pub fn upstream_bad_upgrade(upstream: &str, why: &str) -> ProblemDetails {
    ProblemDetails::new(
        StatusCode::BAD_GATEWAY,
        "upstream-failed",
        "Upstream failed",
        format!(
            "the upstream {upstream} switched protocols unasked or wrongly ({why}); it may have run"
        ),
    )
}
