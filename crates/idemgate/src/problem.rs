//! `application/problem+json` answers (RFC 9457, PROTOCOL §10).
//!
//! Every error the layer answers is a [`ProblemDetails`], turned into a response by
//! its [`IntoResponse`] impl; applications use the same type for their own errors,
//! so handlers can return `Result<_, ProblemDetails>`.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, LINK, RETRY_AFTER};
use http::{HeaderValue, Request, Response, StatusCode};
use serde::Serialize;
use tower_layer::Layer;
use tower_service::Service;

use idemgate_core::StoreError;
use idemgate_core::fingerprint::Differing;
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

    /// The response in `style` and, beside it, the bytes of its body: for the
    /// layer, which sends the problem and stores it for replay without reading
    /// the body back. The response carries the problem in its extensions, so a
    /// [`ProblemStyle`] further out can render it again in its own style.
    pub(crate) fn render(self, style: &ProblemStyle) -> (Response<Body>, Bytes) {
        if style.grpc {
            let status =
                StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let code = crate::grpc::code_for(self.status, self.slug());
            let (mut response, body) =
                crate::grpc::trailers_only(status, code, &self.detail, self.retry_after);
            response.extensions_mut().insert(Rendered(self));
            return (response, body);
        }
        let mut status =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let type_uri = style.type_uri(&self.type_uri);
        let (body, content_type) = match style.shape {
            ProblemShape::Rfc9457 => {
                let styled = Self {
                    type_uri: type_uri.clone(),
                    ..self.clone()
                };
                (
                    serde_json::to_vec(&styled).unwrap_or_default(),
                    "application/problem+json",
                )
            }
            ProblemShape::Stripe => {
                let slug = self.slug().unwrap_or(&self.type_uri);
                // Stripe answers a key reused with other parameters with 400
                // `idempotency_error`, and Stripe-shaped SDKs raise their
                // idempotency error only for a 400 (or 404) of that type.
                if slug == KEY_REUSED {
                    status = StatusCode::BAD_REQUEST;
                }
                let error_type = if STRIPE_IDEMPOTENCY_ERRORS.contains(&slug) {
                    "idempotency_error"
                } else {
                    "api_error"
                };
                let body = serde_json::json!({
                    "error": {
                        "type": error_type,
                        "code": slug,
                        "message": self.detail,
                        "doc_url": type_uri,
                    }
                });
                (
                    serde_json::to_vec(&body).unwrap_or_default(),
                    "application/json",
                )
            }
        };
        let body = Bytes::from(body);
        let mut response = Response::new(Body::from(body.clone()));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        if style.link {
            // A type that cannot be a header value (a handler's own, odd one)
            // simply gets no link.
            if let Ok(link) = HeaderValue::from_str(&format!("<{type_uri}>; rel=\"describedby\"")) {
                headers.insert(LINK, link);
            }
        }
        if let Some(after) = self.retry_after {
            // Integer arithmetic: a float loses the sub-second part of long
            // durations and would round them down (found by the property tests).
            let seconds = after
                .as_secs()
                .saturating_add(u64::from(after.subsec_nanos() > 0))
                .max(1);
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        response.extensions_mut().insert(Rendered(self));
        (response, body)
    }

    /// The slug of a problem under the default base (`key-reused`); `None` for
    /// a type of the application's own that does not start with it.
    pub fn slug(&self) -> Option<&str> {
        self.type_uri.strip_prefix(PROBLEM_BASE)
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

    /// 400 `jsonrpc-batch`: a JSON-RPC batch on a JSON-RPC route (PROTOCOL
    /// §20): several operations, which one key cannot name; nothing was claimed.
    pub fn jsonrpc_batch() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "jsonrpc-batch",
            "JSON-RPC batch on an idempotent endpoint",
            "this endpoint makes each JSON-RPC request idempotent on its own; a batch (an array) holds several operations one key cannot name: send its requests one by one",
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

    /// 422: the key was used before, in the same scope (principal, method, path
    /// or route), with a request of another fingerprint. Another method or path
    /// is another scope, so a new operation and never this problem; what the
    /// fingerprint adds to the scope is the body, the query string, configured
    /// headers and the path as sent (where a route template or a path fold
    /// makes several spellings one scope) — the detail says just that.
    pub fn key_reused() -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            KEY_REUSED,
            "Idempotency-Key reused with a different request",
            "this Idempotency-Key was already used on this endpoint with a different request (another body, query string, or a header or path spelling the fingerprint covers); use a new key for a new request",
        )
    }

    /// 422 naming the body fields the request differs in from the first one
    /// under its key (PROTOCOL §6.3, [`Differing`]): the `differing` member lists
    /// their JSON pointers (at most [`MAX_NAMED`](idemgate_core::fingerprint::MAX_NAMED)),
    /// `differing_complete` says whether that is every differing field, and the
    /// detail (a Stripe-shaped `message`) says the same in words.
    ///
    /// ```
    /// use idemgate::fingerprint::Differing;
    /// let differing = Differing { pointers: vec!["/amount".into()], complete: true };
    /// let problem = idemgate::ProblemDetails::key_reused_differing(&differing);
    /// assert_eq!(problem.members["differing"], serde_json::json!(["/amount"]));
    /// assert!(problem.detail.contains("/amount"));
    /// ```
    pub fn key_reused_differing(differing: &Differing) -> Self {
        let fields = differing.pointers.join(", ");
        let what = match (differing.pointers.is_empty(), differing.complete) {
            (true, true) => "the same body, but another query string, or a header or path spelling the fingerprint covers".to_owned(),
            (true, false) => "another body (in fields too many to name)".to_owned(),
            (false, true) => format!("another body: it differs at {fields}"),
            (false, false) => format!("another body: it differs at {fields}, and elsewhere"),
        };
        let mut problem = Self::key_reused();
        problem.detail = format!(
            "this Idempotency-Key was already used on this endpoint with {what}; use a new key for a new request"
        );
        problem
            .with_member("differing", differing.pointers.clone())
            .with_member("differing_complete", differing.complete)
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

    /// 400: a keyed gRPC call whose body is not exactly one message (`found`
    /// messages, `None`: not gRPC framing). A streaming call has no single
    /// outcome to store, and its request stream may not end before its answers
    /// begin, so it is not keyed (PROTOCOL §22); answered `INVALID_ARGUMENT`.
    pub fn grpc_not_unary(found: Option<usize>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "grpc-not-unary",
            "Keyed gRPC call is not unary",
            match found {
                Some(count) => format!(
                    "a keyed gRPC call carries exactly one message; this one carries {count}: streaming calls are not keyed"
                ),
                None => "the request body is not a sequence of gRPC messages".to_owned(),
            },
        )
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
/// and `Retry-After` when set, in the default style; a [`ProblemStyle`] further
/// out (the layer's, a [`ProblemStyleLayer`]) renders it again in its own.
impl IntoResponse for ProblemDetails {
    fn into_response(self) -> axum::response::Response {
        self.render(&ProblemStyle::default()).0
    }
}

/// The problem a response was rendered from, kept in its extensions so a style
/// further out can render it again; private, so only this module reads it.
#[derive(Clone)]
struct Rendered(ProblemDetails);

/// The problems whose Stripe-shaped `type` is `idempotency_error`: what is about
/// the key, as opposed to the store or the service (`api_error`).
const STRIPE_IDEMPOTENCY_ERRORS: &[&str] = &[KEY_REUSED, IN_PROGRESS, "missing-key", "invalid-key"];

/// How problems look on the wire: the body's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[non_exhaustive]
pub enum ProblemShape {
    /// `application/problem+json` (RFC 9457): `type`, `title`, `status`,
    /// `detail`. The default.
    #[default]
    Rfc9457,
    /// Stripe's error object, `application/json`: `{"error": {"type":
    /// "idempotency_error" | "api_error", "code": <slug>, "message": <detail>,
    /// "doc_url": <type URI>}}`, and a reused key answers 400 as Stripe does —
    /// so SDKs modelled on Stripe's raise their idempotency error instead of an
    /// "invalid response object".
    Stripe,
}

/// Where problem types point and how problems are sent: the base of every
/// idemgate `type` URI (default [`PROBLEM_BASE`], a relative reference that
/// claims no domain), whether a `Link: <type>; rel="describedby"` goes with it,
/// and the body's [`ProblemShape`]. The layer renders its own problems and its
/// handler's [`ProblemDetails`] in it (before storing them, so replays match);
/// [`ProblemStyleLayer`] does the same for problems answered outside the layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProblemStyle {
    base: Arc<str>,
    link: bool,
    shape: ProblemShape,
    /// Problems answered to a gRPC call, as gRPC statuses
    /// (`crate::grpc::trailers_only`) whatever the shape: set by the layer per
    /// request, never by a route.
    grpc: bool,
}

impl Default for ProblemStyle {
    fn default() -> Self {
        Self {
            base: Arc::from(PROBLEM_BASE),
            link: false,
            shape: ProblemShape::Rfc9457,
            grpc: false,
        }
    }
}

impl ProblemStyle {
    /// Type URIs under `base` (`https://docs.example.com/errors/`): the slug is
    /// appended as is, so end it with `/`, `#` or `:`.
    ///
    /// ```
    /// let style = idemgate::problem::ProblemStyle::default().with_base("https://docs.example.com/errors/");
    /// ```
    pub fn with_base(mut self, base: impl Into<String>) -> Self {
        self.base = Arc::from(base.into());
        self
    }

    /// Send `Link: <type URI>; rel="describedby"` with every problem.
    ///
    /// ```
    /// let style = idemgate::problem::ProblemStyle::default().with_link(true);
    /// ```
    pub fn with_link(mut self, link: bool) -> Self {
        self.link = link;
        self
    }

    /// The body's shape.
    ///
    /// ```
    /// use idemgate::problem::{ProblemShape, ProblemStyle};
    /// let style = ProblemStyle::default().with_shape(ProblemShape::Stripe);
    /// ```
    pub fn with_shape(mut self, shape: ProblemShape) -> Self {
        self.shape = shape;
        self
    }

    /// This style for the answers to a request: a gRPC call's problems are
    /// gRPC statuses (PROTOCOL §22), whatever the route's shape.
    pub(crate) fn for_request(&self, grpc: bool) -> Self {
        Self {
            grpc,
            ..self.clone()
        }
    }

    /// The base type URIs start with.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Whether a `Link` goes with each problem.
    pub fn link(&self) -> bool {
        self.link
    }

    /// The body's shape.
    pub fn shape(&self) -> ProblemShape {
        self.shape
    }

    /// `type_uri` (rendered under the default base) under this style's base;
    /// an application's own type that does not start with it is kept.
    fn type_uri(&self, type_uri: &str) -> String {
        match type_uri.strip_prefix(PROBLEM_BASE) {
            Some(slug) => format!("{}{slug}", self.base),
            None => type_uri.to_owned(),
        }
    }

    /// `response` in this style when it was rendered from a [`ProblemDetails`]
    /// and no style has been applied to it yet (status, content type, body and
    /// `Link` replaced; every other header and extension kept); any other
    /// response as it is. The innermost style wins: a route's own style is not
    /// undone by the application's further out.
    pub fn restyle(&self, mut response: Response<Body>) -> Response<Body> {
        let Some(Rendered(problem)) = response.extensions_mut().remove::<Rendered>() else {
            return response;
        };
        if *self == Self::default() {
            return response;
        }
        let (mut parts, _) = response.into_parts();
        let (styled, _) = problem.render(self);
        let (styled, body) = styled.into_parts();
        parts.status = styled.status;
        for name in [CONTENT_TYPE, CONTENT_LENGTH, LINK] {
            parts.headers.remove(name);
        }
        if self.grpc {
            // A gRPC status says it as `grpc-retry-pushback-ms`.
            parts.headers.remove(RETRY_AFTER);
        }
        parts.headers.extend(styled.headers);
        if let Some(status) = styled.extensions.get::<crate::grpc::ProblemStatus>() {
            parts.extensions.insert(*status);
        }
        Response::from_parts(parts, body)
    }
}

/// A tower layer that renders every problem passing through it in its
/// [`ProblemStyle`]: for the problems an application answers outside the
/// idempotency layer (authentication's 401, say), so they look like the layer's.
///
/// ```
/// use idemgate::problem::{ProblemStyle, ProblemStyleLayer};
/// let app: axum::Router = axum::Router::new()
///     .layer(ProblemStyleLayer::new(ProblemStyle::default().with_link(true)));
/// ```
#[derive(Debug, Clone)]
#[must_use = "a layer does nothing until it wraps a service"]
pub struct ProblemStyleLayer {
    style: ProblemStyle,
}

impl ProblemStyleLayer {
    /// Renders problems in `style`.
    pub fn new(style: ProblemStyle) -> Self {
        Self { style }
    }
}

impl<S> Layer<S> for ProblemStyleLayer {
    type Service = ProblemStyled<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ProblemStyled {
            inner,
            style: self.style.clone(),
        }
    }
}

/// The service of [`ProblemStyleLayer`].
#[derive(Debug, Clone)]
pub struct ProblemStyled<S> {
    inner: S,
    style: ProblemStyle,
}

impl<S, ReqBody> Service<Request<ReqBody>> for ProblemStyled<S>
where
    S: Service<Request<ReqBody>, Response = Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<Body>, S::Error>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let style = self.style.clone();
        let future = self.inner.call(request);
        Box::pin(async move { Ok(style.restyle(future.await?)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn the_rendered_bytes_are_the_body() {
        let (response, bytes) = ProblemDetails::handler_failed().render(&ProblemStyle::default());
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(response.headers().get(RETRY_AFTER).is_none());
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(json["type"], "/problems/handler-failed");
    }

    async fn body_of(response: Response<Body>) -> serde_json::Value {
        let body = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&body).unwrap()
    }

    #[test]
    fn the_default_base_claims_no_domain() {
        // A relative reference with the full path (RFC 9457 §3.1.1).
        assert!(PROBLEM_BASE.starts_with('/') && !PROBLEM_BASE.starts_with("//"));
        assert_eq!(
            ProblemDetails::key_reused().type_uri,
            "/problems/key-reused"
        );
        assert_eq!(ProblemDetails::key_reused().slug(), Some(KEY_REUSED));
    }

    #[tokio::test]
    async fn a_style_sets_the_base_and_the_link_and_keeps_the_rest() {
        let style = ProblemStyle::default()
            .with_base("https://docs.example.com/errors/")
            .with_link(true);
        let mut response = ProblemDetails::in_progress(Duration::from_secs(2)).into_response();
        response
            .headers_mut()
            .insert("x-request-id", HeaderValue::from_static("r1"));
        let styled = style.restyle(response);
        assert_eq!(styled.status(), StatusCode::CONFLICT);
        assert_eq!(styled.headers()[RETRY_AFTER], "2");
        assert_eq!(styled.headers()["x-request-id"], "r1");
        assert_eq!(
            styled.headers()[LINK],
            "<https://docs.example.com/errors/in-progress>; rel=\"describedby\""
        );
        assert_eq!(styled.headers()[CONTENT_TYPE], "application/problem+json");
        // Styled once: a style further out leaves it alone (the innermost wins).
        let again = ProblemStyle::default().with_base("/other/").restyle(styled);
        let json = body_of(again).await;
        assert_eq!(json["type"], "https://docs.example.com/errors/in-progress");
        assert_eq!(json["status"], 409);
    }

    #[tokio::test]
    async fn an_application_type_of_its_own_is_kept() {
        let own = ProblemDetails {
            type_uri: "https://shop.example/problems/out-of-stock".into(),
            ..ProblemDetails::handler_failed()
        };
        let styled = ProblemStyle::default()
            .with_base("https://docs.example.com/errors/")
            .restyle(own.into_response());
        let json = body_of(styled).await;
        assert_eq!(json["type"], "https://shop.example/problems/out-of-stock");
    }

    #[tokio::test]
    async fn the_stripe_shape_is_stripes_error_object() {
        let style = ProblemStyle::default().with_shape(ProblemShape::Stripe);
        let reused = style.restyle(ProblemDetails::key_reused().into_response());
        assert_eq!(
            reused.status(),
            StatusCode::BAD_REQUEST,
            "Stripe answers a reused key with 400"
        );
        assert_eq!(reused.headers()[CONTENT_TYPE], "application/json");
        let json = body_of(reused).await;
        assert_eq!(json["error"]["type"], "idempotency_error");
        assert_eq!(json["error"]["code"], "key-reused");
        assert!(
            json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("different request")
        );
        let differing = Differing {
            pointers: vec!["/amount".into(), "/items/0/sku".into()],
            complete: true,
        };
        let named = style.restyle(ProblemDetails::key_reused_differing(&differing).into_response());
        assert_eq!(named.status(), StatusCode::BAD_REQUEST);
        let json = body_of(named).await;
        assert_eq!(json["error"]["code"], "key-reused");
        assert_eq!(
            json["error"]["message"],
            "this Idempotency-Key was already used on this endpoint with another body: it differs at /amount, /items/0/sku; use a new key for a new request"
        );
        let busy =
            style.restyle(ProblemDetails::in_progress(Duration::from_secs(3)).into_response());
        assert_eq!(busy.status(), StatusCode::CONFLICT);
        assert_eq!(busy.headers()[RETRY_AFTER], "3");
        assert_eq!(body_of(busy).await["error"]["type"], "idempotency_error");
        let store =
            style.restyle(ProblemDetails::store_full(Duration::from_secs(1)).into_response());
        assert_eq!(body_of(store).await["error"]["type"], "api_error");
    }

    #[tokio::test]
    async fn a_reused_key_names_the_differing_fields() {
        let json = |pointers: &[&str], complete: bool| {
            let differing = Differing {
                pointers: pointers.iter().map(|p| (*p).to_owned()).collect(),
                complete,
            };
            ProblemDetails::key_reused_differing(&differing).into_response()
        };
        let response = json(&["/amount"], true);
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let body = body_of(response).await;
        assert_eq!(body["type"], "/problems/key-reused");
        assert_eq!(body["differing"], serde_json::json!(["/amount"]));
        assert_eq!(body["differing_complete"], true);
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("differs at /amount;")
        );
        let more = body_of(json(&["/a"], false)).await;
        assert_eq!(more["differing_complete"], false);
        assert!(
            more["detail"]
                .as_str()
                .unwrap()
                .contains("differs at /a, and elsewhere")
        );
        let elsewhere = body_of(json(&[], true)).await;
        assert_eq!(elsewhere["differing"], serde_json::json!([]));
        assert!(
            elsewhere["detail"]
                .as_str()
                .unwrap()
                .contains("the same body")
        );
    }

    #[tokio::test]
    async fn renders_rfc9457_json_with_retry_after() {
        let response = ProblemDetails::in_progress(Duration::from_millis(2_300)).into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
        assert_eq!(response.headers()[RETRY_AFTER], "3");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["type"], "/problems/in-progress");
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
