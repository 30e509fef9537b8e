//! What a request asked for (PROTOCOL §4): same key + other fingerprint = 422.

mod canonical;
mod fields;
#[cfg(test)]
mod properties;
mod select;

pub use fields::{Differing, FieldDigests, MAX_DEPTH, MAX_FIELDS, MAX_NAMED, MAX_POINTER_LEN};
use select::Selected;
pub use select::{BodySelection, JsonPointer, PointerError};

use std::fmt;

use sha2::{Digest, Sha256};

/// SHA-256 over method, path, query, selected headers and the (canonicalized) body.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// The parts of a request that make up its fingerprint.
#[derive(Debug, Clone, Copy)]
pub struct FingerprintInput<'a> {
    /// Request method.
    pub method: &'a str,
    /// Normalized path.
    pub path: &'a str,
    /// Query string, without `?`; empty when absent.
    pub query: &'a str,
    /// `Content-Type`, if any: decides whether the body is canonicalized as JSON.
    pub content_type: Option<&'a str>,
    /// Headers configured to join the fingerprint, as (name, value) pairs in a
    /// fixed order.
    pub headers: &'a [(&'a str, &'a [u8])],
    /// The request body.
    pub body: &'a [u8],
}

impl Fingerprint {
    /// The fingerprint of a request.
    ///
    /// ```
    /// use idemgate_core::fingerprint::{Fingerprint, FingerprintInput};
    ///
    /// let input = |body: &'static str| FingerprintInput {
    ///     method: "POST", path: "/orders", query: "",
    ///     content_type: Some("application/json"), headers: &[], body: body.as_bytes(),
    /// };
    /// assert_eq!(
    ///     Fingerprint::of(input(r#"{"amount": 1.50, "currency": "RUB"}"#)),
    ///     Fingerprint::of(input(r#"{"currency":"RUB","amount":1.5}"#)),
    /// );
    /// ```
    pub fn of(input: FingerprintInput<'_>) -> Self {
        Self::of_selected(input, &BodySelection::Whole)
    }

    /// The fingerprint of a request whose JSON body counts only as far as
    /// `selection` says (a route's `fingerprint` setting); see [`BodySelection`].
    /// With [`BodySelection::Whole`] it is [`Fingerprint::of`].
    pub fn of_selected(input: FingerprintInput<'_>, selection: &BodySelection) -> Self {
        Self::compute(input, selection, None).0
    }

    /// [`Fingerprint::of_selected`], and the per-field digests of the same
    /// selection of the body's canonical form, keyed by `key` (the record's
    /// identity digest): what a record keeps so that a later 422 can name the
    /// fields that differ ([`FieldDigests`]). The digests are `None` when the
    /// body is not JSON (it is fingerprinted raw and has no fields). The body is
    /// canonicalized once for both.
    ///
    /// ```
    /// use idemgate_core::fingerprint::{BodySelection, Fingerprint, FingerprintInput};
    ///
    /// let input = |body: &'static str| FingerprintInput {
    ///     method: "POST", path: "/orders", query: "",
    ///     content_type: Some("application/json"), headers: &[], body: body.as_bytes(),
    /// };
    /// let key = [1u8; 32];
    /// let (first, fields) =
    ///     Fingerprint::with_field_digests(input(r#"{"amount":1}"#), &BodySelection::Whole, &key);
    /// assert_eq!(first, Fingerprint::of(input(r#"{"amount":1}"#)));
    /// let (_, later) =
    ///     Fingerprint::with_field_digests(input(r#"{"amount":2}"#), &BodySelection::Whole, &key);
    /// assert_eq!(fields.unwrap().differing(&later.unwrap()).pointers, ["/amount"]);
    /// ```
    pub fn with_field_digests(
        input: FingerprintInput<'_>,
        selection: &BodySelection,
        key: &[u8],
    ) -> (Self, Option<FieldDigests>) {
        Self::compute(input, selection, Some(key))
    }

    fn compute(
        input: FingerprintInput<'_>,
        selection: &BodySelection,
        digest_key: Option<&[u8]>,
    ) -> (Self, Option<FieldDigests>) {
        let mut hasher = Sha256::new();
        let mut field = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_be_bytes());
            hasher.update(bytes);
        };
        field(b"idemgate/fingerprint/v1");
        field(input.method.as_bytes());
        field(input.path.as_bytes());
        field(input.query.as_bytes());
        for (name, value) in input.headers {
            field(name.as_bytes());
            field(value);
        }
        let canonical = input
            .content_type
            .filter(|ct| is_json(ct))
            .and_then(|_| canonical::canonicalize(input.body).ok());
        let selected = canonical.map(|json| selection.apply(json));
        let digests = digest_key.and_then(|key| {
            let selected = selected.as_ref()?;
            Some(FieldDigests::of_selected(selection, selected, key))
        });
        match selected {
            Some(Selected::Document(json)) => {
                field(b"json");
                field(&json);
            }
            Some(Selected::Values(values)) => {
                field(b"json-only");
                for value in &values {
                    match value {
                        Some(value) => {
                            field(b"=");
                            field(value);
                        }
                        None => field(b"absent"),
                    }
                }
            }
            None => {
                field(b"raw");
                field(input.body);
            }
        }
        (Self(hasher.finalize().into()), digests)
    }

    /// A fingerprint from its 32 bytes (as a store read them back).
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The 32 bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({}…)", hex::encode(&self.0[..6]))
    }
}

/// What a JSON body holds at one pointer, for a key read from the body
/// (PROTOCOL §15): read from the canonical form, so any spelling of the same
/// document gives the same value.
pub(crate) enum JsonMember {
    /// The body has no canonical form: not JSON, or a member named twice (which
    /// would make "the" value at the pointer a guess).
    NotJson,
    /// The pointer names nothing.
    Absent,
    /// The canonical text of the value there.
    Value(Vec<u8>),
}

/// The value at `pointer` in the JSON `body`.
pub(crate) fn json_member(body: &[u8], pointer: &JsonPointer) -> JsonMember {
    match canonical::canonicalize(body) {
        Err(_) => JsonMember::NotJson,
        Ok(json) => match select::value_at(&json, pointer) {
            Some(value) => JsonMember::Value(value.to_vec()),
            None => JsonMember::Absent,
        },
    }
}

/// The canonical form of a JSON text (RFC 8785 layout with exact decimal numbers,
/// PROTOCOL §4), the bytes a JSON body's fingerprint hashes; `None` when `json`
/// is not JSON, names a member twice or nests too deep.
///
/// Public so that other digests of JSON (a representation's `ETag`, see
/// `idemgate::conditional`) agree with the fingerprint on which documents are
/// equal, instead of restating the rules.
///
/// ```
/// use idemgate_core::fingerprint::canonical_json;
/// assert_eq!(canonical_json(br#"{ "b": 1.50, "a": [] }"#).unwrap(), br#"{"a":[],"b":1.5}"#);
/// assert_eq!(canonical_json(b"{"), None);
/// ```
pub fn canonical_json(json: &[u8]) -> Option<Vec<u8>> {
    canonical::canonicalize(json).ok()
}

/// `application/json` or any `*/*+json`, parameters ignored, case-insensitive.
pub fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .split_once('/')
            .is_some_and(|(_, subtype)| subtype.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(body: &str) -> Fingerprint {
        Fingerprint::of(FingerprintInput {
            method: "POST",
            path: "/orders",
            query: "",
            content_type: Some("application/json; charset=utf-8"),
            headers: &[],
            body: body.as_bytes(),
        })
    }

    #[test]
    fn equal_json_hashes_equal() {
        assert_eq!(
            json(r#"{"a":1,"b":[true,null]}"#),
            json("{ \"b\": [true, null], \"a\": 1.0 }")
        );
    }

    #[test]
    fn any_changed_value_changes_the_hash() {
        let base = json(r#"{"items":[{"id":42,"quantity":1}],"currency":"RUB","amount":1500}"#);
        for changed in [
            r#"{"items":[{"id":42,"quantity":2}],"currency":"RUB","amount":1500}"#,
            r#"{"items":[{"id":42,"quantity":1}],"currency":"USD","amount":1500}"#,
            r#"{"items":[{"id":42,"quantity":1}],"currency":"RUB","amount":1501}"#,
            r#"{"items":[{"id":42,"quantity":1}],"currency":"RUB","amount":"1500"}"#,
            r#"{"items":[{"id":42,"quantity":1}],"currency":"RUB"}"#,
            r#"{"items":[],"currency":"RUB","amount":1500}"#,
        ] {
            assert_ne!(base, json(changed), "{changed}");
        }
        assert_ne!(json("9007199254740993"), json("9007199254740992"));
    }

    #[test]
    fn duplicate_members_are_hashed_raw() {
        // Raw hashing: the same bytes match, a reordering of duplicates does not.
        assert_eq!(json(r#"{"a":1,"a":2}"#), json(r#"{"a":1,"a":2}"#));
        assert_ne!(json(r#"{"a":1,"a":2}"#), json(r#"{"a":2,"a":1}"#));
    }

    #[test]
    fn json_that_is_not_utf8_is_hashed_raw() {
        // RFC 8259 §8.1: JSON is UTF-8. A broken sequence and an overlong `/`
        // inside a string make the body not JSON, so it is hashed as bytes.
        for invalid in [&b"\xc3\x28"[..], &b"\xc0\xaf"[..]] {
            let body = |spacing: &str| {
                let mut body = format!("{{{spacing}\"x\":{spacing}\"").into_bytes();
                body.extend_from_slice(invalid);
                body.extend_from_slice(b"\"}");
                body
            };
            assert!(canonical::canonicalize(&body("")).is_err());
            let hash = |body: &[u8]| {
                Fingerprint::of(FingerprintInput {
                    method: "POST",
                    path: "/orders",
                    query: "",
                    content_type: Some("application/json"),
                    headers: &[],
                    body,
                })
            };
            assert_eq!(hash(&body("")), hash(&body("")));
            assert_ne!(
                hash(&body("")),
                hash(&body(" ")),
                "hashed raw, not canonicalized"
            );
        }
    }

    #[test]
    fn non_json_bodies_are_hashed_raw() {
        let text = |body: &str| {
            Fingerprint::of(FingerprintInput {
                method: "POST",
                path: "/orders",
                query: "",
                content_type: Some("text/plain"),
                headers: &[],
                body: body.as_bytes(),
            })
        };
        assert_ne!(text(r#"{"a":1}"#), text(r#"{ "a": 1 }"#));
        assert_ne!(
            text(r#"{"a":1}"#),
            json(r#"{"a":1}"#),
            "content type is part of the hash"
        );
    }

    #[test]
    fn method_path_query_and_headers_count() {
        let base = FingerprintInput {
            method: "POST",
            path: "/orders",
            query: "a=1",
            content_type: None,
            headers: &[("x-tenant", b"7")],
            body: b"",
        };
        let fp = Fingerprint::of(base);
        assert_ne!(
            fp,
            Fingerprint::of(FingerprintInput {
                method: "PATCH",
                ..base
            })
        );
        assert_ne!(
            fp,
            Fingerprint::of(FingerprintInput {
                path: "/other",
                ..base
            })
        );
        assert_ne!(
            fp,
            Fingerprint::of(FingerprintInput {
                query: "a=2",
                ..base
            })
        );
        assert_ne!(
            fp,
            Fingerprint::of(FingerprintInput {
                headers: &[("x-tenant", b"8")],
                ..base
            })
        );
    }

    #[test]
    fn recognizes_json_media_types() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(is_json("application/problem+json"));
        assert!(is_json("application/vnd.api+json"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/jsonx"));
        assert!(!is_json(""));
    }
}
