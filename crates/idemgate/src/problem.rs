//! `application/problem+json` answers (RFC 9457, PROTOCOL §10).
//!
//! Every error the layer answers is a [`ProblemDetails`], turned into a response by
//! its [`IntoResponse`] impl; applications use the same type for their own errors,
//! so handlers can return `Result<_, ProblemDetails>`.

use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};
use serde::Serialize;

use idemgate_core::StoreError;
use idemgate_core::key::KeyError;

pub use idemgate_core::wire::PROBLEM_BASE;
use idemgate_core::wire::{IN_PROGRESS, KEY_REUSED, problem_type};

/// An RFC 9457 problem: a stable `type` URI per error, a title, the status and a
/// detail for this occurrence.
///
/// It is a response ([`IntoResponse`]), so an axum handler can fail with it:
///
/// ```
/// use axum::http::StatusCode;
/// use idemgate::ProblemDetails;
///
/// async fn get_order() -> Result<String, ProblemDetails> {
///     Err(ProblemDetails::new(StatusCode::NOT_FOUND, "order-not-found", "Order not found", "no order 7"))
/// }
/// let app: axum::Router = axum::Router::new().route("/orders/7", axum::routing::get(get_order));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[must_use = "a problem does nothing until it is sent as a response"]
pub struct ProblemDetails {
    /// `PROBLEM_BASE` + a slug, stable across releases.
    #[serde(rename = "type")]
    pub type_uri: String,
    /// Short, the same for every occurrence of this type.
    pub title: &'static str,
    /// The HTTP status, repeated in the body as RFC 9457 asks.
    pub status: u16,
    /// What happened this time.
    pub detail: String,
    /// Seconds after which a retry may succeed; sent as `Retry-After`.
    #[serde(skip)]
    pub retry_after: Option<Duration>,
    /// Extension members (RFC 9457 §3.2): what this occurrence adds for the
    /// client to act on (the current `etag`, `balance`, `version`), beside the
    /// standard members in the same JSON object.
    #[serde(flatten)]
    pub members: serde_json::Map<String, serde_json::Value>,
}

impl ProblemDetails {
    /// A problem of type `PROBLEM_BASE` + `slug`.
    pub fn new(
        status: StatusCode,
        slug: &str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            type_uri: problem_type(slug),
            title,
            status: status.as_u16(),
            detail: detail.into(),
            retry_after: None,
            members: serde_json::Map::new(),
        }
    }

    /// Adds an extension member, so the client can act without another request
    /// (a 409 `precondition-failed` carries the current balance). A name of a
    /// standard member (`type`, `title`, `status`, `detail`) is ignored: those
    /// are the problem's own and never overwritten.
    ///
    /// ```
    /// # use axum::http::StatusCode;
    /// let problem = idemgate::ProblemDetails::new(StatusCode::CONFLICT, "precondition-failed", "Precondition failed", "stale")
    ///     .with_member("version", 7);
    /// assert_eq!(problem.members["version"], 7);
    /// ```
    pub fn with_member(mut self, name: &str, value: impl Into<serde_json::Value>) -> Self {
        if !matches!(name, "type" | "title" | "status" | "detail") {
            self.members.insert(name.to_owned(), value.into());
        }
        self
    }

    /// Adds a `Retry-After` (whole seconds, rounded up, at least 1).
    ///
    /// ```
    /// # use axum::http::StatusCode;
    /// let problem = idemgate::ProblemDetails::new(StatusCode::SERVICE_UNAVAILABLE, "busy", "Busy", "try later")
    ///     .with_retry_after(std::time::Duration::from_secs(2));
    /// ```
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// The response and, beside it, the bytes of its body: for the layer, which
    /// sends the problem and stores it for replay without reading the body back.
    pub(crate) fn render(self) -> (Response<Body>, Bytes) {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = Bytes::from(serde_json::to_vec(&self).unwrap_or_default());
        let mut response = Response::new(Body::from(body.clone()));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(after) = self.retry_after {
            // Integer arithmetic: a float loses the sub-second part of long
            // durations and would round them down (found by the property tests).
            let seconds = after
                .as_secs()
                .saturating_add(u64::from(after.subsec_nanos() > 0))
                .max(1);
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        (response, body)
    }

    /// The answer to a store error: 503 with `retry_after` when retrying may help
    /// (unavailable, full), 500 when an operator must act (corrupt record,
    /// misconfigured store; the error, logged, says the fix).
    ///
    /// ```
    /// let problem = idemgate::ProblemDetails::for_store_error(
    ///     &idemgate::StoreError::Full,
    ///     std::time::Duration::from_secs(1),
    /// );
    /// assert_eq!(problem.status, 503);
    /// ```
    pub fn for_store_error(error: &StoreError, retry_after: Duration) -> Self {
        match error {
            StoreError::Full => Self::store_full(retry_after),
            StoreError::Corrupt(_) => Self::store_corrupt(),
            StoreError::Misconfigured(_) => Self::store_misconfigured(),
            _ => Self::store_unavailable(retry_after),
        }
    }

    /// 400: no `Idempotency-Key` where the layer requires one.
    pub fn missing_key() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "missing-key",
            "Idempotency-Key required",
            "this endpoint requires an Idempotency-Key header; generate a UUID v4 once per user action and reuse it on every retry",
        )
    }

    /// 400 `missing-key` on a route that reads its key from `source` (a path or
    /// query parameter, a body field, another header): the detail says where.
    pub fn missing_key_at(source: &idemgate_core::key::KeySource) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "missing-key",
            "Idempotency-Key required",
            format!(
                "this endpoint requires an idempotency key, read from {source} (or the Idempotency-Key header); generate one once per user action and reuse it on every retry"
            ),
        )
    }

    /// 400 `ambiguous-key`: the standard header and the route's key source carry
    /// different keys (PROTOCOL §15); nothing was claimed.
    pub fn ambiguous_key() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "ambiguous-key",
            "Ambiguous idempotency key",
            "the Idempotency-Key header and the route's own key carry different keys; send one key, or the same key in both places",
        )
    }

    /// 400: a malformed key; `ambiguous-key` when two places disagree.
    pub fn invalid_key(error: &KeyError) -> Self {
        if *error == KeyError::Ambiguous {
            return Self::ambiguous_key();
        }
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid-key",
            "Invalid Idempotency-Key",
            error.to_string(),
        )
    }

    /// 401: no principal to scope the key by.
    pub fn unauthenticated(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "Unauthenticated",
            detail,
        )
    }

    /// 400: a header the request must send at most once (`Authorization`,
    /// `Content-Type`) came on several lines, so what it says is ambiguous.
    pub fn ambiguous_header(name: &http::HeaderName) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "ambiguous-header",
            "Ambiguous header",
            format!("the {name} header appears more than once; send it once"),
        )
    }

    /// 413: request body over the limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Request body too large",
            format!("the request body exceeds {limit} bytes"),
        )
    }

    /// 400: the body could not be read (the client went away mid-upload, or sent a
    /// broken encoding).
    pub fn unreadable_body() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "unreadable-body",
            "Unreadable request body",
            "the request body could not be read",
        )
    }

    /// 422: the key was used before with a different request.
    pub fn key_reused() -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            KEY_REUSED,
            "Idempotency-Key reused with a different request",
            "this Idempotency-Key was already used with a different request body, method, path or query; use a new key for a new request",
        )
    }

    /// 409: the first request with this key is still running.
    pub fn in_progress(retry_after: Duration) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            IN_PROGRESS,
            "Request in progress",
            "a request with this Idempotency-Key is still being processed; retry after the indicated delay",
        )
        .with_retry_after(retry_after)
    }

    /// 503: the idempotency store cannot be reached; nothing was run.
    pub fn store_unavailable(retry_after: Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store-unavailable",
            "Idempotency store unavailable",
            "the idempotency store could not be reached; the request was not processed and can be retried with the same key",
        )
        .with_retry_after(retry_after)
    }

    /// 503: a capacity-bounded store is full; nothing was run.
    pub fn store_full(retry_after: Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store-full",
            "Idempotency store full",
            "the idempotency store holds as many records as it may; the request was not processed",
        )
        .with_retry_after(retry_after)
    }

    /// 500: the stored record cannot be read back.
    pub fn store_corrupt() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "store-corrupt",
            "Corrupt idempotency record",
            "the stored record for this key cannot be read; the request was not processed",
        )
    }

    /// 500: the idempotency store is set up wrong (its table is missing or not
    /// accessible); nothing was run. The operator's fix is logged, not sent.
    pub fn store_misconfigured() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "store-misconfigured",
            "Idempotency store misconfigured",
            "the idempotency store is not set up for this service; the request was not processed",
        )
    }

    /// 503: too many requests are being processed at once.
    pub fn overloaded(retry_after: Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "Too many requests in flight",
            "the server is processing as many keyed requests as it may; nothing was run",
        )
        .with_retry_after(retry_after)
    }

    /// 500: the handler panicked or failed.
    pub fn handler_failed() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "handler-failed",
            "Internal error",
            "the request handler failed",
        )
    }
}

/// A problem is also an error, so a response body can fail with one: a body that
/// breaks off with a `ProblemDetails` in its error's chain (a proxied upstream that
/// stalled mid-body, say) is answered with that problem, and settled by its
/// status, instead of the generic `500 handler-failed` — when the client has
/// received nothing yet (the layer is still buffering the response for the record).
///
/// ```
/// use axum::http::StatusCode;
/// let stalled = idemgate::ProblemDetails::new(StatusCode::GATEWAY_TIMEOUT, "upstream-timeout", "Upstream timeout", "stalled");
/// let error: idemgate::BoxError = Box::new(stalled);
/// assert_eq!(error.to_string(), "stalled");
/// ```
impl std::fmt::Display for ProblemDetails {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for ProblemDetails {}

impl ProblemDetails {
    /// The first `ProblemDetails` in `error`'s chain of sources, if any.
    pub(crate) fn in_chain<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a Self> {
        std::iter::successors(Some(error), |error| error.source())
            .find_map(|error| error.downcast_ref::<Self>())
    }
}

/// The response: status, `Content-Type: application/problem+json`, the JSON body
/// and `Retry-After` when set.
impl IntoResponse for ProblemDetails {
    fn into_response(self) -> axum::response::Response {
        self.render().0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn the_rendered_bytes_are_the_body() {
        let (response, bytes) = ProblemDetails::handler_failed().render();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(response.headers().get(RETRY_AFTER).is_none());
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(json["type"], "https://idemgate.dev/problems/handler-failed");
    }

    #[tokio::test]
    async fn renders_rfc9457_json_with_retry_after() {
        let response = ProblemDetails::in_progress(Duration::from_millis(2_300)).into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
        assert_eq!(response.headers()[RETRY_AFTER], "3");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["type"], "https://idemgate.dev/problems/in-progress");
        assert_eq!(json["status"], 409);
        assert_eq!(json["title"], "Request in progress");
        assert!(
            json["detail"]
                .as_str()
                .unwrap()
                .contains("still being processed")
        );
    }
}
