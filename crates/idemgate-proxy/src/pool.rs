//! The keep-alive connections to one upstream: an [`UpstreamPool`] owned by
//! its forwarder, holding each worker thread's connections apart — each one a
//! hyper [`SendRequest`] over its own TCP connection, with nothing in between.
//!
//! A worker (`idemgate_listener::Workers`, one current-thread runtime per
//! thread) sends every request over connections whose tasks run on its own
//! thread, as an nginx worker keeps its own upstream connections. A request
//! takes an idle connection from its worker's list, or opens one, and hands it
//! back as soon as the response head has arrived: the connection stays in the
//! list while its body streams and is taken again once hyper reports it ready
//! for the next request. There is no pool task, no lock and no channel besides
//! the one between a `SendRequest` and its own connection — what hyper-util's
//! pooled client added per request (a checkout, a dispatch hop, a task to hand
//! the connection back). A worker finds its list through the pool's own
//! per-thread slots ([`ThreadLocal`]: a lock-free lookup by thread), not a
//! process-wide registry: the connections belong to the pool, and go (closed)
//! with its forwarder's last clone, as when a reloaded route table replaces
//! the forwarders (pingora's `ConnectionPool` is likewise an owned object).
//!
//! # Limits
//!
//! - Each worker keeps at most [`DEFAULT_MAX_KEPT`] connections to the upstream
//!   (pingora's default pool size): idle ones and those still streaming a
//!   response body. A connection handed back while its worker keeps that many is
//!   not kept: it is closed once its response has ended. A burst wider than the
//!   bound still gets a connection for every request; only what it leaves
//!   behind is bounded.
//! - An idle connection is reused for at most [`IDLE_REUSE`], then closed.
//!
//! `idemgate_upstream_connections_total{outcome}` counts the connections a
//! request got: `opened` (a new TCP connection) or `reused` (a kept one).
//!
//! On a multi-thread runtime each of its threads has a list, which only costs
//! some reuse.
//!
//! # HTTP/2
//!
//! A request that goes out in HTTP/2 (h2c with prior knowledge: every gRPC
//! call under `--upstream-protocol auto`, the default, or every request under
//! `h2c`; [`UpstreamProtocol`]) takes its worker's one HTTP/2 connection,
//! multiplexed, opened at its first such request and again once it closes
//! (a `GOAWAY`, the upstream gone). Its streams are bounded by the upstream's
//! own `SETTINGS_MAX_CONCURRENT_STREAMS`: a request past it waits for a
//! stream, as it would at the upstream. A request hyper hands back unsent (the
//! connection closed under it) goes out once more on a new connection; one
//! that was sent never does.

use std::cell::RefCell;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Method, Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use thread_local::ThreadLocal;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How long an idle connection to the upstream is reused. Below the common
/// keep-alive timeouts of upstream servers (Node's is 5 s, most others more),
/// so the proxy rarely sends on a connection the upstream is closing; when it
/// does, [`UpstreamPool::send`] says what goes out again.
const IDLE_REUSE: Duration = Duration::from_secs(4);

/// How many connections to one upstream each worker keeps for reuse (idle, or
/// finishing a response body); one more handed back is closed instead.
pub(crate) const DEFAULT_MAX_KEPT: usize = 128;

/// Idle at least this long, a reused connection may have been closed by the
/// upstream's keep-alive timeout just as a request is written to it (no server
/// times an idle connection out sooner). A body-less safe request sent on such
/// a connection is kept, to be sent once more should the connection turn out
/// closed before any answer; a busy connection costs no copy.
const MAY_HAVE_TIMED_OUT: Duration = Duration::from_millis(250);

/// The counter of the connections requests got, by `outcome`.
const CONNECTIONS_METRIC: &str = "idemgate_upstream_connections_total";

/// Why a request got no response from the upstream.
#[derive(Debug)]
pub(crate) enum SendError {
    /// No connection could be opened: nothing was sent.
    Connect(io::Error),
    /// The exchange failed once the request was on a connection: it may have
    /// been received and run.
    Exchange(hyper::Error),
}

/// One forwarder's connections to its upstream, each worker's apart; its
/// clones share them, and the last clone's drop closes them.
#[derive(Clone)]
pub(crate) struct UpstreamPool {
    shared: Arc<Shared>,
}

struct Shared {
    /// The upstream's host (an IPv6 address without brackets) and port.
    host: String,
    port: u16,
    /// The same as written in the upstream URL: an HTTP/2 request's
    /// `:authority` when the client named none.
    authority: http::uri::Authority,
    /// How many connections each worker keeps.
    max_kept: usize,
    /// Which requests go out in HTTP/2.
    protocol: UpstreamProtocol,
    /// Each worker thread's connections, made at its first request.
    workers: ThreadLocal<RefCell<Kept>>,
}

/// One worker's connections to the upstream, and its handles on the counters.
struct Kept {
    list: Vec<Pooled>,
    /// The worker's HTTP/2 connection, multiplexed, once one was needed.
    h2: Option<http2::SendRequest<Body>>,
    opened: metrics::Counter,
    reused: metrics::Counter,
}

impl Kept {
    /// Taken at a worker's first request, once the process's recorder is
    /// installed; the handles then count without a lookup.
    fn new() -> Self {
        Self {
            list: Vec::new(),
            h2: None,
            opened: metrics::counter!(CONNECTIONS_METRIC, "outcome" => "opened"),
            reused: metrics::counter!(CONNECTIONS_METRIC, "outcome" => "reused"),
        }
    }
}

/// A connection in a worker's list: idle, or still reading a response body.
struct Pooled {
    sender: SendRequest<Body>,
    /// When its last response head arrived.
    since: Instant,
}

impl std::fmt::Debug for UpstreamPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamPool")
            .field("host", &self.shared.host)
            .field("port", &self.shared.port)
            .field("max_kept", &self.shared.max_kept)
            .finish_non_exhaustive()
    }
}

impl UpstreamPool {
    /// The connections to `authority` (`host[:port]`, port 80 when absent),
    /// keeping at most [`DEFAULT_MAX_KEPT`] per worker, speaking `protocol`.
    pub(crate) fn new(authority: &http::uri::Authority, protocol: UpstreamProtocol) -> Self {
        Self::with_max_kept(authority, DEFAULT_MAX_KEPT, protocol)
    }

    /// The connections to `authority`, keeping at most `max_kept` HTTP/1
    /// connections per worker.
    pub(crate) fn with_max_kept(
        authority: &http::uri::Authority,
        max_kept: usize,
        protocol: UpstreamProtocol,
    ) -> Self {
        let host = authority.host();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        // Exported at 0 from the start (with a recorder installed by now):
        // adding nothing to a counter registers it without resetting it.
        for outcome in ["opened", "reused"] {
            metrics::counter!(CONNECTIONS_METRIC, "outcome" => outcome).increment(0);
        }
        Self {
            shared: Arc::new(Shared {
                host: host.to_owned(),
                port: authority.port_u16().unwrap_or(80),
                authority: authority.clone(),
                max_kept,
                protocol,
                workers: ThreadLocal::new(),
            }),
        }
    }

    /// This worker's connections.
    fn kept(&self) -> &RefCell<Kept> {
        self.shared.workers.get_or(|| RefCell::new(Kept::new()))
    }

    /// Sends `request` (origin-form URI, `Host` set) over an idle connection of
    /// this worker, or a new one. A reused connection can turn out closed by
    /// the upstream (its keep-alive timeout) as the request goes out; then the
    /// request goes out once more, on a new connection, when nothing can have
    /// run: hyper gave it back unsent, or it is a body-less safe request
    /// (RFC 9110 §9.2.2) that got no byte of an answer. Anything else that was
    /// sent is never sent again: the upstream may have run it.
    pub(crate) async fn send(
        &self,
        request: Request<Body>,
    ) -> Result<Response<Incoming>, SendError> {
        if self.shared.protocol.is_http2_for(request.headers()) {
            return Box::pin(self.send_http2(request)).await;
        }
        let Some((mut sender, idle)) = self.checkout() else {
            // Connecting (name resolution included) is boxed apart: it is rare
            // on keep-alive connections, and its state would enlarge every
            // request's.
            let sender = Box::pin(self.connect()).await?;
            return self.exchange(sender, request).await;
        };
        let copy = (idle >= MAY_HAVE_TIMED_OUT)
            .then(|| replayable_copy(&request))
            .flatten();
        let again = match sender.try_send_request(request).await {
            Ok(response) => {
                self.checkin(sender);
                return Ok(response);
            }
            Err(mut failed) => match (failed.take_message(), copy) {
                (Some(unsent), _) => unsent,
                (None, Some(copy)) if failed.error().is_incomplete_message() => copy,
                _ => return Err(SendError::Exchange(failed.into_error())),
            },
        };
        tracing::debug!(
            "a reused upstream connection was closed as the request went out; sending it on a new one"
        );
        let sender = Box::pin(self.connect()).await?;
        self.exchange(sender, again).await
    }

    /// One request on `sender`, handed back to the list once answered.
    async fn exchange(
        &self,
        mut sender: SendRequest<Body>,
        request: Request<Body>,
    ) -> Result<Response<Incoming>, SendError> {
        let response = sender
            .send_request(request)
            .await
            .map_err(SendError::Exchange)?;
        self.checkin(sender);
        Ok(response)
    }

    /// A ready connection from this worker's list and how long it has been
    /// idle, dropping on the way the closed ones and those idle longer than
    /// [`IDLE_REUSE`].
    fn checkout(&self) -> Option<(SendRequest<Body>, Duration)> {
        let now = Instant::now();
        let mut kept = self.kept().borrow_mut();
        kept.list.retain(|pooled| {
            let stale = pooled.sender.is_ready() && now - pooled.since > IDLE_REUSE;
            !pooled.sender.is_closed() && !stale
        });
        let ready = kept
            .list
            .iter()
            .rposition(|pooled| pooled.sender.is_ready())?;
        let pooled = kept.list.swap_remove(ready);
        kept.reused.increment(1);
        Some((pooled.sender, now - pooled.since))
    }

    /// Puts a connection whose response head has arrived back in this
    /// worker's list, to be taken again once its body is read — unless the
    /// worker keeps its bound already (closed ones not counted): then it is
    /// dropped, and hyper closes it once the response has ended.
    fn checkin(&self, sender: SendRequest<Body>) {
        let mut kept = self.kept().borrow_mut();
        if kept.list.len() >= self.shared.max_kept {
            kept.list.retain(|pooled| !pooled.sender.is_closed());
            if kept.list.len() >= self.shared.max_kept {
                return;
            }
        }
        kept.list.push(Pooled {
            sender,
            since: Instant::now(),
        });
    }

    /// A new connection, its task spawned on this thread's runtime. Upgrades
    /// are enabled: a WebSocket the upstream accepts takes the connection over.
    async fn connect(&self) -> Result<SendRequest<Body>, SendError> {
        let stream = self.tcp().await?;
        // An HTTP/1 handshake does no I/O; it fails only when hyper cannot
        // build the connection, before anything is sent.
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| SendError::Connect(io::Error::other(error)))?;
        tokio::spawn(async move {
            if let Err(error) = connection.with_upgrades().await {
                tracing::debug!(error = ?error, "an upstream connection ended with an error");
            }
        });
        self.kept().borrow().opened.increment(1);
        Ok(sender)
    }
}

impl UpstreamPool {
    /// Sends `request` (origin-form URI, `Host` set) in HTTP/2 over this
    /// worker's connection, opening it when there is none or it closed.
    async fn send_http2(&self, request: Request<Body>) -> Result<Response<Incoming>, SendError> {
        let request = self.http2_request(request);
        let kept = {
            let mut kept = self.kept().borrow_mut();
            kept.h2.take_if(|sender| sender.is_closed());
            kept.h2.clone()
        };
        let Some(mut sender) = kept else {
            let mut sender = self.connect_http2().await?;
            return sender
                .send_request(request)
                .await
                .map_err(refused_or_exchange);
        };
        self.kept().borrow().reused.increment(1);
        match sender.try_send_request(request).await {
            Ok(response) => Ok(response),
            Err(mut failed) => match failed.take_message() {
                // Closed under it before it went out: nothing ran.
                Some(unsent) => {
                    tracing::debug!(
                        "the upstream's HTTP/2 connection closed before the request went out; sending it on a new one"
                    );
                    let mut sender = self.connect_http2().await?;
                    sender
                        .send_request(unsent)
                        .await
                        .map_err(refused_or_exchange)
                }
                None => Err(refused_or_exchange(failed.into_error())),
            },
        }
    }

    /// `request` in HTTP/2's form: the target absolute (`:scheme` and
    /// `:authority`, from `Host`, which HTTP/2 does not carry), and, for a
    /// gRPC call, `te: trailers` — which gRPC requires and every gRPC client
    /// sent, but which the proxy removed with the other hop-by-hop headers.
    fn http2_request(&self, mut request: Request<Body>) -> Request<Body> {
        let authority = request
            .headers_mut()
            .remove(http::header::HOST)
            .and_then(|host| http::uri::Authority::try_from(host.as_bytes()).ok())
            .unwrap_or_else(|| self.shared.authority.clone());
        let mut parts = request.uri().clone().into_parts();
        parts.scheme = Some(http::uri::Scheme::HTTP);
        parts.authority = Some(authority);
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
        *request.version_mut() = http::Version::HTTP_2;
        if idemgate::grpc::is_grpc(request.headers()) {
            request
                .headers_mut()
                .insert(http::header::TE, http::HeaderValue::from_static("trailers"));
        }
        request
    }

    /// A new TCP connection to the upstream, without Nagle's delay: the one
    /// way both protocols connect.
    async fn tcp(&self) -> Result<TcpStream, SendError> {
        let stream = TcpStream::connect((self.shared.host.as_str(), self.shared.port))
            .await
            .map_err(SendError::Connect)?;
        stream.set_nodelay(true).map_err(SendError::Connect)?;
        Ok(stream)
    }

    /// A new HTTP/2 connection (h2c, prior knowledge), kept as this worker's;
    /// its task spawned on this thread's runtime. Pinged while streams are
    /// open, so a peer that vanished is noticed.
    async fn connect_http2(&self) -> Result<http2::SendRequest<Body>, SendError> {
        let stream = self.tcp().await?;
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(HTTP2_PING)
            .keep_alive_timeout(HTTP2_PING)
            // Idle ones too: a connection that died quietly is found before a
            // request is sent on it, not after.
            .keep_alive_while_idle(true)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|error| SendError::Connect(io::Error::other(error)))?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(error = ?error, "an upstream HTTP/2 connection ended with an error");
            }
        });
        let mut kept = self.kept().borrow_mut();
        kept.opened.increment(1);
        kept.h2 = Some(sender.clone());
        Ok(sender)
    }
}

/// What an HTTP/2 exchange that failed means: a stream the upstream refused
/// (`REFUSED_STREAM`, RFC 9113 §8.7: guaranteed not processed) ran nothing,
/// like a refused connection, so its claim is released; anything else may
/// have run.
fn refused_or_exchange(error: hyper::Error) -> SendError {
    use std::error::Error as _;
    let mut cause = error.source();
    while let Some(current) = cause {
        if let Some(h2) = current.downcast_ref::<h2::Error>() {
            if h2.is_remote() && h2.reason() == Some(h2::Reason::REFUSED_STREAM) {
                return SendError::Connect(io::Error::other(error));
            }
            break;
        }
        cause = current.source();
    }
    SendError::Exchange(error)
}

/// How often an upstream HTTP/2 connection is pinged, and
/// how long a ping may go unanswered before the connection is closed.
const HTTP2_PING: Duration = Duration::from_secs(10);

/// Which protocol the proxy speaks to its upstream (`--upstream-protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[non_exhaustive]
pub enum UpstreamProtocol {
    /// HTTP/1.1 for every request (a gRPC call then fails: gRPC needs HTTP/2).
    Http1,
    /// HTTP/2 with prior knowledge (h2c) for every request.
    H2c,
    /// HTTP/2 (h2c) for gRPC calls (`content-type: application/grpc…`), which
    /// need it, and HTTP/1.1 for every other request. The default: an upstream
    /// serving both (tonic beside axum, a Go server with cmux) gets each in
    /// its own, and an HTTP-only upstream sees no change.
    #[default]
    Auto,
}

impl UpstreamProtocol {
    /// Whether a request with `headers` goes out in HTTP/2.
    fn is_http2_for(self, headers: &http::HeaderMap) -> bool {
        match self {
            Self::Http1 => false,
            Self::H2c => true,
            Self::Auto => idemgate::grpc::is_grpc(headers),
        }
    }
}

/// A copy of `request` to send again, if it is safe and has no body.
fn replayable_copy(request: &Request<Body>) -> Option<Request<Body>> {
    use http_body::Body as _;
    let safe = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    );
    if !safe || request.body().size_hint().exact() != Some(0) {
        return None;
    }
    let mut copy = Request::new(Body::empty());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    Some(copy)
}

#[cfg(test)]
impl UpstreamPool {
    /// How many connections this worker keeps that `matching` accepts.
    fn kept_here(&self, matching: impl Fn(&Pooled) -> bool) -> usize {
        self.kept()
            .borrow()
            .list
            .iter()
            .filter(|p| matching(p))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::Barrier;

    use super::*;

    /// An upstream answering every `GET` with `200 ok` on keep-alive
    /// connections, counting the connections it accepts and the requests it
    /// answers. With `together`, it answers only once that many requests are
    /// in (each on its own connection); with `close_after`, it closes each
    /// connection that long after its first answer, without saying so.
    struct Upstream {
        pools: UpstreamPool,
        connections: Arc<AtomicUsize>,
        answered: Arc<AtomicUsize>,
    }

    impl Upstream {
        async fn start(together: Option<usize>, close_after: Option<Duration>) -> Self {
            Self::keeping(DEFAULT_MAX_KEPT, together, close_after).await
        }

        /// [`Upstream::start`] behind a pool that keeps `max_kept` per worker.
        async fn keeping(
            max_kept: usize,
            together: Option<usize>,
            close_after: Option<Duration>,
        ) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let authority = listener.local_addr().unwrap().to_string().parse().unwrap();
            let connections = Arc::new(AtomicUsize::new(0));
            let answered = Arc::new(AtomicUsize::new(0));
            let barrier = together.map(|n| Arc::new(Barrier::new(n)));
            let (accepted, counted) = (Arc::clone(&connections), Arc::clone(&answered));
            tokio::spawn(async move {
                loop {
                    let (mut stream, _) = listener.accept().await.unwrap();
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let (barrier, counted) = (barrier.clone(), Arc::clone(&counted));
                    tokio::spawn(async move {
                        let mut seen = Vec::new();
                        let mut buffer = [0; 1024];
                        loop {
                            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                                match stream.read(&mut buffer).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) => seen.extend_from_slice(&buffer[..n]),
                                }
                            }
                            let end = seen.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
                            seen.drain(..end + 4);
                            if let Some(barrier) = &barrier {
                                barrier.wait().await;
                            }
                            counted.fetch_add(1, Ordering::SeqCst);
                            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if stream.write_all(answer).await.is_err() {
                                return;
                            }
                            if let Some(pause) = close_after {
                                tokio::time::sleep(pause).await;
                                return;
                            }
                        }
                    });
                }
            });
            Self {
                pools: UpstreamPool::with_max_kept(&authority, max_kept, UpstreamProtocol::Http1),
                connections,
                answered,
            }
        }

        /// One `GET /` through the pool, its body read to the end.
        async fn get(&self) -> Vec<u8> {
            let request = Request::get("/")
                .header(http::header::HOST, "upstream")
                .body(Body::empty())
                .unwrap();
            let response = self.pools.send(request).await.unwrap();
            let body = response.into_body().collect().await.unwrap();
            body.to_bytes().to_vec()
        }

        /// Yields until a connection of this worker's list is ready, without
        /// turning the runtime's I/O driver more than the yields do.
        async fn until_one_is_ready(&self) {
            for _ in 0..1000 {
                if self.pools.kept_here(|pooled| pooled.sender.is_ready()) > 0 {
                    return;
                }
                tokio::task::yield_now().await;
            }
            panic!("no connection became ready");
        }

        fn connections(&self) -> usize {
            self.connections.load(Ordering::SeqCst)
        }
    }

    /// Lets the connection tasks see what the last exchange left (a body
    /// read, a close) before the next checkout.
    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    #[tokio::test]
    async fn requests_one_after_another_share_one_connection() {
        let upstream = Upstream::start(None, None).await;
        for _ in 0..10 {
            assert_eq!(upstream.get().await, b"ok");
        }
        assert_eq!(upstream.answered.load(Ordering::SeqCst), 10);
        assert_eq!(upstream.connections(), 1);
    }

    #[tokio::test]
    async fn concurrent_requests_each_get_a_connection_then_reuse_them() {
        let upstream = Arc::new(Upstream::start(Some(8), None).await);
        for round in 1..=2 {
            let requests: Vec<_> = (0..8)
                .map(|_| {
                    let upstream = Arc::clone(&upstream);
                    tokio::spawn(async move { upstream.get().await })
                })
                .collect();
            for request in requests {
                assert_eq!(request.await.unwrap(), b"ok");
            }
            assert_eq!(upstream.answered.load(Ordering::SeqCst), 8 * round);
            // The second round's eight, in flight together, rode the first
            // round's eight connections.
            assert_eq!(upstream.connections(), 8, "round {round}");
            settle().await;
        }
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_is_not_sent_on() {
        let upstream = Upstream::start(None, Some(Duration::ZERO)).await;
        for _ in 0..3 {
            assert_eq!(upstream.get().await, b"ok");
            settle().await;
        }
        assert_eq!(upstream.answered.load(Ordering::SeqCst), 3);
        assert_eq!(upstream.connections(), 3);
    }

    /// Sends a `GET`, lets its connection go idle and ready, holds this
    /// (current-thread) runtime still while the upstream — on threads of its
    /// own — closes that connection, then sends `second` through the pool: the
    /// close race, made deterministic.
    fn after_the_upstream_closed_the_idle_connection(
        second: Request<Body>,
    ) -> (Upstream, Result<Vec<u8>, SendError>) {
        let upstream_runtime = tokio::runtime::Runtime::new().unwrap();
        let upstream =
            upstream_runtime.block_on(Upstream::start(None, Some(Duration::from_millis(50))));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let answer = runtime.block_on(async {
            assert_eq!(upstream.get().await, b"ok");
            upstream.until_one_is_ready().await;
            std::thread::sleep(Duration::from_millis(300));
            let response = upstream.pools.send(second).await?;
            Ok(response
                .into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .to_vec())
        });
        (upstream, answer)
    }

    #[test]
    fn a_body_less_get_on_a_connection_the_upstream_just_closed_goes_out_again() {
        let get = Request::get("/")
            .header(http::header::HOST, "upstream")
            .body(Body::empty())
            .unwrap();
        let (upstream, answer) = after_the_upstream_closed_the_idle_connection(get);
        // Written to the closed connection, it got no answer; it went out once
        // more, on a new connection.
        assert_eq!(answer.unwrap(), b"ok");
        assert_eq!(upstream.answered.load(Ordering::SeqCst), 2);
        assert_eq!(upstream.connections(), 2);
    }

    #[test]
    fn a_request_with_a_body_is_never_sent_twice() {
        let post = Request::post("/orders")
            .header(http::header::HOST, "upstream")
            .body(Body::from("{}"))
            .unwrap();
        let (upstream, answer) = after_the_upstream_closed_the_idle_connection(post);
        // It may have run (as far as the proxy can tell): the failure is the
        // answer, for the layer's policy to settle.
        assert!(matches!(answer, Err(SendError::Exchange(_))), "{answer:?}");
        assert_eq!(upstream.answered.load(Ordering::SeqCst), 1);
        assert_eq!(upstream.connections(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_idle_past_the_reuse_limit_is_replaced() {
        let upstream = Upstream::start(None, None).await;
        assert_eq!(upstream.get().await, b"ok");
        tokio::time::advance(IDLE_REUSE - Duration::from_millis(100)).await;
        assert_eq!(upstream.get().await, b"ok");
        assert_eq!(upstream.connections(), 1, "reused within the limit");
        tokio::time::advance(IDLE_REUSE + Duration::from_millis(100)).await;
        assert_eq!(upstream.get().await, b"ok");
        assert_eq!(upstream.connections(), 2, "replaced past it");
    }

    #[tokio::test]
    async fn an_upstream_that_refuses_connections_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string().parse().unwrap();
        drop(listener);
        let pools = UpstreamPool::new(&authority, UpstreamProtocol::Http1);
        let request = Request::get("/")
            .header(http::header::HOST, "x")
            .body(Body::empty())
            .unwrap();
        assert!(matches!(
            pools.send(request).await,
            Err(SendError::Connect(_))
        ));
    }

    #[tokio::test]
    async fn a_worker_keeps_at_most_its_bound_and_closes_the_rest() {
        let upstream = Arc::new(Upstream::keeping(3, Some(8), None).await);
        let round = || async {
            let requests: Vec<_> = (0..8)
                .map(|_| {
                    let upstream = Arc::clone(&upstream);
                    tokio::spawn(async move { upstream.get().await })
                })
                .collect();
            for request in requests {
                assert_eq!(request.await.unwrap(), b"ok");
            }
            settle().await;
        };
        round().await;
        // Eight in flight together needed eight connections; three were kept,
        // and the five past the bound were closed once their responses ended.
        assert_eq!(upstream.connections(), 8);
        assert_eq!(upstream.pools.kept_here(|_| true), 3);
        round().await;
        // The next eight reused the three kept and opened five more.
        assert_eq!(upstream.connections(), 13);
        assert_eq!(upstream.pools.kept_here(|_| true), 3);
    }

    #[tokio::test]
    async fn connections_opened_and_reused_are_counted() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        // This test's thread only: the worker's handles are taken here.
        let _recording = metrics::set_default_local_recorder(&recorder);
        let upstream = Upstream::start(None, None).await;
        for _ in 0..3 {
            assert_eq!(upstream.get().await, b"ok");
        }
        // One snapshot: taking one hands the counters' values over.
        let snapshot = snapshotter.snapshot().into_vec();
        let counted = |outcome: &str| {
            snapshot
                .iter()
                .find(|(key, ..)| {
                    key.key().name() == CONNECTIONS_METRIC
                        && key.key().labels().any(|l| l.value() == outcome)
                })
                .map(|(.., value)| match value {
                    DebugValue::Counter(n) => *n,
                    other => panic!("{other:?}"),
                })
        };
        assert_eq!(counted("opened"), Some(1));
        assert_eq!(counted("reused"), Some(2));
    }

    #[test]
    fn an_ipv6_upstream_is_connected_to_without_brackets() {
        let pools = UpstreamPool::new(&"[::1]:8080".parse().unwrap(), UpstreamProtocol::Auto);
        assert_eq!(
            (pools.shared.host.as_str(), pools.shared.port),
            ("::1", 8080)
        );
        let pools = UpstreamPool::new(&"api.internal".parse().unwrap(), UpstreamProtocol::Auto);
        assert_eq!(
            (pools.shared.host.as_str(), pools.shared.port),
            ("api.internal", 80)
        );
    }
}
