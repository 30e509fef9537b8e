//! `idemgate proxy` as a library: the idemgate [`IdempotencyLayer`] around a
//! forwarding service, so any HTTP API behind it gets the Idempotency-Key
//! protocol (`docs/PROTOCOL.md`) without a change to its code.
//!
//! There is one protocol implementation, the layer's: this crate brings each
//! request to one reading before the layer sees it (the canonical path of
//! `idemgate::path`, one method, no underscored look-alikes of our headers, no
//! body on a safe method — the ambiguous rest refused with `400`), forwards it
//! ([`Forward`]) — that canonical path under the upstream's base, hop-by-hop
//! headers dropped both ways, only WebSocket upgrades tunnelled, `X-Forwarded-*`
//! appended, the derived key in place of the client's, the response body bounded
//! in time — and answers upstream failures so the layer settles them right (see
//! `docs/proxy.md`). Every route — the default route the command line
//! configures and each one a route file adds ([`Routes`]) — is the same layer
//! configured by one [`Policy`], all sharing one store and one detached-task
//! tracker.
//!
//! ```
//! use std::time::Duration;
//! use idemgate::{IdempotencyLayer, MemoryStore};
//! use idemgate_proxy::{ProxyConfig, app};
//!
//! let config = ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap())
//!     .with_upstream_timeout(Duration::from_secs(10));
//! let layer = IdempotencyLayer::new(MemoryStore::new());
//! let router: axum::Router = app(config, layer);
//! ```

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use idemgate::IdempotencyLayer;
use idemgate::path::PathPolicy;

mod body;
mod conditional;
mod encoding;
mod forward;
mod guard;
pub mod headers;
mod jwt;
mod pool;
mod principal;
mod principal_source;
pub mod problem;
mod routes;
mod upstream;

pub use forward::{DEFAULT_REJECTIONS, Forward, ForwardKey, HostHeader};
pub use guard::{METHOD_OVERRIDE_HEADERS, MethodOverride, SafeMethodBodies, UnderscoreHeaders};
pub use jwt::{JwksError, JwtPrincipal};
pub use pool::UpstreamProtocol;
pub use principal::HeaderPrincipal;
pub use principal_source::PrincipalSource;
pub use routes::{
    Conditional, Policy, PolicyOverride, Proxy, RoutePattern, RouteTable, Routes, RoutesError,
};
pub use upstream::{Upstream, UpstreamError};

/// The default `--upstream-timeout-ms`.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// What the proxy forwards to, how long it waits, which requests it refuses as
/// ambiguous, and the default route's [`Policy`]. Every default is the safe
/// one; see `docs/proxy.md`.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    upstream: Upstream,
    upstream_timeout: Duration,
    upstream_protocol: UpstreamProtocol,
    host: HostHeader,
    https_clients: bool,
    path_policy: PathPolicy,
    underscore_headers: UnderscoreHeaders,
    principal: Option<PrincipalSource>,
    defaults: Policy,
    routes: Routes,
    lock_store: Option<conditional::LockStore>,
}

impl ProxyConfig {
    /// Forwards to `upstream`, waiting [`DEFAULT_UPSTREAM_TIMEOUT`] for each
    /// response head, with [`Policy::default`] as the default route.
    pub fn new(upstream: Upstream) -> Self {
        Self {
            upstream,
            upstream_timeout: DEFAULT_UPSTREAM_TIMEOUT,
            upstream_protocol: UpstreamProtocol::default(),
            host: HostHeader::Client,
            https_clients: false,
            path_policy: PathPolicy::STRICT,
            underscore_headers: UnderscoreHeaders::Drop,
            principal: None,
            defaults: Policy::default(),
            routes: Routes::default(),
            lock_store: None,
        }
    }

    /// The default route: how a request no route matches is treated, and what
    /// every route inherits where it sets nothing (resolve a route file over it:
    /// [`Routes::from_toml`] with [`ProxyConfig::defaults`]). Its record
    /// settings (TTL, lease, wait, limits, problem shape, …) replace the layer's
    /// own on every route.
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let mut defaults = idemgate_proxy::Policy::default();
    /// defaults.wait = std::time::Duration::from_secs(5);
    /// let config = config.with_defaults(defaults);
    /// ```
    pub fn with_defaults(mut self, defaults: Policy) -> Self {
        self.defaults = defaults;
        self
    }

    /// The default route's policy ([`ProxyConfig::with_defaults`]).
    pub fn defaults(&self) -> &Policy {
        &self.defaults
    }

    /// The store that holds the resource leases of routes with `conditional =
    /// "enforce"` (PROTOCOL §17): the one every proxy instance in front of the
    /// upstream shares (PostgreSQL or Redis for several instances), usually the
    /// idempotency store itself. Without it such a route answers 500
    /// `store-misconfigured` instead of writing unserialised.
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_lock_store(std::sync::Arc::new(idemgate::MemoryStore::new()));
    /// ```
    pub fn with_lock_store(mut self, store: Arc<dyn idemgate::Store>) -> Self {
        self.lock_store = Some(conditional::LockStore(store));
        self
    }

    /// How long to wait for the upstream's response head (connecting included);
    /// past it the client gets 504 and, by default, the outcome is stored as
    /// `FAILED`, since the upstream may have run the request. Also the longest
    /// pause in a response body where no idle timeout is set.
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_upstream_timeout(std::time::Duration::from_secs(5));
    /// ```
    pub fn with_upstream_timeout(mut self, timeout: Duration) -> Self {
        self.upstream_timeout = timeout;
        self
    }

    /// The default route's longest pause while the upstream sends its response
    /// body (and between the head and the first body byte); default: the
    /// upstream timeout. Past it: `504 upstream-timeout`, the outcome unknown
    /// (settled by the route's `server_errors`), the upstream connection closed.
    /// A route's `upstream_idle_timeout_ms` overrides it.
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_upstream_idle_timeout(std::time::Duration::from_secs(10));
    /// ```
    pub fn with_upstream_idle_timeout(mut self, idle: Duration) -> Self {
        self.defaults.upstream_idle_timeout = Some(idle);
        self
    }

    /// The longest a whole upstream response may take on the default route, from
    /// sending the request to its last body byte (default: unbounded; a slow but
    /// steady stream is bounded only by the idle timeout). Past it: `504
    /// upstream-timeout`, as for a stall. A route's
    /// `upstream_response_timeout_ms` overrides it.
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_upstream_response_timeout(std::time::Duration::from_secs(120));
    /// ```
    pub fn with_upstream_response_timeout(mut self, total: Duration) -> Self {
        self.defaults.upstream_response_timeout = Some(total);
        self
    }

    /// Which `Host` the upstream receives (default: the client's).
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_host_header(idemgate_proxy::HostHeader::Upstream);
    /// ```
    pub fn with_host_header(mut self, host: HostHeader) -> Self {
        self.host = host;
        self
    }

    /// Say that clients speak HTTPS to the proxy (it terminates TLS itself), so
    /// the upstream gets `X-Forwarded-Proto: https`.
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_https_clients(true);
    /// ```
    pub fn with_https_clients(mut self, https: bool) -> Self {
        self.https_clients = https;
        self
    }

    /// Per-route policies, tried in order before the default route; resolve
    /// them over this config's [`ProxyConfig::defaults`], which they inherit.
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let routes = idemgate_proxy::Routes::from_toml("inline".as_ref(), r#"
    ///     [[route]]
    ///     method = "POST"
    ///     path = "/payments"
    ///     require_key = true
    /// "#, config.defaults()).unwrap();
    /// let config = config.with_routes(routes);
    /// ```
    pub fn with_routes(mut self, routes: Routes) -> Self {
        self.routes = routes;
        self
    }

    /// Which spellings of a request path are refused (`400 ambiguous-path`,
    /// before any claim) and how the others are read; default
    /// [`PathPolicy::STRICT`], every ambiguous class refused. Whatever is let
    /// through is forwarded in the canonical spelling routes matched.
    ///
    /// ```
    /// use idemgate::path::{EncodedSlash, PathPolicy};
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// // An upstream that decodes %2F before it routes.
    /// let config = config.with_path_policy(PathPolicy { encoded_slash: EncodedSlash::Decode, ..PathPolicy::STRICT });
    /// ```
    pub fn with_path_policy(mut self, policy: PathPolicy) -> Self {
        self.path_policy = policy;
        self
    }

    /// Match the default route and scope its keys by the path with ASCII case
    /// folded, for an upstream whose router ignores case (Express's default):
    /// `/Payments` then meets the `/payments` scope. The upstream still gets the
    /// client's case (ids in paths are often case-sensitive), and the
    /// fingerprint too, so a key reused under another case is a `422`. Routes
    /// inherit it; a route's `case_insensitive` overrides it. Default: off.
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_case_insensitive_paths(true);
    /// ```
    pub fn with_case_insensitive_paths(mut self, on: bool) -> Self {
        self.defaults.case_insensitive = on;
        self
    }

    /// Require a key on every covered request — the default route's `POST` and
    /// `PATCH` and every route's method — unless a route says otherwise: a
    /// spelling no route anticipated still cannot run without one. Default: off
    /// (keyless requests pass through).
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_require_key(true);
    /// ```
    pub fn with_require_key(mut self, require: bool) -> Self {
        self.defaults.require_key = require;
        self
    }

    /// Whom a key belongs to (PROTOCOL §13): one value for the layer, which
    /// names each request's principal by it, and the guard, which keeps an
    /// underscored look-alike of a principal header from reaching the upstream
    /// (and exempts that header from [`UnderscoreHeaders::Drop`] should its own
    /// name hold a `_`). Without it, the layer's own principal extractor.
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let source = idemgate_proxy::PrincipalSource::Header(http::HeaderName::from_static("x-user-id"));
    /// let config = config.with_principal(source);
    /// ```
    pub fn with_principal(mut self, source: PrincipalSource) -> Self {
        self.principal = Some(source);
        self
    }

    /// What to do with request headers whose names contain `_` (default: drop
    /// them, as nginx does). See [`UnderscoreHeaders`].
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_underscore_headers(idemgate_proxy::UnderscoreHeaders::Reject);
    /// ```
    pub fn with_underscore_headers(mut self, underscores: UnderscoreHeaders) -> Self {
        self.underscore_headers = underscores;
        self
    }

    /// What to do with `X-HTTP-Method-Override` and its cousins where no route
    /// says (default: refuse, `400 ambiguous-method`). See [`MethodOverride`].
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_method_override(idemgate_proxy::MethodOverride::Honour);
    /// ```
    pub fn with_method_override(mut self, overrides: MethodOverride) -> Self {
        self.defaults.method_override = overrides;
        self
    }

    /// Which protocol the upstream is spoken to in (default
    /// [`UpstreamProtocol::Auto`]: HTTP/2 with prior knowledge for gRPC calls,
    /// HTTP/1.1 for everything else).
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_upstream_protocol(idemgate_proxy::UpstreamProtocol::H2c);
    /// ```
    pub fn with_upstream_protocol(mut self, protocol: UpstreamProtocol) -> Self {
        self.upstream_protocol = protocol;
        self
    }

    /// What to do with content on `GET`, `HEAD` and `OPTIONS` where no route says
    /// (default: refuse, `400 unexpected-body`). See [`SafeMethodBodies`].
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_safe_method_bodies(idemgate_proxy::SafeMethodBodies::Forward);
    /// ```
    pub fn with_safe_method_bodies(mut self, bodies: SafeMethodBodies) -> Self {
        self.defaults.safe_method_bodies = bodies;
        self
    }
}

/// The public listener's whole router: every path belongs to the upstream (no
/// route is reserved), each request through `idempotency` to [`Forward`].
///
/// Before the layer, each request is brought to one reading (the guard): its
/// path in canonical form — which is what routes match, keys are scoped by and
/// the upstream receives — its method spelled once, underscored headers dropped,
/// and the ambiguous rest refused with `400` before any claim. The layer then
/// decides what is covered (by default every `POST`, `PUT`, `PATCH` and
/// `DELETE` with a key); everything else streams through untouched by it. A
/// covered request's answer, live or replayed, is encoded by its
/// `Accept-Encoding` on the way out (its upstream is asked for identity, so the
/// record keeps one representation). A request that a route of `config` matches
/// goes through that route's policy of the same layer, any other through the
/// default route's. `idempotency` gives every route its
/// store, principal (unless the config names one), store timeout and problem
/// base; each route's [`Policy`] gives the rest.
pub fn app(config: ProxyConfig, idempotency: IdempotencyLayer) -> Router {
    Router::new().fallback_service(reloadable_app(config, idempotency).0)
}

/// [`app`] as the bare [`Proxy`] service (what `idemgate proxy`'s listener
/// serves: no router in front of a service that owns every path), with the
/// handle that replaces its routes while it serves (`idemgate proxy` on
/// `SIGHUP`).
///
/// ```
/// use idemgate::{IdempotencyLayer, MemoryStore};
/// use idemgate_proxy::{Proxy, ProxyConfig, Routes, reloadable_app};
///
/// let config = ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
/// let (proxy, table): (Proxy, _) =
///     reloadable_app(config, IdempotencyLayer::new(MemoryStore::new()));
/// let text = "[[route]]\nmethod = \"POST\"\npath = \"/pay\"\n";
/// let routes = Routes::from_toml("routes.toml".as_ref(), text, table.defaults()).unwrap();
/// table.replace(&routes);
/// assert_eq!(table.len(), 1);
/// ```
pub fn reloadable_app(config: ProxyConfig, idempotency: IdempotencyLayer) -> (Proxy, RouteTable) {
    let idempotency = match &config.principal {
        Some(source) => source.apply_to(idempotency),
        None => idempotency,
    };
    let forward = Forward::new(config.upstream, config.upstream_timeout)
        .with_upstream_protocol(config.upstream_protocol)
        .with_host_header(config.host)
        .with_https_clients(config.https_clients);
    let guard = guard::Guard {
        path_policy: config.path_policy,
        underscore_headers: config.underscore_headers,
        principal_header: config
            .principal
            .as_ref()
            .and_then(PrincipalSource::header)
            .cloned(),
    };
    let builder = routes::dispatch::RouteBuilder {
        idempotency,
        forward,
        upstream_timeout: config.upstream_timeout,
        defaults: config.defaults,
        lock_store: config.lock_store,
    };
    let (table, proxy) = RouteTable::new(builder, &config.routes, guard);
    (proxy, table)
}
