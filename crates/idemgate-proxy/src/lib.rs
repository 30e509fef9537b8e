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
//! `docs/proxy.md`). Per-route policies ([`Routes`]) are the same layer
//! configured once per route, all sharing one store and one detached-task
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

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::Router;
use axum::body::Body;
use axum::response::IntoResponse;
use http::{HeaderName, Method, Request, Response};
use idemgate::path::{PathFold, PathPolicy};
use idemgate::{Idempotency, IdempotencyLayer};
use tower::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;

mod body;
mod conditional;
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

pub use forward::{Forward, HostHeader};
pub use guard::{METHOD_OVERRIDE_HEADERS, MethodOverride, SafeMethodBodies, UnderscoreHeaders};
pub use jwt::{JwksError, JwtPrincipal};
pub use principal::HeaderPrincipal;
pub use principal_source::PrincipalSource;
pub use routes::{DEFAULT_REJECTIONS, ForwardKey, RoutePattern, Routes, RoutesError};
pub use upstream::{Upstream, UpstreamError};

/// The default `--upstream-timeout-ms`.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// What the proxy forwards to, how long it waits, and which requests it refuses
/// as ambiguous. Every default is the safe one; see `docs/proxy.md`.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    upstream: Upstream,
    upstream_timeout: Duration,
    upstream_idle_timeout: Option<Duration>,
    upstream_response_timeout: Option<Duration>,
    host: HostHeader,
    https_clients: bool,
    routes: Routes,
    path_policy: PathPolicy,
    case_insensitive: bool,
    require_key: Option<bool>,
    principal_header: Option<HeaderName>,
    underscore_headers: UnderscoreHeaders,
    method_override: MethodOverride,
    safe_method_bodies: SafeMethodBodies,
    lock_store: Option<conditional::LockStore>,
}

impl ProxyConfig {
    /// Forwards to `upstream`, waiting [`DEFAULT_UPSTREAM_TIMEOUT`] for each
    /// response head.
    pub fn new(upstream: Upstream) -> Self {
        Self {
            upstream,
            upstream_timeout: DEFAULT_UPSTREAM_TIMEOUT,
            upstream_idle_timeout: None,
            upstream_response_timeout: None,
            host: HostHeader::Client,
            https_clients: false,
            routes: Routes::default(),
            path_policy: PathPolicy::STRICT,
            case_insensitive: false,
            require_key: None,
            principal_header: None,
            underscore_headers: UnderscoreHeaders::Drop,
            method_override: MethodOverride::Refuse,
            safe_method_bodies: SafeMethodBodies::Refuse,
            lock_store: None,
        }
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
    /// `FAILED`, since the upstream may have run the request.
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_upstream_timeout(std::time::Duration::from_secs(5));
    /// ```
    pub fn with_upstream_timeout(mut self, timeout: Duration) -> Self {
        self.upstream_timeout = timeout;
        self
    }

    /// The longest the upstream may pause while sending its response body (and
    /// between the head and the first body byte); default: the upstream timeout.
    /// Past it: `504 upstream-timeout`, the outcome unknown (settled by the
    /// route's `server_errors`), the upstream connection closed. A route's
    /// `upstream_idle_timeout_ms` overrides it.
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_upstream_idle_timeout(std::time::Duration::from_secs(10));
    /// ```
    pub fn with_upstream_idle_timeout(mut self, idle: Duration) -> Self {
        self.upstream_idle_timeout = Some(idle);
        self
    }

    /// The longest a whole upstream response may take, from sending the request
    /// to its last body byte (default: unbounded; a slow but steady stream is
    /// bounded only by the idle timeout). Past it: `504 upstream-timeout`, as for
    /// a stall. A route's `upstream_response_timeout_ms` overrides it.
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_upstream_response_timeout(std::time::Duration::from_secs(120));
    /// ```
    pub fn with_upstream_response_timeout(mut self, total: Duration) -> Self {
        self.upstream_response_timeout = Some(total);
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

    /// Per-route policies, tried in order before the defaults.
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let routes = idemgate_proxy::Routes::from_toml("inline".as_ref(), r#"
    ///     [[route]]
    ///     method = "POST"
    ///     path = "/payments"
    ///     require_key = true
    /// "#).unwrap();
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

    /// Match routes and scope keys by the path with ASCII case folded, for an
    /// upstream whose router ignores case (Express's default): `/Payments` then
    /// meets the `/payments` route and its key scope. The upstream still gets the
    /// client's case (ids in paths are often case-sensitive), and the
    /// fingerprint too, so a key reused under another case is a `422`. A route's
    /// `case_insensitive` overrides it. Default: off.
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_case_insensitive_paths(true);
    /// ```
    pub fn with_case_insensitive_paths(mut self, on: bool) -> Self {
        self.case_insensitive = on;
        self
    }

    /// Require a key on every covered request — the defaults' `POST` and `PATCH`
    /// and every route's method — unless a route says otherwise: a spelling no
    /// route anticipated still cannot run without one. Default: as the layer was
    /// built (keyless requests pass through).
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_require_key(true);
    /// ```
    pub fn with_require_key(mut self, require: bool) -> Self {
        self.require_key = Some(require);
        self
    }

    /// The header the principal comes from (`--principal header:NAME`), so that
    /// no underscored look-alike of it reaches the upstream, and so that it is
    /// exempt from [`UnderscoreHeaders::Drop`] should its own name hold a `_`.
    ///
    /// ```
    /// # let config = idemgate_proxy::ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
    /// let config = config.with_principal_header(http::HeaderName::from_static("x-user-id"));
    /// ```
    pub fn with_principal_header(mut self, name: HeaderName) -> Self {
        self.principal_header = Some(name);
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
        self.method_override = overrides;
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
        self.safe_method_bodies = bodies;
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
/// decides what is covered (by default every `POST` and `PATCH` with a key);
/// everything else streams through untouched by it. A request that a route of
/// `config` matches goes through that route's configuration of the same layer.
pub fn app(config: ProxyConfig, idempotency: IdempotencyLayer) -> Router {
    reloadable_app(config, idempotency).0
}

/// [`app`], with the handle that replaces its routes while it serves
/// (`idemgate proxy` on `SIGHUP`).
///
/// ```
/// use idemgate::{IdempotencyLayer, MemoryStore};
/// use idemgate_proxy::{ProxyConfig, Routes, reloadable_app};
///
/// let config = ProxyConfig::new("http://127.0.0.1:3000".parse().unwrap());
/// let (router, table): (axum::Router, _) =
///     reloadable_app(config, IdempotencyLayer::new(MemoryStore::new()));
/// let routes = Routes::from_toml("routes.toml".as_ref(), "[[route]]\nmethod = \"POST\"\npath = \"/pay\"\n").unwrap();
/// table.replace(&routes);
/// assert_eq!(table.len(), 1);
/// ```
pub fn reloadable_app(config: ProxyConfig, idempotency: IdempotencyLayer) -> (Router, RouteTable) {
    let idempotency = match config.require_key {
        Some(require) => idempotency.with_require_key(require),
        None => idempotency,
    };
    let idle = config
        .upstream_idle_timeout
        .unwrap_or(config.upstream_timeout);
    let forward = Forward::new(config.upstream, config.upstream_timeout)
        .with_host_header(config.host)
        .with_https_clients(config.https_clients)
        .with_body_timeouts(idle, config.upstream_response_timeout);
    let default_fold = PathFold::NONE.with_case_insensitive(config.case_insensitive);
    let default = DefaultRoute {
        method_override: config.method_override,
        safe_method_bodies: config.safe_method_bodies,
        service: idempotency
            .clone()
            .with_path_fold(default_fold)
            .layer(conditional::Enforcing::new(forward.clone(), None)),
    };
    // The layer's problem style, for the refusals made before the layer.
    let style = idempotency.problem_style().clone();
    let builder = RouteBuilder {
        idempotency,
        forward,
        idle,
        response_timeout: config.upstream_response_timeout,
        case_insensitive: config.case_insensitive,
        method_override: config.method_override,
        safe_method_bodies: config.safe_method_bodies,
        lock_store: config.lock_store,
    };
    let routes = Arc::new(ArcSwap::from_pointee(builder.build(&config.routes)));
    let table = RouteTable {
        builder: Arc::new(builder),
        routes: Arc::clone(&routes),
    };
    let router = Router::new().fallback_service(Dispatch {
        style,
        guard: Arc::new(guard::Guard {
            path_policy: config.path_policy,
            underscore_headers: config.underscore_headers,
            principal_header: config.principal_header,
        }),
        routes,
        default,
    });
    (router, table)
}

/// The routes a running [`reloadable_app`] dispatches to, replaceable as a
/// whole while it serves. A replacement is atomic: each request reads the table
/// once, when it is dispatched, and keeps the route service it got to its end,
/// so a request in flight finishes under the routes it started with and the
/// next one sees only the new table, never a mix. Every route of a new table is
/// the same layer as before (the same store, the same detached-task tracker)
/// with the new file's settings.
#[derive(Clone)]
pub struct RouteTable {
    builder: Arc<RouteBuilder>,
    routes: Arc<ArcSwap<Vec<DispatchRoute>>>,
}

impl fmt::Debug for RouteTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteTable")
            .field("routes", &self.len())
            .finish_non_exhaustive()
    }
}

impl RouteTable {
    /// Dispatches every request from now on by `routes` (already checked:
    /// building a route cannot fail).
    pub fn replace(&self, routes: &Routes) {
        self.routes.store(Arc::new(self.builder.build(routes)));
    }

    /// How many routes the current table has.
    pub fn len(&self) -> usize {
        self.routes.load().len()
    }

    /// Whether the current table has no route (every request gets the defaults).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What turns a route file into dispatchable routes: the command line's
/// settings each route inherits what it does not set from.
#[derive(Clone)]
struct RouteBuilder {
    idempotency: IdempotencyLayer,
    forward: Forward,
    idle: Duration,
    response_timeout: Option<Duration>,
    case_insensitive: bool,
    method_override: MethodOverride,
    safe_method_bodies: SafeMethodBodies,
    /// Where `conditional = "enforce"` routes take their resource leases.
    lock_store: Option<conditional::LockStore>,
}

impl RouteBuilder {
    fn build(&self, routes: &Routes) -> Vec<DispatchRoute> {
        routes
            .iter()
            .map(|route| {
                let policy = &route.policy;
                let fold = policy.fold(self.case_insensitive);
                let forward = self
                    .forward
                    .with_route_policy(
                        policy.forward_key(),
                        policy.rejections.as_deref().unwrap_or(&DEFAULT_REJECTIONS),
                    )
                    .with_body_timeouts(
                        policy.upstream_idle_timeout.unwrap_or(self.idle),
                        policy.upstream_response_timeout.or(self.response_timeout),
                    );
                let upstream = conditional::Enforcing::new(
                    forward,
                    policy.conditional.then(|| conditional::Enforce {
                        store: self.lock_store.as_ref().map(|store| Arc::clone(&store.0)),
                        require_if_match: policy.require_if_match,
                    }),
                );
                DispatchRoute {
                    method: route.method.clone(),
                    pattern: route.pattern.folded(fold),
                    fold,
                    method_override: policy.method_override.unwrap_or(self.method_override),
                    safe_method_bodies: policy.safe_method_body.unwrap_or(self.safe_method_bodies),
                    service: policy
                        .layer(&route.method, &route.pattern, &self.idempotency, fold)
                        .layer(upstream),
                }
            })
            .collect()
    }
}

/// One route, ready to dispatch to: its pattern folded as it matches, and what
/// it decides before the layer.
#[derive(Clone, Debug)]
struct DispatchRoute {
    method: Method,
    pattern: RoutePattern,
    fold: PathFold,
    method_override: MethodOverride,
    safe_method_bodies: SafeMethodBodies,
    service: Idempotency<conditional::Enforcing>,
}

/// What no route matched goes to.
#[derive(Clone, Debug)]
struct DefaultRoute {
    method_override: MethodOverride,
    safe_method_bodies: SafeMethodBodies,
    service: Idempotency<conditional::Enforcing>,
}

/// Brings each request to one reading (the guard), then sends it to the service
/// of the first route that matches it, else to the defaults'.
#[derive(Clone, Debug)]
struct Dispatch {
    /// The layer's problem style, for the refusals made before the layer.
    style: idemgate::problem::ProblemStyle,
    guard: Arc<guard::Guard>,
    /// Read once per request ([`RouteTable`]).
    routes: Arc<ArcSwap<Vec<DispatchRoute>>>,
    default: DefaultRoute,
}

impl Dispatch {
    /// The service for `request`, once it is in the spelling everyone reads; or
    /// the problem it is refused with.
    fn route(
        &self,
        request: &mut Request<Body>,
    ) -> Result<Idempotency<conditional::Enforcing>, idemgate::ProblemDetails> {
        let admitted = self.guard.admit(request)?;
        let method = admitted
            .overridden
            .clone()
            .unwrap_or_else(|| request.method().clone());
        let path = admitted.path.as_str();
        let routes = self.routes.load();
        let matched = routes
            .iter()
            .find(|route| route.method == method && route.pattern.matches(&route.fold.apply(path)));
        let (method_override, safe_method_bodies, service) = match matched {
            Some(route) => (
                route.method_override,
                route.safe_method_bodies,
                &route.service,
            ),
            None => (
                self.default.method_override,
                self.default.safe_method_bodies,
                &self.default.service,
            ),
        };
        if let Some(overridden) = admitted.overridden {
            if method_override == MethodOverride::Refuse {
                return Err(problem::ambiguous_method(format!(
                    "a method-override header names {overridden} for this {} request, which this route does not honour",
                    request.method()
                )));
            }
            guard::honour_override(request, overridden);
        }
        if safe_method_bodies == SafeMethodBodies::Refuse && guard::has_safe_method_content(request)
        {
            return Err(problem::unexpected_body(request.method()));
        }
        guard::rewrite_target(request, &admitted.path);
        Ok(service.clone())
    }
}

impl Service<Request<Body>> for Dispatch {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Each call readies the service it picks (oneshot).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        match self.route(&mut request) {
            Ok(service) => Box::pin(service.oneshot(request)),
            Err(problem) => {
                tracing::debug!(problem = %problem.type_uri, "request refused before the layer");
                Box::pin(std::future::ready(Ok(self
                    .style
                    .restyle(problem.into_response()))))
            }
        }
    }
}
