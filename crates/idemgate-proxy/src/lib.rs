//! `idemgate proxy` as a library: the idemgate [`IdempotencyLayer`] around a
//! forwarding service, so any HTTP API behind it gets the Idempotency-Key
//! protocol (`docs/PROTOCOL.md`) without a change to its code.
//!
//! There is one protocol implementation, the layer's: this crate only forwards
//! ([`Forward`]) — URI rewritten onto the upstream, hop-by-hop headers dropped both
//! ways, `X-Forwarded-*` appended, the derived key in place of the client's — and
//! answers upstream failures so the layer settles them right (see
//! `docs/proxy.md`).
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

use std::time::Duration;

use axum::Router;
use idemgate::IdempotencyLayer;
use tower_layer::Layer;

mod forward;
pub mod headers;
mod principal;
pub mod problem;
mod upstream;

pub use forward::Forward;
pub use principal::HeaderPrincipal;
pub use upstream::{Upstream, UpstreamError};

/// The default `--upstream-timeout-ms`.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// What the proxy forwards to, and how long it waits.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    upstream: Upstream,
    upstream_timeout: Duration,
}

impl ProxyConfig {
    /// Forwards to `upstream`, waiting [`DEFAULT_UPSTREAM_TIMEOUT`] for each
    /// response head.
    pub fn new(upstream: Upstream) -> Self {
        Self {
            upstream,
            upstream_timeout: DEFAULT_UPSTREAM_TIMEOUT,
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
}

/// The public listener's whole router: every path belongs to the upstream (no
/// route is reserved), each request through `idempotency` to [`Forward`]. The
/// layer decides what is covered (by default every `POST` and `PATCH` with a key);
/// everything else streams through untouched by it.
pub fn app(config: ProxyConfig, idempotency: IdempotencyLayer) -> Router {
    let forward = Forward::new(config.upstream, config.upstream_timeout);
    Router::new().fallback_service(idempotency.layer(forward))
}
