//! The one policy type: every setting a route can override, resolved.
//!
//! The command line builds a [`Policy`] in which every setting has a value; it is
//! the default route, the one a request no `[[route]]` matches gets. A route
//! file's table is a [`PolicyOverride`] — the same settings, each `None` unless
//! the table sets it — laid over that default by [`Policy::overlaid`]. Both
//! types, and the defaults, come from the one list below, so a setting a route
//! can override is written in four places: its line in that list (its type,
//! default and doc; what it does to the layer, the forwarder or the guard is
//! in this file too), its TOML key (`file`: the key and its reading), its flag
//! when it has one (the binary's `cli`: the flag and where it sets the
//! default), and its row in `docs/proxy.md`.

use std::time::Duration;

use http::{HeaderName, StatusCode};
use idemgate::fingerprint::BodySelection;
use idemgate::key::{ContentDedup, KeySource};
use idemgate::path::PathFold;
use idemgate::problem::ProblemShape;
use idemgate::webhook::Webhook;
use idemgate::{GrpcCode, IdempotencyLayer, ObservedResponses, ServerErrorPolicy, StrategyMode};

use crate::forward::{DEFAULT_REJECTIONS, Forward, ForwardKey};
use crate::guard::{MethodOverride, SafeMethodBodies};

/// Who evaluates a write's preconditions (`If-Match` & co., PROTOCOL §17).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Conditional {
    /// The upstream's business (the default).
    #[default]
    Off,
    /// The proxy evaluates them against the upstream's current ETag, under a
    /// resource lease (`conditional = "enforce"`).
    Enforce,
    /// As `Enforce`, and a write without `If-Match` is refused with `428`
    /// (`require_if_match = true`): a required precondition nobody checked
    /// would be a promise the upstream does not keep.
    RequireIfMatch,
}

/// Declares [`Policy`] and [`PolicyOverride`] from one list of settings, and the
/// overlay of one on the other, so the two can never disagree on a field.
macro_rules! policy {
    ($( $(#[$doc:meta])* $field:ident: $ty:ty = $default:expr, )*) => {
        /// How the proxy treats the requests of one route, every setting
        /// resolved: the command line's defaults (the default route), or a
        /// `[[route]]`'s [`PolicyOverride`] laid over them. Built with
        /// [`Policy::default`] and its fields; `docs/proxy.md` documents each.
        ///
        /// ```
        /// let mut defaults = idemgate_proxy::Policy::default();
        /// defaults.require_key = true;
        /// defaults.wait = std::time::Duration::from_secs(5);
        /// ```
        #[derive(Debug, Clone)]
        #[non_exhaustive]
        pub struct Policy {
            $( $(#[$doc])* pub $field: $ty, )*
        }

        /// The settings a `[[route]]` table sets; `None` keeps the default
        /// route's ([`Policy::overlaid`]).
        #[derive(Debug, Clone, Default)]
        #[non_exhaustive]
        pub struct PolicyOverride {
            $( $(#[$doc])* pub $field: Option<$ty>, )*
        }

        impl Default for Policy {
            /// Every default of PROTOCOL.md and `docs/proxy.md`, each written
            /// beside its setting below.
            fn default() -> Self {
                Self {
                    $( $field: $default, )*
                }
            }
        }

        impl Policy {
            /// This policy with `route`'s settings in place of its own.
            #[must_use]
            pub fn overlaid(&self, route: &PolicyOverride) -> Self {
                Self {
                    $( $field: route.$field.clone().unwrap_or_else(|| self.$field.clone()), )*
                }
            }
        }
    };
}

policy! {
    /// Whether the layer covers the route at all; `false`: every request passes
    /// through untouched (`enabled`).
    enabled: bool = true,
    /// A covered request without a key is refused (`400 missing-key`)
    /// (`require_key`, `--require-key`).
    require_key: bool = false,
    /// How long a record is kept (`ttl`, `--ttl`).
    ttl: Duration = idemgate::DEFAULT_TTL,
    /// How long a running request's claim lasts without renewal (`lease`,
    /// `--lease`).
    lease: Duration = idemgate::DEFAULT_LEASE,
    /// How long a duplicate of a running request waits for its outcome before
    /// `409`; zero: `409` at once (`wait_ms`, `--wait-ms`; by default
    /// [`idemgate::DEFAULT_WAIT`]).
    wait: Duration = idemgate::DEFAULT_WAIT,
    /// The largest request body, in bytes (`max_request_body`).
    max_request_body: usize = idemgate::DEFAULT_BODY_LIMIT,
    /// The largest response stored, in bytes (`max_stored_response`).
    max_stored_response: usize = idemgate::DEFAULT_RESPONSE_LIMIT,
    /// What an upstream 5xx leaves: a stored outcome or a released claim
    /// (`server_errors`).
    server_errors: ServerErrorPolicy = ServerErrorPolicy::default(),
    /// Which part of a JSON body the fingerprint covers (`fingerprint`).
    fingerprint: BodySelection = BodySelection::Whole,
    /// gRPC statuses that release a call's claim, so its retry runs it
    /// (`grpc_released`; PROTOCOL §22).
    grpc_released: Vec<GrpcCode> = GrpcCode::RELEASED_BY_DEFAULT.to_vec(),
    /// Upstream statuses that release the claim: refused before anything
    /// happened (`rejections`).
    rejections: Vec<StatusCode> = DEFAULT_REJECTIONS.to_vec(),
    /// The `Idempotency-Key` the upstream receives (`forward_key`).
    forward_key: ForwardKey = ForwardKey::default(),
    /// The problem body's shape (`problem_shape`, `--problem-shape`).
    problem_shape: ProblemShape = ProblemShape::default(),
    /// Where the key is read; `None`: the `Idempotency-Key` header, scoped by
    /// the path (`key`).
    key: Option<KeySource> = None,
    /// Content-based deduplication of keyless requests; `None`: off (`dedup`).
    dedup: Option<ContentDedup> = None,
    /// Whether the route's key strategy decides or only measures (`mode`).
    mode: StrategyMode = StrategyMode::default(),
    /// What observe mode keeps of a first run: its outcome only, or its whole
    /// response for the retries after a switch to enforce
    /// (`observe_responses`, `--observe-responses`).
    observe_responses: ObservedResponses = ObservedResponses::default(),
    /// Routes matched and keys scoped with ASCII case folded
    /// (`case_insensitive`, `--case-insensitive-paths`).
    case_insensitive: bool = false,
    /// A final `.json`-style suffix is the same path (`format_suffix`).
    format_suffix: bool = false,
    /// What a method-override header gets (`method_override`,
    /// `--method-override`).
    method_override: MethodOverride = MethodOverride::default(),
    /// What content on `GET`, `HEAD` and `OPTIONS` gets (`safe_method_body`,
    /// `--safe-method-body`).
    safe_method_bodies: SafeMethodBodies = SafeMethodBodies::default(),
    /// The longest pause in an upstream response body; `None`: the upstream
    /// timeout (`upstream_idle_timeout_ms`, `--upstream-idle-timeout-ms`).
    upstream_idle_timeout: Option<Duration> = None,
    /// The longest a whole upstream response may take; `None`: unbounded
    /// (`upstream_response_timeout_ms`, `--upstream-response-timeout-ms`).
    upstream_response_timeout: Option<Duration> = None,
    /// Who evaluates preconditions (`conditional`, `require_if_match`).
    conditional: Conditional = Conditional::default(),
    /// Response headers replays repeat beyond the proxy-wide list
    /// (`replay_headers`; the proxy-wide list is `--replay-header`).
    replay_headers: Vec<HeaderName> = Vec::new(),
    /// Whether replays repeat `Set-Cookie` (`replay_set_cookie`,
    /// `--replay-set-cookie`).
    replay_set_cookie: bool = false,
    /// A webhook receiver: the provider's signature verified before the
    /// delivery's own id is claimed; `None`: not one (`webhook`; no flag: a
    /// secret belongs to one endpoint, never to every route).
    webhook: Option<Webhook> = None,
    /// A JSON-RPC endpoint (an MCP server's): the envelope's `id` left out of
    /// the fingerprint, replays answered with the retry's `id`, batches refused
    /// (`jsonrpc`; no flag: one endpoint's protocol, never every route's).
    jsonrpc: bool = false,
}

impl Policy {
    /// The spellings this policy takes as one path: ASCII case and the format
    /// suffix, as set.
    pub(crate) fn fold(&self) -> PathFold {
        PathFold::NONE
            .with_case_insensitive(self.case_insensitive)
            .with_format_suffix(self.format_suffix)
    }

    /// Why these settings cannot work together, if they cannot: a record that
    /// could expire while its request runs (a TTL or a dedup window not longer
    /// than the lease).
    pub(crate) fn timing_problem(&self) -> Option<String> {
        if let Some(window) = self.dedup.as_ref().map(ContentDedup::window)
            && window <= self.lease
        {
            return Some(format!(
                "the dedup window ({} s) must be longer than lease ({} s)",
                window.as_secs(),
                self.lease.as_secs()
            ));
        }
        (self.ttl <= self.lease).then(|| {
            format!(
                "ttl ({} s) must be longer than lease ({} s)",
                self.ttl.as_secs(),
                self.lease.as_secs()
            )
        })
    }

    /// `base` (its store, principal, problem base and detached-task tracker)
    /// with this policy's record settings; which methods it covers and how it
    /// scopes are the route's ([`crate::routes::dispatch`]).
    pub(crate) fn layer(&self, base: &IdempotencyLayer) -> IdempotencyLayer {
        let mut layer = base
            .clone()
            .with_path_fold(self.fold())
            .with_require_key(self.require_key)
            .with_problem_shape(self.problem_shape)
            .with_ttl(self.ttl)
            .with_lease(self.lease)
            // A zero wait is no wait: a duplicate gets 409 at once.
            .with_wait(self.wait)
            .with_body_limit(self.max_request_body)
            .with_response_limit(self.max_stored_response)
            .with_server_error_policy(self.server_errors)
            .with_grpc_released(self.grpc_released.iter().copied())
            .with_fingerprint_body(self.fingerprint.clone())
            .with_mode(self.mode)
            .with_observed_responses(self.observe_responses)
            .with_replayed_set_cookie(self.replay_set_cookie)
            .with_jsonrpc(self.jsonrpc);
        if let Some(source) = &self.key {
            layer = layer.with_key_source(source.clone());
        }
        if let Some(dedup) = &self.dedup {
            layer = layer.with_content_dedup(dedup.clone());
        }
        if !self.replay_headers.is_empty() {
            layer = layer.with_replayed_header_names(self.replay_headers.iter().cloned());
        }
        if let Some(webhook) = &self.webhook {
            // The route's own `server_errors` (a webhook route's default is
            // `release`, set where the file is read) after the webhook's.
            layer = layer
                .with_webhook(webhook.clone())
                .with_server_error_policy(self.server_errors);
        }
        layer
    }

    /// `base` forwarding as this policy says: which key goes upstream, which
    /// statuses release the claim, how long the body may take (`upstream_timeout`
    /// where no idle timeout is set).
    pub(crate) fn forward(&self, base: &Forward, upstream_timeout: Duration) -> Forward {
        base.with_route_policy(self.forward_key, &self.rejections)
            .with_body_timeouts(
                self.upstream_idle_timeout.unwrap_or(upstream_timeout),
                self.upstream_response_timeout,
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_override_replaces_only_what_it_sets() {
        let defaults = Policy {
            require_key: true,
            wait: Duration::from_secs(5),
            ..Policy::default()
        };
        let route = PolicyOverride {
            ttl: Some(Duration::from_secs(60)),
            forward_key: Some(ForwardKey::Original),
            ..PolicyOverride::default()
        };
        let policy = defaults.overlaid(&route);
        assert_eq!(policy.ttl, Duration::from_secs(60));
        assert_eq!(policy.forward_key, ForwardKey::Original);
        assert!(policy.require_key, "unset: the default's");
        assert_eq!(policy.wait, Duration::from_secs(5));
        assert_eq!(policy.lease, idemgate::DEFAULT_LEASE);
        let unchanged = defaults.overlaid(&PolicyOverride::default());
        assert_eq!(unchanged.ttl, defaults.ttl);
        assert_eq!(unchanged.rejections, DEFAULT_REJECTIONS);
    }

    #[test]
    fn a_record_must_outlive_its_lease() {
        let mut policy = Policy::default();
        assert_eq!(policy.timing_problem(), None);
        policy.ttl = policy.lease;
        let problem = policy.timing_problem().unwrap();
        assert!(problem.contains("must be longer than lease"), "{problem}");
        policy.ttl = idemgate::DEFAULT_TTL;
        policy.dedup = Some(ContentDedup::new(policy.lease));
        let problem = policy.timing_problem().unwrap();
        assert!(problem.contains("dedup window"), "{problem}");
    }
}
