//! Between live responses and stored ones (PROTOCOL §7).

use axum::body::Body;
use http::Response;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use idemgate_core::record::{StoredBody, StoredResponse};

pub use idemgate_core::wire::IDEMPOTENT_REPLAYED;

/// Sent with a replay whose body was too large to keep.
pub static IDEMPOTENCY_RESPONSE: HeaderName = HeaderName::from_static("idempotency-response");

/// Sent with a replay made by content-based deduplication (PROTOCOL §16):
/// `Idempotency-Dedup: content`, so a client that sent no key learns why it got
/// an earlier request's answer.
pub static IDEMPOTENCY_DEDUP: HeaderName = HeaderName::from_static("idempotency-dedup");

/// Headers never stored: hop-by-hop ones (RFC 9110 §7.6.1), `Date` (a replay is
/// sent now), `Content-Length` (recomputed for the replayed body, which may be
/// empty when not retained) and our own replay marker.
fn is_never_stored(name: &HeaderName) -> bool {
    [
        &header::CONNECTION,
        &header::TRANSFER_ENCODING,
        &header::TE,
        &header::TRAILER,
        &header::UPGRADE,
        &header::PROXY_AUTHENTICATE,
        &header::PROXY_AUTHORIZATION,
        &header::DATE,
        &header::CONTENT_LENGTH,
        &IDEMPOTENT_REPLAYED,
        &IDEMPOTENCY_RESPONSE,
        &IDEMPOTENCY_DEDUP,
    ]
    .contains(&name)
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// The headers of a live response that a replay repeats, in order, repeats kept.
pub(crate) fn storable_headers(
    headers: &HeaderMap,
    keep_set_cookie: bool,
) -> Vec<(HeaderName, HeaderValue)> {
    headers
        .iter()
        .filter(|(name, _)| !is_never_stored(name))
        .filter(|(name, _)| keep_set_cookie || *name != header::SET_COOKIE)
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

/// A stored response as a replay: same status, headers and body bytes, plus
/// `Idempotent-Replayed: true` (and `Idempotency-Response: not-retained` with an
/// empty body when the body was not kept).
pub(crate) fn replay(stored: &StoredResponse) -> Response<Body> {
    let body = match &stored.body {
        StoredBody::Retained(bytes) => Body::from(bytes.clone()),
        StoredBody::NotRetained => Body::empty(),
    };
    let mut response = Response::new(body);
    *response.status_mut() = stored.status;
    let headers = response.headers_mut();
    headers.reserve(stored.headers.len() + 2);
    for (name, value) in &stored.headers {
        headers.append(name.clone(), value.clone());
    }
    headers.insert(
        IDEMPOTENT_REPLAYED.clone(),
        HeaderValue::from_static("true"),
    );
    if stored.body == StoredBody::NotRetained {
        headers.insert(
            IDEMPOTENCY_RESPONSE.clone(),
            HeaderValue::from_static("not-retained"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    #[test]
    fn drops_hop_by_hop_date_and_cookies_keeps_order_and_repeats() {
        let mut headers = HeaderMap::new();
        headers.append(header::LOCATION, HeaderValue::from_static("/orders/1"));
        headers.append("x-tag", HeaderValue::from_static("b"));
        headers.append("x-tag", HeaderValue::from_static("a"));
        headers.append(
            header::DATE,
            HeaderValue::from_static("Mon, 30 Nov 2026 07:00:00 GMT"),
        );
        headers.append(header::CONNECTION, HeaderValue::from_static("close"));
        headers.append("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.append(header::SET_COOKIE, HeaderValue::from_static("session=abc"));
        headers.append(header::CONTENT_LENGTH, HeaderValue::from_static("12"));
        let kept: Vec<_> = storable_headers(&headers, false)
            .into_iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
            .collect();
        assert_eq!(kept, ["location: /orders/1", "x-tag: b", "x-tag: a"]);
        assert!(
            storable_headers(&headers, true)
                .iter()
                .any(|(n, _)| n == header::SET_COOKIE)
        );
    }

    #[test]
    fn replay_marks_and_explains_missing_bodies() {
        let stored = StoredResponse {
            status: StatusCode::CREATED,
            headers: vec![
                (
                    HeaderName::from_static("x-tag"),
                    HeaderValue::from_static("b"),
                ),
                (
                    HeaderName::from_static("x-tag"),
                    HeaderValue::from_static("a"),
                ),
            ],
            body: StoredBody::NotRetained,
        };
        let response = replay(&stored);
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.headers()[&IDEMPOTENT_REPLAYED], "true");
        assert_eq!(response.headers()[&IDEMPOTENCY_RESPONSE], "not-retained");
        let tags: Vec<_> = response.headers().get_all("x-tag").iter().collect();
        assert_eq!(tags, ["b", "a"]);
    }
}
