//! Accepting HTTP connections with the limits every public listener needs, in one
//! place for `serve` and for the proxy's public and admin listeners.
//!
//! A server that waits forever for a client is a server a few slow clients can
//! take down: 100 connections dribbling one header byte per second, or 20 bodies
//! sent at 1 B/s, hold a connection (and a file descriptor) each for as long as
//! they like, and once the descriptors run out nobody else is served. So every
//! connection accepted here is bounded in time and in number:
//!
//! - **header-read timeout**: from accept (before the first byte), and from the
//!   first byte of each later request, the request head must be complete within
//!   it;
//! - **idle timeout**: a keep-alive connection with no request in flight and no
//!   byte received is closed after it;
//! - **body-read timeout**: the whole request body must arrive within it, counted
//!   from the end of the head (a total, not a per-read timer: a per-read timer
//!   never fires for a client sending one byte per second); past it the answer is
//!   `408` `body-timeout` problem+json and the connection is closed;
//! - **connection bound**: beyond it a new connection is answered at once with a
//!   canned `503` `connection-limit` and closed, without reading from it, so the
//!   accept loop never waits on a client;
//! - the accept loop survives `EMFILE`/`ENFILE` (it pauses briefly instead of
//!   spinning or dying), and [`raise_fd_limit`] lifts the soft `RLIMIT_NOFILE` to
//!   the hard limit at startup; the connection bound is capped below that limit
//!   so connections alone cannot exhaust the descriptors the stores and the
//!   payment gateway client need.
//!
//! Why not hyper's own `header_read_timeout`: hyper (1.x) starts that timer when it
//! starts waiting for a request head, which includes the wait of an idle
//! keep-alive connection for its next request, so it cannot be shorter than the
//! idle timeout without also cutting keep-alive short (behind a load balancer with
//! a 60 s idle timeout the backend must keep connections longer than that). The
//! watchdog here tells the two phases apart by the bytes it sees.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use axum::response::IntoResponse;
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use idemgate::ProblemDetails;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::cli::ConfigError;

/// File descriptors kept out of the connection bound for everything else the
/// process opens: database and Redis pools, the payment gateway client, SQLite
/// files, the runtime's own descriptors.
const FD_RESERVE: u64 = 128;

/// How long the accept loop pauses after an error that is not one connection's
/// (out of descriptors, out of memory), so it neither spins nor dies.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Connection limits as flags, flattened into every subcommand that listens
/// (`serve`, `proxy`). Each flag has its environment variable; a flag
/// wins over its variable.
#[derive(Debug, Clone, clap::Args)]
pub struct ListenerArgs {
    /// How long a client has to send a complete request head, in milliseconds:
    /// counted from accept for a new connection (so a client that connects and
    /// sends nothing is closed too) and from the first byte of each later request.
    /// Past it the connection is closed.
    #[arg(
        long,
        env = "IDEMGATE_HEADER_READ_TIMEOUT_MS",
        default_value_t = 10_000,
        value_name = "MS"
    )]
    pub header_read_timeout_ms: u64,

    /// How long a client has to send a whole request body, in milliseconds, from
    /// the end of the head. Past it the answer is 408 (problem+json
    /// `body-timeout`), nothing runs, and the connection is closed.
    #[arg(
        long,
        env = "IDEMGATE_BODY_READ_TIMEOUT_MS",
        default_value_t = 30_000,
        value_name = "MS"
    )]
    pub body_read_timeout_ms: u64,

    /// How long a keep-alive connection may wait for its next request, in
    /// milliseconds; then it is closed. Keep it above the idle timeout of a load
    /// balancer in front (often 60 s).
    #[arg(
        long,
        env = "IDEMGATE_IDLE_TIMEOUT_MS",
        default_value_t = 75_000,
        value_name = "MS"
    )]
    pub idle_timeout_ms: u64,

    /// Most connections open at once; beyond it a new connection gets an immediate
    /// 503 (problem+json `connection-limit`, `Retry-After: 1`) and is closed.
    /// Capped at the file-descriptor limit minus a reserve of 128 (logged when it
    /// applies).
    #[arg(
        long,
        env = "IDEMGATE_MAX_CONNECTIONS",
        default_value_t = 10_000,
        value_name = "N"
    )]
    pub max_connections: usize,
}

impl ListenerArgs {
    /// Checks the flags: every timeout and the bound must be at least 1.
    pub fn options(&self) -> Result<ListenerOptions, ConfigError> {
        let millis = |value: u64, flag, env| {
            if value == 0 {
                Err(ConfigError::new(flag, env, "must be at least 1"))
            } else {
                Ok(Duration::from_millis(value))
            }
        };
        if self.max_connections == 0 {
            return Err(ConfigError::new(
                "--max-connections",
                "IDEMGATE_MAX_CONNECTIONS",
                "must be at least 1",
            ));
        }
        Ok(ListenerOptions {
            header_read_timeout: millis(
                self.header_read_timeout_ms,
                "--header-read-timeout-ms",
                "IDEMGATE_HEADER_READ_TIMEOUT_MS",
            )?,
            body_read_timeout: millis(
                self.body_read_timeout_ms,
                "--body-read-timeout-ms",
                "IDEMGATE_BODY_READ_TIMEOUT_MS",
            )?,
            idle_timeout: millis(
                self.idle_timeout_ms,
                "--idle-timeout-ms",
                "IDEMGATE_IDLE_TIMEOUT_MS",
            )?,
            max_connections: self.max_connections,
        })
    }
}

/// The limits of one listener, checked (see the module docs for what each bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerOptions {
    /// From accept, or from a request's first byte, to the end of its head.
    pub header_read_timeout: Duration,
    /// From the end of the head to the end of the body.
    pub body_read_timeout: Duration,
    /// A keep-alive connection's wait for its next request.
    pub idle_timeout: Duration,
    /// Connections open at once, before the file-descriptor cap.
    pub max_connections: usize,
}

impl Default for ListenerOptions {
    /// The flags' defaults: 10 s head, 30 s body, 75 s idle, 10 000 connections.
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(75),
            max_connections: 10_000,
        }
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the soft limit
/// now in force (`None` where it cannot be read). Call it once at startup, before
/// binding: a soft limit of 1024 (a common default) is a few hundred slow clients.
pub fn raise_fd_limit() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(soft) => Some(soft),
        Err(error) => {
            tracing::warn!(%error, "could not raise the open-file limit");
            fd_limit()
        }
    }
}

/// The soft `RLIMIT_NOFILE`, if it can be read.
fn fd_limit() -> Option<u64> {
    rlimit::getrlimit(rlimit::Resource::NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

/// A bound TCP listener that serves a [`Router`] within its [`ListenerOptions`].
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    options: ListenerOptions,
    max_connections: usize,
    /// Set: every connection speaks TLS, its handshake within the header-read
    /// timeout.
    tls: Option<Arc<ServerConfig>>,
}

impl Listener {
    /// Binds `addr`. The connection bound is capped here at the soft descriptor
    /// limit minus a reserve, so call [`raise_fd_limit`] first.
    pub async fn bind(addr: SocketAddr, options: ListenerOptions) -> std::io::Result<Self> {
        let tcp = TcpListener::bind(addr).await?;
        let mut max_connections = options.max_connections;
        if let Some(limit) = fd_limit() {
            let cap =
                usize::try_from(limit.saturating_sub(FD_RESERVE).max(1)).unwrap_or(usize::MAX);
            if cap < max_connections {
                tracing::warn!(
                    configured = max_connections,
                    cap,
                    open_file_limit = limit,
                    "the connection bound is capped by the open-file limit"
                );
                max_connections = cap;
            }
        }
        Ok(Self {
            tcp,
            options,
            max_connections,
            tls: None,
        })
    }

    /// Serves HTTPS with `config` instead of plain HTTP.
    pub fn with_tls(mut self, config: Arc<ServerConfig>) -> Self {
        self.tls = Some(config);
        self
    }

    /// Whether connections speak TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The bound address (the port, when bound to port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// The connection bound in force (after the descriptor cap).
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// Serves `router` (HTTP/1.1 and HTTP/2, upgrades allowed) until `shutdown`
    /// resolves, then stops accepting, lets open requests finish (idle
    /// connections close at once) and returns when every connection is closed.
    /// Put a deadline around it: a client still sending is bounded only by the
    /// timeouts.
    pub async fn serve(self, router: Router, shutdown: impl Future<Output = ()>) {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // The watchdog below times the head; hyper's timer would also cut idle
        // keep-alive connections at the header timeout.
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(None);
        builder.http2().timer(TokioTimer::new());
        let connections = TaskTracker::new();
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut accept_errors = AcceptErrors::default();
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                biased;
                () = &mut shutdown => break,
                accepted = self.tcp.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) if is_connection_error(&error) => continue,
                Err(error) => {
                    accept_errors.log(&error);
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            if connections.len() >= self.max_connections {
                shed(&stream);
                continue;
            }
            let _ = stream.set_nodelay(true);
            connections.spawn(connection(
                stream,
                peer,
                self.tls.clone().map(TlsAcceptor::from),
                builder.clone(),
                router.clone(),
                self.options,
                stop_rx.clone(),
            ));
        }
        drop(self.tcp);
        let _ = stop_tx.send(true);
        connections.close();
        connections.wait().await;
    }
}

/// Errors that concern one connection only: the next accept may succeed at once.
fn is_connection_error(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    )
}

/// Logs accept failures (out of descriptors, mostly) at most every few seconds.
#[derive(Default)]
struct AcceptErrors {
    last_logged: Option<Instant>,
    since_logged: u64,
}

impl AcceptErrors {
    const EVERY: Duration = Duration::from_secs(5);

    fn log(&mut self, error: &std::io::Error) {
        self.since_logged += 1;
        metrics::counter!("idemgate_http_accept_errors_total").increment(1);
        if self
            .last_logged
            .is_none_or(|at| at.elapsed() >= Self::EVERY)
        {
            tracing::warn!(%error, count = self.since_logged, "accepting connections failed; pausing briefly");
            self.last_logged = Some(Instant::now());
            self.since_logged = 0;
        }
    }
}

/// Over the bound: an immediate canned 503 and a close, without waiting on the
/// client. Whatever the client already sent is drained (without waiting) so the
/// close is a FIN, not a reset that could destroy the 503 before it is read.
fn shed(stream: &TcpStream) {
    metrics::counter!("idemgate_http_connections_shed_total").increment(1);
    let _ = stream.try_write(&SHED_RESPONSE);
    let mut sink = [0_u8; 4096];
    for _ in 0..4 {
        match stream.try_read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
}

/// The answer to a connection over the bound, written raw (no HTTP parsing): the
/// `connection-limit` problem, rendered once from [`ProblemDetails`] like every
/// other problem, its length counted rather than written by hand.
static SHED_RESPONSE: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let problem = ProblemDetails::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "connection-limit",
        "Too many connections",
        "the server has as many connections open as it accepts; retry after Retry-After",
    );
    let body = serde_json::to_vec(&problem).unwrap_or_default();
    let mut response = format!(
        "HTTP/1.1 503 Service Unavailable\r\n\
         content-type: application/problem+json\r\n\
         retry-after: 1\r\n\
         connection: close\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    response.extend_from_slice(&body);
    response
});

/// One connection: the TLS handshake if any (within the header-read timeout,
/// which runs from accept), then hyper serving the router.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    builder: auto::Builder<TokioExecutor>,
    router: Router,
    options: ListenerOptions,
    stop: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::new());
    let watched = Watched {
        inner: stream,
        activity: Arc::clone(&activity),
    };
    let Some(tls) = tls else {
        let io = TokioIo::new(watched);
        return serve_connection(io, activity, peer, builder, router, options, stop).await;
    };
    match tokio::time::timeout(options.header_read_timeout, tls.accept(watched)).await {
        Ok(Ok(stream)) => {
            let io = TokioIo::new(stream);
            serve_connection(io, activity, peer, builder, router, options, stop).await;
        }
        Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
        Err(_elapsed) => {
            metrics::counter!("idemgate_http_connection_timeouts_total", "phase" => "tls")
                .increment(1);
            tracing::debug!("closing a connection whose TLS handshake did not finish in time");
        }
    }
}

/// hyper serving the router on one connection, watched for the header and idle
/// timeouts, told to finish when the listener stops.
async fn serve_connection<I>(
    io: I,
    activity: Arc<Activity>,
    peer: SocketAddr,
    builder: auto::Builder<TokioExecutor>,
    router: Router,
    options: ListenerOptions,
    mut stop: watch::Receiver<bool>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn({
        let activity = Arc::clone(&activity);
        move |request: Request<Incoming>| {
            let guard = activity.begin_request();
            serve_request(
                router.clone(),
                request,
                peer,
                options.body_read_timeout,
                guard,
            )
        }
    });
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        let deadline = activity.deadline(&options);
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "connection ended with an error");
                }
                return;
            }
            () = sleep_until(deadline) => {
                if let Some(phase) = activity.expired(&options) {
                    metrics::counter!("idemgate_http_connection_timeouts_total", "phase" => phase).increment(1);
                    tracing::debug!(phase, "closing a connection past its timeout");
                    return;
                }
            }
            () = activity.changed.notified() => {}
            _ = stop.wait_for(|stop| *stop), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// One request, with the client's address as axum's `ConnectInfo` (the proxy's
/// `X-Forwarded-For`): its body under the body-read deadline, the router's answer
/// replaced by 408 when that deadline passed, the response body holding the
/// connection busy until hyper has taken it whole.
async fn serve_request(
    router: Router,
    mut request: Request<Incoming>,
    peer: SocketAddr,
    body_timeout: Duration,
    guard: RequestGuard,
) -> Result<Response<GuardedBody>, Infallible> {
    request.extensions_mut().insert(ConnectInfo(peer));
    let timed_out = Arc::new(AtomicBool::new(false));
    let request = request.map(|body| {
        Body::new(DeadlineBody {
            inner: body,
            deadline: Instant::now() + body_timeout,
            sleep: None,
            timed_out: Arc::clone(&timed_out),
        })
    });
    let response = match router.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let response = if timed_out.load(Ordering::Acquire) {
        metrics::counter!("idemgate_http_body_timeouts_total").increment(1);
        body_timeout_response(body_timeout)
    } else {
        response
    };
    Ok(response.map(|body| GuardedBody {
        inner: body,
        _guard: guard,
    }))
}

/// 408 `body-timeout`, closing the connection (the rest of the body is unread).
fn body_timeout_response(timeout: Duration) -> Response<Body> {
    let mut response = ProblemDetails::new(
        StatusCode::REQUEST_TIMEOUT,
        "body-timeout",
        "Request body too slow",
        format!(
            "the request body did not arrive within {} ms; nothing was done",
            timeout.as_millis()
        ),
    )
    .into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// What a connection is doing, for its watchdog.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for (the rest of) a request head, since this instant.
    Head(Instant),
    /// This many requests are in flight (more than one on HTTP/2).
    Busy(usize),
    /// Nothing in flight and nothing received, since this instant.
    Idle(Instant),
}

/// A connection's phase, shared by its I/O, its requests and its watchdog.
struct Activity {
    phase: Mutex<Phase>,
    /// Woken when the phase changes in a way that moves the deadline.
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            phase: Mutex::new(Phase::Head(Instant::now())),
            changed: Notify::new(),
        }
    }

    fn with_phase<T>(&self, f: impl FnOnce(&mut Phase) -> T) -> T {
        f(&mut self.phase.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Bytes arrived: an idle connection now owes a request head.
    fn received(&self) {
        let woke = self.with_phase(|phase| match *phase {
            Phase::Idle(_) => {
                *phase = Phase::Head(Instant::now());
                true
            }
            Phase::Head(_) | Phase::Busy(_) => false,
        });
        if woke {
            self.changed.notify_one();
        }
    }

    /// A request head is complete: no watchdog deadline until its response ends.
    fn begin_request(self: &Arc<Self>) -> RequestGuard {
        self.with_phase(|phase| {
            *phase = match *phase {
                Phase::Busy(requests) => Phase::Busy(requests + 1),
                Phase::Head(_) | Phase::Idle(_) => Phase::Busy(1),
            }
        });
        RequestGuard(Arc::clone(self))
    }

    fn end_request(&self) {
        let idle = self.with_phase(|phase| match *phase {
            Phase::Busy(requests) if requests > 1 => {
                *phase = Phase::Busy(requests - 1);
                false
            }
            _ => {
                *phase = Phase::Idle(Instant::now());
                true
            }
        });
        if idle {
            self.changed.notify_one();
        }
    }

    fn deadline(&self, options: &ListenerOptions) -> Option<Instant> {
        self.with_phase(|phase| match *phase {
            Phase::Head(since) => Some(since + options.header_read_timeout),
            Phase::Idle(since) => Some(since + options.idle_timeout),
            Phase::Busy(_) => None,
        })
    }

    /// The phase whose timeout has passed, if one has.
    fn expired(&self, options: &ListenerOptions) -> Option<&'static str> {
        let now = Instant::now();
        self.with_phase(|phase| match *phase {
            Phase::Head(since) if now >= since + options.header_read_timeout => Some("header"),
            Phase::Idle(since) if now >= since + options.idle_timeout => Some("idle"),
            _ => None,
        })
    }
}

/// Keeps its connection busy while its request is in flight.
struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.end_request();
    }
}

/// The connection's socket, telling its [`Activity`] when bytes arrive.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.received();
        }
        result
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The request body did not arrive within the body-read timeout.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within the body-read timeout")]
pub struct BodyReadTimeout;

/// A request body with a total deadline; past it, an error and a flag the request
/// sees to answer 408.
struct DeadlineBody {
    inner: Incoming,
    deadline: Instant,
    /// Armed at the first wait, so a body that is already here costs no timer.
    sleep: Option<Pin<Box<Sleep>>>,
    timed_out: Arc<AtomicBool>,
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.as_mut().poll(cx).is_ready() {
            this.timed_out.store(true, Ordering::Release);
            return Poll::Ready(Some(Err(Box::new(BodyReadTimeout))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that keeps its request's [`RequestGuard`] until hyper drops it.
struct GuardedBody {
    inner: Body,
    _guard: RequestGuard,
}

impl http_body::Body for GuardedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_canned_503_declares_its_length() {
        let response = std::str::from_utf8(&SHED_RESPONSE).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(
            head.ends_with(&format!("\r\ncontent-length: {}", body.len())),
            "{head}"
        );
        let problem: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(problem["status"], 503);
        assert_eq!(
            problem["type"],
            "https://idemgate.dev/problems/connection-limit"
        );
    }

    #[test]
    fn a_zero_limit_names_its_flag() {
        let args = ListenerArgs {
            header_read_timeout_ms: 0,
            body_read_timeout_ms: 1,
            idle_timeout_ms: 1,
            max_connections: 1,
        };
        let error = args.options().unwrap_err().to_string();
        assert!(error.contains("IDEMGATE_HEADER_READ_TIMEOUT_MS"), "{error}");
    }
}

/// What hyper's own `header_read_timeout` does, checked rather than assumed: it
/// runs before the first byte and also while a keep-alive connection waits for its
/// next request, which is why the watchdog above times heads and idleness itself.
#[cfg(test)]
mod hyper_header_timer {
    use std::time::Duration;

    use hyper::server::conn::http1;
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::time::Instant;

    const TIMEOUT: Duration = Duration::from_millis(300);

    /// A hyper HTTP/1 server with only its header timer; answers 200 with "ok".
    async fn hyper_server() -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|_request| async {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            http_body_util::Full::new(bytes::Bytes::from_static(b"ok")),
                        ))
                    });
                    let _ = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(TIMEOUT)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        addr
    }

    /// Reads until EOF; how long that took from `since`.
    async fn closed_after(stream: &mut TcpStream, since: Instant) -> Duration {
        let mut buf = [0_u8; 256];
        loop {
            let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
                .await
                .expect("closed within 5 s");
            if matches!(read, Ok(0) | Err(_)) {
                return since.elapsed();
            }
        }
    }

    #[tokio::test]
    async fn it_starts_before_the_first_byte_and_covers_idle_keep_alive() {
        let addr = hyper_server().await;
        let started = Instant::now();
        let mut silent = TcpStream::connect(addr).await.unwrap();
        assert!(closed_after(&mut silent, started).await < TIMEOUT * 5);

        let mut kept = TcpStream::connect(addr).await.unwrap();
        kept.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0_u8; 256];
        let n = kept.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        let idle_since = Instant::now();
        // Idle after a complete exchange: hyper closes it at the header timeout.
        assert!(closed_after(&mut kept, idle_since).await < TIMEOUT * 5);
    }
}
