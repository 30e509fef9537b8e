//! Which part of a JSON body a fingerprint covers: all of it, only the values at
//! some JSON pointers (RFC 6901), or all of it minus the values at some pointers.
//!
//! A route whose clients put volatile fields in the body (a `sent_at` timestamp, a
//! client trace id) would answer every honest retry with 422; excluding those
//! fields, or naming the few that define the operation, keeps the 422 for real
//! changes only.
//!
//! Selection works on the canonical form the canonicalizer produced, never on the
//! raw body: that text has no whitespace, one spelling per string and member names
//! in one order and without duplicates, so a few lines walk it and a member name
//! is compared by its canonical spelling.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use super::canonical::write_string;

/// A JSON pointer (RFC 6901) naming one value inside a body: `/amount`,
/// `/items/0/id`, `/a~1b` for the member `a/b`.
///
/// The empty pointer (the whole document) is refused: a fingerprint of the whole
/// body is [`BodySelection::Whole`].
///
/// ```
/// use idemgate_core::fingerprint::JsonPointer;
///
/// let pointer: JsonPointer = "/meta/sent_at".parse().unwrap();
/// assert_eq!(pointer.to_string(), "/meta/sent_at");
/// assert!("meta".parse::<JsonPointer>().is_err());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct JsonPointer {
    text: String,
    /// Each reference token as the canonical form spells a member name
    /// (quoted, escaped), so names compare as bytes.
    names: Vec<Vec<u8>>,
    /// Each reference token as an array index, when it is one (`0`, `17`; not
    /// `01` or `-`).
    indices: Vec<Option<usize>>,
}

/// Why a string is not a JSON pointer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PointerError {
    /// Every pointer but the empty one starts with `/`.
    #[error("a JSON pointer starts with '/' (got {0:?})")]
    NoLeadingSlash(String),
    /// The empty pointer names the whole body.
    #[error("the empty JSON pointer names the whole body; select the whole body instead")]
    Empty,
    /// `~` is only written as `~0` (a `~`) or `~1` (a `/`).
    #[error("'~' in a JSON pointer must be followed by 0 or 1 (got {0:?})")]
    BadEscape(String),
}

impl FromStr for JsonPointer {
    type Err = PointerError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.is_empty() {
            return Err(PointerError::Empty);
        }
        let Some(rest) = text.strip_prefix('/') else {
            return Err(PointerError::NoLeadingSlash(text.to_owned()));
        };
        let mut names = Vec::new();
        let mut indices = Vec::new();
        for token in rest.split('/') {
            let unescaped =
                unescape(token).ok_or_else(|| PointerError::BadEscape(text.to_owned()))?;
            let index = (unescaped == "0" || !unescaped.starts_with('0'))
                .then(|| unescaped.parse::<usize>().ok())
                .flatten()
                .filter(|_| unescaped.bytes().all(|b| b.is_ascii_digit()));
            let mut name = Vec::with_capacity(unescaped.len() + 2);
            write_string(&mut name, unescaped.as_bytes());
            names.push(name);
            indices.push(index);
        }
        Ok(Self {
            text: text.to_owned(),
            names,
            indices,
        })
    }
}

/// RFC 6901 §4: `~1` is `/`, `~0` is `~`, and any other `~` is an error.
fn unescape(token: &str) -> Option<String> {
    let mut out = String::with_capacity(token.len());
    let mut chars = token.chars();
    while let Some(c) = chars.next() {
        match c {
            '~' => match chars.next() {
                Some('0') => out.push('~'),
                Some('1') => out.push('/'),
                _ => return None,
            },
            other => out.push(other),
        }
    }
    Some(out)
}

impl fmt::Display for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JsonPointer({:?})", self.text)
    }
}

impl JsonPointer {
    fn depth(&self) -> usize {
        self.names.len()
    }
}

/// Which part of a JSON body the fingerprint covers. A body that is not JSON (or
/// has no canonical form) is fingerprinted whole, as raw bytes, whatever the
/// selection: there are no members to select.
///
/// ```
/// use idemgate_core::fingerprint::{BodySelection, Fingerprint, FingerprintInput};
///
/// let input = |body: &'static str| FingerprintInput {
///     method: "POST", path: "/payments", query: "",
///     content_type: Some("application/json"), headers: &[], body: body.as_bytes(),
/// };
/// let selection = BodySelection::Except(vec!["/sent_at".parse().unwrap()]);
/// assert_eq!(
///     Fingerprint::of_selected(input(r#"{"amount":5,"sent_at":"12:00:01"}"#), &selection),
///     Fingerprint::of_selected(input(r#"{"amount":5,"sent_at":"12:00:09"}"#), &selection),
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BodySelection {
    /// The whole body (the default).
    #[default]
    Whole,
    /// Only the values at these pointers, in this order; a pointer that names
    /// nothing counts as "absent", which differs from every value.
    Only(Vec<JsonPointer>),
    /// The whole body without the values at these pointers (members dropped,
    /// array elements dropped). Pointers that name nothing change nothing, so
    /// such a body hashes as with [`BodySelection::Whole`].
    Except(Vec<JsonPointer>),
}

/// What a selection makes of a canonical JSON body, for the hash.
pub(super) enum Selected {
    /// One canonical JSON text: the whole body, or the body minus the excluded
    /// values.
    Document(Vec<u8>),
    /// The value at each selected pointer, `None` where it names nothing.
    Values(Vec<Option<Vec<u8>>>),
}

impl BodySelection {
    /// Applies the selection to `canonical`, the canonical form of a body.
    pub(super) fn apply(&self, canonical: Vec<u8>) -> Selected {
        match self {
            Self::Whole => Selected::Document(canonical),
            Self::Except(pointers) if pointers.is_empty() => Selected::Document(canonical),
            Self::Except(pointers) => {
                let mut out = Vec::with_capacity(canonical.len());
                let paths: Vec<&JsonPointer> = pointers.iter().collect();
                write_without(&canonical, 0..canonical.len(), &paths, 0, &mut out);
                Selected::Document(out)
            }
            Self::Only(pointers) => Selected::Values(
                pointers
                    .iter()
                    .map(|pointer| find(&canonical, pointer).map(|at| canonical[at].to_vec()))
                    .collect(),
            ),
        }
    }
}

/// The canonical text of the value at `pointer` in the canonical text `json`.
pub(super) fn value_at<'a>(json: &'a [u8], pointer: &JsonPointer) -> Option<&'a [u8]> {
    find(json, pointer).map(|at| &json[at])
}

/// The range of the value at `pointer` in the canonical text `json`.
fn find(json: &[u8], pointer: &JsonPointer) -> Option<Range<usize>> {
    let mut at = 0..json.len();
    for depth in 0..pointer.depth() {
        at = children(json, at)
            .find(|child| child.matches(json, pointer, depth))?
            .value;
    }
    Some(at)
}

/// Writes the canonical value at `at` without the values the `pointers` (all
/// already matched down to `depth`) name below it.
fn write_without(
    json: &[u8],
    at: Range<usize>,
    pointers: &[&JsonPointer],
    depth: usize,
    out: &mut Vec<u8>,
) {
    if pointers.is_empty() || !matches!(json[at.start], b'{' | b'[') {
        out.extend_from_slice(&json[at]);
        return;
    }
    let (open, close) = (json[at.start], json[at.end - 1]);
    out.push(open);
    let mut first = true;
    for child in children(json, at) {
        let below: Vec<&JsonPointer> = pointers
            .iter()
            .copied()
            .filter(|pointer| child.matches(json, pointer, depth))
            .collect();
        if below.iter().any(|pointer| pointer.depth() == depth + 1) {
            continue; // this very value is excluded
        }
        if !first {
            out.push(b',');
        }
        first = false;
        if let Some(name) = child.name.clone() {
            out.extend_from_slice(&json[name]);
            out.push(b':');
        }
        write_without(json, child.value, &below, depth + 1, out);
    }
    out.push(close);
}

/// A member of an object (with its quoted name) or an element of an array
/// (with its index).
pub(super) struct Child {
    pub(super) name: Option<Range<usize>>,
    pub(super) index: usize,
    pub(super) value: Range<usize>,
}

impl Child {
    /// Whether this child is what the `depth`-th token of `pointer` names.
    fn matches(&self, json: &[u8], pointer: &JsonPointer, depth: usize) -> bool {
        match &self.name {
            Some(name) => json[name.clone()] == pointer.names[depth][..],
            None => pointer.indices[depth] == Some(self.index),
        }
    }
}

/// The members or elements of the container at `at` (none for a scalar).
pub(super) fn children(json: &[u8], at: Range<usize>) -> impl Iterator<Item = Child> + '_ {
    let is_object = json[at.start] == b'{';
    let container = matches!(json[at.start], b'{' | b'[');
    let end = at.end.saturating_sub(1);
    let mut pos = at.start + 1;
    let mut index = 0;
    std::iter::from_fn(move || {
        if !container || pos >= end {
            return None;
        }
        let name = is_object.then(|| {
            let name = pos..value_end(json, pos);
            pos = name.end + 1; // the ':'
            name
        });
        let value = pos..value_end(json, pos);
        pos = value.end + 1; // the ',' or the closing bracket
        index += 1;
        Some(Child {
            name,
            index: index - 1,
            value,
        })
    })
}

/// Where the canonical value starting at `start` ends.
fn value_end(json: &[u8], start: usize) -> usize {
    let mut depth = 0usize;
    let mut pos = start;
    let mut in_string = false;
    while pos < json.len() {
        let byte = json[pos];
        if in_string {
            match byte {
                b'\\' => pos += 1,
                b'"' => {
                    in_string = false;
                    if depth == 0 {
                        return pos + 1;
                    }
                }
                _ => {}
            }
        } else {
            match byte {
                b'"' => in_string = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' if depth == 0 => return pos,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        return pos + 1;
                    }
                }
                b',' if depth == 0 => return pos,
                _ => {}
            }
        }
        pos += 1;
    }
    pos
}

#[cfg(test)]
mod tests {
    use super::super::canonical::canonicalize;
    use super::*;

    fn pointers(texts: &[&str]) -> Vec<JsonPointer> {
        texts.iter().map(|t| t.parse().unwrap()).collect()
    }

    fn except(body: &str, texts: &[&str]) -> String {
        let canonical = canonicalize(body.as_bytes()).unwrap();
        match BodySelection::Except(pointers(texts)).apply(canonical) {
            Selected::Document(doc) => String::from_utf8(doc).unwrap(),
            Selected::Values(_) => unreachable!(),
        }
    }

    fn only(body: &str, texts: &[&str]) -> Vec<Option<String>> {
        let canonical = canonicalize(body.as_bytes()).unwrap();
        match BodySelection::Only(pointers(texts)).apply(canonical) {
            Selected::Values(values) => values
                .into_iter()
                .map(|v| v.map(|v| String::from_utf8(v).unwrap()))
                .collect(),
            Selected::Document(_) => unreachable!(),
        }
    }

    #[test]
    fn pointers_follow_rfc_6901() {
        let p: JsonPointer = "/a~1b/~0c/0".parse().unwrap();
        assert_eq!(
            p.names,
            [b"\"a/b\"".to_vec(), b"\"~c\"".to_vec(), b"\"0\"".to_vec()]
        );
        assert_eq!(p.indices, [None, None, Some(0)]);
        let p: JsonPointer = "/01/-/12".parse().unwrap();
        assert_eq!(p.indices, [None, None, Some(12)]);
        assert_eq!("".parse::<JsonPointer>(), Err(PointerError::Empty));
        assert!(matches!(
            "a".parse::<JsonPointer>(),
            Err(PointerError::NoLeadingSlash(_))
        ));
        assert!(matches!(
            "/a~2".parse::<JsonPointer>(),
            Err(PointerError::BadEscape(_))
        ));
        assert!(matches!(
            "/a~".parse::<JsonPointer>(),
            Err(PointerError::BadEscape(_))
        ));
    }

    #[test]
    fn except_drops_members_and_elements_anywhere() {
        let body = r#"{"b":[1,{"x":2,"y":3},4],"a":"s","c":{"d":null}}"#;
        assert_eq!(
            except(body, &["/a"]),
            r#"{"b":[1,{"x":2,"y":3},4],"c":{"d":null}}"#
        );
        assert_eq!(
            except(body, &["/b/1/x", "/c/d"]),
            r#"{"a":"s","b":[1,{"y":3},4],"c":{}}"#
        );
        assert_eq!(
            except(body, &["/b/0", "/b/2"]),
            r#"{"a":"s","b":[{"x":2,"y":3}],"c":{"d":null}}"#
        );
        assert_eq!(
            except(body, &["/nothing", "/b/9", "/a/x"]),
            canonical_text(body)
        );
        assert_eq!(
            except(r#"{"a/b":1,"~":2,"k":3}"#, &["/a~1b", "/~0"]),
            r#"{"k":3}"#
        );
        assert_eq!(except("[1,2]", &["/0", "/1"]), "[]");
        assert_eq!(except("7", &["/0"]), "7");
    }

    #[test]
    fn except_matches_escaped_names_by_their_value() {
        // `\u0041` is `A`: the canonical form spells it once, so the pointer finds it.
        assert_eq!(
            except(r#"{"\u0041":1,"q\"":2,"z":3}"#, &["/A", "/q\""]),
            r#"{"z":3}"#
        );
    }

    #[test]
    fn only_picks_values_in_pointer_order() {
        let body = r#"{"amount":1.50,"items":[{"id":42}],"note":"x"}"#;
        assert_eq!(
            only(body, &["/items/0/id", "/amount", "/missing", "/items/1"]),
            [Some("42".to_owned()), Some("1.5".to_owned()), None, None]
        );
        assert_eq!(only(body, &["/items"]), [Some(r#"[{"id":42}]"#.to_owned())]);
        assert_eq!(only(body, &["/note/0"]), [None], "a string has no children");
    }

    fn canonical_text(body: &str) -> String {
        String::from_utf8(canonicalize(body.as_bytes()).unwrap()).unwrap()
    }
}
