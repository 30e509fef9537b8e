//! The forwarding service the idempotency layer wraps: one request to the
//! upstream per call, over this thread's keep-alive connections (`pool`),
//! headers cleaned both ways.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::IntoResponse;
use base64::Engine as _;
use http::header::{
    ACCEPT_ENCODING, CONNECTION, HOST, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE,
};
use http::{HeaderValue, Request, Response, StatusCode, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use idemgate::grpc::GRPC_TIMEOUT;
use idemgate::{Finality, OperationContext};
use serde::Deserialize;
use sha1::{Digest, Sha1};
use tokio::time::Instant;
use tower_service::Service;

use crate::body::{ClientBody, UpstreamBody};
use crate::headers::{IDEMPOTENCY_KEY, add_forwarded, remove_hop_by_hop};
use crate::pool::{SendError, UpstreamPool, UpstreamProtocol};
use crate::problem;
use crate::upstream::Upstream;

/// Sends each request to the upstream and answers with its response.
///
/// What the upstream gets: the client's method, path (under the upstream's base),
/// query, headers and body, minus the hop-by-hop headers, plus `X-Forwarded-*`;
/// `Host` as the client sent it; and, in place of the client's `Idempotency-Key`,
/// the operation's derived key ([`OperationContext::downstream_key`]) when the
/// idempotency layer claimed one — never the client's raw key. A request the
/// layer did not cover keeps the key it carries, as sent: it reaches the
/// upstream as it would without the proxy. A response header that echoes the
/// derived key back shows the client its own key instead.
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
    client: UpstreamPool,
    upstream: Arc<Upstream>,
    timeout: Duration,
    host: HostHeader,
    /// The scheme clients spoke to this proxy, for `X-Forwarded-Proto`.
    proto: &'static str,
    key: ForwardKey,
    rejections: Arc<[StatusCode]>,
    /// The longest pause between response body frames (and before the first).
    idle: Duration,
    /// The whole response, from sending, head to last byte; `None`: unbounded.
    deadline: Option<Duration>,
}

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
    /// default. A request the layer did not cover keeps the client's key as
    /// sent, and a response header echoing the derived key is rewritten to the
    /// client's.
    #[default]
    Derived,
    /// The client's key as it sent it (for an upstream that shares the key space
    /// with the client, e.g. to look operations up by it). Two principals' equal
    /// keys then reach the upstream equal. A disabled route's default: what
    /// passes through untouched keeps the client's key.
    Original,
    /// No `Idempotency-Key` at all.
    None,
}

/// The `Host` header the upstream receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
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
    /// until the response head arrives (connecting included). Every clone
    /// shares its keep-alive connections to the upstream, kept per worker
    /// thread, at most 128 per worker (see `docs/proxy.md`, "Upstream
    /// connections"); the last clone's drop closes them.
    pub fn new(upstream: Upstream, timeout: Duration) -> Self {
        Self {
            client: UpstreamPool::new(upstream.authority_parts(), UpstreamProtocol::default()),
            upstream: Arc::new(upstream),
            timeout,
            host: HostHeader::Client,
            proto: "http",
            key: ForwardKey::Derived,
            rejections: Arc::from(DEFAULT_REJECTIONS),
            idle: timeout,
            deadline: None,
        }
    }

    /// Which protocol the upstream is spoken to in (default
    /// [`UpstreamProtocol::Auto`]: HTTP/2 for gRPC calls, HTTP/1.1 for the
    /// rest). The connections kept so far are dropped.
    ///
    /// ```
    /// # let forward = idemgate_proxy::Forward::new("http://127.0.0.1:3000".parse().unwrap(), std::time::Duration::from_secs(30));
    /// let forward = forward.with_upstream_protocol(idemgate_proxy::UpstreamProtocol::H2c);
    /// ```
    pub fn with_upstream_protocol(mut self, protocol: UpstreamProtocol) -> Self {
        self.client = UpstreamPool::new(self.upstream.authority_parts(), protocol);
        self
    }

    /// Which `Host` the upstream receives (default: the client's).
    ///
    /// ```
    /// # let forward = idemgate_proxy::Forward::new("http://127.0.0.1:3000".parse().unwrap(), std::time::Duration::from_secs(30));
    /// let forward = forward.with_host_header(idemgate_proxy::HostHeader::Upstream);
    /// ```
    pub fn with_host_header(mut self, host: HostHeader) -> Self {
        self.host = host;
        self
    }

    /// Whether clients speak HTTPS to this proxy (it terminates TLS), for
    /// `X-Forwarded-Proto`.
    ///
    /// ```
    /// # let forward = idemgate_proxy::Forward::new("http://127.0.0.1:3000".parse().unwrap(), std::time::Duration::from_secs(30));
    /// let forward = forward.with_https_clients(true);
    /// ```
    pub fn with_https_clients(mut self, https: bool) -> Self {
        self.proto = if https { "https" } else { "http" };
        self
    }

    /// Bounds on the upstream's response body: at most `idle` without a byte
    /// (default: the head timeout of [`Forward::new`]) and, when set, the whole
    /// response within `deadline` of sending. Past either, the response fails
    /// with `504 upstream-timeout` and the upstream connection is closed (see
    /// `docs/proxy.md` for what the client has received by then).
    ///
    /// ```
    /// use std::time::Duration;
    /// # let forward = idemgate_proxy::Forward::new("http://127.0.0.1:3000".parse().unwrap(), Duration::from_secs(30));
    /// let forward = forward.with_body_timeouts(Duration::from_secs(5), Some(Duration::from_secs(60)));
    /// ```
    pub fn with_body_timeouts(mut self, idle: Duration, deadline: Option<Duration>) -> Self {
        self.idle = idle;
        self.deadline = deadline;
        self
    }

    /// This forwarder (sharing its connection pool) with a route's key mode and
    /// rejection statuses.
    ///
    /// ```
    /// # let forward = idemgate_proxy::Forward::new("http://127.0.0.1:3000".parse().unwrap(), std::time::Duration::from_secs(30));
    /// let forward = forward.with_route_policy(idemgate_proxy::ForwardKey::None, &idemgate_proxy::DEFAULT_REJECTIONS);
    /// ```
    pub fn with_route_policy(&self, key: ForwardKey, rejections: &[StatusCode]) -> Self {
        Self {
            key,
            rejections: Arc::from(rejections),
            ..self.clone()
        }
    }

    /// The upstream's response-head timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The upstream's `host:port`, for messages.
    pub(crate) fn upstream_authority(&self) -> &str {
        self.upstream.authority()
    }

    /// One exchange with the upstream.
    pub(crate) async fn send(&self, mut request: Request<Body>) -> Response<Body> {
        let echo = self.echo(&request);
        let grpc_deadline = request
            .headers()
            .get(&GRPC_TIMEOUT)
            .and_then(|value| idemgate::grpc::parse_timeout(value.as_bytes()));
        // Taken before the headers are cleaned: a WebSocket upgrade is the one
        // hop-by-hop exchange a proxy carries on, by tunnelling both connections.
        // A covered request never upgrades (PITFALLS 29).
        let covered = request.extensions().get::<OperationContext>().is_some();
        let upgrade = WebSocketUpgrade::requested(&mut request, covered);
        let mut request = self.upstream_request(request);
        if let Some(upgrade) = &upgrade {
            upgrade.mark(request.headers_mut());
        }
        let client_failed = Arc::new(AtomicBool::new(false));
        let request =
            request.map(|body| Body::new(ClientBody::new(body, Arc::clone(&client_failed))));
        // A gRPC call's own deadline (`grpc-timeout`) bounds the whole call:
        // past it the client has given up, and the upstream was told so too.
        let deadline = match (self.deadline, grpc_deadline) {
            (Some(route), Some(call)) => Some(route.min(call)),
            (route, call) => route.or(call),
        };
        let deadline = deadline.map(|length| (length, Instant::now() + length));
        let head_wait = deadline.map_or(self.timeout, |(d, _)| d.min(self.timeout));
        let sent = tokio::time::timeout(head_wait, self.client.send(request)).await;
        match sent {
            Ok(Ok(response)) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
                self.switched(upgrade, response)
            }
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
                if let Some(echo) = &echo {
                    echo.rewrite(&mut parts.headers);
                }
                if covered {
                    // Asked for identity: encoded for the client on the way out.
                    parts.extensions.insert(CoveredAnswer);
                }
                let body = UpstreamBody::new(body, self.idle, deadline);
                Response::from_parts(parts, Body::new(body))
            }
            Ok(Err(SendError::Connect(error))) => {
                tracing::warn!(upstream = self.upstream.authority(), error = ?error, "upstream unreachable; nothing was sent");
                (
                    Finality::Retryable,
                    problem::upstream_unreachable(self.upstream.authority()),
                )
                    .into_response()
            }
            Ok(Err(SendError::Exchange(error))) if client_failed.load(Ordering::SeqCst) => {
                // The client's body broke (bad chunked framing, an upload cut
                // off): the client's fault, whatever it did to the exchange.
                tracing::debug!(error = ?error, "the client's request body failed while it was forwarded");
                problem::client_body_failed().into_response()
            }
            Ok(Err(SendError::Exchange(error))) => {
                tracing::warn!(upstream = self.upstream.authority(), error = ?error, "upstream exchange failed after the request was sent");
                problem::upstream_failed(self.upstream.authority()).into_response()
            }
            Err(_elapsed) => {
                tracing::warn!(upstream = self.upstream.authority(), timeout = ?head_wait, "upstream did not answer in time");
                problem::upstream_timeout(head_wait).into_response()
            }
        }
    }

    /// The upstream answered `101`: tunnelled when it accepts the WebSocket the
    /// client asked for, else a `502` (a protocol switch nobody asked for, or a
    /// handshake that is not this one's) and the upstream connection dropped.
    fn switched(
        &self,
        upgrade: Option<WebSocketUpgrade>,
        mut response: Response<hyper::body::Incoming>,
    ) -> Response<Body> {
        let refused = |why: &str| {
            tracing::warn!(
                upstream = self.upstream.authority(),
                why,
                "refused the upstream's 101"
            );
            problem::upstream_bad_upgrade(self.upstream.authority(), why).into_response()
        };
        let Some(upgrade) = upgrade else {
            return refused("the request asked for no WebSocket");
        };
        if let Err(why) = upgrade.accepted_by(response.headers()) {
            return refused(why);
        }
        let upstream = hyper::upgrade::on(&mut response);
        upgrade.tunnel(upstream);
        let (mut parts, _) = response.into_parts();
        remove_hop_by_hop(&mut parts.headers);
        parts
            .headers
            .insert(CONNECTION, HeaderValue::from_static("upgrade"));
        parts
            .headers
            .insert(UPGRADE, HeaderValue::from_static("websocket"));
        parts.version = Version::HTTP_11;
        Response::from_parts(parts, Body::empty())
    }

    /// What an echo of the derived key is turned back into: the client's own
    /// `Idempotency-Key`, on a covered request that carried one and is
    /// forwarded with the derived key.
    fn echo(&self, request: &Request<Body>) -> Option<KeyEcho> {
        if self.key != ForwardKey::Derived {
            return None;
        }
        let derived = request
            .extensions()
            .get::<OperationContext>()
            .map(OperationContext::downstream_key)?;
        let client = request.headers().get(IDEMPOTENCY_KEY)?.clone();
        Some(KeyEcho { derived, client })
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
        let covered = derived_key.is_some();
        // An HTTP/2 client names the host in the URI (`:authority`), not in Host.
        let authority = request.uri().authority().cloned();
        let target = self.upstream.path_and_query(request.uri());
        let headers = request.headers_mut();
        remove_hop_by_hop(headers);
        match self.key {
            // A covered request's key is its operation's; a request the layer did
            // not cover keeps the key it carries, as sent: dropping it would give
            // the upstream less than the client asked for.
            ForwardKey::Derived => {
                if let Some(key) = derived_key.and_then(|key| HeaderValue::try_from(key).ok()) {
                    headers.insert(IDEMPOTENCY_KEY, key);
                }
            }
            ForwardKey::Original => {}
            ForwardKey::None => {
                headers.remove(IDEMPOTENCY_KEY);
            }
        }
        if covered {
            // What is stored is what every retry can read: the representation
            // itself, not a coding the first client happened to accept
            // (PROTOCOL §7). The proxy's compression encodes it for each
            // attempt, first run and replay, by its own Accept-Encoding
            // (`covered_answer`); the layer still decodes a stored coding a
            // retry refuses, should an upstream compress regardless.
            headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        }
        if !headers.contains_key(HOST)
            && let Some(host) = authority.and_then(|a| HeaderValue::try_from(a.as_str()).ok())
        {
            headers.insert(HOST, host);
        }
        add_forwarded(headers, client_ip, self.proto);
        // The upstream's own name: when asked for, or when the client named
        // none (HTTP/1.0 without Host) — an HTTP/1.1 request must carry one.
        if (self.host == HostHeader::Upstream || !headers.contains_key(HOST))
            && let Ok(host) = HeaderValue::try_from(self.upstream.authority())
        {
            headers.insert(HOST, host);
        }
        // Origin-form: the connection is already the upstream's.
        *request.uri_mut() = http::Uri::from(target);
        *request.version_mut() = Version::HTTP_11;
        request
    }
}

/// Marks the upstream's answer to a covered request: it was asked for identity
/// (the one representation the record keeps), so the proxy encodes it — live, and
/// every replay — by the client's own `Accept-Encoding` ([`crate::encoding`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CoveredAnswer;

/// The derived key a covered request was forwarded with, and the client's own
/// key it stands for.
struct KeyEcho {
    derived: String,
    client: HeaderValue,
}

impl KeyEcho {
    /// Every response header whose value is the derived key (an upstream that
    /// echoes `Idempotency-Key`, under that name or its own) gets the client's
    /// key instead: the client never sees a key it did not send.
    fn rewrite(&self, headers: &mut http::HeaderMap) {
        for value in headers.values_mut() {
            if value.as_bytes() == self.derived.as_bytes() {
                *value = self.client.clone();
            }
        }
    }
}

/// The GUID RFC 6455 §1.3 appends to the key before hashing.
const WEBSOCKET_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// An HTTP/1.1 `GET` asking to become a WebSocket (RFC 6455 §4.1), and the
/// client's side of the connection once switched. No other upgrade is carried:
/// `h2c` (deprecated by RFC 9113 §3.1) and any other protocol lose their
/// `Upgrade` header with the hop-by-hop ones and go on as plain HTTP/1.1
/// requests, as a server that does not switch answers them.
struct WebSocketUpgrade {
    key: HeaderValue,
    client: OnUpgrade,
}

impl WebSocketUpgrade {
    /// The upgrade `request` asks for, if it is one this proxy tunnels.
    fn requested(request: &mut Request<Body>, covered: bool) -> Option<Self> {
        // The request line first, then the key: most requests stop there,
        // before any further header lookup.
        if covered || request.version() != Version::HTTP_11 || request.method() != http::Method::GET
        {
            return None;
        }
        let headers = request.headers();
        let key = single(headers, &SEC_WEBSOCKET_KEY)?.clone();
        let connection_upgrade = headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
        let websocket = single(headers, &UPGRADE)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"websocket"));
        (connection_upgrade && websocket).then(|| Self {
            key,
            client: hyper::upgrade::on(request),
        })
    }

    /// Puts the upgrade back on the cleaned upstream request.
    fn mark(&self, headers: &mut http::HeaderMap) {
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
    }

    /// Whether a `101`'s headers accept this handshake: `Upgrade: websocket`
    /// and the `Sec-WebSocket-Accept` of our key (RFC 6455 §4.2.2).
    fn accepted_by(&self, headers: &http::HeaderMap) -> Result<(), &'static str> {
        if !single(headers, &UPGRADE)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"websocket"))
        {
            return Err("its Upgrade is not websocket");
        }
        let mut hash = Sha1::new();
        hash.update(self.key.as_bytes());
        hash.update(WEBSOCKET_GUID.as_bytes());
        let expected = base64::engine::general_purpose::STANDARD.encode(hash.finalize());
        match single(headers, &SEC_WEBSOCKET_ACCEPT) {
            Some(accept) if accept.as_bytes() == expected.as_bytes() => Ok(()),
            _ => Err("its Sec-WebSocket-Accept does not answer the key"),
        }
    }

    /// Once both sides have switched, copies bytes both ways until either closes.
    fn tunnel(self, upstream: OnUpgrade) {
        tokio::spawn(async move {
            let (client, upstream) = match tokio::try_join!(self.client, upstream) {
                Ok(sides) => sides,
                Err(error) => {
                    tracing::warn!(error = ?error, "an upgraded connection failed to switch");
                    return;
                }
            };
            let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
            if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
                tracing::debug!(error = ?error, "an upgraded connection ended with an error");
            }
        });
    }
}

/// The value of a header sent exactly once.
fn single<'a>(headers: &'a http::HeaderMap, name: &http::HeaderName) -> Option<&'a HeaderValue> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => Some(value),
        _ => None,
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
        Box::pin(async move { Ok(this.send(request).await) })
    }
}
