//! Where a route's key comes from (PROTOCOL §15): the `Idempotency-Key` header,
//! another header, a path parameter of the route template, a JSON pointer into
//! the body, a query parameter, or a field of a gRPC call's message.
//!
//! Whatever the source, the value is validated as §2 says and becomes the same
//! [`IdempotencyKey`]: scope, fingerprint, claim, replay and fencing are unchanged.
//! The only rule of its own is ambiguity: the standard header and the route's
//! source both present with different values are refused, before any claim.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use http::HeaderMap;
use http::header::HeaderName;

use super::{IDEMPOTENCY_KEY, IdempotencyKey, KeyError};
use crate::fingerprint::{
    BodySelection, Fingerprint, FingerprintInput, JsonMember, JsonPointer, PointerError, is_json,
    json_member,
};
use crate::wire::is_grpc_content_type;

/// Where a route reads its idempotency key. Written `header:NAME`, `path:PARAM`,
/// `json:/POINTER`, `query:NAME` or `protobuf:FIELD` (the proxy's `key = "…"`);
/// the default is `header:Idempotency-Key`.
///
/// ```
/// use idemgate_core::key::KeySource;
///
/// let source: KeySource = "json:/reference_id".parse().unwrap();
/// assert_eq!(source.to_string(), "json:/reference_id");
/// assert_eq!(source.strategy(), "json");
/// assert_eq!(KeySource::default().to_string(), "header:idempotency-key");
/// assert!("body:/id".parse::<KeySource>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySource {
    /// A request header, parsed as `Idempotency-Key` is (bare or sf-string).
    Header(HeaderName),
    /// A `{PARAM}` segment of the route template (`PUT /orders/{order_id}`). The
    /// scope's path is then the template, so every id shares one scope and the id
    /// alone names the operation.
    Path(String),
    /// The string at a JSON pointer in a JSON body (`/reference_id`, Square's
    /// `/idempotency_key`).
    Json(JsonPointer),
    /// A query parameter (`?request_id=…`).
    Query(String),
    /// The string at a top-level field number of a gRPC call's message
    /// (AIP-155's `request_id`; `protobuf:1`), read without the schema
    /// (PROTOCOL §22).
    Protobuf(u32),
}

impl Default for KeySource {
    fn default() -> Self {
        Self::Header(IDEMPOTENCY_KEY.clone())
    }
}

/// Why a key source's spelling was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeySourceError {
    /// Not one of the four kinds.
    #[error(
        "a key source is \"header:NAME\", \"path:PARAM\", \"json:/POINTER\", \"query:NAME\" or \"protobuf:FIELD\" (got {0:?})"
    )]
    UnknownKind(String),
    /// `header:` with a name that is not a header name.
    #[error("{0:?} is not a header name")]
    HeaderName(String),
    /// `path:` or `query:` with an empty or odd name.
    #[error("a path or query parameter name is letters, digits and '_' (got {0:?})")]
    ParameterName(String),
    /// `json:` with a bad pointer.
    #[error(transparent)]
    Pointer(#[from] PointerError),
    /// `protobuf:` without a field number (1 to 536870911).
    #[error("a protobuf field number is 1 to 536870911 (got {0:?})")]
    FieldNumber(String),
}

impl FromStr for KeySource {
    type Err = KeySourceError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let Some((kind, name)) = text.split_once(':') else {
            return Err(KeySourceError::UnknownKind(text.to_owned()));
        };
        let parameter = |name: &str| {
            if !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
            {
                Ok(name.to_owned())
            } else {
                Err(KeySourceError::ParameterName(name.to_owned()))
            }
        };
        match kind {
            "header" => HeaderName::from_bytes(name.as_bytes())
                .map(Self::Header)
                .map_err(|_| KeySourceError::HeaderName(name.to_owned())),
            "path" => parameter(name).map(Self::Path),
            "json" => Ok(Self::Json(name.parse()?)),
            "query" => parameter(name).map(Self::Query),
            "protobuf" => name
                .parse::<u32>()
                .ok()
                .filter(|number| (1..=MAX_FIELD_NUMBER).contains(number))
                .map(Self::Protobuf)
                .ok_or_else(|| KeySourceError::FieldNumber(name.to_owned())),
            _ => Err(KeySourceError::UnknownKind(text.to_owned())),
        }
    }
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Header(name) => write!(f, "header:{name}"),
            Self::Path(param) => write!(f, "path:{param}"),
            Self::Json(pointer) => write!(f, "json:{pointer}"),
            Self::Query(name) => write!(f, "query:{name}"),
            Self::Protobuf(number) => write!(f, "protobuf:{number}"),
        }
    }
}

/// Where a request's key was found (PROTOCOL §15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOrigin {
    /// The standard `Idempotency-Key` header: what a client sends of its own
    /// accord, on every route.
    StandardHeader,
    /// The route's own source (a path or query parameter, a JSON member, another
    /// header) — alone, or agreeing with the standard header.
    Source,
}

/// What a key is read from: the parts of one request.
#[derive(Debug, Clone, Copy)]
pub struct KeyInput<'a> {
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// The normalized request path.
    pub path: &'a str,
    /// The route template the request matched (`/orders/{order_id}`), if known.
    pub template: Option<&'a str>,
    /// The query string, without `?`.
    pub query: &'a str,
    /// `Content-Type`, if any: a key is read from the body only when it is JSON.
    pub content_type: Option<&'a str>,
    /// The request body (empty unless the source reads it).
    pub body: &'a [u8],
}

impl KeySource {
    /// The strategy's name in metrics: `header`, `path`, `json`, `query` or
    /// `protobuf`.
    pub fn strategy(&self) -> &'static str {
        match self {
            Self::Header(_) => "header",
            Self::Path(_) => "path",
            Self::Json(_) => "json",
            Self::Query(_) => "query",
            Self::Protobuf(_) => "protobuf",
        }
    }

    /// Whether the key is in the body, which must then be read before the key.
    pub fn reads_body(&self) -> bool {
        matches!(self, Self::Json(_) | Self::Protobuf(_))
    }

    /// The path parameter the key is, if it is one: the scope's path is then the
    /// route template (PROTOCOL §15).
    pub fn path_parameter(&self) -> Option<&str> {
        match self {
            Self::Path(param) => Some(param),
            _ => None,
        }
    }

    /// The request's key (PROTOCOL §2, §15): `Ok(None)` when neither the standard
    /// header nor this source has one. The standard header counts on every route;
    /// when it and this source both carry a key they must be the same key, or the
    /// request is refused ([`KeyError::Ambiguous`]).
    ///
    /// ```
    /// use http::HeaderMap;
    /// use idemgate_core::key::{KeyInput, KeySource};
    ///
    /// let source: KeySource = "path:order_id".parse().unwrap();
    /// let headers = HeaderMap::new();
    /// let input = KeyInput {
    ///     headers: &headers, path: "/orders/ORD-7", template: Some("/orders/{order_id}"),
    ///     query: "", content_type: None, body: b"",
    /// };
    /// assert_eq!(source.key(&input, 255).unwrap().unwrap().as_str(), "ORD-7");
    /// ```
    pub fn key(
        &self,
        input: &KeyInput<'_>,
        max_len: usize,
    ) -> Result<Option<IdempotencyKey>, KeyError> {
        Ok(self.locate(input, max_len)?.map(|(key, _)| key))
    }

    /// [`KeySource::key`], and where the key was found: a route that measures
    /// its own source in observe mode still enforces the standard header
    /// (PROTOCOL §16), so the layer must know which of the two named the key.
    pub fn locate(
        &self,
        input: &KeyInput<'_>,
        max_len: usize,
    ) -> Result<Option<(IdempotencyKey, KeyOrigin)>, KeyError> {
        let standard = IdempotencyKey::from_headers(input.headers, max_len)?;
        if self.is_standard_header() {
            return Ok(standard.map(|key| (key, KeyOrigin::StandardHeader)));
        }
        let own = self.own_key(input, max_len)?;
        match (standard, own) {
            (Some(standard), Some(own)) if standard != own => Err(KeyError::Ambiguous),
            (_, Some(own)) => Ok(Some((own, KeyOrigin::Source))),
            (standard, None) => Ok(standard.map(|key| (key, KeyOrigin::StandardHeader))),
        }
    }

    /// Whether this source is the standard `Idempotency-Key` header itself.
    pub fn is_standard_header(&self) -> bool {
        matches!(self, Self::Header(name) if *name == IDEMPOTENCY_KEY)
    }

    /// The key this source alone finds.
    fn own_key(
        &self,
        input: &KeyInput<'_>,
        max_len: usize,
    ) -> Result<Option<IdempotencyKey>, KeyError> {
        match self {
            Self::Header(name) => {
                let mut values = input.headers.get_all(name).iter();
                let Some(value) = values.next() else {
                    return Ok(None);
                };
                if values.next().is_some() {
                    return Err(KeyError::Repeated);
                }
                IdempotencyKey::parse(value.as_bytes(), max_len).map(Some)
            }
            Self::Path(param) => match input
                .template
                .and_then(|template| path_parameter(template, input.path, param))
            {
                Some(raw) => {
                    let decoded =
                        percent_decode(raw.as_bytes(), false).ok_or(KeyError::InvalidCharacter)?;
                    IdempotencyKey::from_value(&decoded, max_len).map(Some)
                }
                None => Ok(None),
            },
            Self::Query(name) => {
                let mut found = None;
                for pair in input.query.split('&').filter(|pair| !pair.is_empty()) {
                    let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
                    if percent_decode(raw_name.as_bytes(), true).as_deref() != Some(name) {
                        continue;
                    }
                    if found.is_some() {
                        return Err(KeyError::Repeated);
                    }
                    found = Some(
                        percent_decode(raw_value.as_bytes(), true)
                            .ok_or(KeyError::InvalidCharacter)?,
                    );
                }
                found
                    .map(|value| IdempotencyKey::from_value(&value, max_len))
                    .transpose()
            }
            Self::Json(pointer) => {
                let is_json_body = input.content_type.is_some_and(is_json);
                if !is_json_body || input.body.is_empty() {
                    return Ok(None);
                }
                match json_member(input.body, pointer) {
                    JsonMember::NotJson => Err(KeyError::BodyNotJson),
                    JsonMember::Absent => Ok(None),
                    JsonMember::Value(value) if value == b"null" => Ok(None),
                    JsonMember::Value(value) => {
                        let text = canonical_string(&value).ok_or(KeyError::NotAString)??;
                        IdempotencyKey::from_value(&text, max_len).map(Some)
                    }
                }
            }
            Self::Protobuf(number) => {
                // A protobuf message: gRPC's default `+proto` form, not `+json`.
                let is_proto = input.content_type.is_some_and(|content_type| {
                    is_grpc_content_type(content_type)
                        && !content_type.to_ascii_lowercase().contains("+json")
                });
                if !is_proto {
                    return Ok(None);
                }
                match super::protobuf::string_field(input.body, *number) {
                    Ok(None) => Ok(None),
                    // Not one message: a streaming call, which has no key in
                    // its messages and passes through unkeyed (PROTOCOL §22).
                    Err(super::protobuf::Unreadable::NotOneMessage) => Ok(None),
                    // An empty string is proto3's default: the field unset.
                    Ok(Some(b"")) => Ok(None),
                    Ok(Some(value)) => {
                        let text =
                            std::str::from_utf8(value).map_err(|_| KeyError::InvalidCharacter)?;
                        IdempotencyKey::from_value(text, max_len).map(Some)
                    }
                    Err(_) => Err(KeyError::MessageUnreadable),
                }
            }
        }
    }
}

/// The largest protobuf field number (2^29 - 1).
const MAX_FIELD_NUMBER: u32 = (1 << 29) - 1;

/// Content-based deduplication (PROTOCOL §16), opt-in per route: a covered
/// request that carries no key gets one from its content — the SHA-256 of its
/// canonical body (§4), or of the values at `fields` — scoped by principal,
/// method and route, kept for `window` (SQS FIFO's `ContentBasedDeduplication`:
/// five minutes). An explicit key always wins.
///
/// Two honest requests with the same content inside the window are folded into
/// one: opt in only where that is what a duplicate means.
///
/// ```
/// use std::time::Duration;
/// use idemgate_core::fingerprint::FingerprintInput;
/// use idemgate_core::key::ContentDedup;
///
/// let dedup = ContentDedup::new(Duration::from_secs(300))
///     .with_fields(vec!["/to".parse().unwrap(), "/amount".parse().unwrap()]);
/// let message = |path, body| FingerprintInput {
///     method: "POST", path, query: "", content_type: Some("application/json"),
///     headers: &[], body,
/// };
/// let q1 = |body| dedup.key(&message("/messages/q1", body));
/// assert_eq!(
///     q1(br#"{"to":"bob","amount":5,"note":"a"}"#),
///     q1(br#"{ "note": "b", "amount": 5, "to": "bob" }"#),
/// );
/// assert_ne!(q1(br#"{"to":"bob","amount":6}"#), q1(br#"{"to":"bob","amount":5}"#));
/// // The same message to another queue is another operation.
/// let body = br#"{"to":"bob","amount":5}"#;
/// assert_ne!(dedup.key(&message("/messages/q2", body)), q1(body));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentDedup {
    window: Duration,
    fields: Vec<JsonPointer>,
}

impl ContentDedup {
    /// Deduplication over the whole canonical body, for `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            fields: Vec::new(),
        }
    }

    /// Only the values at `fields` count (a JSON body; any other body counts
    /// whole). Empty: the whole body.
    #[must_use]
    pub fn with_fields(mut self, fields: Vec<JsonPointer>) -> Self {
        self.fields = fields;
        self
    }

    /// How long a request's content is remembered: the record's TTL.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// What counts, as a fingerprint selection: a request whose counted content
    /// is the same is a duplicate (replayed), never a 422.
    pub fn selection(&self) -> BodySelection {
        if self.fields.is_empty() {
            BodySelection::Whole
        } else {
            BodySelection::Only(self.fields.clone())
        }
    }

    /// The key of a keyless request: 64 hex digits of its fingerprint over the
    /// selected content (PROTOCOL §16) — the fingerprint the record is claimed
    /// with, of the same method, concrete path, query and headers. Two requests
    /// with one key therefore always have one fingerprint: a duplicate is
    /// replayed, never a 422, and the same content sent to another path (another
    /// queue, another account) is another operation.
    pub fn key(&self, request: &FingerprintInput<'_>) -> IdempotencyKey {
        let digest = Fingerprint::of_selected(*request, &self.selection());
        // Hex digits: always a valid key, whatever the configured maximum length.
        IdempotencyKey(crate::hex_text::encode(digest.as_bytes()))
    }
}

/// The segment of `path` where `template` has `{param}`, when the two have the
/// same shape up to it.
fn path_parameter<'a>(template: &str, path: &'a str, param: &str) -> Option<&'a str> {
    let wanted = format!("{{{param}}}");
    let index = template
        .trim_start_matches('/')
        .split('/')
        .position(|segment| segment == wanted)?;
    path.trim_start_matches('/')
        .split('/')
        .nth(index)
        .filter(|segment| !segment.is_empty())
}

/// Percent-decoding (and `+` as a space in a query), to a string: `None` for a
/// bad escape or bytes that are not UTF-8 (a key is ASCII anyway).
fn percent_decode(raw: &[u8], plus_is_space: bool) -> Option<String> {
    let mut out = Vec::with_capacity(raw.len());
    let mut bytes = raw.iter().copied();
    while let Some(byte) = bytes.next() {
        match byte {
            b'%' => {
                let high = (bytes.next()? as char).to_digit(16)?;
                let low = (bytes.next()? as char).to_digit(16)?;
                // Two hex digits are at most 255.
                out.push((high * 16 + low) as u8);
            }
            b'+' if plus_is_space => out.push(b' '),
            other => out.push(other),
        }
    }
    String::from_utf8(out).ok()
}

/// The content of a canonical JSON string (`None` if the value is not a string).
/// The canonical form escapes only `"`, `\` and control characters; a control
/// character is never part of a key, so its escape is an invalid character.
fn canonical_string(value: &[u8]) -> Option<Result<String, KeyError>> {
    let inner = value.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter().copied();
    while let Some(byte) = bytes.next() {
        match byte {
            b'\\' => match bytes.next() {
                Some(escaped @ (b'"' | b'\\')) => out.push(escaped),
                _ => return Some(Err(KeyError::InvalidCharacter)),
            },
            other => out.push(other),
        }
    }
    Some(String::from_utf8(out).map_err(|_| KeyError::InvalidCharacter))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const MAX: usize = 255;

    struct Request {
        headers: HeaderMap,
        path: &'static str,
        template: Option<&'static str>,
        query: &'static str,
        content_type: Option<&'static str>,
        body: &'static str,
    }

    impl Request {
        fn new() -> Self {
            Self {
                headers: HeaderMap::new(),
                path: "/orders",
                template: None,
                query: "",
                content_type: Some("application/json"),
                body: "",
            }
        }

        fn header(mut self, name: &'static str, value: &'static str) -> Self {
            self.headers.append(name, HeaderValue::from_static(value));
            self
        }

        fn key(&self, source: &str) -> Result<Option<String>, KeyError> {
            let source: KeySource = source.parse().unwrap();
            source
                .key(
                    &KeyInput {
                        headers: &self.headers,
                        path: self.path,
                        template: self.template,
                        query: self.query,
                        content_type: self.content_type,
                        body: self.body.as_bytes(),
                    },
                    MAX,
                )
                .map(|key| key.map(|key| key.as_str().to_owned()))
        }
    }

    fn json(body: &'static str) -> Request {
        Request {
            body,
            ..Request::new()
        }
    }

    #[test]
    fn spellings_round_trip_and_bad_ones_are_refused() {
        for text in [
            "header:x-idempotency-key",
            "path:order_id",
            "json:/reference_id",
            "json:/a/0/b",
            "query:request_id",
        ] {
            assert_eq!(text.parse::<KeySource>().unwrap().to_string(), text);
        }
        for bad in [
            "reference_id",
            "body:/x",
            "header:",
            "header:bad name",
            "path:",
            "path:{id}",
            "json:reference_id",
            "json:",
            "query:",
        ] {
            assert!(bad.parse::<KeySource>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_default_is_the_standard_header() {
        let request = Request::new().header("idempotency-key", "\"k-1\"");
        assert_eq!(
            request.key("header:Idempotency-Key").unwrap().unwrap(),
            "k-1"
        );
        assert_eq!(Request::new().key("header:Idempotency-Key"), Ok(None));
        assert!(!KeySource::default().reads_body());
    }

    #[test]
    fn another_header_is_parsed_as_the_standard_one() {
        let request = Request::new().header("paypal-request-id", " \"abc\" ");
        assert_eq!(
            request.key("header:PayPal-Request-Id").unwrap().unwrap(),
            "abc"
        );
        let twice = Request::new()
            .header("x-idempotency-key", "a")
            .header("x-idempotency-key", "a");
        assert_eq!(
            twice.key("header:x-idempotency-key"),
            Err(KeyError::Repeated)
        );
        let list = Request::new().header("x-idempotency-key", "a,b");
        assert_eq!(list.key("header:x-idempotency-key"), Err(KeyError::List));
    }

    #[test]
    fn a_path_key_is_the_templates_parameter() {
        let request = Request {
            path: "/api/v1/orders/ORD-42%5F1/items",
            template: Some("/api/v1/orders/{order_id}/items"),
            ..Request::new()
        };
        assert_eq!(request.key("path:order_id").unwrap().unwrap(), "ORD-42_1");
        assert_eq!(request.key("path:other"), Ok(None), "not in the template");
        let no_template = Request {
            template: None,
            ..request
        };
        assert_eq!(no_template.key("path:order_id"), Ok(None));
        let space = Request {
            path: "/orders/a%20",
            template: Some("/orders/{id}"),
            ..Request::new()
        };
        assert_eq!(space.key("path:id"), Err(KeyError::Whitespace));
        let bad_escape = Request {
            path: "/orders/a%zz",
            template: Some("/orders/{id}"),
            ..Request::new()
        };
        assert_eq!(bad_escape.key("path:id"), Err(KeyError::InvalidCharacter));
    }

    #[test]
    fn a_query_key_is_one_decoded_parameter() {
        let request = Request {
            query: "a=1&request_id=r%2D7+x&b",
            ..Request::new()
        };
        assert_eq!(request.key("query:request_id").unwrap().unwrap(), "r-7 x");
        assert_eq!(request.key("query:missing"), Ok(None));
        let twice = Request {
            query: "request_id=1&request_id=1",
            ..Request::new()
        };
        assert_eq!(twice.key("query:request_id"), Err(KeyError::Repeated));
        let empty = Request {
            query: "request_id=",
            ..Request::new()
        };
        assert_eq!(empty.key("query:request_id"), Err(KeyError::Empty));
    }

    #[test]
    fn a_json_key_is_the_same_whatever_the_spelling_of_the_body() {
        let compact = json(r#"{"reference_id":"tr-1","amount":5}"#);
        let respelled = json("{ \"amount\" : 5.0,\n  \"reference_id\": \"tr\\u002d1\" }");
        assert_eq!(compact.key("json:/reference_id").unwrap().unwrap(), "tr-1");
        assert_eq!(
            respelled.key("json:/reference_id"),
            compact.key("json:/reference_id")
        );
        let nested = json(r#"{"meta":{"ids":["x","tr-2"]}}"#);
        assert_eq!(nested.key("json:/meta/ids/1").unwrap().unwrap(), "tr-2");
        let escaped = json(r#"{"k":"a\"b\\c"}"#);
        assert_eq!(escaped.key("json:/k").unwrap().unwrap(), r#"a"b\c"#);
    }

    #[test]
    fn a_json_key_must_be_a_valid_string() {
        assert_eq!(
            json(r#"{"id":7}"#).key("json:/id"),
            Err(KeyError::NotAString)
        );
        assert_eq!(
            json(r#"{"id":{"a":"b"}}"#).key("json:/id"),
            Err(KeyError::NotAString)
        );
        assert_eq!(json(r#"{"id":null}"#).key("json:/id"), Ok(None));
        assert_eq!(json(r#"{"other":"x"}"#).key("json:/id"), Ok(None));
        assert_eq!(json(r#"{"id":""}"#).key("json:/id"), Err(KeyError::Empty));
        assert_eq!(
            json(r#"{"id":"a\nb"}"#).key("json:/id"),
            Err(KeyError::InvalidCharacter)
        );
        assert_eq!(
            json(r#"{"id":"ключ"}"#).key("json:/id"),
            Err(KeyError::InvalidCharacter)
        );
        assert_eq!(
            json(r#"{"id":"x","id":"y"}"#).key("json:/id"),
            Err(KeyError::BodyNotJson)
        );
        assert_eq!(
            json(r#"{"id":"x""#).key("json:/id"),
            Err(KeyError::BodyNotJson)
        );
        assert_eq!(json("").key("json:/id"), Ok(None), "no body, no key");
        let text = Request {
            content_type: Some("text/plain"),
            ..json(r#"{"id":"x"}"#)
        };
        assert_eq!(
            text.key("json:/id"),
            Ok(None),
            "only a JSON body has members"
        );
        let long = json(Box::leak(
            format!(r#"{{"id":"{}"}}"#, "k".repeat(MAX + 1)).into_boxed_str(),
        ));
        assert_eq!(long.key("json:/id"), Err(KeyError::TooLong { max: MAX }));
    }

    /// PROTOCOL §15 applies §2 to the value: a key is exact. Case is part of it
    /// (two keys that differ in case are two operations); surrounding spaces are
    /// refused rather than trimmed, so `" a"` is never silently `"a"`.
    #[test]
    fn case_makes_another_key_and_surrounding_spaces_are_refused() {
        let upper = json(r#"{"id":"TR-1"}"#).key("json:/id").unwrap();
        let lower = json(r#"{"id":"tr-1"}"#).key("json:/id").unwrap();
        assert_ne!(upper, lower);
        assert_eq!(
            json(r#"{"id":" tr-1"}"#).key("json:/id"),
            Err(KeyError::Whitespace)
        );
        assert_eq!(
            json(r#"{"id":"tr-1 "}"#).key("json:/id"),
            Err(KeyError::Whitespace)
        );
        assert_eq!(
            json(r#"{"id":"tr 1"}"#).key("json:/id").unwrap().unwrap(),
            "tr 1"
        );
    }

    #[test]
    fn the_standard_header_and_the_source_must_agree() {
        let same = json(r#"{"id":"k1"}"#).header("idempotency-key", "k1");
        assert_eq!(same.key("json:/id").unwrap().unwrap(), "k1");
        let different = json(r#"{"id":"k1"}"#).header("idempotency-key", "k2");
        assert_eq!(different.key("json:/id"), Err(KeyError::Ambiguous));
        let only_header = json(r#"{"other":1}"#).header("idempotency-key", "k2");
        assert_eq!(only_header.key("json:/id").unwrap().unwrap(), "k2");
        let other_header = Request::new()
            .header("idempotency-key", "k1")
            .header("x-request-id", "k2");
        assert_eq!(
            other_header.key("header:x-request-id"),
            Err(KeyError::Ambiguous)
        );
        let bad_standard = json(r#"{"id":"k1"}"#).header("idempotency-key", "a b");
        assert_eq!(
            bad_standard.key("json:/id"),
            Err(KeyError::InvalidCharacter)
        );
    }
}
