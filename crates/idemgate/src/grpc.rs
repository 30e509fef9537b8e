//! gRPC calls (PROTOCOL §22): a unary call is an HTTP/2 `POST` whose outcome is
//! in its trailers, and whose client reads only gRPC statuses.
//!
//! The protocol is the same as for any request — the key from the
//! `idempotency-key` metadata (a header), the fingerprint over the message
//! bytes (the body), the record keeping the trailers — but three things differ,
//! and this module holds them:
//!
//! - **What the layer answers** is a gRPC status, never an HTTP error: a client
//!   library reads `409` or `problem+json` as a transport failure. Every
//!   problem is sent Trailers-Only (HTTP 200, `grpc-status`, `grpc-message`,
//!   and `grpc-retry-pushback-ms` where a retry should wait: gRFC A6) by
//!   `trailers_only`, its code chosen by `code_for` (the problem itself stays
//!   `crate::problem`'s, which renders it so).
//! - **Which outcome is final** is read from `grpc-status`, not the HTTP
//!   status (always 200): `settlement_status`.
//! - **Only unary calls are keyed**: a keyed request carrying other than one
//!   message is a streaming call, refused (`message_count`).
//!
//! A tonic server is a tower service of HTTP requests, so the layer wraps it
//! in-process, every method at once (`examples/grpc_orders` is a whole
//! service; the key may also be a message's `request_id`,
//! [`crate::key::KeySource::Protobuf`]):
//!
//! ```no_run
//! use idemgate::{IdempotencyLayer, MemoryStore};
//!
//! # async fn serve(services: tonic::service::Routes) -> Result<(), tonic::transport::Error> {
//! tonic::transport::Server::builder()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()))
//!     .add_routes(services) // or .add_service(OrdersServer::new(shop))
//!     .serve("127.0.0.1:50051".parse().unwrap())
//!     .await
//! # }
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use crate::finality::Finality;

/// `grpc-status`: the call's status code, a trailer (or a header, in a
/// Trailers-Only answer).
pub static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`: the status message, percent-encoded.
pub static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// A gRPC answer whose reply was not kept (past the stored-response limit)
/// replays as this status: the call ran once, and what it answered is gone —
/// not a retryable status, so no retry policy asks again.
pub(crate) const NOT_RETAINED: GrpcCode = GrpcCode::DataLoss;

/// `grpc-retry-pushback-ms`: how long a client's retry policy waits before its
/// next attempt (gRFC A6).
pub static GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// `grpc-timeout`: the call's deadline, relative (gRPC over HTTP/2).
pub static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// A `grpc-timeout` value: at most 8 digits and a unit (`H`ours, `M`inutes,
/// `S`econds, `m`illi-, `u` micro-, `n`anoseconds); `None` when malformed.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(idemgate::grpc::parse_timeout(b"1500m"), Some(Duration::from_millis(1500)));
/// assert_eq!(idemgate::grpc::parse_timeout(b"2S"), Some(Duration::from_secs(2)));
/// assert_eq!(idemgate::grpc::parse_timeout(b"123456789S"), None);
/// ```
pub fn parse_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(amount * 3600),
        b'M' => Duration::from_secs(amount * 60),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// A problem answered to a gRPC call keeps its HTTP status here (in the
/// answer's extensions): the record is settled by it as for any request (a
/// proxy's `504` after the request went out may have run, and is stored), not
/// by the gRPC status it is sent as (a `409`'s `ABORTED` is no outcome).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProblemStatus(pub(crate) StatusCode);

/// The status codes of gRPC (`grpc/doc/statuscodes.md`), by their wire number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GrpcCode {
    /// `0`: success.
    Ok = 0,
    /// `1`: cancelled, typically by the caller.
    Cancelled = 1,
    /// `2`: unknown error.
    Unknown = 2,
    /// `3`: the request is wrong whatever the system's state.
    InvalidArgument = 3,
    /// `4`: the deadline expired before the operation could complete.
    DeadlineExceeded = 4,
    /// `5`: an entity was not found.
    NotFound = 5,
    /// `6`: the entity already exists.
    AlreadyExists = 6,
    /// `7`: the caller may not do this.
    PermissionDenied = 7,
    /// `8`: a quota or resource ran out.
    ResourceExhausted = 8,
    /// `9`: the system is not in the state the call needs.
    FailedPrecondition = 9,
    /// `10`: aborted by a concurrency conflict; retry at a higher level.
    Aborted = 10,
    /// `11`: past the valid range.
    OutOfRange = 11,
    /// `12`: not implemented.
    Unimplemented = 12,
    /// `13`: an internal invariant broke.
    Internal = 13,
    /// `14`: the service is unavailable for now; retrying may help.
    Unavailable = 14,
    /// `15`: unrecoverable data loss.
    DataLoss = 15,
    /// `16`: no valid credentials.
    Unauthenticated = 16,
}

const CODES: [(GrpcCode, &str); 17] = [
    (GrpcCode::Ok, "OK"),
    (GrpcCode::Cancelled, "CANCELLED"),
    (GrpcCode::Unknown, "UNKNOWN"),
    (GrpcCode::InvalidArgument, "INVALID_ARGUMENT"),
    (GrpcCode::DeadlineExceeded, "DEADLINE_EXCEEDED"),
    (GrpcCode::NotFound, "NOT_FOUND"),
    (GrpcCode::AlreadyExists, "ALREADY_EXISTS"),
    (GrpcCode::PermissionDenied, "PERMISSION_DENIED"),
    (GrpcCode::ResourceExhausted, "RESOURCE_EXHAUSTED"),
    (GrpcCode::FailedPrecondition, "FAILED_PRECONDITION"),
    (GrpcCode::Aborted, "ABORTED"),
    (GrpcCode::OutOfRange, "OUT_OF_RANGE"),
    (GrpcCode::Unimplemented, "UNIMPLEMENTED"),
    (GrpcCode::Internal, "INTERNAL"),
    (GrpcCode::Unavailable, "UNAVAILABLE"),
    (GrpcCode::DataLoss, "DATA_LOSS"),
    (GrpcCode::Unauthenticated, "UNAUTHENTICATED"),
];

impl GrpcCode {
    /// The code numbered `number`; `None` past 16.
    pub fn from_number(number: u32) -> Option<Self> {
        CODES.get(number as usize).map(|(code, _)| *code)
    }

    /// The wire number.
    pub const fn number(self) -> u32 {
        self as u32
    }

    /// The canonical name (`UNAVAILABLE`).
    pub fn name(self) -> &'static str {
        CODES[self as usize].1
    }

    /// The codes released by default (the claim undone, the key free for the
    /// retry): those a service answers when it did not take the call on —
    /// `UNAVAILABLE`, `RESOURCE_EXHAUSTED`. Not `DEADLINE_EXCEEDED`, which
    /// gRPC says "may be returned even if the operation has completed
    /// successfully" (a grpc-go or grpc-java handler runs on past it): it
    /// follows the server-error policy, as `INTERNAL` does.
    pub const RELEASED_BY_DEFAULT: [GrpcCode; 2] =
        [GrpcCode::Unavailable, GrpcCode::ResourceExhausted];
}

impl fmt::Display for GrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a text is not a gRPC status code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a gRPC status code: {0:?} (a name such as UNAVAILABLE, or a number 0-16)")]
pub struct UnknownGrpcCode(pub String);

impl FromStr for GrpcCode {
    type Err = UnknownGrpcCode;

    /// A code by its name in any case (`unavailable`, `UNAVAILABLE`) or number.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if let Ok(number) = text.parse::<u32>() {
            return Self::from_number(number).ok_or_else(|| UnknownGrpcCode(text.to_owned()));
        }
        CODES
            .iter()
            .find(|(_, name)| name.eq_ignore_ascii_case(text))
            .map(|(code, _)| *code)
            .ok_or_else(|| UnknownGrpcCode(text.to_owned()))
    }
}

impl<'de> serde::Deserialize<'de> for GrpcCode {
    /// A name (`"UNAVAILABLE"`) or a number (`14`, `"14"`).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Written {
            Number(u32),
            Text(String),
        }
        match Written::deserialize(deserializer)? {
            Written::Number(number) => Self::from_number(number)
                .ok_or_else(|| serde::de::Error::custom(UnknownGrpcCode(number.to_string()))),
            Written::Text(text) => text.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Whether `headers` (a request's or a response's) say gRPC:
/// `content-type: application/grpc`, or one of its `+proto`/`+json` forms.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(idemgate_core::wire::is_grpc_content_type)
}

/// Whether `headers` are a gRPC Trailers-Only answer's: the call's status in
/// the headers, nothing after them (an error answered at once, as tonic,
/// grpc-go and grpc-java send every error without a message).
pub(crate) fn is_trailers_only(headers: &HeaderMap) -> bool {
    is_grpc(headers) && headers.contains_key(&GRPC_STATUS)
}

/// The status of a gRPC answer: `grpc-status` in its trailers, or in its
/// headers for a Trailers-Only answer; `UNKNOWN` when neither has a valid one
/// (an answer cut short, or not gRPC after all).
pub(crate) fn status_of(headers: &HeaderMap, trailers: &[(HeaderName, HeaderValue)]) -> GrpcCode {
    trailers
        .iter()
        .find(|(name, _)| *name == GRPC_STATUS)
        .map(|(_, value)| value)
        .or_else(|| headers.get(&GRPC_STATUS))
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse::<u32>().ok())
        .and_then(GrpcCode::from_number)
        .unwrap_or(GrpcCode::Unknown)
}

/// What [`crate::finality::settlement_for`] reads for a gRPC answer with
/// `code`, whose HTTP status is 200 whatever happened: the code in HTTP's
/// terms, and a mark when the route decides for it (PROTOCOL §22).
///
/// - a code in `released` (by default [`GrpcCode::RELEASED_BY_DEFAULT`]):
///   released, the retry runs the call;
/// - `UNKNOWN`, `INTERNAL`, `DATA_LOSS`, `CANCELLED`, `DEADLINE_EXCEEDED` —
///   the call may have run, part way or whole — are server errors: stored as
///   `FAILED` or released by the route's server-error policy, as an HTTP 5xx
///   is;
/// - `OK` and every deterministic error (`INVALID_ARGUMENT`, `NOT_FOUND`,
///   `FAILED_PRECONDITION`, …): final, stored and replayed.
pub(crate) fn settlement_status(
    code: GrpcCode,
    released: &[GrpcCode],
) -> (StatusCode, Option<Finality>) {
    if released.contains(&code) {
        return (StatusCode::OK, Some(Finality::Retryable));
    }
    match code {
        GrpcCode::Unknown
        | GrpcCode::Internal
        | GrpcCode::DataLoss
        | GrpcCode::Cancelled
        | GrpcCode::DeadlineExceeded => (StatusCode::INTERNAL_SERVER_ERROR, None),
        _ => (StatusCode::OK, Some(Finality::Final)),
    }
}

/// The gRPC status a problem (of HTTP `status`, and `slug` under the default
/// base) is answered with: the HTTP status in gRPC's terms — with one choice
/// of idemgate's own: a key reused with another message is
/// `FAILED_PRECONDITION`, not `INVALID_ARGUMENT`. The message is a valid one;
/// what it conflicts with is the state the key is in (gRPC's own rule:
/// "`INVALID_ARGUMENT` indicates arguments that are problematic regardless of
/// the state of the system"), and no retry policy retries it.
pub(crate) fn code_for(status: u16, slug: Option<&str>) -> GrpcCode {
    if slug == Some(idemgate_core::wire::KEY_REUSED) {
        return GrpcCode::FailedPrecondition;
    }
    match status {
        400 | 422 => GrpcCode::InvalidArgument,
        401 => GrpcCode::Unauthenticated,
        403 => GrpcCode::PermissionDenied,
        404 => GrpcCode::NotFound,
        // 409 is the layer's "in progress": another attempt holds the key.
        409 => GrpcCode::Aborted,
        412 | 428 => GrpcCode::FailedPrecondition,
        413 | 429 => GrpcCode::ResourceExhausted,
        499 => GrpcCode::Cancelled,
        501 => GrpcCode::Unimplemented,
        502 | 503 => GrpcCode::Unavailable,
        504 => GrpcCode::DeadlineExceeded,
        500..=599 => GrpcCode::Internal,
        _ => GrpcCode::Unknown,
    }
}

/// A problem of HTTP `status` as a Trailers-Only gRPC answer: HTTP 200,
/// `content-type: application/grpc`, `grpc-status` (`code`), `grpc-message`
/// (`message`) and, when a retry should wait, `grpc-retry-pushback-ms` — and
/// no body (the returned bytes are empty). The HTTP status goes in the
/// extensions ([`ProblemStatus`]) for the settlement.
pub(crate) fn trailers_only(
    status: StatusCode,
    code: GrpcCode,
    message: &str,
    retry_after: Option<Duration>,
) -> (Response<Body>, Bytes) {
    let mut response = Response::new(Body::empty());
    response.extensions_mut().insert(ProblemStatus(status));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS.clone(), HeaderValue::from(code.number()));
    if let Ok(message) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert(GRPC_MESSAGE.clone(), message);
    }
    if let Some(after) = retry_after {
        headers.insert(GRPC_RETRY_PUSHBACK_MS.clone(), pushback(after));
    }
    (response, Bytes::new())
}

fn pushback(after: Duration) -> HeaderValue {
    HeaderValue::from(u64::try_from(after.as_millis()).unwrap_or(u64::MAX))
}

/// `message` as `grpc-message` carries it: bytes outside printable ASCII, and
/// `%`, percent-encoded (the gRPC HTTP/2 protocol's rule).
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &byte in message.as_bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// How many length-prefixed messages a gRPC request body holds (each a
/// compressed flag, a 4-byte big-endian length, the message); `None` when the
/// body is not made of whole messages. A unary call's is exactly one.
pub(crate) fn message_count(body: &[u8]) -> Option<usize> {
    let mut rest = body;
    let mut count = 0;
    while !rest.is_empty() {
        let [flag, a, b, c, d, ..] = *rest else {
            return None;
        };
        if flag > 1 {
            return None;
        }
        let len = usize::try_from(u32::from_be_bytes([a, b, c, d])).ok()?;
        rest = rest.get(len.checked_add(5)?..)?;
        count += 1;
    }
    Some(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_parse_by_name_or_number_and_print_by_name() {
        assert_eq!("unavailable".parse(), Ok(GrpcCode::Unavailable));
        assert_eq!("14".parse(), Ok(GrpcCode::Unavailable));
        assert!("17".parse::<GrpcCode>().is_err());
        assert!("SLOW".parse::<GrpcCode>().is_err());
        for (number, (code, name)) in CODES.iter().enumerate() {
            assert_eq!(code.number() as usize, number);
            assert_eq!(code.name(), *name);
        }
    }

    #[test]
    fn a_route_names_codes_by_name_or_number() {
        let codes: Vec<GrpcCode> = serde_json::from_str(r#"[14, "aborted", "8"]"#).unwrap();
        assert_eq!(
            codes,
            [
                GrpcCode::Unavailable,
                GrpcCode::Aborted,
                GrpcCode::ResourceExhausted
            ]
        );
        assert!(serde_json::from_str::<Vec<GrpcCode>>("[17]").is_err());
        assert!(serde_json::from_str::<Vec<GrpcCode>>(r#"["SLOW"]"#).is_err());
    }

    #[test]
    fn grpc_content_types_are_recognized() {
        let grpc = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(value));
            is_grpc(&headers)
        };
        assert!(grpc("application/grpc"));
        assert!(grpc("application/grpc+proto"));
        assert!(grpc("Application/GRPC; charset=utf-8"));
        assert!(!grpc("application/grpc-web"));
        assert!(!grpc("application/json"));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn the_status_is_read_from_trailers_then_headers() {
        let mut headers = HeaderMap::new();
        assert_eq!(status_of(&headers, &[]), GrpcCode::Unknown);
        headers.insert(GRPC_STATUS.clone(), HeaderValue::from_static("5"));
        assert_eq!(status_of(&headers, &[]), GrpcCode::NotFound);
        let trailers = [(GRPC_STATUS.clone(), HeaderValue::from_static("0"))];
        assert_eq!(status_of(&headers, &trailers), GrpcCode::Ok);
    }

    #[test]
    fn outcomes_settle_by_the_route_s_released_codes() {
        let released = GrpcCode::RELEASED_BY_DEFAULT;
        assert_eq!(
            settlement_status(GrpcCode::Ok, &released),
            (StatusCode::OK, Some(Finality::Final))
        );
        assert_eq!(
            settlement_status(GrpcCode::FailedPrecondition, &released),
            (StatusCode::OK, Some(Finality::Final))
        );
        assert_eq!(
            settlement_status(GrpcCode::Unavailable, &released).1,
            Some(Finality::Retryable)
        );
        assert_eq!(
            settlement_status(GrpcCode::Internal, &released),
            (StatusCode::INTERNAL_SERVER_ERROR, None)
        );
        assert_eq!(
            settlement_status(GrpcCode::DeadlineExceeded, &released),
            (StatusCode::INTERNAL_SERVER_ERROR, None)
        );
        assert_eq!(
            settlement_status(GrpcCode::Aborted, &[GrpcCode::Aborted]).1,
            Some(Finality::Retryable)
        );
    }

    #[test]
    fn problems_become_statuses_with_pushback() {
        let (response, body) = trailers_only(
            StatusCode::CONFLICT,
            code_for(409, Some("in-progress")),
            "in progress",
            Some(Duration::from_millis(1_500)),
        );
        assert_eq!(response.status(), StatusCode::OK);
        assert!(body.is_empty());
        assert_eq!(response.headers()[&GRPC_STATUS], "10");
        assert_eq!(response.headers()[&GRPC_RETRY_PUSHBACK_MS], "1500");
        assert_eq!(
            code_for(422, Some("key-reused")),
            GrpcCode::FailedPrecondition
        );
        assert_eq!(
            code_for(422, Some("invalid-order")),
            GrpcCode::InvalidArgument
        );
        assert_eq!(
            code_for(503, Some("store-unavailable")),
            GrpcCode::Unavailable
        );
        assert_eq!(
            code_for(400, Some("missing-key")),
            GrpcCode::InvalidArgument
        );
        assert_eq!(code_for(500, None), GrpcCode::Internal);
        assert_eq!(code_for(504, None), GrpcCode::DeadlineExceeded);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("in progress: 50%"), "in progress: 50%25");
        assert_eq!(percent_encode("déjà"), "d%C3%A9j%C3%A0");
    }

    #[test]
    fn only_one_whole_message_is_unary() {
        let one = [0, 0, 0, 0, 2, b'h', b'i'];
        assert_eq!(message_count(&one), Some(1));
        assert_eq!(message_count(&[one, one].concat()), Some(2));
        assert_eq!(message_count(&[]), Some(0));
        assert_eq!(message_count(&one[..6]), None);
    }
}
