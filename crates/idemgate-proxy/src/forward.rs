//! The forwarding service the idempotency layer wraps: one request to the
//! upstream per call, over a pooled keep-alive client, headers cleaned both ways.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::IntoResponse;
use http::header::HOST;
use http::{HeaderValue, Request, Response, StatusCode, Version};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use idemgate::{Finality, OperationContext};
use tower_service::Service;

use crate::headers::{IDEMPOTENCY_KEY, add_forwarded, remove_hop_by_hop};
use crate::problem;
use crate::routes::{DEFAULT_REJECTIONS, ForwardKey};
use crate::upstream::Upstream;

/// How long an idle pooled connection to the upstream is kept. Below the
/// common keep-alive timeouts of upstream servers (Node's is 5 s, most others
/// more), so the proxy rarely reuses a connection the upstream is closing.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// Sends each request to the upstream and answers with its response.
///
/// What the upstream gets: the client's method, path (under the upstream's base),
/// query, headers and body, minus the hop-by-hop headers, plus `X-Forwarded-*`;
/// `Host` as the client sent it; and, in place of the client's `Idempotency-Key`,
/// the operation's derived key ([`OperationContext::downstream_key`]) when the
/// idempotency layer claimed one — never the client's raw key.
///
/// A route's policy changes two things here: which key the upstream gets
/// ([`ForwardKey`]), and which upstream statuses are rejections — answers that
/// mean nothing happened, marked [`Finality::Rejected`] so the layer undoes the
/// claim and the client may correct the body and reuse its key.
///
/// Failures are answered with problem+json and marked for the layer: a refused
/// connection ran nothing, so its claim is released ([`Finality::Retryable`]); a
/// timeout or a broken exchange after the request went out may have run, so it is
/// left to the layer's server-error policy (stored as `FAILED` by default, so a
/// retry replays it instead of running it again).
#[derive(Clone, Debug)]
pub struct Forward {
    client: Client<HttpConnector, Body>,
    upstream: Arc<Upstream>,
    timeout: Duration,
    host: HostHeader,
    /// The scheme clients spoke to this proxy, for `X-Forwarded-Proto`.
    proto: &'static str,
    key: ForwardKey,
    rejections: Arc<[StatusCode]>,
}

/// The `Host` header the upstream receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HostHeader {
    /// The client's, as it sent it (the default): the upstream sees the name its
    /// clients use, as behind any reverse proxy.
    #[default]
    Client,
    /// The upstream URL's `host:port`, for an upstream that routes by its own name
    /// (a virtual host, a platform router). The client's is still in
    /// `X-Forwarded-Host`.
    Upstream,
}

impl Forward {
    /// A forwarder to `upstream` whose requests each get `timeout` from sending
    /// until the response head arrives (connecting included). The connection pool
    /// is created here, once, and shared by every clone.
    pub fn new(upstream: Upstream, timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .build(connector);
        Self {
            client,
            upstream: Arc::new(upstream),
            timeout,
            host: HostHeader::Client,
            proto: "http",
            key: ForwardKey::Derived,
            rejections: Arc::from(DEFAULT_REJECTIONS),
        }
    }

    /// Which `Host` the upstream receives (default: the client's).
    pub fn with_host_header(mut self, host: HostHeader) -> Self {
        self.host = host;
        self
    }

    /// Whether clients speak HTTPS to this proxy (it terminates TLS), for
    /// `X-Forwarded-Proto`.
    pub fn with_https_clients(mut self, https: bool) -> Self {
        self.proto = if https { "https" } else { "http" };
        self
    }

    /// This forwarder (sharing its connection pool) with a route's key mode and
    /// rejection statuses.
    pub fn with_route_policy(&self, key: ForwardKey, rejections: &[StatusCode]) -> Self {
        Self {
            key,
            rejections: Arc::from(rejections),
            ..self.clone()
        }
    }

    async fn forward(self, request: Request<Body>) -> Response<Body> {
        let request = self.upstream_request(request);
        let sent = tokio::time::timeout(self.timeout, self.client.request(request)).await;
        match sent {
            Ok(Ok(response)) => {
                let (mut parts, body) = response.into_parts();
                remove_hop_by_hop(&mut parts.headers);
                if self.rejections.contains(&parts.status) {
                    // Inert on requests the layer does not cover.
                    parts.extensions.insert(Finality::Rejected);
                }
                // The upstream's HTTP version is its hop's: the client's hop is
                // answered in HTTP/1.1 (or HTTP/2, which ignores this field), not
                // downgraded to an HTTP/1.0 upstream's version and its closes.
                parts.version = Version::HTTP_11;
                Response::from_parts(parts, Body::new(body))
            }
            Ok(Err(error)) if error.is_connect() => {
                tracing::warn!(upstream = self.upstream.authority(), error = ?error, "upstream unreachable; nothing was sent");
                (
                    Finality::Retryable,
                    problem::upstream_unreachable(self.upstream.authority()),
                )
                    .into_response()
            }
            Ok(Err(error)) => {
                tracing::warn!(upstream = self.upstream.authority(), error = ?error, "upstream exchange failed after the request was sent");
                problem::upstream_failed(self.upstream.authority()).into_response()
            }
            Err(_elapsed) => {
                tracing::warn!(upstream = self.upstream.authority(), timeout = ?self.timeout, "upstream did not answer in time");
                problem::upstream_timeout(self.timeout).into_response()
            }
        }
    }

    /// The request as the upstream receives it.
    fn upstream_request(&self, mut request: Request<Body>) -> Request<Body> {
        let client_ip = request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|info| info.0.ip());
        let derived_key = request
            .extensions()
            .get::<OperationContext>()
            .map(OperationContext::downstream_key);
        // An HTTP/2 client names the host in the URI (`:authority`), not in Host.
        let authority = request.uri().authority().cloned();
        let target = self.upstream.target(request.uri());
        let headers = request.headers_mut();
        remove_hop_by_hop(headers);
        match self.key {
            // The client's key goes only with the operation it claimed: a request
            // the layer did not cover carries none upstream.
            ForwardKey::Derived => {
                headers.remove(IDEMPOTENCY_KEY);
                if let Some(key) = derived_key.and_then(|key| HeaderValue::try_from(key).ok()) {
                    headers.insert(IDEMPOTENCY_KEY, key);
                }
            }
            ForwardKey::Original => {}
            ForwardKey::None => {
                headers.remove(IDEMPOTENCY_KEY);
            }
        }
        if !headers.contains_key(HOST)
            && let Some(host) = authority.and_then(|a| HeaderValue::try_from(a.as_str()).ok())
        {
            headers.insert(HOST, host);
        }
        add_forwarded(headers, client_ip, self.proto);
        if self.host == HostHeader::Upstream
            && let Ok(host) = HeaderValue::try_from(self.upstream.authority())
        {
            headers.insert(HOST, host);
        }
        *request.uri_mut() = target;
        *request.version_mut() = Version::HTTP_11;
        request
    }
}

impl Service<Request<Body>> for Forward {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The pool grows on demand; there is no readiness to wait for.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(request).await) })
    }
}
