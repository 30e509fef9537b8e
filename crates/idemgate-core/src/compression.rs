//! The one codec of stored response bodies, the same on every store: a body
//! larger than a threshold is kept zstd-compressed, and the record says so in
//! its stored headers (`idemgate-stored-coding: zstd`, a name no response may
//! carry: the layer never stores it from a handler). A record without the marker
//! (written before this codec, or under the threshold) is the body as is, so old
//! records still replay. The layer compresses before completing and
//! decompresses before replaying; stores keep the bytes they are given.

use bytes::Bytes;
use http::{HeaderName, HeaderValue};

use crate::record::{DecodeError, StoredBody, StoredResponse};

/// The stored header that names the body's storage codec; never sent.
pub static STORED_CODING: HeaderName = HeaderName::from_static("idemgate-stored-coding");

/// The default threshold: bodies larger than this many bytes are compressed.
pub const DEFAULT_THRESHOLD: usize = 1024;

/// The zstd level: the fastest, since compression is on the request path.
pub const LEVEL: i32 = 1;

/// The largest body a stored one decompresses to; a larger one is corrupt.
pub const MAX_DECOMPRESSED: usize = 64 * 1024 * 1024;

/// `response` as it is stored: its body zstd-compressed and marked when it is
/// retained, larger than `threshold` and smaller compressed; else as it is.
///
/// ```
/// use idemgate_core::compression::{compress, decompress};
/// use idemgate_core::record::{StoredBody, StoredResponse};
/// let body = "{\"items\":[".to_owned() + &"{\"id\":42},".repeat(200) + "{}]}";
/// let response = StoredResponse {
///     trailers: Vec::new(),
///     status: http::StatusCode::OK,
///     headers: vec![],
///     body: StoredBody::Retained(body.clone().into()),
/// };
/// let stored = compress(response.clone(), 1024);
/// assert!(matches!(&stored.body, StoredBody::Retained(b) if b.len() < body.len() / 10));
/// assert_eq!(decompress(&stored).unwrap(), response);
/// ```
pub fn compress(response: StoredResponse, threshold: usize) -> StoredResponse {
    let StoredBody::Retained(body) = &response.body else {
        return response;
    };
    if body.len() <= threshold {
        return response;
    }
    match zstd::bulk::compress(body, LEVEL) {
        Ok(compressed) if compressed.len() < body.len() => {
            let mut headers = response.headers;
            headers.push((STORED_CODING.clone(), HeaderValue::from_static("zstd")));
            StoredResponse {
                trailers: response.trailers,
                status: response.status,
                headers,
                body: StoredBody::Retained(Bytes::from(compressed)),
            }
        }
        _ => response,
    }
}

/// Whether `response`'s body is stored compressed.
pub fn is_compressed(response: &StoredResponse) -> bool {
    response
        .headers
        .iter()
        .any(|(name, _)| *name == STORED_CODING)
}

/// `response` as it was before [`compress`]: the body decompressed and the
/// marker gone. A record without the marker is returned as it is.
pub fn decompress(response: &StoredResponse) -> Result<StoredResponse, DecodeError> {
    let Some((_, coding)) = response
        .headers
        .iter()
        .find(|(name, _)| *name == STORED_CODING)
    else {
        return Ok(response.clone());
    };
    if coding != "zstd" {
        return Err(DecodeError("unknown stored body coding"));
    }
    let body = match &response.body {
        StoredBody::Retained(body) => StoredBody::Retained(Bytes::from(
            zstd::bulk::decompress(body, MAX_DECOMPRESSED)
                .map_err(|_| DecodeError("a stored body that does not decompress"))?,
        )),
        StoredBody::NotRetained | StoredBody::InPieces(_) => {
            return Err(DecodeError("a compressed body that was not kept whole"));
        }
    };
    Ok(StoredResponse {
        trailers: response.trailers.clone(),
        status: response.status,
        headers: response
            .headers
            .iter()
            .filter(|(name, _)| *name != STORED_CODING)
            .cloned()
            .collect(),
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn response(body: &[u8]) -> StoredResponse {
        StoredResponse {
            trailers: Vec::new(),
            status: StatusCode::CREATED,
            headers: vec![(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body: StoredBody::Retained(Bytes::copy_from_slice(body)),
        }
    }

    #[test]
    fn small_and_incompressible_bodies_stay_as_they_are() {
        let small = response(b"{\"order\":1}");
        assert_eq!(compress(small.clone(), DEFAULT_THRESHOLD), small);
        let noise: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let noisy = response(&noise);
        let stored = compress(noisy.clone(), DEFAULT_THRESHOLD);
        if !is_compressed(&stored) {
            assert_eq!(stored, noisy);
        }
        assert_eq!(decompress(&stored).unwrap(), noisy);
    }

    #[test]
    fn a_large_body_round_trips_and_old_records_replay_as_they_are() {
        let big = response(
            "{\"sku\":\"SKU-000001\",\"qty\":3},"
                .repeat(3000)
                .as_bytes(),
        );
        let stored = compress(big.clone(), DEFAULT_THRESHOLD);
        assert!(is_compressed(&stored));
        assert_eq!(decompress(&stored).unwrap(), big);
        // A record from before the codec: no marker, the body as is.
        assert_eq!(decompress(&big).unwrap(), big);
    }

    #[test]
    fn a_broken_stored_body_is_an_error() {
        let mut broken = response(b"not zstd");
        broken
            .headers
            .push((STORED_CODING.clone(), HeaderValue::from_static("zstd")));
        assert!(decompress(&broken).is_err());
        broken.headers.last_mut().unwrap().1 = HeaderValue::from_static("lz4");
        assert!(decompress(&broken).is_err());
    }
}

/// What the codec costs and saves, printed: `cargo test --release -p
/// idemgate-core --lib compression::measure -- --ignored --nocapture`
/// (docs/benchmarks.md, "Stored bytes").
#[cfg(test)]
mod measure {
    use super::*;
    use std::time::Instant;

    fn order_body() -> String {
        r#"{"order_id":"0b6e6f3c-4e43-4c61-9a57-1f1e5f3b2a10","amount":1500,"currency":"RUB","status":"paid","items":[{"id":42,"quantity":1}],"created_at":"2026-12-02T10:00:00.000Z"}"#.to_owned()
    }

    fn json_100k() -> String {
        let items: Vec<String> = (0..2650)
            .map(|i| format!(r#"{{"id":{i},"sku":"SKU-{i:06}","qty":{}}}"#, i % 7))
            .collect();
        format!(r#"{{"run":1,"items":[{}]}}"#, items.join(","))
    }

    #[test]
    #[ignore = "a measurement, not a test: run it in release"]
    fn stored_bytes_and_cpu() {
        for (name, body) in [("order", order_body()), ("100 KiB JSON", json_100k())] {
            let response = StoredResponse {
                trailers: Vec::new(),
                status: http::StatusCode::CREATED,
                headers: vec![(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                body: StoredBody::Retained(Bytes::from(body.clone())),
            };
            let rounds = 200u32;
            let started = Instant::now();
            let mut stored = response.clone();
            for _ in 0..rounds {
                stored = compress(response.clone(), DEFAULT_THRESHOLD);
            }
            let compress_each = started.elapsed() / rounds;
            let started = Instant::now();
            for _ in 0..rounds {
                assert_eq!(decompress(&stored).unwrap().body, response.body);
            }
            let decompress_each = started.elapsed() / rounds;
            let StoredBody::Retained(kept) = &stored.body else {
                unreachable!()
            };
            println!(
                "{name}: body {} B, stored {} B, compress {compress_each:?}, decompress {decompress_each:?}",
                body.len(),
                kept.len()
            );
        }
    }
}
