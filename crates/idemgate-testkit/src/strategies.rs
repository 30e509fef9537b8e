//! Proptest strategies for what stores keep: stored responses and record states,
//! over the whole range each codec must carry (any status, repeated and non-UTF-8
//! header values, empty and binary bodies, bodies not retained).

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use idemgate_core::record::{RecordState, StoredBody, StoredResponse};
use idemgate_core::time::Timestamp;
use proptest::prelude::*;

/// A header name: lower-case token characters, as `http` normalizes them.
fn header_name() -> impl Strategy<Value = HeaderName> {
    "[a-z0-9!#$%&'*+.^_`|~-]{1,40}".prop_map(|name| {
        HeaderName::from_bytes(name.as_bytes()).expect("token characters make a header name")
    })
}

/// A header value: visible ASCII, spaces and tabs inside, and obs-text bytes.
fn header_value() -> impl Strategy<Value = HeaderValue> {
    prop::collection::vec(
        prop_oneof![0x21u8..=0x7e, Just(b' '), Just(b'\t'), 0x80u8..=0xff],
        0..64,
    )
    .prop_map(|mut bytes| {
        // Leading and trailing whitespace is not a field value's.
        while bytes.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
            bytes.remove(0);
        }
        while bytes.last().is_some_and(|b| *b == b' ' || *b == b'\t') {
            bytes.pop();
        }
        HeaderValue::from_bytes(&bytes).expect("no control bytes in a header value")
    })
}

/// Any response a store may have to keep.
pub fn stored_response() -> impl Strategy<Value = StoredResponse> {
    let body = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..4096)
            .prop_map(|bytes| StoredBody::Retained(Bytes::from(bytes))),
        // Long, compressible bodies, for codecs that compress.
        (any::<u8>(), 0usize..20_000)
            .prop_map(|(byte, len)| StoredBody::Retained(Bytes::from(vec![byte; len]))),
        Just(StoredBody::NotRetained),
        any::<u32>().prop_map(StoredBody::InPieces),
    ];
    (
        100u16..=999,
        prop::collection::vec((header_name(), header_value()), 0..12),
        body,
        prop::collection::vec((header_name(), header_value()), 0..3),
    )
        .prop_map(|(status, headers, body, trailers)| StoredResponse {
            trailers,
            status: StatusCode::from_u16(status).expect("100..=999 is a status"),
            headers,
            body,
        })
}

/// Any record state, with its lease end or its response.
pub fn record_state() -> impl Strategy<Value = RecordState> {
    prop_oneof![
        (0i64..=i64::MAX / 2).prop_map(|ms| RecordState::Processing {
            locked_until: Timestamp::from_millis(ms)
        }),
        Just(RecordState::Released),
        stored_response().prop_map(RecordState::Completed),
        stored_response().prop_map(RecordState::Failed),
    ]
}

/// One character of a path segment, as a path means it (before spelling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PathAtom {
    /// An RFC 3986 unreserved character: raw or escaped, it is the same.
    Unreserved(u8),
    /// A sub-delimiter, `:` or `@`: written raw (its escape is another path).
    Delimiter(u8),
    /// A byte a path carries escaped (space, `%`, `?`, `#`, `;`…); `"`, `{`, `}`,
    /// `[`, `]`, `^` and `|` may also come raw, which equals their escape.
    Escaped(u8),
    /// A non-ASCII character, sent as its escaped UTF-8 bytes.
    Utf8(char),
}

/// A path as a resource name: segments of characters, none empty, none a dot
/// segment. [`path_spellings`] writes it many ways.
#[derive(Debug, Clone)]
pub struct LogicalPath {
    segments: Vec<Vec<PathAtom>>,
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";
const HEX_LOWER: &[u8; 16] = b"0123456789abcdef";

fn escape(out: &mut String, byte: u8, lower: bool) {
    let hex = if lower { HEX_LOWER } else { HEX_UPPER };
    out.push('%');
    out.push(char::from(hex[usize::from(byte >> 4)]));
    out.push(char::from(hex[usize::from(byte & 0xf)]));
}

impl LogicalPath {
    /// Its one canonical spelling (`idemgate_core::path::canonicalize`'s
    /// answer for every spelling of it).
    pub fn canonical(&self) -> String {
        let mut out = String::new();
        for segment in &self.segments {
            out.push('/');
            for atom in segment {
                match *atom {
                    PathAtom::Unreserved(b) | PathAtom::Delimiter(b) => out.push(char::from(b)),
                    PathAtom::Escaped(b) => escape(&mut out, b, false),
                    PathAtom::Utf8(c) => {
                        for b in c.to_string().bytes() {
                            escape(&mut out, b, false);
                        }
                    }
                }
            }
        }
        if out.is_empty() {
            out.push('/');
        }
        out
    }

    /// One spelling, by `choices` (one byte per decision, reused cyclically):
    /// escapes in either case, unreserved characters escaped or not, duplicate
    /// slashes, `.` segments, `x/..` detours and a trailing slash — every
    /// spelling RFC 3986 (and any upstream that resolves them) reads as this path.
    fn spell(&self, choices: &[u8]) -> String {
        let mut next = {
            let mut at = 0;
            move || {
                let choice = choices.get(at % choices.len().max(1)).copied().unwrap_or(0);
                at += 1;
                choice
            }
        };
        let mut out = String::new();
        for segment in &self.segments {
            out.push('/');
            match next() % 6 {
                0 => out.push('/'),
                1 => out.push_str("./"),
                2 => out.push_str("detour/../"),
                3 => out.push_str(".//zz/./../"),
                _ => {}
            }
            for atom in segment {
                let choice = next();
                let lower = choice & 1 == 1;
                match *atom {
                    PathAtom::Unreserved(b) if choice & 2 == 2 => escape(&mut out, b, lower),
                    PathAtom::Unreserved(b) | PathAtom::Delimiter(b) => out.push(char::from(b)),
                    PathAtom::Escaped(b) if choice & 2 == 2 && b"\"{}[]^|".contains(&b) => {
                        out.push(char::from(b));
                    }
                    PathAtom::Escaped(b) => escape(&mut out, b, lower),
                    PathAtom::Utf8(c) => {
                        for b in c.to_string().bytes() {
                            escape(&mut out, b, lower);
                        }
                    }
                }
            }
        }
        match next() % 4 {
            0 => out.push('/'),
            1 => out.push_str("/."),
            2 => out.push_str("//"),
            _ => {}
        }
        if out.is_empty() {
            out.push('/');
        }
        out
    }
}

fn path_atom() -> impl Strategy<Value = PathAtom> {
    prop_oneof![
        6 => prop::sample::select(
            b"abcxyzABCXYZ0189-._~".to_vec()
        ).prop_map(PathAtom::Unreserved),
        2 => prop::sample::select(b"!$&'()*+,=:@".to_vec()).prop_map(PathAtom::Delimiter),
        2 => prop::sample::select(b" \"%<>?#;[]^`{|}".to_vec()).prop_map(PathAtom::Escaped),
        1 => prop::sample::select(vec!['é', 'ж', '€', '𝄞']).prop_map(PathAtom::Utf8),
    ]
}

/// A path of 0 to 5 segments of 1 to 8 characters each.
pub fn logical_path() -> impl Strategy<Value = LogicalPath> {
    prop::collection::vec(prop::collection::vec(path_atom(), 1..8), 0..5)
        .prop_filter("a segment is never . or ..", |segments| {
            segments.iter().all(|segment| {
                segment != &[PathAtom::Unreserved(b'.')]
                    && segment != &[PathAtom::Unreserved(b'.'), PathAtom::Unreserved(b'.')]
            })
        })
        .prop_map(|segments| LogicalPath { segments })
}

/// A path's canonical spelling and several other spellings of it, each of which
/// a strict canonicalizer must bring back to the first.
pub fn path_spellings() -> impl Strategy<Value = (String, Vec<String>)> {
    (
        logical_path(),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 1..64), 1..5),
    )
        .prop_map(|(path, choices)| {
            let spellings = choices.iter().map(|choice| path.spell(choice)).collect();
            (path.canonical(), spellings)
        })
}

/// Any path-like string, ambiguous spellings included: slashes and backslashes,
/// dot segments raw and escaped, escapes of `/`, `\`, controls, non-UTF-8 bytes,
/// malformed ones, `;` parameters, raw non-ASCII and characters a path may not
/// hold raw.
pub fn raw_path() -> impl Strategy<Value = String> {
    let token = prop::sample::select(vec![
        "/", "/", "/", "//", ".", "..", "%2e", "%2E", "%2f", "%2F", "%5c", "\\", ";", ";x=1", "a",
        "b", "Z", "0", "~", "-", "_", "%41", "%7e", "%7E", "%zz", "%", "%4", "%C3%A9", "%c3",
        "%FF", "%00", "%0a", "%7f", "é", "{", "}", "\"", " ", "!", "+", "%21", "%3B", "%25", "?",
        "#", "\u{1}",
    ]);
    prop::collection::vec(token, 0..24).prop_map(|tokens| tokens.concat())
}
