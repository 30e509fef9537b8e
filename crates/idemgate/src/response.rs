//! Between live responses and stored ones (PROTOCOL §7).

use std::io::Read;

use axum::body::Body;
use axum::response::IntoResponse;
use bytes::Bytes;
use http::Response;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use idemgate_core::compression::{STORED_CODING, decompress};
use idemgate_core::encoding::acceptable;
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
        &STORED_CODING,
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

/// The most bytes a stored body is decoded to for a retry that does not accept
/// its coding; a larger one (a decompression bomb, or just huge) is replayed as
/// stored.
const MAX_DECODED: u64 = 64 * 1024 * 1024;

/// `body` with the content codings `coding` lists undone (the last applied
/// first); `None` for a coding this layer cannot decode (`br`), a body that does
/// not decode, or one past [`MAX_DECODED`].
fn decode(coding: &str, body: &Bytes) -> Option<Bytes> {
    let mut bytes = body.clone();
    for coding in coding.rsplit(',').map(str::trim).filter(|c| !c.is_empty()) {
        let mut decoded = Vec::new();
        let read = match coding.to_ascii_lowercase().as_str() {
            "identity" => continue,
            "gzip" | "x-gzip" => flate2::read::MultiGzDecoder::new(&bytes[..])
                .take(MAX_DECODED + 1)
                .read_to_end(&mut decoded),
            // HTTP's `deflate` is the zlib format (RFC 9110 §8.4.1.2).
            "deflate" => flate2::read::ZlibDecoder::new(&bytes[..])
                .take(MAX_DECODED + 1)
                .read_to_end(&mut decoded),
            "zstd" => zstd::stream::read::Decoder::new(&bytes[..])
                .and_then(|decoder| decoder.take(MAX_DECODED + 1).read_to_end(&mut decoded)),
            _ => return None,
        };
        if read.is_err() || decoded.len() as u64 > MAX_DECODED {
            return None;
        }
        bytes = Bytes::from(decoded);
    }
    Some(bytes)
}

/// A stored response as a replay: same status, headers and body bytes, plus
/// `Idempotent-Replayed: true` (and `Idempotency-Response: not-retained` with an
/// empty body when the body was not kept).
///
/// Always in a coding the retry accepts (PROTOCOL §7, RFC 9110 §12.5.3): a body
/// stored in a content coding the retry's `accept_encoding` does not accept
/// (the first request took gzip, the retry only identity) is decoded, without
/// its `Content-Encoding`, and its strong `ETag` made weak (the bytes differ,
/// the representation does not). A coding that cannot be decoded here is
/// replayed as stored, with a warning.
pub(crate) fn replay(stored: &StoredResponse, accept_encoding: Option<&str>) -> Response<Body> {
    // The body as the handler answered it, whatever the store keeps
    // (`idemgate_core::compression`).
    let stored = match decompress(stored) {
        Ok(stored) => stored,
        Err(error) => {
            tracing::error!(%error, "a stored body cannot be decompressed");
            return crate::ProblemDetails::store_corrupt().into_response();
        }
    };
    let stored = &stored;
    let coding = stored
        .headers
        .iter()
        .filter(|(name, _)| *name == header::CONTENT_ENCODING)
        .filter_map(|(_, value)| value.to_str().ok())
        .collect::<Vec<_>>()
        .join(", ");
    let decoded = match &stored.body {
        StoredBody::Retained(bytes)
            if !coding.is_empty() && !acceptable(Some(&coding), accept_encoding) =>
        {
            let decoded = decode(&coding, bytes);
            if decoded.is_none() {
                tracing::warn!(
                    coding,
                    "a replay's content coding is not accepted by the retry and cannot be decoded; replayed as stored"
                );
            }
            decoded
        }
        _ => None,
    };
    let body = match (&stored.body, &decoded) {
        (_, Some(decoded)) => Body::from(decoded.clone()),
        (StoredBody::Retained(bytes), None) => Body::from(bytes.clone()),
        (StoredBody::NotRetained, None) => Body::empty(),
    };
    let mut response = Response::new(body);
    *response.status_mut() = stored.status;
    let headers = response.headers_mut();
    headers.reserve(stored.headers.len() + 2);
    for (name, value) in &stored.headers {
        if decoded.is_some() && *name == header::CONTENT_ENCODING {
            continue;
        }
        if decoded.is_some() && *name == header::ETAG && !value.as_bytes().starts_with(b"W/") {
            let mut weak = b"W/".to_vec();
            weak.extend_from_slice(value.as_bytes());
            if let Ok(weak) = HeaderValue::from_bytes(&weak) {
                headers.append(name.clone(), weak);
            }
            continue;
        }
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
        let response = replay(&stored, None);
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.headers()[&IDEMPOTENT_REPLAYED], "true");
        assert_eq!(response.headers()[&IDEMPOTENCY_RESPONSE], "not-retained");
        let tags: Vec<_> = response.headers().get_all("x-tag").iter().collect();
        assert_eq!(tags, ["b", "a"]);
    }
}
