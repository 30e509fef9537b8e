//! Per-field digests of a JSON body: what lets a 422 name the fields a reused
//! key's second request changed (PROTOCOL §6.3), without storing either body.
//!
//! A record keeps, beside its fingerprint, a short digest of each leaf of the
//! body's canonical form (§4) — each scalar, empty container, or container at the
//! depth limit — named by its JSON pointer. A later request under the same key
//! with another fingerprint computes its own and compares: the pointers whose
//! digests differ, or that only one side has, are the differing fields.
//!
//! Everything is bounded, so a record never grows with its request:
//! - at most [`MAX_FIELDS`] leaves are kept, the first in canonical order (members
//!   by name, elements by index); a body with more, or a leaf whose pointer is
//!   longer than [`MAX_POINTER_LEN`] bytes, is kept *incomplete* and the answer says
//!   so (`differing_complete: false`) instead of guessing;
//! - pointers go at most [`MAX_DEPTH`] tokens deep: a container there is one leaf,
//!   so a change deeper down is named by its ancestor at that depth;
//! - an answer names at most [`MAX_NAMED`] pointers; more are summarised the same
//!   way (`differing_complete: false`).
//!
//! Each digest is the first 8 bytes of a SHA-256 over the record's identity digest,
//! the pointer and the canonical value. Keyed by the identity, equal values in two
//! records have unrelated digests, so the store shows no field shared across
//! operations; 64 bits make a change that goes unnamed (a digest collision) a
//! 2⁻⁶⁴ event, and even then the answer is still the 422 — the fingerprint, not
//! the digests, decides. A digest says no more about a value than the fingerprint
//! already says about the whole body (each can be checked against a guess), and a
//! route that keeps a field out of its fingerprint (`BodySelection::Except`) keeps
//! it out of the digests too.

use std::fmt;

use sha2::{Digest, Sha256};

use super::select::{BodySelection, Selected, children};
use crate::decode::DecodeError;

/// The most leaves a record keeps a digest of.
pub const MAX_FIELDS: usize = 32;
/// The deepest pointer kept (in reference tokens); a container at this depth is
/// one leaf.
pub const MAX_DEPTH: usize = 4;
/// The longest pointer kept, in bytes; a leaf with a longer one is left out.
pub const MAX_POINTER_LEN: usize = 128;
/// The most pointers one answer names.
pub const MAX_NAMED: usize = 16;

const DIGEST_LEN: usize = 8;
/// The first byte of [`FieldDigests::encode`]'s layout.
const ENCODING_VERSION: u8 = 1;

/// One leaf's digest.
type LeafDigest = [u8; DIGEST_LEN];

/// The bounded per-field digests of one request's JSON body, as a record keeps
/// them (see the module docs for the bounds and the digest).
///
/// ```
/// use idemgate_core::fingerprint::FieldDigests;
///
/// let key = [7u8; 32]; // the record's identity digest
/// let first = FieldDigests::of_json(br#"{"amount":1500,"currency":"RUB"}"#, &key).unwrap();
/// let retry = FieldDigests::of_json(br#"{ "currency": "RUB", "amount": 1600 }"#, &key).unwrap();
/// let differing = first.differing(&retry);
/// assert_eq!(differing.pointers, ["/amount"]);
/// assert!(differing.complete);
/// assert!(FieldDigests::of_json(b"not json", &key).is_none());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct FieldDigests {
    /// (pointer, digest) per leaf, in canonical order, at most [`MAX_FIELDS`].
    fields: Vec<(String, LeafDigest)>,
    /// Whether every leaf of the body is in `fields`.
    complete: bool,
}

/// The fields two requests under one key differ in: what a 422 names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Differing {
    /// JSON pointers (RFC 6901), at most [`MAX_NAMED`]: the first request's fields
    /// in canonical order, then those only the later request has.
    pub pointers: Vec<String>,
    /// Whether `pointers` names every body field that differs. `false` when a
    /// body had more fields than a record keeps or the list was cut at
    /// [`MAX_NAMED`]: something else differs too. `true` with no pointers: the
    /// bodies are the same, and the requests differ elsewhere (path, query, or a
    /// fingerprinted header).
    pub complete: bool,
}

impl FieldDigests {
    /// The digests of a JSON text (canonicalized first), keyed by `key` (the
    /// record's identity digest); `None` when `json` is not JSON (or names a
    /// member twice): such a body is fingerprinted raw, and has no fields.
    pub fn of_json(json: &[u8], key: &[u8]) -> Option<Self> {
        let canonical = super::canonical::canonicalize(json).ok()?;
        Some(Self::of_selected(
            &BodySelection::Whole,
            &Selected::Document(canonical),
            key,
        ))
    }

    /// The digests of what a body selection made of a canonical body.
    pub(super) fn of_selected(selection: &BodySelection, selected: &Selected, key: &[u8]) -> Self {
        let mut walk = Walk {
            key,
            fields: Vec::new(),
            complete: true,
            pointer: String::new(),
        };
        match selected {
            Selected::Document(json) => {
                walk.leaves(json, 0..json.len(), 0);
            }
            Selected::Values(values) => {
                // A selection of pointers: each selected value is one leaf,
                // under the pointer that selected it.
                // (Only `BodySelection::Only` selects values.)
                let pointers = match selection {
                    BodySelection::Only(pointers) => pointers.as_slice(),
                    _ => &[],
                };
                for (pointer, value) in pointers.iter().zip(values) {
                    walk.pointer = pointer.to_string();
                    if !walk.push(value.as_deref()) {
                        break;
                    }
                }
            }
        }
        Self {
            fields: walk.fields,
            complete: walk.complete,
        }
    }

    /// How the request these digests describe differs from `later`, a request
    /// under the same key (and so the same digest key) with another fingerprint.
    pub fn differing(&self, later: &Self) -> Differing {
        // What one side did not keep cannot be compared: the answer is then
        // incomplete, whatever the kept fields say.
        let mut complete = self.complete && later.complete;
        let mut pointers = Vec::new();
        for (pointer, digest) in &self.fields {
            match later.get(pointer) {
                Some(other) if other == digest => {}
                Some(_) => pointers.push(pointer.clone()),
                // Absent later: removed, unless the later body was cut short
                // before it.
                None if later.complete => pointers.push(pointer.clone()),
                None => {}
            }
        }
        for (pointer, _) in &later.fields {
            // Only later: added, unless the first body was cut short before it.
            if self.complete && self.get(pointer).is_none() {
                pointers.push(pointer.clone());
            }
        }
        if pointers.len() > MAX_NAMED {
            pointers.truncate(MAX_NAMED);
            complete = false;
        }
        Differing { pointers, complete }
    }

    /// The pointers kept, in canonical order.
    pub fn pointers(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(|(pointer, _)| pointer.as_str())
    }

    /// Whether every leaf of the body was kept.
    pub const fn is_complete(&self) -> bool {
        self.complete
    }

    fn get(&self, pointer: &str) -> Option<&LeafDigest> {
        self.fields
            .iter()
            .find(|(kept, _)| kept == pointer)
            .map(|(_, digest)| digest)
    }

    /// The stored form: `version:u8 complete:u8 count:u8`, then per field
    /// `pointer_len:u8 pointer digest:[u8; 8]`. At most
    /// `3 + MAX_FIELDS × (1 + MAX_POINTER_LEN + 8)` bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            3 + self
                .fields
                .iter()
                .map(|(p, _)| 1 + p.len() + DIGEST_LEN)
                .sum::<usize>(),
        );
        out.push(ENCODING_VERSION);
        out.push(u8::from(self.complete));
        // At most MAX_FIELDS (32) fields of at most MAX_POINTER_LEN (128) bytes
        // each: both fit a byte.
        out.push(self.fields.len() as u8);
        for (pointer, digest) in &self.fields {
            out.push(pointer.len() as u8);
            out.extend_from_slice(pointer.as_bytes());
            out.extend_from_slice(digest);
        }
        out
    }

    /// Reverses [`FieldDigests::encode`]; anything else (another version, a
    /// bound exceeded, a truncated or overlong value) is an error.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let truncated = DecodeError("truncated field digests");
        let [version, complete, count, tail @ ..] = bytes else {
            return Err(truncated);
        };
        let mut rest: &[u8] = tail;
        if *version != ENCODING_VERSION {
            return Err(DecodeError("unknown field digest encoding"));
        }
        let complete = match complete {
            0 => false,
            1 => true,
            _ => return Err(DecodeError("invalid field digest flag")),
        };
        let count = usize::from(*count);
        if count > MAX_FIELDS {
            return Err(DecodeError("too many field digests"));
        }
        let mut fields = Vec::with_capacity(count);
        for _ in 0..count {
            let Some((&len, tail)) = rest.split_first() else {
                return Err(truncated);
            };
            let len = usize::from(len);
            if len > MAX_POINTER_LEN {
                return Err(DecodeError("field pointer too long"));
            }
            if tail.len() < len + DIGEST_LEN {
                return Err(truncated);
            }
            let pointer = std::str::from_utf8(&tail[..len])
                .map_err(|_| DecodeError("field pointer is not UTF-8"))?;
            let mut digest = [0; DIGEST_LEN];
            digest.copy_from_slice(&tail[len..len + DIGEST_LEN]);
            fields.push((pointer.to_owned(), digest));
            rest = &tail[len + DIGEST_LEN..];
        }
        if !rest.is_empty() {
            return Err(DecodeError("trailing bytes after field digests"));
        }
        Ok(Self { fields, complete })
    }
}

impl fmt::Debug for FieldDigests {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FieldDigests")
            .field("pointers", &self.pointers().collect::<Vec<_>>())
            .field("complete", &self.complete)
            .finish()
    }
}

/// The walk over a canonical document that collects its leaves.
struct Walk<'k> {
    key: &'k [u8],
    fields: Vec<(String, LeafDigest)>,
    complete: bool,
    /// The pointer of the value being visited.
    pointer: String,
}

impl Walk<'_> {
    /// Visits the canonical value at `at`, `depth` tokens deep. `false` once
    /// the bound on fields is reached: the walk stops there.
    fn leaves(&mut self, json: &[u8], at: std::ops::Range<usize>, depth: usize) -> bool {
        let container = matches!(json[at.start], b'{' | b'[') && at.len() > 2;
        if !container || depth == MAX_DEPTH {
            return self.push(Some(&json[at]));
        }
        for child in children(json, at) {
            let len = self.pointer.len();
            self.pointer.push('/');
            match &child.name {
                Some(name) => push_token(&mut self.pointer, &json[name.clone()]),
                None => self.pointer.push_str(&child.index.to_string()),
            }
            let more = self.leaves(json, child.value, depth + 1);
            self.pointer.truncate(len);
            if !more {
                return false;
            }
        }
        true
    }

    /// Keeps the leaf at the current pointer (`None`: a selected pointer that
    /// names nothing). `false` when the bound on fields was already reached.
    fn push(&mut self, value: Option<&[u8]>) -> bool {
        if self.fields.len() == MAX_FIELDS {
            self.complete = false;
            return false;
        }
        if self.pointer.len() > MAX_POINTER_LEN {
            self.complete = false;
            return true;
        }
        let mut hasher = Sha256::new();
        let mut field = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_be_bytes());
            hasher.update(bytes);
        };
        field(b"idemgate/field/v1");
        field(self.key);
        field(self.pointer.as_bytes());
        match value {
            Some(value) => {
                field(b"=");
                field(value);
            }
            None => field(b"absent"),
        }
        let hash = hasher.finalize();
        let mut digest = [0; DIGEST_LEN];
        digest.copy_from_slice(&hash[..DIGEST_LEN]);
        self.fields.push((self.pointer.clone(), digest));
        true
    }
}

/// Appends a member name, given in its canonical quoted spelling, as a pointer
/// reference token (RFC 6901: `~` as `~0`, `/` as `~1`).
fn push_token(pointer: &mut String, quoted: &[u8]) {
    // The canonical form is UTF-8 with exactly these escapes (RFC 8785 §3.2.2.2):
    // `\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, and `\u00xx` for other controls.
    let inner = &quoted[1..quoted.len() - 1];
    let text = String::from_utf8_lossy(inner);
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        let c = match c {
            '\\' => match chars.next() {
                Some('b') => '\u{8}',
                Some('f') => '\u{c}',
                Some('n') => '\n',
                Some('r') => '\r',
                Some('t') => '\t',
                Some('u') => {
                    let hex: String = chars.by_ref().take(4).collect();
                    u32::from_str_radix(&hex, 16)
                        .ok()
                        .and_then(char::from_u32)
                        .unwrap_or(char::REPLACEMENT_CHARACTER)
                }
                Some(other) => other, // `\"` and `\\`
                None => break,
            },
            other => other,
        };
        match c {
            '~' => pointer.push_str("~0"),
            '/' => pointer.push_str("~1"),
            other => pointer.push(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [3; 32];

    fn of(json: &str) -> FieldDigests {
        FieldDigests::of_json(json.as_bytes(), &KEY).expect("JSON")
    }

    fn differing(a: &str, b: &str) -> Differing {
        of(a).differing(&of(b))
    }

    #[test]
    fn names_changed_added_and_removed_fields() {
        let order = r#"{"amount":1500,"currency":"RUB","items":[{"sku":"A-1","quantity":1}]}"#;
        assert_eq!(
            of(order).pointers().collect::<Vec<_>>(),
            ["/amount", "/currency", "/items/0/quantity", "/items/0/sku"]
        );
        let d = differing(
            order,
            r#"{"amount":1500,"currency":"RUB","items":[{"sku":"A-1","quantity":2}]}"#,
        );
        assert_eq!(d.pointers, ["/items/0/quantity"]);
        assert!(d.complete);
        let d = differing(
            order,
            r#"{"amount":1500,"items":[{"sku":"A-1","quantity":1}],"note":"x"}"#,
        );
        assert_eq!(d.pointers, ["/currency", "/note"]);
        assert!(d.complete);
        let same = differing(
            order,
            r#"{ "items":[{"quantity":1.0,"sku":"A-1"}], "currency":"RUB", "amount":15e2 }"#,
        );
        assert_eq!(same.pointers, Vec::<String>::new());
        assert!(same.complete, "same body: the difference is elsewhere");
    }

    #[test]
    fn a_type_change_and_empty_containers_are_differences() {
        assert_eq!(differing(r#"{"a":{}}"#, r#"{"a":[]}"#).pointers, ["/a"]);
        assert_eq!(differing(r#"{"a":"1"}"#, r#"{"a":1}"#).pointers, ["/a"]);
        assert_eq!(
            differing(r#"{"a":{"b":1}}"#, r#"{"a":5}"#).pointers,
            ["/a/b", "/a"]
        );
        assert_eq!(differing("1", "2").pointers, [""], "the whole document");
    }

    #[test]
    fn pointers_escape_member_names() {
        let digests = of(r#"{"a/b":1,"c~d":2,"q\"\n":3}"#);
        assert_eq!(
            digests.pointers().collect::<Vec<_>>(),
            ["/a~1b", "/c~0d", "/q\"\n"]
        );
    }

    #[test]
    fn depth_is_bounded_by_the_ancestor_at_the_limit() {
        let a = r#"{"a":{"b":{"c":{"d":{"e":1}}}}}"#;
        let b = r#"{"a":{"b":{"c":{"d":{"e":2}}}}}"#;
        assert_eq!(of(a).pointers().collect::<Vec<_>>(), ["/a/b/c/d"]);
        assert_eq!(differing(a, b).pointers, ["/a/b/c/d"]);
    }

    #[test]
    fn count_is_bounded_and_the_rest_summarised() {
        let wide = |changed: usize| {
            let members: Vec<String> = (0..40)
                .map(|i| format!("\"f{i:02}\":{}", i32::from(i == changed)))
                .collect();
            format!("{{{}}}", members.join(","))
        };
        let digests = of(&wide(99));
        assert_eq!(digests.pointers().count(), MAX_FIELDS);
        assert!(!digests.is_complete());
        // A change among the kept fields is named; that more may differ is said.
        let d = differing(&wide(99), &wide(3));
        assert_eq!(d.pointers, ["/f03"]);
        // Both bodies cut short at the same place: the kept fields compare, and
        // nothing can be said of the others.
        let d = differing(&wide(99), &wide(35));
        assert_eq!(d.pointers, Vec::<String>::new());
        assert!(!d.complete, "a change past the kept fields is not hidden");
        // More differences than an answer names.
        let many_a: Vec<String> = (0..20).map(|i| format!("\"f{i:02}\":0")).collect();
        let many_b: Vec<String> = (0..20).map(|i| format!("\"f{i:02}\":1")).collect();
        let d = differing(
            &format!("{{{}}}", many_a.join(",")),
            &format!("{{{}}}", many_b.join(",")),
        );
        assert_eq!(d.pointers.len(), MAX_NAMED);
        assert!(!d.complete);
    }

    #[test]
    fn long_pointers_are_left_out_and_said() {
        let name = "n".repeat(MAX_POINTER_LEN + 1);
        let digests = of(&format!(r#"{{"{name}":1,"a":2}}"#));
        assert_eq!(digests.pointers().collect::<Vec<_>>(), ["/a"]);
        assert!(!digests.is_complete());
    }

    #[test]
    fn digests_are_keyed_by_the_identity() {
        let a = FieldDigests::of_json(br#"{"a":1}"#, &[1; 32]).unwrap();
        let b = FieldDigests::of_json(br#"{"a":1}"#, &[2; 32]).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn encodings_round_trip_and_reject_garbage() {
        for body in [
            r#"{"amount":1500,"currency":"RUB","items":[{"sku":"A-1","quantity":1}]}"#,
            "{}",
            "null",
            r#"{"é/~":[1,2,3]}"#,
        ] {
            let digests = of(body);
            assert_eq!(FieldDigests::decode(&digests.encode()), Ok(digests));
        }
        let encoded = of(r#"{"amount":1500,"currency":"RUB"}"#).encode();
        for len in 0..encoded.len() {
            assert!(
                FieldDigests::decode(&encoded[..len]).is_err(),
                "prefix {len}"
            );
        }
        let mut trailing = encoded.clone();
        trailing.push(0);
        assert!(FieldDigests::decode(&trailing).is_err());
        let mut version = encoded.clone();
        version[0] = 2;
        assert!(FieldDigests::decode(&version).is_err());
        assert!(FieldDigests::decode(&[1, 1, 33]).is_err());
    }

    #[test]
    fn a_typical_order_costs_under_a_hundred_bytes() {
        // The body `idemgate serve`'s orders API takes (docs/problems.md quotes
        // the number): 4 fields, 44 bytes of pointers, 4 × 9 of lengths and
        // digests, 3 of header.
        let order = r#"{"items":[{"id":42,"quantity":1}],"currency":"RUB","amount":1500}"#;
        let size = of(order).encode().len();
        assert_eq!(size, 83, "docs/problems.md quotes this number");
    }
}
