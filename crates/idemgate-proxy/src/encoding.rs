//! The proxy's content coding of covered answers (PROTOCOL §1): a covered
//! request's upstream is asked for identity, so the record keeps one
//! representation, and each attempt — the first run and every replay — gets it
//! in a coding its own `Accept-Encoding` accepts (gzip, br, zstd, or identity),
//! negotiated and encoded by tower-http. Every other answer streams through as
//! the upstream encoded it, untouched and unwrapped: a compression layer around
//! every request cost a pass-through about a twelfth of its instructions
//! (callgrind, `docs/benchmarks.md`), for answers it never encoded.

use std::convert::Infallible;

use axum::body::Body;
use http::header::ACCEPT_ENCODING;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Version};
use tower::ServiceExt;
use tower_http::compression::{CompressionLayer, Predicate as _, predicate};
use tower_layer::Layer;

use crate::forward::CoveredAnswer;

/// What a request's `Accept-Encoding` said, kept (without a copy of the rest of
/// the request) for its answer.
#[derive(Debug)]
pub(crate) struct Accepted(Vec<HeaderValue>);

impl Accepted {
    /// The `Accept-Encoding` values of `headers` (none: nothing is allocated).
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        Self(headers.get_all(ACCEPT_ENCODING).iter().cloned().collect())
    }

    /// `response`, encoded as the request accepted if it is a covered answer
    /// ([`covered_answer`]) that is not read as it comes ([`not_streamed`]);
    /// otherwise as it is.
    pub(crate) async fn encode(self, response: Response<Body>) -> Response<Body> {
        if !covered_answer(response.headers(), response.extensions()) {
            return response;
        }
        type Allowed = fn(StatusCode, Version, &HeaderMap, &http::Extensions) -> bool;
        let compression = CompressionLayer::new()
            .compress_when(predicate::DefaultPredicate::new().and(not_streamed as Allowed));
        // tower-http negotiates from a request and encodes its service's
        // answer: a request of these values alone, answered by `response`.
        let mut negotiation = Request::new(());
        for value in self.0 {
            negotiation.headers_mut().append(ACCEPT_ENCODING, value);
        }
        // Called once (`oneshot`): the default is never answered.
        let mut response = Some(response);
        let answer = tower::service_fn(move |_: Request<()>| {
            std::future::ready(Ok::<_, Infallible>(response.take().unwrap_or_default()))
        });
        match compression.layer(answer).oneshot(negotiation).await {
            Ok(encoded) => encoded.map(Body::new),
            Err(never) => match never {},
        }
    }
}

/// Whether the response of `headers` and `extensions` is the proxy's to encode:
/// an answer to a covered request (live, [`CoveredAnswer`]) or a replay
/// (`Idempotent-Replayed`). Everything else — what streams through uncovered,
/// in whatever coding the upstream chose for the client's own
/// `Accept-Encoding` — is passed on untouched.
fn covered_answer(headers: &HeaderMap, extensions: &http::Extensions) -> bool {
    extensions.get::<CoveredAnswer>().is_some()
        || headers.contains_key(&idemgate::IDEMPOTENT_REPLAYED)
}

/// Whether the proxy may encode a response of `headers`: not one a client
/// reads as it comes (`text/event-stream`, NDJSON, JSON Lines,
/// [`idemgate::is_streamed_media_type`]), whose events a compressor would hold
/// back. tower-http's default predicate knows only `text/event-stream`.
fn not_streamed(_: StatusCode, _: Version, headers: &HeaderMap, _: &http::Extensions) -> bool {
    !headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(idemgate::is_streamed_media_type)
}
