//! Per-route policies (`idemgate proxy --config FILE`): which requests the
//! idempotency layer covers, and how, by method and path.
//!
//! The file is TOML, one `[[route]]` table per route, tried in order; the first
//! whose method and path pattern match decides. A request no route matches gets
//! the defaults (the command line's settings: `POST` and `PATCH` covered). The
//! keys are documented in `docs/proxy.md`.
//!
//! ```
//! let routes = idemgate_proxy::Routes::from_toml("routes.toml".as_ref(), r#"
//!     [[route]]
//!     method = "POST"
//!     path = "/payments/{id}/capture"
//!     require_key = true
//!     fingerprint = { except = ["/sent_at"] }
//!
//!     [[route]]
//!     method = "POST"
//!     path = "/webhooks/*"
//!     enabled = false
//! "#).unwrap();
//! assert_eq!(routes.len(), 2);
//! ```

use std::fmt;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use idemgate::fingerprint::{BodySelection, JsonPointer};
use idemgate::key::{ContentDedup, KeySource};
use idemgate::path::PathFold;
use idemgate::problem::ProblemShape;
use idemgate::scope::normalize_path;
use idemgate::{
    IdempotencyLayer, ReplayedHeaders, ServerErrorPolicy, StrategyMode, UnlistableHeader,
};

use crate::guard::{MethodOverride, SafeMethodBodies};
use serde::Deserialize;

/// The upstream statuses that mean "refused before anything happened" unless a
/// route says otherwise: their claim is undone, so the client can correct the
/// body and reuse the key.
pub const DEFAULT_REJECTIONS: [StatusCode; 4] = [
    StatusCode::BAD_REQUEST,
    StatusCode::UNAUTHORIZED,
    StatusCode::FORBIDDEN,
    StatusCode::UNPROCESSABLE_ENTITY,
];

/// Which `Idempotency-Key` the upstream receives for a covered request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ForwardKey {
    /// A key derived from the operation id (PROTOCOL §11): stable across
    /// takeovers and releases, distinct per principal, new after expiry. The
    /// default.
    #[default]
    Derived,
    /// The client's key as it sent it (for an upstream that shares the key space
    /// with the client, e.g. to look operations up by it). Two principals' equal
    /// keys then reach the upstream equal.
    Original,
    /// No `Idempotency-Key` at all.
    None,
}

/// The policy file, checked: the routes in file order.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    path: PathBuf,
    routes: Vec<Route>,
}

/// One `[[route]]`.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub(crate) method: Method,
    pub(crate) pattern: RoutePattern,
    pub(crate) policy: RoutePolicy,
    /// The line of the route's `[[route]]`, for messages.
    line: usize,
}

/// What a route sets; `None` keeps the default.
#[derive(Debug, Clone)]
pub(crate) struct RoutePolicy {
    enabled: bool,
    require_key: Option<bool>,
    ttl: Option<Duration>,
    lease: Option<Duration>,
    wait: Option<Duration>,
    max_request_body: Option<usize>,
    max_stored_response: Option<usize>,
    server_errors: Option<ServerErrorPolicy>,
    fingerprint: Option<BodySelection>,
    pub(crate) rejections: Option<Vec<StatusCode>>,
    forward_key: Option<ForwardKey>,
    /// The route's problem body shape; `None`: the proxy-wide one.
    problem_shape: Option<ProblemShape>,
    /// Where the route's key is read (`key = "json:/reference_id"`); `None`: the
    /// `Idempotency-Key` header.
    key: Option<KeySource>,
    /// Content-based deduplication of keyless requests (`dedup = { window, fields }`).
    dedup: Option<ContentDedup>,
    /// `mode = "observe"`: measure the route's key strategy without enforcing it.
    mode: Option<StrategyMode>,
    /// `None`: the proxy-wide setting.
    pub(crate) case_insensitive: Option<bool>,
    pub(crate) format_suffix: bool,
    pub(crate) method_override: Option<MethodOverride>,
    pub(crate) safe_method_body: Option<SafeMethodBodies>,
    pub(crate) upstream_idle_timeout: Option<Duration>,
    pub(crate) upstream_response_timeout: Option<Duration>,
    /// `conditional = "enforce"`: the proxy enforces the route's preconditions.
    pub(crate) conditional: bool,
    /// `require_if_match`: 428 for a write without `If-Match`.
    pub(crate) require_if_match: bool,
    /// Response headers replays repeat beyond the proxy-wide ones.
    replay_headers: Vec<HeaderName>,
    /// `None`: the proxy-wide setting.
    replay_set_cookie: Option<bool>,
}

/// A route's `conditional` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Conditional {
    /// The upstream's business (the default).
    Off,
    /// The proxy evaluates `If-Match` & co. against the upstream's current ETag.
    Enforce,
}

/// Why the policy file was refused. Both name the file; a bad file also names the
/// line and column of the problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RoutesError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, or not a policy this proxy can follow.
    #[error("{}:{line}:{column}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column of the problem.
        column: usize,
        /// What is wrong.
        message: String,
    },
}

impl Routes {
    /// Reads and checks the policy file at `path`.
    pub fn load(path: &Path) -> Result<Self, RoutesError> {
        let text = std::fs::read_to_string(path).map_err(|source| RoutesError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(path, &text)
    }

    /// Checks the policy text `text`; `path` only names it in errors.
    pub fn from_toml(path: &Path, text: &str) -> Result<Self, RoutesError> {
        let file: File = toml::from_str(text).map_err(|error| {
            let at = error.span().map_or(0, |span| span.start);
            invalid(path, text, at, error.message().trim_end().to_owned())
        })?;
        let routes = file
            .route
            .into_iter()
            .map(|entry| {
                let line = line_and_column(text, entry.span().start).0;
                entry
                    .into_inner()
                    .into_route(line)
                    .map_err(|(at, message)| invalid(path, text, at, message))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            path: path.to_owned(),
            routes,
        })
    }

    /// How many routes the file has.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether the file has no route (every request gets the defaults).
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Checks each route's record timing against the defaults it inherits: a TTL
    /// must outlast the lease, or a record could expire while its request runs.
    pub fn check_timing(&self, ttl: Duration, lease: Duration) -> Result<(), RoutesError> {
        for route in &self.routes {
            let route_ttl = route.policy.ttl.unwrap_or(ttl);
            let route_lease = route.policy.lease.unwrap_or(lease);
            if let Some(window) = route.policy.dedup.as_ref().map(ContentDedup::window)
                && window <= route_lease
            {
                return Err(RoutesError::Invalid {
                    path: self.path.clone(),
                    line: route.line,
                    column: 1,
                    message: format!(
                        "route {} {}: the dedup window ({} s) must be longer than lease ({} s)",
                        route.method,
                        route.pattern,
                        window.as_secs(),
                        route_lease.as_secs()
                    ),
                });
            }
            if route_ttl <= route_lease {
                return Err(RoutesError::Invalid {
                    path: self.path.clone(),
                    line: route.line,
                    column: 1,
                    message: format!(
                        "route {} {}: ttl ({} s) must be longer than lease ({} s)",
                        route.method,
                        route.pattern,
                        route_ttl.as_secs(),
                        route_lease.as_secs()
                    ),
                });
            }
        }
        Ok(())
    }

    /// The routes, in file order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Route> {
        self.routes.iter()
    }
}

impl Route {
    /// Whether this route decides for a request of `method` to the normalized
    /// path `path`, no fold applied (the dispatcher matches folded patterns).
    #[cfg(test)]
    pub(crate) fn matches(&self, method: &Method, path: &str) -> bool {
        self.method == method && self.pattern.matches(path)
    }
}

impl RoutePolicy {
    /// The key the upstream gets: as set, else the derived one — except on a
    /// disabled route, passed through untouched, where the client's own key goes
    /// on as sent.
    pub(crate) fn forward_key(&self) -> ForwardKey {
        match (self.forward_key, self.enabled) {
            (Some(key), _) => key,
            (None, true) => ForwardKey::Derived,
            (None, false) => ForwardKey::Original,
        }
    }

    /// The spellings this route takes as one path: ASCII case as set (else as
    /// `case_insensitive`, the proxy-wide setting), and its format suffix.
    pub(crate) fn fold(&self, case_insensitive: bool) -> PathFold {
        PathFold::NONE
            .with_case_insensitive(self.case_insensitive.unwrap_or(case_insensitive))
            .with_format_suffix(self.format_suffix)
    }

    /// The layer for this route: `base` (the defaults, sharing its store and its
    /// detached-task tracker) with this route's settings, covering `method` only
    /// — or nothing, so every request passes through, when disabled — and
    /// scoping by the path folded by `fold` (by `pattern`, the route's template,
    /// when the key is one of its parameters).
    pub(crate) fn layer(
        &self,
        method: &Method,
        pattern: &RoutePattern,
        base: &IdempotencyLayer,
        fold: PathFold,
    ) -> IdempotencyLayer {
        let mut layer = base
            .clone()
            .with_methods(if self.enabled {
                vec![method.clone()]
            } else {
                Vec::new()
            })
            .with_path_fold(fold);
        if let Some(require) = self.require_key {
            layer = layer.with_require_key(require);
        }
        if let Some(shape) = self.problem_shape {
            layer = layer.with_problem_shape(shape);
        }
        if let Some(ttl) = self.ttl {
            layer = layer.with_ttl(ttl);
        }
        if let Some(lease) = self.lease {
            layer = layer.with_lease(lease);
        }
        if let Some(wait) = self.wait {
            // A zero wait is no wait: a duplicate gets 409 at once.
            layer = layer.with_wait(wait);
        }
        if let Some(bytes) = self.max_request_body {
            layer = layer.with_body_limit(bytes);
        }
        if let Some(bytes) = self.max_stored_response {
            layer = layer.with_response_limit(bytes);
        }
        if let Some(policy) = self.server_errors {
            layer = layer.with_server_error_policy(policy);
        }
        if let Some(selection) = &self.fingerprint {
            layer = layer.with_fingerprint_body(selection.clone());
        }
        if let Some(source) = &self.key {
            layer = layer.with_key_source(source.clone());
        }
        if let Some(dedup) = &self.dedup {
            layer = layer.with_content_dedup(dedup.clone());
        }
        if let Some(mode) = self.mode {
            layer = layer.with_mode(mode);
        }
        if !self.replay_headers.is_empty() {
            layer = layer.with_replayed_header_names(self.replay_headers.iter().cloned());
        }
        if let Some(replay) = self.replay_set_cookie {
            layer = layer.with_replayed_set_cookie(replay);
        }
        if self.key.is_some() || self.dedup.is_some() {
            // A path key and content dedup scope by the route, not the path.
            layer = layer.with_route_template(pattern.to_string());
        }
        layer
    }
}

fn invalid(path: &Path, text: &str, at: usize, message: String) -> RoutesError {
    let (line, column) = line_and_column(text, at);
    RoutesError::Invalid {
        path: path.to_owned(),
        line,
        column,
        message,
    }
}

/// The 1-based line and column of byte offset `at` of `text`.
fn line_and_column(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |newline| newline + 1) + 1;
    (line, column)
}

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
    fn has_parameter(&self, name: &str) -> bool {
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

// --- The file as serde reads it: each value checked where it is, so an error
// --- carries its position.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    route: Vec<toml::Spanned<RouteEntry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteEntry {
    method: MethodName,
    path: PatternText,
    #[serde(default = "yes")]
    enabled: bool,
    require_key: Option<bool>,
    /// Seconds.
    ttl: Option<NonZeroU64>,
    /// Seconds.
    lease: Option<NonZeroU64>,
    wait_ms: Option<u64>,
    max_request_body: Option<usize>,
    max_stored_response: Option<usize>,
    server_errors: Option<ServerErrors>,
    rejections: Option<Vec<Rejection>>,
    fingerprint: Option<FingerprintSetting>,
    forward_key: Option<ForwardKey>,
    problem_shape: Option<ProblemShapeSetting>,
    key: Option<toml::Spanned<KeySourceText>>,
    dedup: Option<toml::Spanned<DedupSetting>>,
    mode: Option<toml::Spanned<ModeSetting>>,
    case_insensitive: Option<bool>,
    #[serde(default)]
    format_suffix: bool,
    method_override: Option<MethodOverride>,
    safe_method_body: Option<SafeMethodBodies>,
    upstream_idle_timeout_ms: Option<NonZeroU64>,
    upstream_response_timeout_ms: Option<NonZeroU64>,
    conditional: Option<Conditional>,
    require_if_match: Option<bool>,
    #[serde(default)]
    replay_headers: Vec<ReplayHeaderName>,
    replay_set_cookie: Option<bool>,
}

fn yes() -> bool {
    true
}

impl RouteEntry {
    /// The route, or where (a byte offset) and why its keys do not go together.
    fn into_route(self, line: usize) -> Result<Route, (usize, String)> {
        let key = match self.key {
            Some(spanned) => {
                let at = spanned.span().start;
                let source = spanned.into_inner().0;
                if let Some(param) = source.path_parameter()
                    && !self.path.0.has_parameter(param)
                {
                    return Err((
                        at,
                        format!(
                            "key = \"{source}\": the route's path {} has no {{{param}}} segment",
                            self.path.0
                        ),
                    ));
                }
                if !self.enabled {
                    return Err((
                        at,
                        format!("key = \"{source}\" on a disabled route: nothing would read it"),
                    ));
                }
                Some(source)
            }
            None => None,
        };
        let dedup = match self.dedup {
            Some(spanned) if !self.enabled => {
                return Err((
                    spanned.span().start,
                    "dedup on a disabled route: nothing would deduplicate".to_owned(),
                ));
            }
            Some(spanned) => {
                let setting = spanned.into_inner();
                Some(
                    ContentDedup::new(setting.window.0)
                        .with_fields(setting.fields.into_iter().map(|p| p.0).collect()),
                )
            }
            None => None,
        };
        let mode = match self.mode {
            Some(spanned) if !self.enabled => {
                return Err((
                    spanned.span().start,
                    "mode on a disabled route: there is no strategy to observe".to_owned(),
                ));
            }
            Some(spanned) => Some(match spanned.into_inner() {
                ModeSetting::Enforce => StrategyMode::Enforce,
                ModeSetting::Observe => StrategyMode::Observe,
            }),
            None => None,
        };
        Ok(Route {
            method: self.method.0,
            pattern: self.path.0,
            line,
            policy: RoutePolicy {
                enabled: self.enabled,
                require_key: self.require_key,
                ttl: self.ttl.map(|s| Duration::from_secs(s.get())),
                lease: self.lease.map(|s| Duration::from_secs(s.get())),
                wait: self.wait_ms.map(Duration::from_millis),
                max_request_body: self.max_request_body,
                max_stored_response: self.max_stored_response,
                server_errors: self.server_errors.map(|s| match s {
                    ServerErrors::Store => ServerErrorPolicy::Store,
                    ServerErrors::Release => ServerErrorPolicy::Release,
                }),
                fingerprint: self.fingerprint.map(|f| match f {
                    FingerprintSetting::Whole => BodySelection::Whole,
                    FingerprintSetting::Only(p) => {
                        BodySelection::Only(p.into_iter().map(|p| p.0).collect())
                    }
                    FingerprintSetting::Except(p) => {
                        BodySelection::Except(p.into_iter().map(|p| p.0).collect())
                    }
                }),
                rejections: self
                    .rejections
                    .map(|statuses| statuses.into_iter().map(|s| s.0).collect()),
                forward_key: self.forward_key,
                problem_shape: self.problem_shape.map(|shape| match shape {
                    ProblemShapeSetting::Rfc9457 => ProblemShape::Rfc9457,
                    ProblemShapeSetting::Stripe => ProblemShape::Stripe,
                }),
                key,
                dedup,
                mode,
                case_insensitive: self.case_insensitive,
                format_suffix: self.format_suffix,
                method_override: self.method_override,
                safe_method_body: self.safe_method_body,
                upstream_idle_timeout: self
                    .upstream_idle_timeout_ms
                    .map(|ms| Duration::from_millis(ms.get())),
                upstream_response_timeout: self
                    .upstream_response_timeout_ms
                    .map(|ms| Duration::from_millis(ms.get())),
                // Requiring If-Match is enforcing it: a required precondition
                // nobody checks would be a promise the upstream does not keep.
                conditional: self.conditional == Some(Conditional::Enforce)
                    || self.require_if_match == Some(true),
                require_if_match: self.require_if_match == Some(true),
                replay_headers: self.replay_headers.into_iter().map(|n| n.0).collect(),
                replay_set_cookie: self.replay_set_cookie,
            },
        })
    }
}

#[derive(Deserialize)]
#[serde(try_from = "String")]
struct MethodName(Method);

impl TryFrom<String> for MethodName {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(format!(
                "a method is an upper-case name such as \"POST\" (got {text:?})"
            ));
        }
        Method::from_bytes(text.as_bytes())
            .map(Self)
            .map_err(|error| error.to_string())
    }
}

/// A `replay_headers` entry: a header name that can be stored (not one never
/// stored, and `Set-Cookie` only through `replay_set_cookie`).
#[derive(Deserialize)]
#[serde(try_from = "String")]
struct ReplayHeaderName(HeaderName);

impl TryFrom<String> for ReplayHeaderName {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        ReplayedHeaders::listable(&text)
            .map(Self)
            .map_err(|error| match error {
                UnlistableHeader::SetCookie => format!("{error}: replay_set_cookie = true"),
                _ => error.to_string(),
            })
    }
}

#[derive(Deserialize)]
#[serde(try_from = "String")]
struct PatternText(RoutePattern);

impl TryFrom<String> for PatternText {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse().map(Self)
    }
}

/// `dedup = { window = "5m", fields = ["/to", "/amount"] }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DedupSetting {
    window: WindowText,
    #[serde(default)]
    fields: Vec<PointerText>,
}

/// A window: a positive whole number of seconds, minutes or hours (`"300s"`,
/// `"5m"`, `"1h"`).
#[derive(Deserialize)]
#[serde(try_from = "String")]
struct WindowText(Duration);

impl TryFrom<String> for WindowText {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let bad = || {
            format!(
                "a window is a positive number of seconds, minutes or hours: \"300s\", \"5m\", \"1h\" (got {text:?})"
            )
        };
        let unit = match text.chars().last() {
            Some('s') => 1,
            Some('m') => 60,
            Some('h') => 3600,
            _ => return Err(bad()),
        };
        let number: u64 = text[..text.len() - 1].parse().map_err(|_| bad())?;
        match number.checked_mul(unit) {
            Some(seconds) if seconds > 0 => Ok(Self(Duration::from_secs(seconds))),
            _ => Err(bad()),
        }
    }
}

#[derive(Deserialize)]
#[serde(try_from = "String")]
struct KeySourceText(KeySource);

impl TryFrom<String> for KeySourceText {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse().map(Self).map_err(|error| error.to_string())
    }
}

#[derive(Deserialize)]
#[serde(try_from = "String")]
struct PointerText(JsonPointer);

impl TryFrom<String> for PointerText {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse().map(Self).map_err(|error| error.to_string())
    }
}

/// An error status (400–599): a success cannot be "refused before anything
/// happened".
#[derive(Deserialize)]
#[serde(try_from = "u16")]
struct Rejection(StatusCode);

impl TryFrom<u16> for Rejection {
    type Error = String;

    fn try_from(code: u16) -> Result<Self, String> {
        match StatusCode::from_u16(code) {
            Ok(status) if status.is_client_error() || status.is_server_error() => Ok(Self(status)),
            _ => Err(format!(
                "a rejection is an error status, 400 to 599 (got {code})"
            )),
        }
    }
}

/// `problem_shape = "rfc9457" | "stripe"`.
#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum ProblemShapeSetting {
    Rfc9457,
    Stripe,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum ModeSetting {
    Enforce,
    Observe,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum ServerErrors {
    Store,
    Release,
}

/// `fingerprint = "whole"`, `{ only = [...] }` or `{ except = [...] }`.
#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum FingerprintSetting {
    Whole,
    Only(Vec<PointerText>),
    Except(Vec<PointerText>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditional_enforce_and_require_if_match() {
        let routes = Routes::from_toml(
            "routes.toml".as_ref(),
            r#"
            [[route]]
            method = "PUT"
            path = "/docs/*"
            conditional = "enforce"

            [[route]]
            method = "PATCH"
            path = "/docs/*"
            require_if_match = true

            [[route]]
            method = "DELETE"
            path = "/docs/*"
            conditional = "off"
            "#,
        )
        .unwrap();
        let policies: Vec<_> = routes
            .iter()
            .map(|route| (route.policy.conditional, route.policy.require_if_match))
            .collect();
        assert_eq!(policies, [(true, false), (true, true), (false, false)]);
        let error = Routes::from_toml(
            "routes.toml".as_ref(),
            "[[route]]\nmethod = \"PUT\"\npath = \"/a\"\nconditional = \"always\"\n",
        )
        .unwrap_err();
        assert!(error.to_string().contains("enforce"), "{error}");
    }

    #[test]
    fn replay_headers_are_storable_header_names() {
        let routes = parse(
            "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nreplay_headers = [\"X-Order-Ref\"]\nreplay_set_cookie = true\n",
        )
        .unwrap();
        let policy = &routes.iter().next().unwrap().policy;
        assert_eq!(
            policy.replay_headers,
            [HeaderName::from_static("x-order-ref")]
        );
        assert_eq!(policy.replay_set_cookie, Some(true));
        for (name, says) in [
            ("set-cookie", "replay_set_cookie"),
            ("Date", "never stored"),
            ("connection", "never stored"),
            ("bad name", "not a header name"),
        ] {
            let message = error(&format!(
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nreplay_headers = [\"{name}\"]\n"
            ));
            assert!(message.contains(says), "{name}: {message}");
            assert!(message.starts_with("routes.toml:4:"), "{message}");
        }
    }

    fn parse(text: &str) -> Result<Routes, RoutesError> {
        Routes::from_toml(Path::new("routes.toml"), text)
    }

    fn error(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

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

    #[test]
    fn every_key_parses() {
        let routes = parse(
            r#"
            [[route]]
            method = "PUT"
            path = "/payments/{id}"
            enabled = true
            require_key = true
            ttl = 172800
            lease = 60
            wait_ms = 2500
            max_request_body = 65536
            max_stored_response = 4096
            server_errors = "release"
            rejections = [400, 409]
            fingerprint = { only = ["/amount", "/currency"] }
            forward_key = "original"
            case_insensitive = true
            format_suffix = true
            method_override = "honour"
            safe_method_body = "forward"
            upstream_idle_timeout_ms = 1500
            upstream_response_timeout_ms = 60000
            problem_shape = "stripe"

            [[route]]
            method = "POST"
            path = "/hooks/*"
            enabled = false
            fingerprint = "whole"
            "#,
        )
        .unwrap();
        let route = &routes.routes[0];
        assert_eq!(route.method, Method::PUT);
        assert_eq!(route.line, 2, "the route's [[route]] line");
        let policy = &route.policy;
        assert_eq!(policy.ttl, Some(Duration::from_secs(172_800)));
        assert_eq!(policy.lease, Some(Duration::from_secs(60)));
        assert_eq!(policy.wait, Some(Duration::from_millis(2500)));
        assert_eq!(policy.max_request_body, Some(65536));
        assert_eq!(policy.max_stored_response, Some(4096));
        assert_eq!(policy.server_errors, Some(ServerErrorPolicy::Release));
        assert_eq!(
            policy.rejections,
            Some(vec![StatusCode::BAD_REQUEST, StatusCode::CONFLICT])
        );
        assert_eq!(
            policy.fingerprint,
            Some(BodySelection::Only(vec![
                "/amount".parse().unwrap(),
                "/currency".parse().unwrap()
            ]))
        );
        assert_eq!(policy.forward_key(), ForwardKey::Original);
        assert_eq!(policy.case_insensitive, Some(true));
        assert!(policy.format_suffix);
        assert_eq!(policy.method_override, Some(MethodOverride::Honour));
        assert_eq!(policy.safe_method_body, Some(SafeMethodBodies::Forward));
        assert_eq!(policy.problem_shape, Some(ProblemShape::Stripe));
        assert_eq!(
            policy.upstream_idle_timeout,
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            policy.upstream_response_timeout,
            Some(Duration::from_secs(60))
        );
        let hooks = &routes.routes[1].policy;
        assert_eq!(
            (
                hooks.case_insensitive,
                hooks.format_suffix,
                hooks.method_override
            ),
            (None, false, None),
            "unset keys inherit"
        );
        assert!(!routes.routes[1].policy.enabled);
        assert_eq!(
            routes.routes[1].policy.forward_key(),
            ForwardKey::Original,
            "a disabled route passes the client's key on"
        );
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn errors_name_the_file_line_and_problem() {
        let cases = [
            (
                "[[route]]\nmethod = \"POST\"\npath = \"orders\"\n",
                "routes.toml:3:",
                "starts with '/'",
            ),
            (
                "[[route]]\nmethod = \"post\"\npath = \"/a\"\n",
                "routes.toml:2:",
                "upper-case",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nttl = 0\n",
                "routes.toml:4:",
                "nonzero",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nrejections = [400, 200]\n",
                "routes.toml:4:",
                "400 to 599",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nfingerprint = { only = [\"amount\"] }\n",
                "routes.toml:4:",
                "starts with '/'",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nfingerprint = \"parts\"\n",
                "routes.toml:4:",
                "whole",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nforward_key = \"raw\"\n",
                "routes.toml:4:",
                "derived",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nserver_errors = \"retry\"\n",
                "routes.toml:4:",
                "release",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nrequire_keys = true\n",
                "routes.toml:4:",
                "require_keys",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nmethod_override = \"yes\"\n",
                "routes.toml:4:",
                "honour",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nsafe_method_body = \"keep\"\n",
                "routes.toml:4:",
                "forward",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nupstream_idle_timeout_ms = 0\n",
                "routes.toml:4:",
                "nonzero",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nformat_suffix = \"json\"\n",
                "routes.toml:4:",
                "bool",
            ),
            ("[[route]]\nmethod = \"POST\"\n", "routes.toml:1:", "path"),
            ("[[route]\n", "routes.toml:1:", ""),
            ("[[routes]]\n", "routes.toml:1:", "routes"),
        ];
        for (text, place, problem) in cases {
            let message = error(text);
            assert!(message.starts_with(place), "{text:?}: {message}");
            assert!(message.contains(problem), "{text:?}: {message}");
        }
    }

    #[test]
    fn the_example_of_docs_proxy_md_is_a_valid_file() {
        let doc = include_str!("../../../docs/proxy.md");
        let example = doc
            .split("```toml\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("docs/proxy.md has a TOML example");
        let routes = parse(example).unwrap();
        assert_eq!(routes.len(), 4);
        let payments = &routes.routes[0];
        assert!(payments.matches(&Method::POST, "/payments/p_1/capture"));
        assert_eq!(payments.policy.forward_key(), ForwardKey::Original);
        assert_eq!(routes.routes[1].policy.forward_key(), ForwardKey::Derived);
        assert!(!routes.routes[3].policy.enabled);
        routes
            .check_timing(Duration::from_secs(86_400), Duration::from_secs(30))
            .unwrap();
    }

    #[test]
    fn a_key_source_is_read_and_checked_against_the_route() {
        let routes = parse(
            "[[route]]\nmethod = \"PUT\"\npath = \"/orders/{order_id}\"\nkey = \"path:order_id\"\n\n\
             [[route]]\nmethod = \"POST\"\npath = \"/transfers\"\nkey = \"json:/reference_id\"\n",
        )
        .unwrap();
        assert_eq!(
            routes.routes[0].policy.key,
            Some(KeySource::Path("order_id".into()))
        );
        assert_eq!(
            routes.routes[1]
                .policy
                .key
                .as_ref()
                .map(ToString::to_string),
            Some("json:/reference_id".into())
        );
        assert_eq!(routes.routes[1].line, 6);
        let dedup = parse(
            "[[route]]\nmethod = \"POST\"\npath = \"/t\"\ndedup = { window = \"5m\", fields = [\"/to\"] }\n\n\
             [[route]]\nmethod = \"POST\"\npath = \"/u\"\ndedup = { window = \"1h\" }\n\n\
             [[route]]\nmethod = \"POST\"\npath = \"/v\"\ndedup = { window = \"300s\" }\n",
        )
        .unwrap();
        let windows: Vec<_> = dedup
            .routes
            .iter()
            .map(|route| route.policy.dedup.as_ref().unwrap().window().as_secs())
            .collect();
        assert_eq!(windows, [300, 3600, 300]);
        assert_eq!(
            dedup.routes[0].policy.dedup.as_ref().unwrap().selection(),
            BodySelection::Only(vec!["/to".parse().unwrap()])
        );
        let short = dedup
            .check_timing(Duration::from_secs(86_400), Duration::from_secs(400))
            .unwrap_err()
            .to_string();
        assert!(short.contains("dedup window"), "{short}");
        let observe =
            parse("[[route]]\nmethod = \"POST\"\npath = \"/t\"\nmode = \"observe\"\n").unwrap();
        assert_eq!(observe.routes[0].policy.mode, Some(StrategyMode::Observe));
        let cases = [
            (
                "[[route]]\nmethod = \"PUT\"\npath = \"/orders/{id}\"\nkey = \"path:order_id\"\n",
                "routes.toml:4:7:",
                "no {order_id} segment",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nkey = \"body:/id\"\n",
                "routes.toml:4:7:",
                "header:NAME",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nkey = \"json:id\"\n",
                "routes.toml:4:7:",
                "starts with '/'",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nenabled = false\nkey = \"query:id\"\n",
                "routes.toml:5:7:",
                "disabled route",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\ndedup = { window = \"5 minutes\" }\n",
                "routes.toml:4:",
                "\"300s\"",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\ndedup = { window = \"0s\" }\n",
                "routes.toml:4:",
                "positive",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\ndedup = { window = \"5m\", fields = [\"to\"] }\n",
                "routes.toml:4:",
                "starts with '/'",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\ndedup = { windows = \"5m\" }\n",
                "routes.toml:4:",
                "windows",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nenabled = false\ndedup = { window = \"5m\" }\n",
                "routes.toml:5:9:",
                "disabled route",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nmode = \"dry-run\"\n",
                "routes.toml:4:",
                "observe",
            ),
            (
                "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nenabled = false\nmode = \"observe\"\n",
                "routes.toml:5:8:",
                "disabled route",
            ),
        ];
        for (text, place, problem) in cases {
            let message = error(text);
            assert!(message.starts_with(place), "{text:?}: {message}");
            assert!(message.contains(problem), "{text:?}: {message}");
        }
    }

    #[test]
    fn a_ttl_must_outlast_the_lease_it_inherits() {
        let routes = parse("\n[[route]]\nmethod = \"POST\"\npath = \"/a\"\nttl = 10\n").unwrap();
        let ok = routes.check_timing(Duration::from_secs(86_400), Duration::from_secs(5));
        assert!(ok.is_ok());
        let message = routes
            .check_timing(Duration::from_secs(86_400), Duration::from_secs(30))
            .unwrap_err()
            .to_string();
        assert!(message.starts_with("routes.toml:2:"), "{message}");
        assert!(message.contains("must be longer than lease"), "{message}");
    }
}
