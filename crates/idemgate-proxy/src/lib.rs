//! `idemgate proxy` as a library: the idemgate [`IdempotencyLayer`] around a
//! forwarding service, so any HTTP API behind it gets the Idempotency-Key
//! protocol (`docs/PROTOCOL.md`) without a change to its code.
//!
//! There is one protocol implementation, the layer's: this crate only forwards
//! ([`Forward`]) — URI rewritten onto the upstream, hop-by-hop headers dropped both
//! ways, `X-Forwarded-*` appended, the derived key in place of the client's — and
//! answers upstream failures so the layer settles them right (see
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
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{Request, Response};
use idemgate::scope::normalize_path;
use idemgate::{Idempotency, IdempotencyLayer};
use tower::ServiceExt;
use tower::util::Oneshot;
use tower_layer::Layer;
use tower_service::Service;

mod forward;
pub mod headers;
mod jwt;
mod principal;
mod principal_source;
pub mod problem;
mod routes;
mod upstream;

pub use forward::{Forward, HostHeader};
pub use jwt::{JwksError, JwtPrincipal};
pub use principal::HeaderPrincipal;
pub use principal_source::PrincipalSource;
pub use routes::{DEFAULT_REJECTIONS, ForwardKey, RoutePattern, Routes, RoutesError};
pub use upstream::{Upstream, UpstreamError};

/// The default `--upstream-timeout-ms`.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// What the proxy forwards to, and how long it waits.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    upstream: Upstream,
    upstream_timeout: Duration,
    host: HostHeader,
    https_clients: bool,
    routes: Routes,
}

impl ProxyConfig {
    /// Forwards to `upstream`, waiting [`DEFAULT_UPSTREAM_TIMEOUT`] for each
    /// response head.
    pub fn new(upstream: Upstream) -> Self {
        Self {
            upstream,
            upstream_timeout: DEFAULT_UPSTREAM_TIMEOUT,
            host: HostHeader::Client,
            https_clients: false,
            routes: Routes::default(),
        }
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
}

/// The public listener's whole router: every path belongs to the upstream (no
/// route is reserved), each request through `idempotency` to [`Forward`]. The
/// layer decides what is covered (by default every `POST` and `PATCH` with a key);
/// everything else streams through untouched by it. A request that a route of
/// `config` matches goes through that route's configuration of the same layer.
pub fn app(config: ProxyConfig, idempotency: IdempotencyLayer) -> Router {
    let forward = Forward::new(config.upstream, config.upstream_timeout)
        .with_host_header(config.host)
        .with_https_clients(config.https_clients);
    let routes = config
        .routes
        .iter()
        .map(|route| {
            let policy = &route.policy;
            let forward = forward.with_route_policy(
                policy.forward_key(),
                policy.rejections.as_deref().unwrap_or(&DEFAULT_REJECTIONS),
            );
            let service = policy.layer(&route.method, &idempotency).layer(forward);
            (route.clone(), service)
        })
        .collect();
    Router::new().fallback_service(Dispatch {
        routes: Arc::new(routes),
        default: idempotency.layer(forward),
    })
}

/// Sends each request to the service of the first route that matches it, else
/// to the defaults'.
#[derive(Clone, Debug)]
struct Dispatch {
    routes: Arc<Vec<(routes::Route, Idempotency<Forward>)>>,
    default: Idempotency<Forward>,
}

impl Service<Request<Body>> for Dispatch {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Oneshot<Idempotency<Forward>, Request<Body>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Each call readies the service it picks (Oneshot).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let service = if self.routes.is_empty() {
            &self.default
        } else {
            let path = normalize_path(request.uri().path());
            self.routes
                .iter()
                .find(|(route, _)| route.matches(request.method(), &path))
                .map_or(&self.default, |(_, service)| service)
        };
        service.clone().oneshot(request)
    }
}
