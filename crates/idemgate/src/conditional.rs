//! Conditional requests (RFC 9110 §13, PROTOCOL §17) for applications: entity
//! tags, the request's preconditions and their evaluation, so a handler gets
//! "two editors cannot overwrite each other" right without writing the RFC's
//! rules by hand.
//!
//! - [`EntityTag`]: strong and weak tags, parsed and compared as RFC 9110 §8.8.3
//!   says, and [`EntityTag::of_json`], a strong tag for a JSON representation (a
//!   digest of its canonical form, the fingerprint's, so equal JSON has one tag);
//! - [`Preconditions`]: `If-Match`, `If-None-Match`, `If-Unmodified-Since` and
//!   `If-Modified-Since` of a request, an axum extractor (a malformed tag list is
//!   answered 400 `invalid-precondition`; an unparsable date is ignored, as RFC
//!   9110 §13.1.3–§13.1.4 require);
//! - [`Preconditions::evaluate`]: RFC 9110 §13.2.2's order, a pure function of the
//!   request's preconditions, its method and the resource's current
//!   [`Validators`]; [`Preconditions::check`] turns a false condition into the
//!   answer ([`Refusal`]: 304, 412 with the current `ETag`, or 428).
//!
//! A write handler, with the idempotency layer in front of it: the layer replays
//! a retried write whose first attempt succeeded before this code runs, so a stale
//! `If-Match` on a retry is never answered 412 (PROTOCOL §17).
//!
//! ```
//! use axum::{Json, http::{Method, header}, response::IntoResponse};
//! use idemgate::conditional::{EntityTag, Preconditions, Refusal, Validators};
//!
//! async fn rename(pre: Preconditions, Json(name): Json<String>) -> Result<impl IntoResponse, Refusal> {
//!     let current = serde_json::json!({ "id": 7, "name": "old" }); // read it from the database
//!     let validators = Validators::etag(EntityTag::of_json(&current));
//!     pre.require_if_match()?; // 428 when the client sent no If-Match
//!     pre.check(&Method::PATCH, Some(&validators))?; // 412 with the current ETag when stale
//!     let updated = serde_json::json!({ "id": 7, "name": name }); // write it, compare-and-set
//!     let etag = EntityTag::of_json(&updated);
//!     Ok(([(header::ETAG, etag.to_header_value())], Json(updated)))
//! }
//! let app: axum::Router = axum::Router::new().route("/users/7", axum::routing::patch(rename));
//! ```
//!
//! The check and the write must be one step against concurrent writers: compare
//! the version the tag was computed from in the write itself (`UPDATE … WHERE
//! version = ?`) and answer 412 when nothing was updated.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::header::{ETAG, IF_MATCH, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_UNMODIFIED_SINCE};
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use sha2::{Digest, Sha256};

use crate::finality::Finality;
use crate::problem::ProblemDetails;

/// An entity tag (RFC 9110 §8.8.3): an opaque validator of one representation,
/// strong (`"abc"`: the bytes are the same) or weak (`W/"abc"`: equivalent).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct EntityTag {
    weak: bool,
    /// Between the quotes; every byte an `etagc` (`%x21 / %x23-7E / obs-text`).
    opaque: Vec<u8>,
}

/// Why a text is not an entity tag or a list of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidEntityTag {
    /// No opening `"` (after an optional `W/`).
    #[error("an entity tag starts with a double quote (or W/ and a double quote)")]
    NotQuoted,
    /// No closing `"`.
    #[error("an entity tag ends with a double quote")]
    Unterminated,
    /// A byte an entity tag may not hold (a control character, a space).
    #[error("an entity tag holds a byte it may not hold (byte {0:#04x})")]
    Byte(u8),
    /// Something other than a comma after a tag in a list, or `*` inside a list.
    #[error("entity tags in a list are separated by commas, and * stands alone")]
    List,
}

fn is_etagc(byte: u8) -> bool {
    byte == 0x21 || (0x23..=0x7e).contains(&byte) || byte >= 0x80
}

impl EntityTag {
    /// A strong tag with this opaque part (without quotes).
    pub fn strong(opaque: impl Into<Vec<u8>>) -> Result<Self, InvalidEntityTag> {
        Self::checked(false, opaque.into())
    }

    /// A weak tag with this opaque part (without quotes).
    pub fn weak(opaque: impl Into<Vec<u8>>) -> Result<Self, InvalidEntityTag> {
        Self::checked(true, opaque.into())
    }

    fn checked(weak: bool, opaque: Vec<u8>) -> Result<Self, InvalidEntityTag> {
        match opaque.iter().find(|byte| !is_etagc(**byte)) {
            Some(byte) => Err(InvalidEntityTag::Byte(*byte)),
            None => Ok(Self { weak, opaque }),
        }
    }

    /// The strong tag of a JSON representation: the SHA-256 of its canonical
    /// form (the one the request fingerprint uses, PROTOCOL §4), so member order,
    /// whitespace and number spelling do not change it, and any change of a
    /// value does.
    ///
    /// ```
    /// use idemgate::conditional::EntityTag;
    /// let a = EntityTag::of_json(&serde_json::json!({ "note": "x", "id": 1 }));
    /// let b = EntityTag::of_json(&serde_json::json!({ "id": 1, "note": "x" }));
    /// assert_eq!(a, b);
    /// assert!(!a.is_weak());
    /// ```
    pub fn of_json(value: &serde_json::Value) -> Self {
        // Serializing a `Value` cannot fail: its map keys are strings.
        let text = serde_json::to_vec(value).unwrap_or_default();
        let canonical = idemgate_core::fingerprint::canonical_json(&text).unwrap_or(text);
        let digest = Sha256::new()
            .chain_update(b"idemgate/etag/v1\0")
            .chain_update(&canonical)
            .finalize();
        Self {
            weak: false,
            // 128 bits: collisions between two versions of one resource are out
            // of reach, and the header stays short.
            opaque: hex::encode(&digest[..16]).into_bytes(),
        }
    }

    /// Parses one entity tag (`"abc"` or `W/"abc"`), surrounding spaces allowed.
    ///
    /// ```
    /// use idemgate::conditional::EntityTag;
    /// let tag = EntityTag::parse(b"W/\"v1\"").unwrap();
    /// assert!(tag.is_weak());
    /// assert!(EntityTag::parse(b"v1").is_err());
    /// ```
    pub fn parse(text: &[u8]) -> Result<Self, InvalidEntityTag> {
        let text = trim_ows(text);
        let (tag, rest) = Self::parse_prefix(text)?;
        if rest.is_empty() {
            Ok(tag)
        } else {
            Err(InvalidEntityTag::List)
        }
    }

    /// One tag at the start of `text`, and what follows it.
    fn parse_prefix(text: &[u8]) -> Result<(Self, &[u8]), InvalidEntityTag> {
        let (weak, text) = match text.strip_prefix(b"W/") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let text = text
            .strip_prefix(b"\"")
            .ok_or(InvalidEntityTag::NotQuoted)?;
        let end = text
            .iter()
            .position(|byte| *byte == b'"')
            .ok_or(InvalidEntityTag::Unterminated)?;
        let tag = Self::checked(weak, text[..end].to_vec())?;
        Ok((tag, &text[end + 1..]))
    }

    /// Whether it is weak (`W/`).
    pub fn is_weak(&self) -> bool {
        self.weak
    }

    /// The opaque part, without quotes.
    pub fn opaque(&self) -> &[u8] {
        &self.opaque
    }

    /// Strong comparison (RFC 9110 §8.8.3.2): both strong and the same opaque
    /// part. What `If-Match` uses: a write must be based on these exact bytes.
    pub fn strong_eq(&self, other: &Self) -> bool {
        !self.weak && !other.weak && self.opaque == other.opaque
    }

    /// Weak comparison: the same opaque part, weak or not. What `If-None-Match`
    /// uses.
    pub fn weak_eq(&self, other: &Self) -> bool {
        self.opaque == other.opaque
    }

    /// The header value (`"abc"` or `W/"abc"`), for `ETag`.
    pub fn to_header_value(&self) -> HeaderValue {
        let mut bytes = Vec::with_capacity(self.opaque.len() + 4);
        if self.weak {
            bytes.extend_from_slice(b"W/");
        }
        bytes.push(b'"');
        bytes.extend_from_slice(&self.opaque);
        bytes.push(b'"');
        // Every byte is an etagc or a quote, all valid in a header value.
        HeaderValue::from_bytes(&bytes).unwrap_or_else(|_| HeaderValue::from_static("\"\""))
    }
}

impl fmt::Display for EntityTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = if self.weak { "W/" } else { "" };
        write!(f, "{prefix}\"{}\"", String::from_utf8_lossy(&self.opaque))
    }
}

impl fmt::Debug for EntityTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EntityTag({self})")
    }
}

fn trim_ows(mut text: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = text {
        text = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = text {
        text = rest;
    }
    text
}

/// The value of an `If-Match` or `If-None-Match` field: `*` or a list of tags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntityTagList {
    /// `*`: any current representation.
    Any,
    /// The listed tags (possibly none: an empty list matches nothing).
    Tags(Vec<EntityTag>),
}

impl EntityTagList {
    /// Parses the field's lines as one list (RFC 9110 §5.3: repeated lines are
    /// one comma-separated list; empty elements are allowed). A malformed member
    /// makes the whole field malformed, so a typo is never taken as "no match".
    pub fn parse<'a>(lines: impl IntoIterator<Item = &'a [u8]>) -> Result<Self, InvalidEntityTag> {
        let mut tags = Vec::new();
        let mut any = false;
        let mut elements = 0_usize;
        for line in lines {
            let mut rest = trim_ows(line);
            loop {
                while let [b',' | b' ' | b'\t', tail @ ..] = rest {
                    rest = tail;
                }
                if rest.is_empty() {
                    break;
                }
                elements += 1;
                if let Some(tail) = rest.strip_prefix(b"*") {
                    any = true;
                    rest = tail;
                } else {
                    let (tag, tail) = EntityTag::parse_prefix(rest)?;
                    tags.push(tag);
                    rest = tail;
                }
                rest = trim_ows(rest);
                match rest {
                    [] => break,
                    [b',', ..] => {}
                    _ => return Err(InvalidEntityTag::List),
                }
            }
        }
        match (any, elements) {
            (true, 1) => Ok(Self::Any),
            (true, _) => Err(InvalidEntityTag::List),
            (false, _) => Ok(Self::Tags(tags)),
        }
    }

    /// `If-Match`'s condition (RFC 9110 §13.1.1): `*` is true when a current
    /// representation exists; a list is true when one tag matches the current
    /// tag by strong comparison.
    pub fn matches_strong(&self, current: Option<&Validators>) -> bool {
        match (self, current) {
            (_, None) => false,
            (Self::Any, Some(_)) => true,
            (Self::Tags(tags), Some(current)) => current
                .etag
                .as_ref()
                .is_some_and(|etag| tags.iter().any(|tag| tag.strong_eq(etag))),
        }
    }

    /// Whether `If-None-Match` finds the representation (its condition is then
    /// false, RFC 9110 §13.1.2): `*` when one exists, else a tag that matches
    /// the current tag by weak comparison.
    pub fn matches_weak(&self, current: Option<&Validators>) -> bool {
        match (self, current) {
            (_, None) => false,
            (Self::Any, Some(_)) => true,
            (Self::Tags(tags), Some(current)) => current
                .etag
                .as_ref()
                .is_some_and(|etag| tags.iter().any(|tag| tag.weak_eq(etag))),
        }
    }
}

/// The validators of a resource's current representation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Validators {
    /// Its entity tag, if it has one.
    pub etag: Option<EntityTag>,
    /// When it last changed, if known (compared at whole seconds, the precision
    /// of an HTTP date).
    pub last_modified: Option<SystemTime>,
}

impl Validators {
    /// Validators with an entity tag only.
    pub fn etag(etag: EntityTag) -> Self {
        Self {
            etag: Some(etag),
            last_modified: None,
        }
    }
}

/// What RFC 9110 §13.2.2 says to do with a request.
///
/// Exhaustive on purpose: a handler must answer each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evaluation {
    /// Every condition holds (or there is none): perform the method.
    Proceed,
    /// `GET`/`HEAD` whose `If-None-Match` or `If-Modified-Since` found the
    /// client's copy current: 304.
    NotModified,
    /// A condition is false: do not perform the method, 412.
    PreconditionFailed,
}

/// A request's preconditions (RFC 9110 §13.1), as an axum extractor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Preconditions {
    /// `If-Match`.
    pub if_match: Option<EntityTagList>,
    /// `If-None-Match`.
    pub if_none_match: Option<EntityTagList>,
    /// `If-Unmodified-Since`; `None` when absent or not a valid HTTP date.
    pub if_unmodified_since: Option<SystemTime>,
    /// `If-Modified-Since`; `None` when absent or not a valid HTTP date.
    pub if_modified_since: Option<SystemTime>,
}

/// A request's precondition header that cannot be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {header} header is malformed: {error}")]
pub struct InvalidPreconditions {
    /// The field.
    pub header: HeaderName,
    /// What is wrong with it.
    #[source]
    pub error: InvalidEntityTag,
}

impl Preconditions {
    /// Reads the precondition fields. A malformed `If-Match`/`If-None-Match` is an
    /// error (answered 400: guessing could perform a write the client meant to
    /// guard); a date that does not parse, or comes on several lines, is ignored,
    /// as RFC 9110 §13.1.3–§13.1.4 require.
    ///
    /// ```
    /// use idemgate::conditional::{EntityTagList, Preconditions};
    /// let mut headers = http::HeaderMap::new();
    /// headers.insert(http::header::IF_MATCH, "\"a\", W/\"b\"".parse().unwrap());
    /// let pre = Preconditions::from_headers(&headers).unwrap();
    /// assert!(matches!(pre.if_match, Some(EntityTagList::Tags(ref tags)) if tags.len() == 2));
    /// ```
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, InvalidPreconditions> {
        let list = |name: HeaderName| -> Result<Option<EntityTagList>, InvalidPreconditions> {
            if !headers.contains_key(&name) {
                return Ok(None);
            }
            EntityTagList::parse(headers.get_all(&name).iter().map(HeaderValue::as_bytes))
                .map(Some)
                .map_err(|error| InvalidPreconditions {
                    header: name,
                    error,
                })
        };
        let date = |name: HeaderName| {
            let mut lines = headers.get_all(name).iter();
            match (lines.next(), lines.next()) {
                (Some(line), None) => line
                    .to_str()
                    .ok()
                    .and_then(|text| httpdate::parse_http_date(text.trim()).ok()),
                _ => None,
            }
        };
        Ok(Self {
            if_match: list(IF_MATCH)?,
            if_none_match: list(IF_NONE_MATCH)?,
            if_unmodified_since: date(IF_UNMODIFIED_SINCE),
            if_modified_since: date(IF_MODIFIED_SINCE),
        })
    }

    /// RFC 9110 §13.2.2, steps 1–4, for a resource whose current representation
    /// has `current` validators (`None`: there is none). Pure: the same inputs
    /// give the same answer. The RFC's exception for a write that already
    /// succeeded is the idempotency layer's replay, which runs before this.
    pub fn evaluate(&self, method: &Method, current: Option<&Validators>) -> Evaluation {
        let safe = *method == Method::GET || *method == Method::HEAD;
        let last_modified = current.and_then(|current| current.last_modified.map(whole_seconds));
        // Step 1, else step 2 (If-Unmodified-Since only without If-Match).
        if let Some(if_match) = &self.if_match {
            if !if_match.matches_strong(current) {
                return Evaluation::PreconditionFailed;
            }
        } else if let (Some(since), Some(modified)) = (self.if_unmodified_since, last_modified) {
            if modified > whole_seconds(since) {
                return Evaluation::PreconditionFailed;
            }
        }
        // Step 3, else step 4 (If-Modified-Since only without If-None-Match, and
        // only for GET and HEAD).
        if let Some(if_none_match) = &self.if_none_match {
            if if_none_match.matches_weak(current) {
                return if safe {
                    Evaluation::NotModified
                } else {
                    Evaluation::PreconditionFailed
                };
            }
        } else if let (true, Some(since), Some(modified)) =
            (safe, self.if_modified_since, last_modified)
        {
            if modified <= whole_seconds(since) {
                return Evaluation::NotModified;
            }
        }
        Evaluation::Proceed
    }

    /// [`Preconditions::evaluate`] as a `Result`: `Ok` to perform the method,
    /// else the answer, carrying the current `ETag`.
    pub fn check(&self, method: &Method, current: Option<&Validators>) -> Result<(), Refusal> {
        let etag = || current.and_then(|current| current.etag.clone());
        match self.evaluate(method, current) {
            Evaluation::Proceed => Ok(()),
            Evaluation::NotModified => Err(Refusal::NotModified(etag())),
            Evaluation::PreconditionFailed => Err(Refusal::PreconditionFailed(etag())),
        }
    }

    /// 428 (RFC 6585 §3) unless the request sent `If-Match`: for routes where an
    /// unconditional write would be a lost update waiting to happen.
    pub fn require_if_match(&self) -> Result<(), Refusal> {
        match self.if_match {
            Some(_) => Ok(()),
            None => Err(Refusal::PreconditionRequired),
        }
    }
}

/// Truncates to the whole second, an HTTP date's precision, so a resource
/// modified at 12:00:00.5 is "not modified since 12:00:00" (RFC 9110 §8.8.2.1).
fn whole_seconds(time: SystemTime) -> SystemTime {
    match time.duration_since(UNIX_EPOCH) {
        Ok(since) => UNIX_EPOCH + Duration::from_secs(since.as_secs()),
        Err(_) => time,
    }
}

/// Answers `400 invalid-precondition` for a malformed `If-Match`/`If-None-Match`.
impl<S: Send + Sync> FromRequestParts<S> for Preconditions {
    type Rejection = ProblemDetails;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Self::from_headers(&parts.headers).map_err(|error| {
            ProblemDetails::new(
                StatusCode::BAD_REQUEST,
                "invalid-precondition",
                "Invalid precondition",
                error.to_string(),
            )
        })
    }
}

/// A request not performed because of its preconditions.
///
/// Each is marked [`Finality::Rejected`]: nothing happened, so the idempotency
/// record is undone (PROTOCOL §8) and the client may re-read and retry with the
/// same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 304, with the current `ETag`.
    NotModified(Option<EntityTag>),
    /// 412 `precondition-failed`, with the current `ETag` as header and as the
    /// `etag` member, so the client can re-read or rebase.
    PreconditionFailed(Option<EntityTag>),
    /// 428 `precondition-required`: the route requires `If-Match`.
    PreconditionRequired,
}

impl Refusal {
    /// The problem sent for a 412 or 428 (`None` for a 304, which has no body).
    pub fn problem(&self) -> Option<ProblemDetails> {
        match self {
            Self::NotModified(_) => None,
            Self::PreconditionFailed(etag) => {
                let problem = ProblemDetails::new(
                    StatusCode::PRECONDITION_FAILED,
                    "precondition-failed",
                    "Precondition failed",
                    "the resource changed since the representation your If-Match names; read it again and retry against its current ETag",
                );
                Some(match etag {
                    Some(etag) => problem.with_member("etag", etag.to_string()),
                    None => problem,
                })
            }
            Self::PreconditionRequired => Some(ProblemDetails::new(
                StatusCode::PRECONDITION_REQUIRED,
                "precondition-required",
                "Precondition required",
                "this write requires an If-Match header naming the ETag of the representation it is based on",
            )),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let problem = self.problem();
        let etag = match self {
            Self::NotModified(etag) | Self::PreconditionFailed(etag) => etag,
            Self::PreconditionRequired => None,
        };
        let mut response = match problem {
            Some(problem) => (Finality::Rejected, problem).into_response(),
            None => (Finality::Rejected, StatusCode::NOT_MODIFIED).into_response(),
        };
        if let Some(etag) = etag {
            response.headers_mut().insert(ETAG, etag.to_header_value());
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tag(text: &str) -> EntityTag {
        EntityTag::parse(text.as_bytes()).unwrap()
    }

    fn list(text: &str) -> EntityTagList {
        EntityTagList::parse([text.as_bytes()]).unwrap()
    }

    fn current(text: &str) -> Validators {
        Validators::etag(tag(text))
    }

    #[test]
    fn rfc_9110_comparison_table() {
        // RFC 9110 §8.8.3.2, the table.
        let cases = [
            ("W/\"1\"", "W/\"1\"", false, true),
            ("W/\"1\"", "W/\"2\"", false, false),
            ("W/\"1\"", "\"1\"", false, true),
            ("\"1\"", "\"1\"", true, true),
        ];
        for (a, b, strong, weak) in cases {
            assert_eq!(tag(a).strong_eq(&tag(b)), strong, "{a} {b}");
            assert_eq!(tag(a).weak_eq(&tag(b)), weak, "{a} {b}");
        }
    }

    #[test]
    fn parses_lists_across_lines_with_empty_elements_and_commas_inside_tags() {
        let parsed = EntityTagList::parse([&b" , \"a,b\" ,W/\"c\""[..], b"\"d\","]).unwrap();
        assert_eq!(
            parsed,
            EntityTagList::Tags(vec![tag("\"a,b\""), tag("W/\"c\""), tag("\"d\"")])
        );
        assert_eq!(list("*"), EntityTagList::Any);
        assert_eq!(list(""), EntityTagList::Tags(vec![]));
    }

    #[test]
    fn refuses_malformed_lists() {
        for bad in [
            "a",
            "\"a",
            "\"a\" \"b\"",
            "*, \"a\"",
            "w/\"a\"",
            "\"a b\"",
            "**",
        ] {
            assert!(EntityTagList::parse([bad.as_bytes()]).is_err(), "{bad}");
        }
        assert!(EntityTagList::parse([&b"*"[..], b"*"]).is_err());
    }

    #[test]
    fn if_match_is_strong_and_star_needs_a_representation() {
        let pre = |text: &str| Preconditions {
            if_match: Some(list(text)),
            ..Preconditions::default()
        };
        let put = Method::PUT;
        let now = current("\"v1\"");
        assert_eq!(
            pre("\"v1\"").evaluate(&put, Some(&now)),
            Evaluation::Proceed
        );
        assert_eq!(
            pre("\"v0\", \"v1\"").evaluate(&put, Some(&now)),
            Evaluation::Proceed
        );
        assert_eq!(
            pre("W/\"v1\"").evaluate(&put, Some(&now)),
            Evaluation::PreconditionFailed
        );
        assert_eq!(
            pre("\"v0\"").evaluate(&put, Some(&now)),
            Evaluation::PreconditionFailed
        );
        assert_eq!(pre("*").evaluate(&put, Some(&now)), Evaluation::Proceed);
        assert_eq!(
            pre("*").evaluate(&put, None),
            Evaluation::PreconditionFailed
        );
        let weak_current = current("W/\"v1\"");
        assert_eq!(
            pre("W/\"v1\"").evaluate(&put, Some(&weak_current)),
            Evaluation::PreconditionFailed
        );
    }

    #[test]
    fn if_none_match_is_weak_304_for_reads_412_for_writes() {
        let pre = |text: &str| Preconditions {
            if_none_match: Some(list(text)),
            ..Preconditions::default()
        };
        let now = current("\"v1\"");
        assert_eq!(
            pre("W/\"v1\"").evaluate(&Method::GET, Some(&now)),
            Evaluation::NotModified
        );
        assert_eq!(
            pre("\"v1\"").evaluate(&Method::HEAD, Some(&now)),
            Evaluation::NotModified
        );
        assert_eq!(
            pre("\"v0\"").evaluate(&Method::GET, Some(&now)),
            Evaluation::Proceed
        );
        assert_eq!(
            pre("\"v1\"").evaluate(&Method::DELETE, Some(&now)),
            Evaluation::PreconditionFailed
        );
        // Create only if absent.
        assert_eq!(pre("*").evaluate(&Method::PUT, None), Evaluation::Proceed);
        assert_eq!(
            pre("*").evaluate(&Method::PUT, Some(&now)),
            Evaluation::PreconditionFailed
        );
    }

    #[test]
    fn dates_follow_the_order_and_whole_seconds() {
        let modified = UNIX_EPOCH + Duration::from_millis(1_000_500);
        let now = Validators {
            etag: Some(tag("\"v1\"")),
            last_modified: Some(modified),
        };
        let at = |secs: u64| Some(UNIX_EPOCH + Duration::from_secs(secs));
        let ius = |secs| Preconditions {
            if_unmodified_since: at(secs),
            ..Preconditions::default()
        };
        assert_eq!(
            ius(1_000).evaluate(&Method::PUT, Some(&now)),
            Evaluation::Proceed
        );
        assert_eq!(
            ius(999).evaluate(&Method::PUT, Some(&now)),
            Evaluation::PreconditionFailed
        );
        // If-Match present: If-Unmodified-Since is not evaluated.
        let both = Preconditions {
            if_match: Some(list("\"v1\"")),
            ..ius(999)
        };
        assert_eq!(both.evaluate(&Method::PUT, Some(&now)), Evaluation::Proceed);
        // Without a modification date it is ignored.
        assert_eq!(
            ius(1).evaluate(&Method::PUT, Some(&current("\"v1\""))),
            Evaluation::Proceed
        );
        let ims = |secs| Preconditions {
            if_modified_since: at(secs),
            ..Preconditions::default()
        };
        assert_eq!(
            ims(1_000).evaluate(&Method::GET, Some(&now)),
            Evaluation::NotModified
        );
        assert_eq!(
            ims(999).evaluate(&Method::GET, Some(&now)),
            Evaluation::Proceed
        );
        assert_eq!(
            ims(1_000).evaluate(&Method::POST, Some(&now)),
            Evaluation::Proceed
        );
        // If-None-Match present: If-Modified-Since is not evaluated.
        let both = Preconditions {
            if_none_match: Some(list("\"v0\"")),
            ..ims(1_000)
        };
        assert_eq!(both.evaluate(&Method::GET, Some(&now)), Evaluation::Proceed);
    }

    #[test]
    fn headers_malformed_lists_are_errors_and_bad_dates_are_ignored() {
        let mut headers = HeaderMap::new();
        headers.insert(IF_UNMODIFIED_SINCE, HeaderValue::from_static("yesterday"));
        headers.insert(
            IF_MODIFIED_SINCE,
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        let pre = Preconditions::from_headers(&headers).unwrap();
        assert_eq!(pre.if_unmodified_since, None);
        assert_eq!(
            pre.if_modified_since,
            Some(UNIX_EPOCH + Duration::from_secs(784_111_777))
        );
        headers.insert(IF_MATCH, HeaderValue::from_static("v1"));
        let error = Preconditions::from_headers(&headers).unwrap_err();
        assert_eq!(error.header, IF_MATCH);
    }

    #[test]
    fn json_tags_follow_the_canonical_form() {
        let a = EntityTag::of_json(&serde_json::json!({"amount": 1.50, "note": "x"}));
        let b = EntityTag::of_json(&serde_json::json!({"note": "x", "amount": 1.5}));
        let c = EntityTag::of_json(&serde_json::json!({"note": "y", "amount": 1.5}));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(EntityTag::parse(a.to_header_value().as_bytes()).unwrap(), a);
    }

    fn opaque() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(
            prop_oneof![Just(0x21_u8), 0x23_u8..=0x7e, 0x80_u8..=0xff],
            0..12,
        )
    }

    fn any_tag() -> impl Strategy<Value = EntityTag> {
        (any::<bool>(), opaque()).prop_map(|(weak, opaque)| EntityTag { weak, opaque })
    }

    proptest! {
        #[test]
        fn a_tag_round_trips_through_its_header_value(tag in any_tag()) {
            prop_assert_eq!(EntityTag::parse(tag.to_header_value().as_bytes()).unwrap(), tag);
        }

        #[test]
        fn a_list_round_trips(tags in proptest::collection::vec(any_tag(), 0..5)) {
            let joined = tags
                .iter()
                .map(|tag| tag.to_header_value().as_bytes().to_vec())
                .collect::<Vec<_>>()
                .join(&b", "[..]);
            prop_assert_eq!(EntityTagList::parse([&joined[..]]).unwrap(), EntityTagList::Tags(tags));
        }

        #[test]
        fn strong_implies_weak_both_symmetric(a in any_tag(), b in any_tag()) {
            prop_assert_eq!(a.strong_eq(&b), b.strong_eq(&a));
            prop_assert_eq!(a.weak_eq(&b), b.weak_eq(&a));
            prop_assert!(!a.strong_eq(&b) || a.weak_eq(&b));
            prop_assert_eq!(a.strong_eq(&a), !a.is_weak());
            prop_assert!(a.weak_eq(&a));
        }

        #[test]
        fn if_match_proceeds_exactly_when_a_listed_tag_is_strongly_equal(
            tags in proptest::collection::vec(any_tag(), 0..4),
            now in any_tag(),
            method in prop_oneof![Just(Method::PUT), Just(Method::PATCH), Just(Method::DELETE)],
        ) {
            let expected = tags.iter().any(|tag| tag.strong_eq(&now));
            let pre = Preconditions { if_match: Some(EntityTagList::Tags(tags)), ..Preconditions::default() };
            let proceed = pre.evaluate(&method, Some(&Validators::etag(now))) == Evaluation::Proceed;
            prop_assert_eq!(proceed, expected);
        }

        #[test]
        fn arbitrary_field_values_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = EntityTagList::parse([&bytes[..]]);
            let _ = EntityTag::parse(&bytes);
        }
    }
}
