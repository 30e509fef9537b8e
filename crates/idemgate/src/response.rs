//! Between live responses and stored ones (PROTOCOL §7).

use std::io::Read;

use axum::body::Body;
use axum::response::IntoResponse;
use bytes::Bytes;
use http::Response;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use idemgate_core::compression::{STORED_CODING, decompress};
use idemgate_core::encoding::acceptable;
use idemgate_core::event_stream::{LAST_EVENT_ID, resume_offset};
use idemgate_core::record::{StoredBody, StoredResponse};

use crate::jsonrpc::{self, RequestId};

pub use idemgate_core::wire::IDEMPOTENT_REPLAYED;

/// Sent with a replay whose body was too large to keep.
pub static IDEMPOTENCY_RESPONSE: HeaderName = HeaderName::from_static("idempotency-response");

/// Sent with a replay made by content-based deduplication (PROTOCOL §16):
/// `Idempotency-Dedup: content`, so a client that sent no key learns why it got
/// an earlier request's answer.
pub static IDEMPOTENCY_DEDUP: HeaderName = HeaderName::from_static("idempotency-dedup");

/// Headers never stored, whatever the configuration: hop-by-hop ones (RFC 9110
/// §7.6.1), `Date` (a replay is sent now), `Content-Length` (recomputed for the
/// replayed body, which may be empty when not retained) and our own markers.
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

/// [`ReplayedHeaders::defaults`].
static REPLAYED_BY_DEFAULT: [HeaderName; 32] = [
    // The representation: what the body is and how to read it.
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LOCATION,
    header::CONTENT_DISPOSITION,
    header::CONTENT_RANGE,
    HeaderName::from_static("content-digest"),
    HeaderName::from_static("repr-digest"),
    header::ETAG,
    header::LAST_MODIFIED,
    header::VARY,
    header::CACHE_CONTROL,
    header::EXPIRES,
    // The outcome: where the created thing is, what to do next.
    header::LOCATION,
    header::LINK,
    header::RETRY_AFTER,
    header::ALLOW,
    HeaderName::from_static("accept-patch"),
    HeaderName::from_static("accept-post"),
    HeaderName::from_static("preference-applied"),
    header::WWW_AUTHENTICATE,
    // The original request's id, as Stripe replays it: a replay is that request's
    // answer, and the id is how its caller finds it in the API's logs (an SDK's
    // `last_response.request_id`).
    HeaderName::from_static("request-id"),
    HeaderName::from_static("x-request-id"),
    // A gRPC answer's coding, and a Trailers-Only answer's outcome, which is
    // in its headers (PROTOCOL §22).
    HeaderName::from_static("grpc-encoding"),
    HeaderName::from_static("grpc-status"),
    HeaderName::from_static("grpc-message"),
    HeaderName::from_static("grpc-status-details-bin"),
    // What a browser needs to hand the replay to the page that asked.
    header::ACCESS_CONTROL_ALLOW_ORIGIN,
    header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
    header::ACCESS_CONTROL_EXPOSE_HEADERS,
    header::X_CONTENT_TYPE_OPTIONS,
    header::CONTENT_SECURITY_POLICY,
];

/// Why a name cannot be added to the replayed headers
/// ([`ReplayedHeaders::listable`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnlistableHeader {
    /// Not a valid header name.
    #[error("{0:?} is not a header name")]
    NotAName(String),
    /// `Set-Cookie` is switched on by itself, never by listing it.
    #[error("Set-Cookie has its own switch")]
    SetCookie,
    /// A header that is never stored (hop-by-hop, `Date`, `Content-Length`,
    /// idemgate's own markers).
    #[error(
        "{0} is never stored: hop-by-hop headers, Date, Content-Length and idemgate's own are per response"
    )]
    NeverStored(HeaderName),
}

/// Which headers of a live response are stored for its replays (PROTOCOL §7):
/// only what a replay needs to be the same answer — the representation's
/// metadata, the outcome's pointers, and what a browser needs to read it — plus
/// names the application adds, and the original request's id (`Request-Id`,
/// `X-Request-Id`, as Stripe replays it). Per-response headers (`Date`,
/// `Server`, trace ids, rate-limit counters) are not stored, so a replay never
/// repeats another response's; `Set-Cookie` is stored only when asked for, since
/// replaying a session cookie to whoever holds the key is rarely what you want.
///
/// ```
/// use idemgate::ReplayedHeaders;
/// let replayed = ReplayedHeaders::default()
///     .with_names([http::HeaderName::from_static("x-order-ref")]);
/// assert!(replayed.keeps(&http::header::LOCATION));
/// assert!(replayed.keeps(&http::HeaderName::from_static("x-order-ref")));
/// assert!(replayed.keeps(&http::HeaderName::from_static("x-request-id")));
/// assert!(!replayed.keeps(&http::header::SERVER));
/// assert!(!replayed.keeps(&http::header::SET_COOKIE));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayedHeaders {
    added: Vec<HeaderName>,
    set_cookie: bool,
}

impl ReplayedHeaders {
    /// The headers every replay repeats when the response had them
    /// (`docs/PROTOCOL.md` §7 lists them with the reason for each group).
    pub fn defaults() -> &'static [HeaderName] {
        &REPLAYED_BY_DEFAULT
    }

    /// Also store and replay `names` (an application's `X-Order-Ref`, say).
    /// Hop-by-hop headers, `Date`, `Content-Length` and idemgate's own markers
    /// are never stored, listed or not ([`ReplayedHeaders::listable`] checks a
    /// name given as text).
    pub fn with_names(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        for name in names {
            if !self.added.contains(&name) {
                self.added.push(name);
            }
        }
        self
    }

    /// `text` as a name [`ReplayedHeaders::with_names`] can add — the one check
    /// behind `--replay-header` and a route's `replay_headers`: a header name,
    /// not one that is never stored, and not `Set-Cookie`, which has its own
    /// switch.
    ///
    /// ```
    /// use idemgate::ReplayedHeaders;
    /// assert_eq!(ReplayedHeaders::listable("X-Order-Ref").unwrap(), "x-order-ref");
    /// assert!(ReplayedHeaders::listable("Date").is_err());
    /// assert!(ReplayedHeaders::listable("set-cookie").is_err());
    /// ```
    pub fn listable(text: &str) -> Result<HeaderName, UnlistableHeader> {
        let name = HeaderName::from_bytes(text.trim().as_bytes())
            .map_err(|_| UnlistableHeader::NotAName(text.to_owned()))?;
        if name == header::SET_COOKIE {
            return Err(UnlistableHeader::SetCookie);
        }
        if is_never_stored(&name) {
            return Err(UnlistableHeader::NeverStored(name));
        }
        Ok(name)
    }

    /// Store and replay `Set-Cookie` too (default: not).
    pub fn with_set_cookie(mut self, replay: bool) -> Self {
        self.set_cookie = replay;
        self
    }

    /// Whether a response header named `name` is stored for replays.
    pub fn keeps(&self, name: &HeaderName) -> bool {
        if is_never_stored(name) {
            return false;
        }
        if *name == header::SET_COOKIE {
            return self.set_cookie;
        }
        REPLAYED_BY_DEFAULT.contains(name) || self.added.contains(name)
    }

    /// The headers of a live response that a replay repeats, in order, repeats
    /// kept.
    pub(crate) fn storable(&self, headers: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
        headers
            .iter()
            .filter(|(name, _)| self.keeps(name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    }
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

/// What a retry asks of the replay it may get (PROTOCOL §7, §20): the content
/// codings it accepts, and for an event stream the id of the last event it
/// received.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReplayRequest {
    /// The request's `Accept-Encoding` lines, joined; `None` when it sent none.
    accept_encoding: Option<String>,
    /// The request's `Last-Event-ID` (the HTML standard's reconnection header),
    /// when it is text.
    last_event_id: Option<String>,
    /// On a JSON-RPC route, the request's `id`: the replay answers with it
    /// (PROTOCOL §20).
    jsonrpc_id: Option<RequestId>,
    /// A gRPC call: the layer's problems are answered as gRPC statuses
    /// (PROTOCOL §22).
    grpc: bool,
}

impl ReplayRequest {
    /// The id of the last event the client received, when it resumes a stream.
    pub(crate) fn last_event_id(&self) -> Option<&str> {
        self.last_event_id.as_deref()
    }

    /// The JSON-RPC `id` a replay answers with, on a JSON-RPC route.
    pub(crate) fn jsonrpc_id(&self) -> Option<&RequestId> {
        self.jsonrpc_id.as_ref()
    }

    /// Whether the request is a gRPC call.
    pub(crate) fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// This request, answered on a JSON-RPC route with `id`.
    pub(crate) fn with_jsonrpc_id(mut self, id: RequestId) -> Self {
        self.jsonrpc_id = Some(id);
        self
    }

    /// Read from a request's headers.
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        let lines: Vec<&str> = headers
            .get_all(header::ACCEPT_ENCODING)
            .iter()
            .map(|value| value.to_str().unwrap_or_default())
            .collect();
        Self {
            accept_encoding: (!lines.is_empty()).then(|| lines.join(", ")),
            last_event_id: headers
                .get(LAST_EVENT_ID)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned),
            jsonrpc_id: None,
            grpc: crate::grpc::is_grpc(headers),
        }
    }
}

/// Whether stored headers say the body is an event stream.
pub(crate) fn is_event_stream(headers: &[(HeaderName, HeaderValue)]) -> bool {
    headers.iter().any(|(name, value)| {
        *name == header::CONTENT_TYPE
            && value.to_str().is_ok_and(|v| {
                v.split(';')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .eq_ignore_ascii_case("text/event-stream")
            })
    })
}

/// The fields of a gRPC Trailers-Only answer that are stored: all but the
/// never-stored ones and `Set-Cookie` — its headers are the call's status and
/// metadata, kept whole as trailers are (PROTOCOL §22).
pub(crate) fn trailers_only_fields(headers: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    headers
        .iter()
        .filter(|(name, _)| !is_never_stored(name) && *name != header::SET_COOKIE)
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

/// `body` in one frame, then `trailers` in a trailers frame when there are
/// any: how a stored answer goes out, first or replayed. Without trailers it
/// is a plain body of a known length.
pub(crate) fn body_with_trailers(body: Bytes, trailers: &[(HeaderName, HeaderValue)]) -> Body {
    if trailers.is_empty() {
        return Body::from(body);
    }
    let mut fields = HeaderMap::with_capacity(trailers.len());
    for (name, value) in trailers {
        fields.append(name.clone(), value.clone());
    }
    let data = (!body.is_empty()).then(|| http_body::Frame::data(body));
    let frames = data
        .into_iter()
        .chain([http_body::Frame::trailers(fields)])
        .map(Ok::<_, std::convert::Infallible>);
    Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
        frames,
    )))
}

/// The fields of `map` as a list, repeats of a name kept in their order.
pub(crate) fn field_list(map: HeaderMap) -> impl Iterator<Item = (HeaderName, HeaderValue)> {
    let mut name = None;
    map.into_iter().filter_map(move |(next, value)| {
        if next.is_some() {
            name = next;
        }
        Some((name.clone()?, value))
    })
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
///
/// An event stream replayed to a retry that sent `Last-Event-ID` starts after
/// that event (PROTOCOL §20, [`resume_offset`], the one reading of the format
/// clients resume by too).
pub(crate) fn replay(stored: &StoredResponse, wants: &ReplayRequest) -> Response<Body> {
    let accept_encoding = wants.accept_encoding.as_deref();
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
    let bytes = match (&stored.body, &decoded) {
        (_, Some(decoded)) => Some(decoded.clone()),
        (StoredBody::Retained(bytes), None) => Some(bytes.clone()),
        // A stream in pieces is replayed from the store (`crate::replaying`),
        // never through here.
        (StoredBody::NotRetained | StoredBody::InPieces(_), None) => None,
    };
    let readable = coding.is_empty() || decoded.is_some();
    let event_stream = is_event_stream(&stored.headers);
    let bytes = match (bytes, &wants.last_event_id) {
        (Some(bytes), Some(last_event_id)) if readable && event_stream => {
            let from = resume_offset(&bytes, last_event_id).unwrap_or(0);
            Some(bytes.slice(from..))
        }
        (bytes, _) => bytes,
    };
    // A JSON-RPC retry's answer carries its own `id` (PROTOCOL §20): other
    // bytes, so no stored length is repeated.
    let answered = match (&bytes, &wants.jsonrpc_id) {
        (Some(bytes), Some(id)) if readable => jsonrpc::answer_for(bytes, event_stream, id),
        _ => None,
    };
    let rewritten = answered.is_some();
    let body = match (answered, bytes) {
        (Some(answered), _) => Body::from(answered),
        (None, Some(bytes)) => body_with_trailers(bytes, &stored.trailers),
        (None, None) => body_with_trailers(Bytes::new(), &stored.trailers),
    };
    let mut response = Response::new(body);
    *response.status_mut() = stored.status;
    let headers = response.headers_mut();
    headers.reserve(stored.headers.len() + 2);
    for (name, value) in &stored.headers {
        if decoded.is_some() && *name == header::CONTENT_ENCODING {
            continue;
        }
        if rewritten && *name == header::CONTENT_LENGTH {
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
        // A gRPC client reads only a status: the call ran, its reply is gone.
        if crate::grpc::is_grpc(headers) && stored.trailers.is_empty() {
            headers.insert(
                crate::grpc::GRPC_STATUS.clone(),
                HeaderValue::from(crate::grpc::NOT_RETAINED.number()),
            );
            headers.insert(
                crate::grpc::GRPC_MESSAGE.clone(),
                HeaderValue::from_static(
                    "the call ran once; its reply was larger than the stored-response limit and was not kept",
                ),
            );
        }
    }
    if !stored.trailers.is_empty() && !rewritten {
        // HTTP/1.1 sends trailers only when the head names them (HTTP/2
        // ignores this).
        let mut names: Vec<&str> = Vec::new();
        for (name, _) in &stored.trailers {
            if !names.contains(&name.as_str()) {
                names.push(name.as_str());
            }
        }
        if let Ok(value) = HeaderValue::from_str(&names.join(", ")) {
            headers.insert(header::TRAILER, value);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    #[test]
    fn an_event_stream_resumes_after_the_event_that_set_the_id() {
        let stream = b"id: 1\ndata: a\n\nid: 2\ndata: b\n\ndata: no id\n\nid: 3\ndata: c\n\n";
        let after = |id: &str| resume_offset(stream, id).map(|at| &stream[at..]);
        assert_eq!(
            after("1"),
            Some(&b"id: 2\ndata: b\n\ndata: no id\n\nid: 3\ndata: c\n\n"[..])
        );
        assert_eq!(after("2"), Some(&b"data: no id\n\nid: 3\ndata: c\n\n"[..]));
        assert_eq!(after("3"), Some(&b""[..]), "after the last: nothing");
        assert_eq!(after("4"), None, "an id no event set: the whole stream");
        assert_eq!(after(""), None);
    }

    #[test]
    fn event_stream_lines_end_in_crlf_lf_or_cr_and_the_last_id_field_counts() {
        for (stream, rest) in [
            (&b"id:7\r\ndata: a\r\n\r\nrest"[..], &b"rest"[..]),
            (&b"id: 7\rdata: a\r\rrest"[..], &b"rest"[..]),
            (&b": comment\nid: 6\nid: 7\n\nrest"[..], &b"rest"[..]),
        ] {
            let at = resume_offset(stream, "7").expect("found");
            assert_eq!(&stream[at..], rest, "{:?}", String::from_utf8_lossy(stream));
        }
        assert_eq!(
            resume_offset(b"id: 7\nid: 8\n\n", "7"),
            None,
            "the event's last id field is its id"
        );
        assert_eq!(
            resume_offset(b"id: 7\ndata: unfinished", "7"),
            None,
            "an event never ended was never dispatched"
        );
    }

    #[test]
    fn a_replayed_event_stream_starts_after_last_event_id_and_others_are_whole() {
        let stream = Bytes::from_static(b"id: 1\ndata: a\n\nid: 2\ndata: b\n\n");
        let stored = |content_type: &'static str| StoredResponse {
            trailers: Vec::new(),
            status: StatusCode::OK,
            headers: vec![(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
            body: StoredBody::Retained(stream.clone()),
        };
        let mut headers = HeaderMap::new();
        headers.insert("last-event-id", HeaderValue::from_static("1"));
        let resumed = ReplayRequest::of(&headers);
        let body = |response: Response<Body>| async move {
            http_body_util::BodyExt::collect(response.into_body())
                .await
                .unwrap()
                .to_bytes()
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let sse = stored("text/event-stream; charset=utf-8");
            assert_eq!(
                body(replay(&sse, &resumed)).await,
                &b"id: 2\ndata: b\n\n"[..]
            );
            assert_eq!(body(replay(&sse, &ReplayRequest::default())).await, stream);
            let json = stored("application/json");
            assert_eq!(
                body(replay(&json, &resumed)).await,
                stream,
                "not a stream: whole"
            );
        });
    }

    #[test]
    fn stores_what_a_replay_needs_in_order_with_repeats() {
        let mut headers = HeaderMap::new();
        headers.append(header::LOCATION, HeaderValue::from_static("/orders/1"));
        headers.append("x-tag", HeaderValue::from_static("b"));
        headers.append(header::SERVER, HeaderValue::from_static("upstream/1.0"));
        headers.append("x-request-id", HeaderValue::from_static("req-1"));
        headers.append("x-ratelimit-remaining", HeaderValue::from_static("99"));
        headers.append(header::LINK, HeaderValue::from_static("</a>; rel=next"));
        headers.append(header::LINK, HeaderValue::from_static("</b>; rel=prev"));
        headers.append("x-tag", HeaderValue::from_static("a"));
        headers.append(
            header::DATE,
            HeaderValue::from_static("Mon, 30 Nov 2026 07:00:00 GMT"),
        );
        headers.append(header::CONNECTION, HeaderValue::from_static("close"));
        headers.append("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.append(header::SET_COOKIE, HeaderValue::from_static("session=abc"));
        headers.append(header::CONTENT_LENGTH, HeaderValue::from_static("12"));
        let kept = |replayed: ReplayedHeaders| -> Vec<String> {
            replayed
                .storable(&headers)
                .into_iter()
                .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
                .collect()
        };
        assert_eq!(
            kept(ReplayedHeaders::default()),
            [
                "location: /orders/1",
                "x-request-id: req-1",
                "link: </a>; rel=next",
                "link: </b>; rel=prev"
            ]
        );
        let tagged = ReplayedHeaders::default().with_names([
            HeaderName::from_static("x-tag"),
            // Listed or not, never stored.
            header::CONTENT_LENGTH,
            header::CONNECTION,
            header::DATE,
        ]);
        assert_eq!(
            kept(tagged.clone()),
            [
                "location: /orders/1",
                "x-tag: b",
                "x-tag: a",
                "x-request-id: req-1",
                "link: </a>; rel=next",
                "link: </b>; rel=prev"
            ]
        );
        assert!(
            !kept(tagged.clone())
                .iter()
                .any(|h| h.starts_with("set-cookie"))
        );
        assert!(
            kept(tagged.with_set_cookie(true))
                .iter()
                .any(|h| h == "set-cookie: session=abc")
        );
    }

    #[test]
    fn replay_marks_and_explains_missing_bodies() {
        let stored = StoredResponse {
            trailers: Vec::new(),
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
        let response = replay(&stored, &ReplayRequest::default());
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.headers()[&IDEMPOTENT_REPLAYED], "true");
        assert_eq!(response.headers()[&IDEMPOTENCY_RESPONSE], "not-retained");
        let tags: Vec<_> = response.headers().get_all("x-tag").iter().collect();
        assert_eq!(tags, ["b", "a"]);
    }
}
