//! The `Idempotency-Key` header (PROTOCOL §2), and where else a route may read
//! its key ([`KeySource`], PROTOCOL §15).

mod protobuf;
mod source;

pub use source::{ContentDedup, KeyInput, KeyOrigin, KeySource, KeySourceError};

use std::fmt;

use http::HeaderMap;
use http::header::HeaderName;
use sha2::{Digest, Sha256};

/// The header this crate reads.
pub static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The default and usual maximum key length, in characters.
pub const DEFAULT_MAX_KEY_LENGTH: usize = 255;

/// A validated idempotency key: the unquoted content of the header.
///
/// `Debug` and `Display` show a short digest, never the key itself: keys are lookup
/// handles and must not end up in logs (PROTOCOL §2, PITFALLS 17).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why an `Idempotency-Key` header was refused. Each answers 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The header is present but the key is empty.
    #[error("the Idempotency-Key is empty")]
    Empty,
    /// The key is longer than the configured maximum.
    #[error("the Idempotency-Key is longer than {max} characters")]
    TooLong {
        /// The configured maximum.
        max: usize,
    },
    /// A control character, a non-ASCII byte, or a character the bare form forbids.
    #[error("the Idempotency-Key contains a character that is not allowed")]
    InvalidCharacter,
    /// Two or more `Idempotency-Key` header lines.
    #[error("more than one Idempotency-Key header line")]
    Repeated,
    /// A comma-separated list (what proxies make of repeated headers).
    #[error("the Idempotency-Key is a list of several items")]
    List,
    /// An sf-string followed by `;parameters`.
    #[error("the Idempotency-Key carries parameters")]
    Parameters,
    /// A quoted string that is not closed, or a bad escape.
    #[error("the Idempotency-Key is a malformed quoted string")]
    Malformed,
    /// A key read from the path, a query parameter or the body begins or ends with
    /// whitespace: refused rather than trimmed, so `" a"` never silently names the
    /// operation `"a"` (PROTOCOL §15).
    #[error("the idempotency key begins or ends with whitespace")]
    Whitespace,
    /// The route reads its key from a JSON body field, and the value there is not a
    /// string.
    #[error("the idempotency key field of the body is not a JSON string")]
    NotAString,
    /// The route reads its key from the JSON body, which does not parse (or names a
    /// member twice, so "the" field would be a guess).
    #[error(
        "the idempotency key is read from the JSON body, which is not valid JSON or names a member twice"
    )]
    BodyNotJson,
    /// The route reads its key from a field of a gRPC message, and the body is
    /// not one whole uncompressed message, or the field is not a string.
    #[error(
        "the idempotency key is read from a field of the gRPC message, which is not one whole uncompressed protobuf message, or the field is not a string"
    )]
    MessageUnreadable,
    /// The `Idempotency-Key` header and the route's own key source carry different
    /// keys: which one names the operation would be a guess (answers
    /// `ambiguous-key`).
    #[error("the Idempotency-Key header and the route's key source carry different keys")]
    Ambiguous,
}

impl IdempotencyKey {
    /// Reads the key from request headers.
    ///
    /// `Ok(None)` when there is no header; an error when there are several lines or
    /// the single value is not a valid key.
    ///
    /// ```
    /// use http::HeaderMap;
    /// use idemgate_core::key::{IdempotencyKey, DEFAULT_MAX_KEY_LENGTH};
    ///
    /// let mut headers = HeaderMap::new();
    /// headers.insert("idempotency-key", "\"8e03978e-40d5-43e8\"".parse().unwrap());
    /// let key = IdempotencyKey::from_headers(&headers, DEFAULT_MAX_KEY_LENGTH).unwrap().unwrap();
    /// assert_eq!(key.as_str(), "8e03978e-40d5-43e8");
    /// ```
    pub fn from_headers(headers: &HeaderMap, max_len: usize) -> Result<Option<Self>, KeyError> {
        let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(KeyError::Repeated);
        }
        Self::parse(value.as_bytes(), max_len).map(Some)
    }

    /// Parses one header value: an RFC 8941 sf-string (`"abc"`) or a bare key (`abc`).
    pub fn parse(value: &[u8], max_len: usize) -> Result<Self, KeyError> {
        let value = trim_ows(value);
        let key = match value.first() {
            Some(b'"') => parse_sf_string(value)?,
            _ => parse_bare(value)?,
        };
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > max_len {
            return Err(KeyError::TooLong { max: max_len });
        }
        Ok(Self(key))
    }

    /// A key taken verbatim from somewhere that is not a header (a path or query
    /// parameter, decoded; a JSON string): 1 to `max_len` printable ASCII
    /// characters, spaces allowed inside but not around it (PROTOCOL §2, §15).
    ///
    /// ```
    /// use idemgate_core::key::{IdempotencyKey, KeyError};
    ///
    /// assert_eq!(IdempotencyKey::from_value("ORD-7", 255).unwrap().as_str(), "ORD-7");
    /// assert_eq!(IdempotencyKey::from_value(" ORD-7", 255), Err(KeyError::Whitespace));
    /// ```
    pub fn from_value(value: &str, max_len: usize) -> Result<Self, KeyError> {
        if value.is_empty() {
            return Err(KeyError::Empty);
        }
        if !value.bytes().all(|b| b == b' ' || is_visible_ascii(b)) {
            return Err(KeyError::InvalidCharacter);
        }
        if value.starts_with(' ') || value.ends_with(' ') {
            return Err(KeyError::Whitespace);
        }
        if value.len() > max_len {
            return Err(KeyError::TooLong { max: max_len });
        }
        Ok(Self(value.to_owned()))
    }

    /// The key itself. Do not log it; log [`IdempotencyKey::digest_prefix`].
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex digits of the key's SHA-256: enough to correlate log lines,
    /// useless for replaying someone's request.
    pub fn digest_prefix(&self) -> String {
        let digest = Sha256::digest(self.0.as_bytes());
        hex::encode(&digest[..6])
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey(sha256:{}…)", self.digest_prefix())
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}…", self.digest_prefix())
    }
}

fn trim_ows(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

fn is_visible_ascii(byte: u8) -> bool {
    (0x21..=0x7e).contains(&byte)
}

/// Bare form: printable ASCII without `,`, `"` or spaces.
fn parse_bare(value: &[u8]) -> Result<String, KeyError> {
    if value.contains(&b',') {
        return Err(KeyError::List);
    }
    if !value.iter().all(|&b| is_visible_ascii(b) && b != b'"') {
        return Err(KeyError::InvalidCharacter);
    }
    Ok(value.iter().map(|&b| char::from(b)).collect())
}

/// RFC 8941 §4.2.5: `"` then printable ASCII with `\"` and `\\` escapes, then `"`.
/// Anything after the closing quote makes it a list (`,`), parameters (`;`), or junk.
fn parse_sf_string(value: &[u8]) -> Result<String, KeyError> {
    let mut out = String::with_capacity(value.len());
    let mut bytes = value[1..].iter().copied();
    loop {
        match bytes.next() {
            None => return Err(KeyError::Malformed),
            Some(b'"') => break,
            Some(b'\\') => match bytes.next() {
                Some(escaped @ (b'"' | b'\\')) => out.push(char::from(escaped)),
                _ => return Err(KeyError::Malformed),
            },
            Some(byte) if byte == b' ' || is_visible_ascii(byte) => out.push(char::from(byte)),
            Some(_) => return Err(KeyError::InvalidCharacter),
        }
    }
    let rest: Vec<u8> = bytes.collect();
    match trim_ows(&rest).first() {
        None => Ok(out),
        Some(b',') => Err(KeyError::List),
        Some(b';') => Err(KeyError::Parameters),
        Some(_) => Err(KeyError::Malformed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn parse(value: &[u8]) -> Result<String, KeyError> {
        IdempotencyKey::parse(value, DEFAULT_MAX_KEY_LENGTH).map(|k| k.0)
    }

    #[test]
    fn accepts_bare_and_quoted_forms() {
        let uuid = "9b1deb4d-3b7d-4bad-9bdd-2b0d7b3dcb6d";
        assert_eq!(parse(uuid.as_bytes()).unwrap(), uuid);
        assert_eq!(parse(format!("\"{uuid}\"").as_bytes()).unwrap(), uuid);
        assert_eq!(parse(b"  abc\t").unwrap(), "abc");
        assert_eq!(
            parse(b"a;b=c").unwrap(),
            "a;b=c",
            "';' is printable ASCII in the bare form"
        );
    }

    #[test]
    fn quoted_form_allows_commas_spaces_and_escapes() {
        assert_eq!(parse(br#""a, b""#).unwrap(), "a, b");
        assert_eq!(
            parse(br#""say \"hi\" \\ bye""#).unwrap(),
            r#"say "hi" \ bye"#
        );
    }

    #[test]
    fn rejects_empty_values() {
        assert_eq!(parse(b""), Err(KeyError::Empty));
        assert_eq!(parse(b"   "), Err(KeyError::Empty));
        assert_eq!(parse(b"\"\""), Err(KeyError::Empty));
    }

    #[test]
    fn enforces_the_length_limit_on_the_unquoted_content() {
        let max = "k".repeat(255);
        assert!(parse(max.as_bytes()).is_ok());
        assert!(parse(format!("\"{max}\"").as_bytes()).is_ok());
        let long = "k".repeat(256);
        assert_eq!(parse(long.as_bytes()), Err(KeyError::TooLong { max: 255 }));
        assert_eq!(
            IdempotencyKey::parse(b"abcdef", 5).map(|k| k.0),
            Err(KeyError::TooLong { max: 5 })
        );
    }

    #[test]
    fn rejects_lists_parameters_and_bad_characters() {
        assert_eq!(parse(b"a,b"), Err(KeyError::List));
        assert_eq!(parse(br#""a", "b""#), Err(KeyError::List));
        assert_eq!(parse(br#""a";p=1"#), Err(KeyError::Parameters));
        assert_eq!(parse(b"a b"), Err(KeyError::InvalidCharacter));
        assert_eq!(parse(b"a\"b"), Err(KeyError::InvalidCharacter));
        assert_eq!(parse(b"a\x01b"), Err(KeyError::InvalidCharacter));
        assert_eq!(parse("ключ".as_bytes()), Err(KeyError::InvalidCharacter));
        assert_eq!(parse(b"\"a\x7fb\""), Err(KeyError::InvalidCharacter));
        assert_eq!(parse(b"\"abc"), Err(KeyError::Malformed));
        assert_eq!(parse(br#""a\nb""#), Err(KeyError::Malformed));
        assert_eq!(parse(br#""a"b"#), Err(KeyError::Malformed));
    }

    #[test]
    fn reads_headers_and_rejects_repeated_lines() {
        let mut headers = HeaderMap::new();
        assert_eq!(IdempotencyKey::from_headers(&headers, 255), Ok(None));
        headers.append(&IDEMPOTENCY_KEY, HeaderValue::from_static("one"));
        assert_eq!(
            IdempotencyKey::from_headers(&headers, 255)
                .unwrap()
                .unwrap()
                .as_str(),
            "one"
        );
        headers.append(&IDEMPOTENCY_KEY, HeaderValue::from_static("one"));
        assert_eq!(
            IdempotencyKey::from_headers(&headers, 255),
            Err(KeyError::Repeated)
        );
    }

    #[test]
    fn debug_and_display_hide_the_key() {
        let key = IdempotencyKey::parse(b"secret-order-key", 255).unwrap();
        assert!(!format!("{key:?}").contains("secret"));
        assert!(!key.to_string().contains("secret"));
        assert_eq!(key.digest_prefix().len(), 12);
    }
}
