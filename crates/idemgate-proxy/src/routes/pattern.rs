//! Route path patterns: what a `[[route]]`'s `path` matches, and how it meets
//! the spellings a lenient upstream router takes as one path.

use std::fmt;
use std::str::FromStr;

use idemgate::path::PathFold;
use idemgate::scope::normalize_path;

/// A path pattern: exact segments, `{name}` for any one non-empty segment, and an
/// optional trailing `/*` for "this path and everything under it". Matched
/// against the normalized request path (PROTOCOL §3), so `/a/` and `/%61` are
/// `/a`.
///
/// ```
/// let pattern: idemgate_proxy::RoutePattern = "/orders/{id}/items/*".parse().unwrap();
/// assert!(pattern.matches("/orders/7/items"));
/// assert!(pattern.matches("/orders/7/items/3/notes"));
/// assert!(!pattern.matches("/orders/7"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutePattern {
    text: String,
    segments: Vec<Segment>,
    /// Ends in `/*`: longer paths match too.
    prefix: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    /// `{name}`.
    Param(String),
}

impl FromStr for RoutePattern {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if !text.starts_with('/') {
            return Err(format!("a path pattern starts with '/' (got {text:?})"));
        }
        let (fixed, prefix) = match text.strip_suffix("/*") {
            Some(fixed) => (fixed, true),
            None => (text, false),
        };
        // Split first, then bring each literal to canonical spelling (PROTOCOL §3),
        // so `{name}` is read before its braces would be escaped.
        let body = fixed.strip_prefix('/').unwrap_or(fixed);
        let body = body.strip_suffix('/').unwrap_or(body);
        let raw_segments: Vec<&str> = if body.is_empty() {
            Vec::new()
        } else {
            body.split('/').collect()
        };
        let segments = raw_segments
            .into_iter()
            .map(|segment| {
                match segment
                    .strip_prefix('{')
                    .and_then(|rest| rest.strip_suffix('}'))
                {
                    Some(name)
                        if !name.is_empty()
                            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
                    {
                        Ok(Segment::Param(name.to_owned()))
                    }
                    _ if segment.contains(['{', '}', '*']) => Err(format!(
                        "{text:?}: a segment is a literal, {{name}}, or a final /* (got {segment:?})"
                    )),
                    _ => {
                        let canonical = normalize_path(&format!("/{segment}"));
                        match canonical.strip_prefix('/') {
                            Some(literal) if !literal.is_empty() && !literal.contains('/') => {
                                Ok(Segment::Literal(literal.to_owned()))
                            }
                            _ => Err(format!(
                                "{text:?}: a segment may not be empty, '.' or '..' (got {segment:?})"
                            )),
                        }
                    }
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            text: text.to_owned(),
            segments,
            prefix,
        })
    }
}

/// The segments of a normalized path (none for `/`).
fn split(path: &str) -> impl Iterator<Item = &str> {
    path.strip_prefix('/')
        .unwrap_or(path)
        .split('/')
        .filter(move |_| path != "/")
}

impl RoutePattern {
    /// This pattern as it matches paths folded by `fold`: its literals folded
    /// the same way (a format suffix only off a final literal).
    pub(crate) fn folded(&self, fold: PathFold) -> Self {
        let case_only = PathFold::NONE.with_case_insensitive(fold.is_case_insensitive());
        let last = self.segments.len().saturating_sub(1);
        let segments = self
            .segments
            .iter()
            .enumerate()
            .map(|(at, segment)| match segment {
                Segment::Param(name) => Segment::Param(name.clone()),
                Segment::Literal(literal) => {
                    let rule = if at == last && !self.prefix {
                        fold
                    } else {
                        case_only
                    };
                    let folded = rule.apply(&format!("/{literal}")).into_owned();
                    Segment::Literal(folded[1..].to_owned())
                }
            })
            .collect();
        Self {
            text: self.text.clone(),
            segments,
            prefix: self.prefix,
        }
    }

    /// Whether the normalized path `path` matches.
    pub fn matches(&self, path: &str) -> bool {
        let mut segments = split(path);
        for expected in &self.segments {
            match (expected, segments.next()) {
                (Segment::Literal(literal), Some(segment)) if literal == segment => {}
                (Segment::Param(_), Some(segment)) if !segment.is_empty() => {}
                _ => return false,
            }
        }
        self.prefix || segments.next().is_none()
    }
}

impl RoutePattern {
    /// Whether `{name}` is one of the pattern's segments.
    pub(crate) fn has_parameter(&self, name: &str) -> bool {
        self.segments
            .iter()
            .any(|segment| matches!(segment, Segment::Param(param) if param == name))
    }
}

impl fmt::Display for RoutePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_exact_params_and_prefixes() {
        let p = |text: &str| text.parse::<RoutePattern>().unwrap();
        assert!(p("/orders").matches("/orders"));
        assert!(!p("/orders").matches("/orders/1"));
        assert!(!p("/orders").matches("/order"));
        assert!(p("/").matches("/"));
        assert!(!p("/").matches("/a"));
        assert!(p("/orders/{id}").matches("/orders/42"));
        assert!(!p("/orders/{id}").matches("/orders"));
        assert!(!p("/orders/{id}").matches("/orders//x"));
        assert!(p("/orders/{id}/capture").matches("/orders/42/capture"));
        assert!(!p("/orders/{id}/capture").matches("/orders/42/refund"));
        assert!(p("/hooks/*").matches("/hooks"));
        assert!(p("/hooks/*").matches("/hooks/a/b/c"));
        assert!(!p("/hooks/*").matches("/hookshot"));
        assert!(p("/*").matches("/anything/at/all"));
        assert!(p("/%7Eme/").matches("/~me"), "patterns are normalized too");
        assert!(
            p("/{id}/{x}").matches("/7/8"),
            "braces are read before escaping"
        );
        assert!(p("/a:b@c").matches("/a:b@c"));
        for bad in [
            "orders", "/a*", "/a/*/b", "/{}", "/{a-b}", "/x{id}", "/a//b", "/a/./b", "/a/../b",
        ] {
            assert!(bad.parse::<RoutePattern>().is_err(), "{bad}");
        }
    }

    #[test]
    fn folded_patterns_meet_the_spellings_a_lenient_router_takes_as_theirs() {
        let fold = PathFold::NONE
            .with_case_insensitive(true)
            .with_format_suffix(true);
        let matches = |pattern: &str, fold: PathFold, path: &str| {
            let pattern: RoutePattern = pattern.parse().unwrap();
            pattern.folded(fold).matches(&fold.apply(path))
        };
        assert!(matches(
            "/Payments/{id}/capture",
            fold,
            "/payments/P1/CAPTURE.json"
        ));
        assert!(matches("/payments", fold, "/PAYMENTS.xml"));
        assert!(
            matches("/v1.0", fold, "/v1.json"),
            "a final literal loses its suffix too"
        );
        assert!(matches("/hooks/*", fold, "/Hooks/a/b.json"));
        assert!(!matches("/payments", fold, "/payment"));
        let case = PathFold::NONE.with_case_insensitive(true);
        assert!(!matches("/payments", case, "/payments.json"));
        assert!(!matches("/payments", PathFold::NONE, "/Payments"));
        let pattern: RoutePattern = "/Orders/{id}".parse().unwrap();
        assert!(pattern.folded(PathFold::NONE).matches("/Orders/AB"));
    }
}
