//! One spelling per path (PROTOCOL §3): the canonical form a request path is
//! matched, scoped, fingerprinted and — behind the proxy — forwarded in.
//!
//! Two parties that read one request target differently is how a proxy is talked
//! around: it matches `//payments` to no route and forwards it, and an upstream
//! that merges slashes runs `POST /payments` without the key the route requires.
//! So the path is brought to one spelling once, here, and every surface uses that
//! spelling for everything: the layer's scope ([`crate::scope::normalize_path`]),
//! the proxy's route matching, and the path the upstream receives.
//!
//! [`canonicalize`] follows RFC 3986 §6.2.2: escapes of unreserved characters are
//! decoded (`%7E` → `~`), the hex of the other escapes is upper-cased (`%2f` →
//! `%2F`), characters a path may not carry as they are are escaped (`{` → `%7B`),
//! empty segments are dropped (`//a///b/` → `/a/b`: duplicate slashes merged, the
//! trailing slash remembered apart), and dot segments are removed (§5.2.4,
//! `/a/./b/../c` → `/a/c`). Slashes are merged before dot segments are resolved,
//! as nginx does (`/a//../b` → `/b`; Envoy's RFC-then-merge order gives `/a/b`):
//! the upstream receives the result, so whichever order it would have used, it
//! reads the path that was matched.
//!
//! What upstreams read differently even in canonical form is a choice, made per
//! class by a [`PathPolicy`] (strict by default: refused): an encoded `/` or `\`,
//! an encoded dot segment, a `;` path parameter, control or non-ASCII bytes (and
//! escapes that are malformed or do not decode to UTF-8), and a `..` that climbs
//! above the root.
//!
//! ```
//! use idemgate_core::path::{AmbiguousPath, PathPolicy, canonicalize};
//!
//! let path = canonicalize("//api/./%6Frders/../payments/", &PathPolicy::STRICT).unwrap();
//! assert_eq!(path.as_str(), "/api/payments");
//! assert_eq!(path.forwarded(), "/api/payments/");
//! assert_eq!(
//!     canonicalize("/api/%2e%2e/admin", &PathPolicy::STRICT),
//!     Err(AmbiguousPath::EncodedDotSegment)
//! );
//! ```

use std::borrow::Cow;

/// What to do with an encoded slash or backslash (`%2F`, `%5C`) and a raw `\`.
/// Some upstreams decode `%2F` before routing (so `/a%2Fb` is `/a/b`), others
/// after (a segment `a/b`); IIS and some Windows-minded routers read `\` as `/`.
/// Spring's `StrictHttpFirewall` refuses all three; Envoy's
/// `path_with_escaped_slashes_action` offers the same three choices as here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum EncodedSlash {
    /// `400` (the default; Envoy's `REJECT_REQUEST`).
    Refuse,
    /// Part of the segment, kept encoded (`%2F`, `%5C`): for an upstream that
    /// routes before decoding (Envoy's `KEEP_UNCHANGED`).
    Keep,
    /// Decoded to `/`, a segment boundary, before slashes are merged and dot
    /// segments resolved: for an upstream that decodes before routing (Envoy's
    /// `UNESCAPE_AND_FORWARD`).
    Decode,
}

/// What to do with a dot segment spelled with an escape (`%2e`, `.%2E`,
/// `%2e%2e`). RFC 3986 decodes `%2E` and then resolves the segment; an upstream
/// that routes before decoding sees a literal segment instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum EncodedDotSegment {
    /// `400` (the default; Spring refuses encoded `.` too).
    Refuse,
    /// Decoded and resolved like `.` and `..` (RFC 3986, Envoy's `normalize_path`).
    Resolve,
}

/// What to do with a `;` in a segment. Tomcat, Jetty and Spring strip
/// `;params` from each segment before routing (so `/payments;x=1` and even
/// `/..;/payments` reach `/payments`); most other routers keep `;` as a character.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum PathParameters {
    /// `400` (the default; Spring's firewall refuses `;`).
    Refuse,
    /// A character of the segment, forwarded as sent.
    Keep,
    /// Removed with the rest of the segment, as Tomcat does, before dot segments
    /// are resolved: the upstream receives the path without them.
    Strip,
}

/// What to do with bytes a request target cannot carry unambiguously: raw
/// non-ASCII characters, escaped control bytes (`%00`, `%0A`, `%7F`), escapes
/// that do not decode to UTF-8 (`%FF`: a lossy decoder upstream folds `%FE` and
/// `%FF` into one `U+FFFD`), a `%` not followed by two hex digits — and, where a
/// path arrives from outside HTTP, raw control bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum ControlOrNonAscii {
    /// `400` (the default).
    Refuse,
    /// Escaped: a raw `é` becomes `%C3%A9` (the spelling it equals), a lone `%`
    /// becomes `%25`, escaped controls and non-UTF-8 escapes stay escaped.
    Encode,
}

/// What to do with a `..` that would climb above the root (`/../admin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum AboveRoot {
    /// `400` (the default): no client of a path-based API needs it.
    Refuse,
    /// Dropped, as RFC 3986 §5.2.4 does (`/../a` → `/a`).
    Clamp,
}

/// Which spellings of a path are refused as ambiguous, one choice per class.
///
/// [`PathPolicy::STRICT`] (the default) refuses every class;
/// [`PathPolicy::PERMISSIVE`] refuses none, choosing for each the reading that
/// keeps the most distinct (what [`crate::scope::normalize_path`] uses).
///
/// ```
/// use idemgate_core::path::{EncodedSlash, PathPolicy, canonicalize};
///
/// // An upstream that decodes %2F before it routes.
/// let policy = PathPolicy { encoded_slash: EncodedSlash::Decode, ..PathPolicy::STRICT };
/// assert_eq!(canonicalize("/a%2Fb", &policy).unwrap().as_str(), "/a/b");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathPolicy {
    /// `%2F`, `%5C`, raw `\`.
    pub encoded_slash: EncodedSlash,
    /// `%2e`, `%2E%2E`, `.%2e`.
    pub encoded_dot_segment: EncodedDotSegment,
    /// `;` inside a segment.
    pub path_parameters: PathParameters,
    /// Raw non-ASCII, escaped controls, non-UTF-8 or malformed escapes.
    pub control_or_non_ascii: ControlOrNonAscii,
    /// `..` above the root.
    pub above_root: AboveRoot,
}

impl PathPolicy {
    /// Every ambiguous class refused.
    pub const STRICT: Self = Self {
        encoded_slash: EncodedSlash::Refuse,
        encoded_dot_segment: EncodedDotSegment::Refuse,
        path_parameters: PathParameters::Refuse,
        control_or_non_ascii: ControlOrNonAscii::Refuse,
        above_root: AboveRoot::Refuse,
    };

    /// Nothing refused: encoded slashes and `;` kept, encoded dot segments
    /// resolved, odd bytes escaped, `..` clamped at the root (RFC 3986).
    pub const PERMISSIVE: Self = Self {
        encoded_slash: EncodedSlash::Keep,
        encoded_dot_segment: EncodedDotSegment::Resolve,
        path_parameters: PathParameters::Keep,
        control_or_non_ascii: ControlOrNonAscii::Encode,
        above_root: AboveRoot::Clamp,
    };
}

impl Default for PathPolicy {
    fn default() -> Self {
        Self::STRICT
    }
}

/// Why a path was refused: the class of ambiguity its spelling falls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AmbiguousPath {
    /// `%2F`, `%5C` or a raw `\`.
    #[error(
        "the path has an encoded slash or a backslash (%2F, %5C, \\), which servers split into segments or not"
    )]
    EncodedSlash,
    /// A `.` or `..` segment spelled with `%2E`.
    #[error("the path has a dot segment spelled with %2E, which servers resolve or take literally")]
    EncodedDotSegment,
    /// A `;` in a segment.
    #[error("the path has a ';' parameter, which some servers strip before routing")]
    PathParameter,
    /// A raw non-ASCII or control byte, an escaped control byte, or escapes that
    /// do not decode to UTF-8.
    #[error(
        "the path has control or non-ASCII bytes (raw, or escaped to a control byte or to invalid UTF-8)"
    )]
    ControlOrNonAscii,
    /// A `%` not followed by two hex digits.
    #[error("the path has a '%' that does not start a two-digit escape")]
    MalformedEscape,
    /// A `..` above the root.
    #[error("the path climbs above its root with '..'")]
    AboveRoot,
}

/// A path in its one canonical spelling: starts with `/`, no empty segment, no
/// `.` or `..` segment, no trailing `/` (unless it is `/`), escapes only where
/// needed and in upper case.
///
/// The trailing slash the client sent is kept beside it, for [`forwarded`]:
/// matching and scoping ignore it (`/orders/` is `/orders`, PROTOCOL §3), but
/// routers such as Django's tell `/orders/` from `/orders`, so an upstream gets
/// the one it was sent.
///
/// [`forwarded`]: CanonicalPath::forwarded
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CanonicalPath {
    path: String,
    trailing_slash: bool,
}

impl CanonicalPath {
    /// The canonical path: what routes match and scopes name.
    pub fn as_str(&self) -> &str {
        &self.path
    }

    /// Whether the client's spelling ended in `/` (or in a dot segment, which
    /// RFC 3986 resolves to one).
    pub fn has_trailing_slash(&self) -> bool {
        self.trailing_slash
    }

    /// The path to send on: the canonical path, with its trailing `/` when the
    /// client sent one.
    pub fn forwarded(&self) -> Cow<'_, str> {
        if self.trailing_slash && self.path != "/" {
            Cow::Owned(format!("{}/", self.path))
        } else {
            Cow::Borrowed(&self.path)
        }
    }

    /// The canonical path, owned.
    pub fn into_string(self) -> String {
        self.path
    }
}

/// Brings `raw` (a request target's path, without its query) to its canonical
/// spelling, or says which ambiguity `policy` refuses in it. A path that does not
/// start with `/` is read as if it did. See the [module docs](self).
///
/// ```
/// use idemgate_core::path::{PathPolicy, canonicalize};
///
/// let path = canonicalize("/Caf%c3%a9s/%7Bid%7d/{x}", &PathPolicy::STRICT).unwrap();
/// assert_eq!(path.as_str(), "/Caf%C3%A9s/%7Bid%7D/%7Bx%7D");
/// ```
pub fn canonicalize(raw: &str, policy: &PathPolicy) -> Result<CanonicalPath, AmbiguousPath> {
    match already_canonical(raw) {
        Some(path) => Ok(path),
        None => decode(raw, policy),
    }
}

/// `raw` itself when it is already in canonical spelling under every policy —
/// what nearly every request path is (`/api/v1/orders`): it starts with `/`,
/// holds only bytes every reading keeps as they are (unreserved, sub-delims
/// but `;`, `:`, `@`), and has no empty, `.` or `..` segment and no trailing
/// slash. One copy instead of a decoded segment list.
fn already_canonical(raw: &str) -> Option<CanonicalPath> {
    let bytes = raw.as_bytes();
    let plain = |byte: &u8| {
        is_unreserved(*byte) || is_sub_delim(*byte) || matches!(byte, b':' | b'@' | b'/')
    };
    let segments_plain = raw
        .split('/')
        .skip(1)
        .all(|segment| !matches!(segment, "" | "." | ".."));
    (bytes.first() == Some(&b'/') && bytes.iter().all(plain) && segments_plain).then(|| {
        CanonicalPath {
            path: raw.to_owned(),
            trailing_slash: false,
        }
    })
}

/// The full reading: every segment decoded, dot segments resolved, each
/// ambiguity the policy refuses refused.
fn decode(raw: &str, policy: &PathPolicy) -> Result<CanonicalPath, AmbiguousPath> {
    let mut kept: Vec<String> = Vec::new();
    let mut trailing_slash = false;
    for raw_segment in split_raw(raw, policy)? {
        for segment in decode_segment(raw_segment, policy)? {
            trailing_slash = true;
            match segment.dot {
                _ if segment.text.is_empty() => {}
                Some(dot) => {
                    if segment.escaped && policy.encoded_dot_segment == EncodedDotSegment::Refuse {
                        return Err(AmbiguousPath::EncodedDotSegment);
                    }
                    if dot == Dot::Parent
                        && kept.pop().is_none()
                        && policy.above_root == AboveRoot::Refuse
                    {
                        return Err(AmbiguousPath::AboveRoot);
                    }
                }
                None => {
                    trailing_slash = false;
                    kept.push(segment.text);
                }
            }
        }
    }
    let mut path = String::with_capacity(raw.len() + 1);
    for segment in &kept {
        path.push('/');
        path.push_str(segment);
    }
    if path.is_empty() {
        path.push('/');
    }
    Ok(CanonicalPath {
        path,
        trailing_slash,
    })
}

/// The canonical spelling of `raw` under [`PathPolicy::PERMISSIVE`], which
/// refuses nothing: what the layer scopes and fingerprints by (PROTOCOL §3), and
/// what the operator tooling computes a record's identity from.
///
/// ```
/// use idemgate_core::path::normalize_path;
/// assert_eq!(normalize_path("/api/%7Eorders/"), "/api/~orders");
/// assert_eq!(normalize_path("//api/./v1/../orders"), "/api/orders");
/// assert_eq!(normalize_path("/a%2fb"), "/a%2Fb");
/// ```
pub fn normalize_path(raw: &str) -> String {
    match canonicalize(raw, &PathPolicy::PERMISSIVE) {
        Ok(path) => path.into_string(),
        // PERMISSIVE chooses a non-refusing reading for every class, and
        // `canonicalize` refuses only classes its policy refuses.
        Err(never) => unreachable!("the permissive policy refuses nothing, yet: {never}"),
    }
}

/// Spellings of one canonical path that a lenient upstream router takes as the
/// same route, folded into one for route matching and for the scope — never for
/// what is forwarded or fingerprinted.
///
/// Two are offered, both off by default: ASCII case (Express routes are
/// case-insensitive by default, so `/Payments` is `/payments` there) and a format
/// suffix on the last segment (Rails routes `/payments.json` to `/payments`).
///
/// ```
/// use idemgate_core::path::PathFold;
///
/// let fold = PathFold::NONE.with_case_insensitive(true).with_format_suffix(true);
/// assert_eq!(fold.apply("/Payments.JSON"), "/payments");
/// assert_eq!(fold.apply("/caf%C3%A9"), "/caf%C3%A9", "escapes keep their case");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathFold {
    case_insensitive: bool,
    format_suffix: bool,
}

impl PathFold {
    /// No folding: every canonical path is its own.
    pub const NONE: Self = Self {
        case_insensitive: false,
        format_suffix: false,
    };

    /// Fold ASCII letters to lower case (outside escapes; non-ASCII letters are
    /// escaped in canonical form and keep their bytes).
    ///
    /// ```
    /// let fold = idemgate_core::path::PathFold::NONE.with_case_insensitive(true);
    /// assert_eq!(fold.apply("/Orders/AB"), "/orders/ab");
    /// ```
    #[must_use]
    pub fn with_case_insensitive(mut self, on: bool) -> Self {
        self.case_insensitive = on;
        self
    }

    /// Drop a format suffix: from the first `.` of the last segment on
    /// (`/payments.json` and `/payments.v2.xml` are `/payments`); a last segment
    /// that starts with `.` (`/.well-known`) keeps its name.
    ///
    /// ```
    /// let fold = idemgate_core::path::PathFold::NONE.with_format_suffix(true);
    /// assert_eq!(fold.apply("/orders/7.json"), "/orders/7");
    /// ```
    #[must_use]
    pub fn with_format_suffix(mut self, on: bool) -> Self {
        self.format_suffix = on;
        self
    }

    /// Whether ASCII case is folded.
    pub fn is_case_insensitive(&self) -> bool {
        self.case_insensitive
    }

    /// Whether a format suffix is dropped.
    pub fn drops_format_suffix(&self) -> bool {
        self.format_suffix
    }

    /// `canonical` (a [`CanonicalPath`] or a route pattern in canonical form)
    /// folded.
    pub fn apply<'a>(&self, canonical: &'a str) -> Cow<'a, str> {
        let mut path = Cow::Borrowed(canonical);
        if self.format_suffix {
            let last = path.rfind('/').map_or(0, |slash| slash + 1);
            let segment = &path[last..];
            // A name that starts with a dot (`.well-known`, `...`) has no suffix:
            // cutting it could leave a dot segment.
            if !segment.starts_with('.')
                && let Some(dot) = segment.find('.')
            {
                path.to_mut().truncate(last + dot);
            }
        }
        if self.case_insensitive && path.bytes().any(|b| b.is_ascii_uppercase()) {
            path = Cow::Owned(fold_ascii_case(&path));
        }
        path
    }
}

/// Lower-cases ASCII letters, leaving the two hex digits of each escape as they
/// are (canonical escapes are upper case).
fn fold_ascii_case(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut escape_digits = 0;
    for c in path.chars() {
        if escape_digits > 0 {
            escape_digits -= 1;
            out.push(c);
        } else if c == '%' {
            escape_digits = 2;
            out.push(c);
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// `.` or `..`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dot {
    Current,
    Parent,
}

/// One segment, decoded to canonical spelling.
struct Segment {
    text: String,
    /// `Some` when the segment is `.` or `..`.
    dot: Option<Dot>,
    /// Whether a `.` of it came from `%2E`.
    escaped: bool,
}

/// The raw segments between separators: `/`, and `\` when it is decoded as one.
fn split_raw<'a>(raw: &'a str, policy: &PathPolicy) -> Result<Vec<&'a [u8]>, AmbiguousPath> {
    let bytes = raw.as_bytes();
    let mut segments = Vec::new();
    let mut start = 0;
    for (i, byte) in bytes.iter().enumerate() {
        let separator = match byte {
            b'/' => true,
            b'\\' => match policy.encoded_slash {
                EncodedSlash::Refuse => return Err(AmbiguousPath::EncodedSlash),
                EncodedSlash::Keep => false,
                EncodedSlash::Decode => true,
            },
            _ => false,
        };
        if separator {
            segments.push(&bytes[start..i]);
            start = i + 1;
        }
    }
    segments.push(&bytes[start..]);
    Ok(segments)
}

/// Decodes one raw segment into canonical spelling; more than one segment when
/// an encoded slash is decoded as a boundary.
fn decode_segment(raw: &[u8], policy: &PathPolicy) -> Result<Vec<Segment>, AmbiguousPath> {
    let mut done = Vec::new();
    let mut current = Builder::default();
    let mut i = 0;
    while i < raw.len() {
        let byte = raw[i];
        if byte == b'%' {
            let Some(decoded) = escape_at(raw, i) else {
                current.flush_high(policy)?;
                refuse_unless_encoded(policy, AmbiguousPath::MalformedEscape)?;
                current.text.push_str("%25");
                i += 1;
                continue;
            };
            i += 3;
            if decoded >= 0x80 {
                current.high.push(decoded);
                continue;
            }
            current.flush_high(policy)?;
            match decoded {
                b'/' | b'\\' => match policy.encoded_slash {
                    EncodedSlash::Refuse => return Err(AmbiguousPath::EncodedSlash),
                    EncodedSlash::Keep => push_escape(&mut current.text, decoded),
                    EncodedSlash::Decode => done.push(std::mem::take(&mut current).finish()),
                },
                b'.' => {
                    current.escaped_dot = true;
                    current.text.push('.');
                }
                b if is_unreserved(b) => current.text.push(char::from(b)),
                b if b < 0x20 || b == 0x7f => {
                    refuse_unless_encoded(policy, AmbiguousPath::ControlOrNonAscii)?;
                    push_escape(&mut current.text, b);
                }
                b => push_escape(&mut current.text, b),
            }
            continue;
        }
        current.flush_high(policy)?;
        i += 1;
        match byte {
            b';' => match policy.path_parameters {
                PathParameters::Refuse => return Err(AmbiguousPath::PathParameter),
                PathParameters::Keep => current.text.push(';'),
                // Tomcat's reading: the parameter runs to the end of the segment.
                PathParameters::Strip => break,
            },
            b if !(0x20..0x7f).contains(&b) => {
                refuse_unless_encoded(policy, AmbiguousPath::ControlOrNonAscii)?;
                push_escape(&mut current.text, b);
            }
            // Reached only when kept (split_raw refused or split on it otherwise).
            b'\\' => push_escape(&mut current.text, byte),
            b if is_unreserved(b) || is_sub_delim(b) || b == b':' || b == b'@' => {
                current.text.push(char::from(b));
            }
            // `"`, `{`, `}`, `[`, `]`, `^`, `|`, and what a path from outside
            // HTTP may hold (space, `<`, `?`, `#`…): escaped, as they equal it.
            b => push_escape(&mut current.text, b),
        }
    }
    current.flush_high(policy)?;
    done.push(current.finish());
    Ok(done)
}

/// A segment being decoded.
#[derive(Default)]
struct Builder {
    text: String,
    /// Escaped bytes ≥ 0x80 not yet written: checked as UTF-8 as a run.
    high: Vec<u8>,
    escaped_dot: bool,
}

impl Builder {
    /// Writes the pending escaped non-ASCII bytes, refusing a run that is not
    /// UTF-8 unless the policy encodes.
    fn flush_high(&mut self, policy: &PathPolicy) -> Result<(), AmbiguousPath> {
        if self.high.is_empty() {
            return Ok(());
        }
        if std::str::from_utf8(&self.high).is_err() {
            refuse_unless_encoded(policy, AmbiguousPath::ControlOrNonAscii)?;
        }
        for byte in std::mem::take(&mut self.high) {
            push_escape(&mut self.text, byte);
        }
        Ok(())
    }

    fn finish(self) -> Segment {
        let dot = match self.text.as_str() {
            "." => Some(Dot::Current),
            ".." => Some(Dot::Parent),
            _ => None,
        };
        Segment {
            escaped: self.escaped_dot && dot.is_some(),
            dot,
            text: self.text,
        }
    }
}

fn refuse_unless_encoded(policy: &PathPolicy, class: AmbiguousPath) -> Result<(), AmbiguousPath> {
    match policy.control_or_non_ascii {
        ControlOrNonAscii::Refuse => Err(class),
        ControlOrNonAscii::Encode => Ok(()),
    }
}

/// The byte `%XY` at `at` stands for, if `X` and `Y` are hex digits.
fn escape_at(raw: &[u8], at: usize) -> Option<u8> {
    let digit = |offset: usize| {
        raw.get(at + offset)
            .and_then(|b| char::from(*b).to_digit(16))
    };
    Some((digit(1)? << 4 | digit(2)?) as u8)
}

fn push_escape(out: &mut String, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(byte >> 4)]));
    out.push(char::from(HEX[usize::from(byte & 0xf)]));
}

/// RFC 3986 `unreserved`.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// RFC 3986 `sub-delims`, except `;`, which is a class of its own here.
fn is_sub_delim(byte: u8) -> bool {
    matches!(
        byte,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b'='
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The shortcut for plain paths answers what the full reading does,
        /// under every policy.
        #[test]
        fn the_plain_path_shortcut_agrees_with_the_full_reading(
            raw in prop_oneof!["[/a.%2eE;:@~\\\\!=-]{0,12}", "(/[a.E:@~!=-]{0,3}){1,4}"],
        ) {
            if let Some(shortcut) = already_canonical(&raw) {
                for policy in [PathPolicy::STRICT, PathPolicy::PERMISSIVE] {
                    prop_assert_eq!(&decode(&raw, &policy), &Ok(shortcut.clone()));
                }
            }
        }
    }

    #[test]
    fn the_shortcut_takes_plain_paths_only() {
        assert!(already_canonical("/api/v1/orders").is_some());
        assert!(already_canonical("/a:b@c/d.e~f!$&'()*+,=").is_some());
        for raw in [
            "", "/", "api", "/a/", "//a", "/a/./b", "/a/..", "/a;b", "/a%41", "/a\\b", "/é",
        ] {
            assert!(already_canonical(raw).is_none(), "{raw:?}");
        }
    }

    fn strict(raw: &str) -> Result<String, AmbiguousPath> {
        canonicalize(raw, &PathPolicy::STRICT).map(CanonicalPath::into_string)
    }

    #[test]
    fn spellings_of_one_path_become_one() {
        for raw in [
            "/payments",
            "//payments",
            "/payments/",
            "///payments//",
            "/./payments",
            "/payments/.",
            "/x/../payments",
            "/webhooks/a/../../payments",
            "/%70ayments",
            "/%70%61yments",
            "payments",
        ] {
            assert_eq!(strict(raw).as_deref(), Ok("/payments"), "{raw}");
        }
        assert_eq!(strict(""), Ok("/".into()));
        assert_eq!(strict("/"), Ok("/".into()));
        assert_eq!(strict("/a/.."), Ok("/".into()));
        assert_eq!(strict("/a//../b"), Ok("/b".into()), "merged, then resolved");
    }

    #[test]
    fn escapes_are_upper_cased_and_odd_characters_escaped() {
        assert_eq!(strict("/a%3bb"), Ok("/a%3Bb".into()));
        assert_eq!(strict("/a%20b%25"), Ok("/a%20b%25".into()));
        assert_eq!(
            strict("/{\"a\"}|^[]"),
            Ok("/%7B%22a%22%7D%7C%5E%5B%5D".into())
        );
        assert_eq!(strict("/a:b@c!$&'()*+,="), Ok("/a:b@c!$&'()*+,=".into()));
        assert_eq!(strict("/caf%c3%a9"), Ok("/caf%C3%A9".into()));
        assert_eq!(strict("/file%2Ejson"), Ok("/file.json".into()));
    }

    #[test]
    fn the_trailing_slash_is_kept_apart() {
        let path = canonicalize("/orders//", &PathPolicy::STRICT).unwrap();
        assert_eq!(path.as_str(), "/orders");
        assert!(path.has_trailing_slash());
        assert_eq!(path.forwarded(), "/orders/");
        let path = canonicalize("/orders/x/..", &PathPolicy::STRICT).unwrap();
        assert_eq!(path.forwarded(), "/orders/");
        let path = canonicalize("/orders", &PathPolicy::STRICT).unwrap();
        assert_eq!(path.forwarded(), "/orders");
        let root = canonicalize("//", &PathPolicy::STRICT).unwrap();
        assert_eq!(root.forwarded(), "/");
    }

    #[test]
    fn strict_refuses_each_class() {
        use AmbiguousPath::*;
        let cases = [
            ("/a%2Fb", EncodedSlash),
            ("/a%2fb", EncodedSlash),
            ("/a%5Cb", EncodedSlash),
            ("/a\\b", EncodedSlash),
            ("/%2e/a", EncodedDotSegment),
            ("/a/%2E%2E/b", EncodedDotSegment),
            ("/a/.%2e", EncodedDotSegment),
            ("/a;x=1", PathParameter),
            ("/..;/a", PathParameter),
            ("/заказы", ControlOrNonAscii),
            ("/a%00", ControlOrNonAscii),
            ("/a%0d%0aX", ControlOrNonAscii),
            ("/a%7F", ControlOrNonAscii),
            ("/a%FF", ControlOrNonAscii),
            ("/a%C3", ControlOrNonAscii),
            ("/a%zz", MalformedEscape),
            ("/a%4", MalformedEscape),
            ("/../a", AboveRoot),
            ("/a/../../b", AboveRoot),
        ];
        for (raw, class) in cases {
            assert_eq!(strict(raw), Err(class), "{raw}");
        }
    }

    #[test]
    fn each_class_has_its_alternatives() {
        let with = |change: fn(&mut PathPolicy), raw: &str| {
            let mut policy = PathPolicy::STRICT;
            change(&mut policy);
            canonicalize(raw, &policy).map(CanonicalPath::into_string)
        };
        let keep = |p: &mut PathPolicy| p.encoded_slash = EncodedSlash::Keep;
        let decode = |p: &mut PathPolicy| p.encoded_slash = EncodedSlash::Decode;
        assert_eq!(with(keep, "/a%2fb\\c"), Ok("/a%2Fb%5Cc".into()));
        assert_eq!(with(decode, "/a%2fb\\c"), Ok("/a/b/c".into()));
        assert_eq!(with(decode, "/x%2F..%2Fpayments"), Ok("/payments".into()));
        let resolve = |p: &mut PathPolicy| p.encoded_dot_segment = EncodedDotSegment::Resolve;
        assert_eq!(with(resolve, "/a/%2e%2E/b"), Ok("/b".into()));
        let keep_params = |p: &mut PathPolicy| p.path_parameters = PathParameters::Keep;
        assert_eq!(with(keep_params, "/a;x=1/b"), Ok("/a;x=1/b".into()));
        let strip = |p: &mut PathPolicy| p.path_parameters = PathParameters::Strip;
        assert_eq!(with(strip, "/a;x=1/b;y"), Ok("/a/b".into()));
        assert_eq!(with(strip, "/a/b/..;/c"), Ok("/a/c".into()), "Tomcat's ..;");
        assert_eq!(with(strip, "/a;x%2Fy/b"), Ok("/a/b".into()));
        let encode = |p: &mut PathPolicy| p.control_or_non_ascii = ControlOrNonAscii::Encode;
        assert_eq!(with(encode, "/é"), Ok("/%C3%A9".into()));
        assert_eq!(with(encode, "/a%00%ff%4"), Ok("/a%00%FF%254".into()));
        let clamp = |p: &mut PathPolicy| p.above_root = AboveRoot::Clamp;
        assert_eq!(with(clamp, "/../../a"), Ok("/a".into()));
    }

    #[test]
    fn the_permissive_normalization_refuses_nothing() {
        assert_eq!(normalize_path("/orders"), "/orders");
        assert_eq!(normalize_path("/orders//"), "/orders");
        assert_eq!(normalize_path("/%6Frders"), "/orders");
        assert_eq!(normalize_path("/a%2fb%20c"), "/a%2Fb%20c");
        assert_eq!(normalize_path("/bad%zz%4"), "/bad%25zz%254");
        assert_eq!(
            normalize_path("/заказы/"),
            "/%D0%B7%D0%B0%D0%BA%D0%B0%D0%B7%D1%8B"
        );
        assert_eq!(normalize_path("/a;b/../%2e%2e/../c"), "/c");
    }

    #[test]
    fn folds_case_and_suffixes_only_when_asked() {
        assert_eq!(PathFold::NONE.apply("/Payments.json"), "/Payments.json");
        let case = PathFold::NONE.with_case_insensitive(true);
        assert_eq!(case.apply("/Payments/%C3%A9X"), "/payments/%C3%A9x");
        let suffix = PathFold::NONE.with_format_suffix(true);
        assert_eq!(suffix.apply("/payments.json"), "/payments");
        assert_eq!(suffix.apply("/a.b/c.d.e"), "/a.b/c");
        assert_eq!(suffix.apply("/.well-known"), "/.well-known");
        assert_eq!(suffix.apply("/..."), "/...");
        assert_eq!(suffix.apply("/"), "/");
        assert_eq!(suffix.apply("/payments"), "/payments");
    }
}
