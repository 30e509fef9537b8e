//! The route file (`idemgate proxy --config FILE`) as TOML: one `[[route]]`
//! table per route, each a method, a path pattern and a [`PolicyOverride`],
//! checked where each value is so an error names its line and column, then
//! resolved over the default route's [`Policy`] and checked as a whole.

use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use idemgate::fingerprint::{BodySelection, JsonPointer};
use idemgate::key::{ContentDedup, KeySource};
use idemgate::problem::ProblemShape;
use idemgate::webhook::{Provider, Webhook};
use idemgate::{
    GrpcCode, ObservedResponses, ReplayedHeaders, ServerErrorPolicy, StrategyMode, UnlistableHeader,
};
use serde::Deserialize;

use super::pattern::RoutePattern;
use super::policy::{Conditional, Policy, PolicyOverride};
use crate::forward::ForwardKey;
use crate::guard::{MethodOverride, SafeMethodBodies};

/// The route file, checked: its routes in file order, each checked as resolved
/// over the defaults it was loaded with (the default route it is served with).
#[derive(Debug, Clone, Default)]
pub struct Routes {
    routes: Vec<Route>,
}

/// One `[[route]]`: what it matches and what it sets.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub(crate) method: Method,
    pub(crate) pattern: RoutePattern,
    /// What the table sets; the rest is the default route's, laid under it
    /// when the table is built ([`Policy::overlaid`]).
    pub(crate) overrides: PolicyOverride,
    /// The line of the route's `[[route]]`, for messages.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) line: usize,
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
    /// Checks the route file text `text` (`path` only names it in errors) and
    /// resolves each route over `defaults`, the default route's policy: every
    /// key, how the keys of one route go together, and each route's record
    /// timing as resolved (a TTL or a dedup window must outlast the lease, or a
    /// record could expire while its request runs). The one loader of a route
    /// file: startup, `--check-config` and a reload all come here.
    ///
    /// ```
    /// use idemgate_proxy::{Policy, Routes};
    ///
    /// let routes = Routes::from_toml("routes.toml".as_ref(), r#"
    ///     [[route]]
    ///     method = "POST"
    ///     path = "/payments/{id}/capture"
    ///     require_key = true
    ///     fingerprint = { except = ["/sent_at"] }
    ///
    ///     [[route]]
    ///     method = "POST"
    ///     path = "/webhooks/*"
    ///     enabled = false
    /// "#, &Policy::default()).unwrap();
    /// assert_eq!(routes.len(), 2);
    /// ```
    pub fn from_toml(path: &Path, text: &str, defaults: &Policy) -> Result<Self, RoutesError> {
        let file: File = toml::from_str(text).map_err(|error| {
            let at = error.span().map_or(0, |span| span.start);
            invalid(path, text, at, error.message().trim_end().to_owned())
        })?;
        let routes = file
            .route
            .into_iter()
            .map(|entry| {
                let at = entry.span().start;
                let line = line_and_column(text, at).0;
                let (method, pattern, overrides) = entry
                    .into_inner()
                    .into_parts()
                    .map_err(|(at, message)| invalid(path, text, at, message))?;
                if let Some(problem) = defaults.overlaid(&overrides).timing_problem() {
                    return Err(RoutesError::Invalid {
                        path: path.to_owned(),
                        line,
                        column: 1,
                        message: format!("route {method} {pattern}: {problem}"),
                    });
                }
                Ok(Route {
                    method,
                    pattern,
                    overrides,
                    line,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { routes })
    }

    /// How many routes the file has.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether the file has no route (every request gets the defaults).
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
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

// --- The file as serde reads it: each value checked where it is, so an error
// --- carries its position.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    route: Vec<toml::Spanned<RouteEntry>>,
}

/// A `[[route]]` table: the route's method and path, and its overrides, each
/// key in its TOML spelling (`docs/proxy.md`).
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
    server_errors: Option<ServerErrorPolicy>,
    grpc_released: Option<Vec<GrpcCode>>,
    rejections: Option<Vec<Rejection>>,
    fingerprint: Option<FingerprintSetting>,
    forward_key: Option<ForwardKey>,
    problem_shape: Option<ProblemShape>,
    key: Option<toml::Spanned<KeySourceText>>,
    dedup: Option<toml::Spanned<DedupSetting>>,
    mode: Option<toml::Spanned<StrategyMode>>,
    observe_responses: Option<ObservedResponses>,
    case_insensitive: Option<bool>,
    format_suffix: Option<bool>,
    method_override: Option<MethodOverride>,
    safe_method_body: Option<SafeMethodBodies>,
    upstream_idle_timeout_ms: Option<NonZeroU64>,
    upstream_response_timeout_ms: Option<NonZeroU64>,
    conditional: Option<ConditionalSetting>,
    require_if_match: Option<bool>,
    replay_headers: Option<Vec<ReplayHeaderName>>,
    replay_set_cookie: Option<bool>,
    webhook: Option<toml::Spanned<WebhookSetting>>,
    jsonrpc: Option<bool>,
}

fn yes() -> bool {
    true
}

impl RouteEntry {
    /// The route's method, pattern and overrides, or where (a byte offset) and
    /// why its keys do not go together.
    fn into_parts(self) -> Result<(Method, RoutePattern, PolicyOverride), (usize, String)> {
        let pattern = self.path.0;
        let disabled = |spanned_at: usize, what: &str| -> Result<(), (usize, String)> {
            if self.enabled {
                Ok(())
            } else {
                Err((spanned_at, format!("{what} on a disabled route")))
            }
        };
        let key = match self.key {
            Some(spanned) => {
                let at = spanned.span().start;
                let source = spanned.into_inner().0;
                if let Some(param) = source.path_parameter()
                    && !pattern.has_parameter(param)
                {
                    return Err((
                        at,
                        format!(
                            "key = \"{source}\": the route's path {pattern} has no {{{param}}} segment"
                        ),
                    ));
                }
                disabled(at, &format!("key = \"{source}\""))
                    .map_err(|(at, why)| (at, format!("{why}: nothing would read it")))?;
                Some(Some(source))
            }
            None => None,
        };
        let dedup = match self.dedup {
            Some(spanned) => {
                disabled(spanned.span().start, "dedup")
                    .map_err(|(at, why)| (at, format!("{why}: nothing would deduplicate")))?;
                let setting = spanned.into_inner();
                Some(Some(ContentDedup::new(setting.window.0).with_fields(
                    setting.fields.into_iter().map(|p| p.0).collect(),
                )))
            }
            None => None,
        };
        let mode = match self.mode {
            Some(spanned) => {
                disabled(spanned.span().start, "mode")
                    .map_err(|(at, why)| (at, format!("{why}: there is no strategy to observe")))?;
                Some(spanned.into_inner())
            }
            None => None,
        };
        let webhook = match self.webhook {
            Some(spanned) => {
                let at = spanned.span().start;
                disabled(at, "webhook")
                    .map_err(|(at, why)| (at, format!("{why}: nothing would verify it")))?;
                // A delivery is keyed by its own id, always enforced.
                if key.is_some() || dedup.is_some() {
                    return Err((
                        at,
                        "webhook: a delivery is keyed by its own id; remove key and dedup"
                            .to_owned(),
                    ));
                }
                if matches!(mode, Some(StrategyMode::Observe)) {
                    return Err((at, "webhook: a delivery's signature and id are always enforced; remove mode = \"observe\"".to_owned()));
                }
                Some(spanned.into_inner().resolve().map_err(|why| (at, why))?)
            }
            None => None,
        };
        // Requiring If-Match is enforcing it: a required precondition nobody
        // checks would be a promise the upstream does not keep.
        let conditional = match (self.require_if_match, self.conditional) {
            (Some(true), _) => Some(Conditional::RequireIfMatch),
            (_, Some(ConditionalSetting::Enforce)) => Some(Conditional::Enforce),
            (Some(false), _) | (_, Some(ConditionalSetting::Off)) => Some(Conditional::Off),
            (None, None) => None,
        };
        let overrides = PolicyOverride {
            enabled: Some(self.enabled),
            require_key: self.require_key,
            ttl: self.ttl.map(|s| Duration::from_secs(s.get())),
            lease: self.lease.map(|s| Duration::from_secs(s.get())),
            wait: self.wait_ms.map(Duration::from_millis),
            max_request_body: self.max_request_body,
            max_stored_response: self.max_stored_response,
            // A provider redelivers after a 5xx: a webhook route releases it.
            server_errors: self
                .server_errors
                .or(webhook.is_some().then_some(ServerErrorPolicy::Release)),
            grpc_released: self.grpc_released,
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
            // What a disabled route passes through untouched keeps the
            // client's key, unless the route says otherwise.
            forward_key: self
                .forward_key
                .or((!self.enabled).then_some(ForwardKey::Original)),
            problem_shape: self.problem_shape,
            key,
            dedup,
            mode,
            observe_responses: self.observe_responses,
            jsonrpc: self.jsonrpc,
            case_insensitive: self.case_insensitive,
            format_suffix: self.format_suffix,
            method_override: self.method_override,
            safe_method_bodies: self.safe_method_body,
            upstream_idle_timeout: self
                .upstream_idle_timeout_ms
                .map(|ms| Some(Duration::from_millis(ms.get()))),
            upstream_response_timeout: self
                .upstream_response_timeout_ms
                .map(|ms| Some(Duration::from_millis(ms.get()))),
            conditional,
            replay_headers: self
                .replay_headers
                .map(|names| names.into_iter().map(|n| n.0).collect()),
            replay_set_cookie: self.replay_set_cookie,
            webhook: webhook.map(Some),
        };
        Ok((self.method.0, pattern, overrides))
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

/// `webhook = { provider = "stripe", secret = "env:NAME", tolerance = "5m" }`,
/// or `secrets = ["env:A", "env:B"]` during a rotation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookSetting {
    provider: Provider,
    secret: Option<SecretName>,
    #[serde(default)]
    secrets: Vec<SecretName>,
    tolerance: Option<WindowText>,
}

impl WebhookSetting {
    /// The webhook, its secrets read from the environment now (at load).
    fn resolve(self) -> Result<Webhook, String> {
        let provider = self.provider;
        let names: Vec<SecretName> = self.secret.into_iter().chain(self.secrets).collect();
        if names.is_empty() {
            return Err(format!(
                "webhook ({provider}): name its secret, secret = \"env:NAME\" (or secrets = [\"env:A\", \"env:B\"] during a rotation)"
            ));
        }
        let secrets = names
            .iter()
            .map(|name| match std::env::var(&name.0) {
                Ok(value) if !value.is_empty() => Ok(value),
                Ok(_) => Err(format!(
                    "webhook ({provider}): the variable {} of secret env:{} is empty",
                    name.0, name.0
                )),
                Err(_) => Err(format!(
                    "webhook ({provider}): the variable {} of secret env:{} is not set",
                    name.0, name.0
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut webhook = Webhook::new(provider, &secrets)
            .map_err(|error| format!("webhook ({provider}): {error}"))?;
        if let Some(tolerance) = self.tolerance {
            if !provider.signs_timestamps() {
                return Err(format!(
                    "webhook ({provider}): {provider} signs no timestamp, so there is no tolerance to set"
                ));
            }
            webhook = webhook.with_tolerance(tolerance.0);
        }
        Ok(webhook)
    }
}

/// `"env:NAME"`: a secret is named, never written in the route file.
#[derive(Deserialize)]
#[serde(try_from = "String")]
struct SecretName(String);

impl TryFrom<String> for SecretName {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        match text.strip_prefix("env:") {
            Some(name)
                if !name.is_empty()
                    && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
            {
                Ok(Self(name.to_owned()))
            }
            _ => Err(
                "a webhook secret is named as \"env:NAME\" (an environment variable read at load); the secret itself never goes in the route file"
                    .to_owned(),
            ),
        }
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

/// `conditional = "off" | "enforce"`.
#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum ConditionalSetting {
    Off,
    Enforce,
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
        let routes = parse(
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
            .map(|route| resolved(route).conditional)
            .collect();
        assert_eq!(
            policies,
            [
                Conditional::Enforce,
                Conditional::RequireIfMatch,
                Conditional::Off
            ]
        );
        let error = error("[[route]]\nmethod = \"PUT\"\npath = \"/a\"\nconditional = \"always\"\n");
        assert!(error.contains("enforce"), "{error}");
    }

    #[test]
    fn replay_headers_are_storable_header_names() {
        let routes = parse(
            "[[route]]\nmethod = \"POST\"\npath = \"/a\"\nreplay_headers = [\"X-Order-Ref\"]\nreplay_set_cookie = true\n",
        )
        .unwrap();
        let policy = &resolved(routes.iter().next().unwrap());
        assert_eq!(
            policy.replay_headers,
            [HeaderName::from_static("x-order-ref")]
        );
        assert!(policy.replay_set_cookie);
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

    /// `route` over the built-in defaults.
    fn resolved(route: &Route) -> Policy {
        Policy::default().overlaid(&route.overrides)
    }

    fn parse(text: &str) -> Result<Routes, RoutesError> {
        Routes::from_toml(Path::new("routes.toml"), text, &Policy::default())
    }

    /// The defaults of a proxy started with `--ttl TTL --lease LEASE`.
    fn timed(ttl: u64, lease: u64) -> Policy {
        Policy {
            ttl: Duration::from_secs(ttl),
            lease: Duration::from_secs(lease),
            ..Policy::default()
        }
    }

    fn error(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn every_key_parses() {
        // Defaults other than the built-in ones, so inheriting them shows.
        let mut defaults = timed(7200, 5);
        defaults.case_insensitive = true;
        defaults.method_override = MethodOverride::Honour;
        let routes = Routes::from_toml(
            Path::new("routes.toml"),
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
            grpc_released = ["UNAVAILABLE", "aborted"]
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
            &defaults,
        )
        .unwrap();
        let route = &routes.routes[0];
        assert_eq!(route.method, Method::PUT);
        assert_eq!(route.line, 2, "the route's [[route]] line");
        let policy = &defaults.overlaid(&route.overrides);
        assert!(policy.enabled && policy.require_key);
        assert_eq!(policy.ttl, Duration::from_secs(172_800));
        assert_eq!(policy.lease, Duration::from_secs(60));
        assert_eq!(policy.wait, Duration::from_millis(2500));
        assert_eq!(policy.max_request_body, 65536);
        assert_eq!(policy.max_stored_response, 4096);
        assert_eq!(policy.server_errors, ServerErrorPolicy::Release);
        assert_eq!(
            policy.grpc_released,
            [GrpcCode::Unavailable, GrpcCode::Aborted]
        );
        assert_eq!(
            policy.rejections,
            vec![StatusCode::BAD_REQUEST, StatusCode::CONFLICT]
        );
        assert_eq!(
            policy.fingerprint,
            BodySelection::Only(vec![
                "/amount".parse().unwrap(),
                "/currency".parse().unwrap()
            ])
        );
        assert_eq!(policy.forward_key, ForwardKey::Original);
        assert!(policy.case_insensitive);
        assert!(policy.format_suffix);
        assert_eq!(policy.method_override, MethodOverride::Honour);
        assert_eq!(policy.safe_method_bodies, SafeMethodBodies::Forward);
        assert_eq!(policy.problem_shape, ProblemShape::Stripe);
        assert_eq!(
            policy.upstream_idle_timeout,
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            policy.upstream_response_timeout,
            Some(Duration::from_secs(60))
        );
        let hooks = &defaults.overlaid(&routes.routes[1].overrides);
        assert_eq!(
            (
                hooks.case_insensitive,
                hooks.format_suffix,
                hooks.method_override,
                hooks.ttl,
            ),
            (
                defaults.case_insensitive,
                false,
                defaults.method_override,
                defaults.ttl
            ),
            "unset keys inherit"
        );
        assert!(!resolved(&routes.routes[1]).enabled);
        assert_eq!(
            resolved(&routes.routes[1]).forward_key,
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
        let doc = include_str!("../../../../docs/proxy.md");
        let example = doc
            .split("```toml\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("docs/proxy.md has a TOML example");
        // The proxy's default record timing: a day's TTL, a 30 s lease.
        let routes =
            Routes::from_toml(Path::new("routes.toml"), example, &timed(86_400, 30)).unwrap();
        assert_eq!(routes.len(), 4);
        let payments = &routes.routes[0];
        assert!(payments.matches(&Method::POST, "/payments/p_1/capture"));
        assert_eq!(resolved(payments).forward_key, ForwardKey::Original);
        assert_eq!(resolved(&routes.routes[1]).forward_key, ForwardKey::Derived);
        assert!(!resolved(&routes.routes[3]).enabled);
    }

    #[test]
    fn the_mcp_and_completion_recipes_of_docs_proxy_md_load() {
        let doc = include_str!("../../../../docs/proxy.md");
        let block = |marker: &str| {
            doc.split("```toml\n")
                .filter_map(|rest| rest.split("```").next())
                .find(|block| block.contains(marker))
                .unwrap_or_else(|| panic!("docs/proxy.md has a TOML block with {marker}"))
        };
        let defaults = timed(86_400, 30);
        let mcp =
            Routes::from_toml(Path::new("r.toml"), block("jsonrpc = true"), &defaults).unwrap();
        let tool_calls = resolved(&mcp.routes[0]);
        assert!(tool_calls.jsonrpc);
        assert!(tool_calls.key.is_some());
        let completions = Routes::from_toml(
            Path::new("r.toml"),
            block("/v1/chat/completions"),
            &defaults,
        )
        .unwrap();
        assert!(resolved(&completions.routes[0]).require_key);
    }

    #[test]
    fn a_key_source_is_read_and_checked_against_the_route() {
        let routes = parse(
            "[[route]]\nmethod = \"PUT\"\npath = \"/orders/{order_id}\"\nkey = \"path:order_id\"\n\n\
             [[route]]\nmethod = \"POST\"\npath = \"/transfers\"\nkey = \"json:/reference_id\"\n",
        )
        .unwrap();
        assert_eq!(
            resolved(&routes.routes[0]).key,
            Some(KeySource::Path("order_id".into()))
        );
        assert_eq!(
            resolved(&routes.routes[1])
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
            .map(|route| resolved(route).dedup.as_ref().unwrap().window().as_secs())
            .collect();
        assert_eq!(windows, [300, 3600, 300]);
        assert_eq!(
            resolved(&dedup.routes[0])
                .dedup
                .as_ref()
                .unwrap()
                .selection(),
            BodySelection::Only(vec!["/to".parse().unwrap()])
        );
        let short = Routes::from_toml(
            Path::new("routes.toml"),
            "[[route]]\nmethod = \"POST\"\npath = \"/t\"\ndedup = { window = \"5m\", fields = [\"/to\"] }\n",
            &timed(86_400, 400),
        )
        .unwrap_err()
        .to_string();
        assert!(short.contains("dedup window"), "{short}");
        let observe =
            parse("[[route]]\nmethod = \"POST\"\npath = \"/t\"\nmode = \"observe\"\n").unwrap();
        assert_eq!(resolved(&observe.routes[0]).mode, StrategyMode::Observe);
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
        let text = "\n[[route]]\nmethod = \"POST\"\npath = \"/a\"\nttl = 10\n";
        let load = |defaults: &Policy| Routes::from_toml(Path::new("routes.toml"), text, defaults);
        assert!(load(&timed(86_400, 5)).is_ok());
        let message = load(&timed(86_400, 30)).unwrap_err().to_string();
        assert!(message.starts_with("routes.toml:2:"), "{message}");
        assert!(message.contains("must be longer than lease"), "{message}");
    }
}
