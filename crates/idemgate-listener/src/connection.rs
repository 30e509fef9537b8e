//! One accepted connection: the TLS handshake, hyper serving the service, the
//! watchdog that times request heads and idle keep-alive by the bytes it sees, and
//! the response body that keeps the connection busy until hyper has sent it.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::{Request, Response};
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::body::DeadlineBody;
use crate::refusal::Refusals;
use crate::{HttpService, ListenerOptions};

/// One connection: the TLS handshake if any (within the header-read timeout,
/// which runs from accept), then hyper serving `service`. `activity` is the
/// connection's phase, registered with the listener so that it can evict it.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    builder: auto::Builder<TokioExecutor>,
    service: impl HttpService,
    options: ListenerOptions,
    refusals: Arc<Refusals>,
    activity: Arc<Activity>,
) {
    let watched = Watched {
        inner: stream,
        activity: Arc::clone(&activity),
        closing: Closing::Open,
    };
    let Some(tls) = tls else {
        let io = TokioIo::new(watched);
        return serve_connection(io, activity, peer, builder, service, options, refusals).await;
    };
    let handshake = tokio::select! {
        handshake = tokio::time::timeout(options.header_read_timeout, tls.accept(watched)) => handshake,
        () = activity.evicted() => {
            metrics::counter!("idemgate_http_connections_evicted_total").increment(1);
            tracing::debug!("evicted a connection still in its TLS handshake");
            return;
        }
    };
    match handshake {
        Ok(Ok(stream)) => {
            let io = TokioIo::new(stream);
            serve_connection(io, activity, peer, builder, service, options, refusals).await;
        }
        Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
        Err(_elapsed) => {
            metrics::counter!("idemgate_http_connection_timeouts_total", "phase" => "tls")
                .increment(1);
            tracing::debug!("closing a connection whose TLS handshake did not finish in time");
        }
    }
}

/// hyper serving `service` on one connection, watched for the header and idle
/// timeouts, told to finish when the listener stops.
#[allow(clippy::too_many_arguments)]
async fn serve_connection<I>(
    io: I,
    activity: Arc<Activity>,
    peer: SocketAddr,
    builder: auto::Builder<TokioExecutor>,
    service: impl HttpService,
    options: ListenerOptions,
    refusals: Arc<Refusals>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn({
        let activity = Arc::clone(&activity);
        move |request: Request<Incoming>| {
            let guard = activity.begin_request();
            serve_request(
                service.clone(),
                request,
                peer,
                options.body_read_timeout,
                Arc::clone(&refusals),
                guard,
            )
        }
    });
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    // The watchdog's futures live as long as the connection, each made anew
    // only once it has fired: a timer or a waiter registered and cancelled
    // per request was a measurable part of a proxied request's cost.
    let changed = activity.changed.notified();
    tokio::pin!(changed);
    let sleep = tokio::time::sleep_until(Instant::now());
    tokio::pin!(sleep);
    // When the timer is set for: it is moved earlier at once, never later. A
    // deadline that moved later (the connection went idle, a request began)
    // is found when the timer fires early, and the timer is set again.
    let mut armed: Option<Instant> = None;
    let mut stopping = false;
    let end = std::future::poll_fn(|cx| {
        loop {
            // The connection's turn. What it changes in the activity (bytes
            // received, a request begun or ended) is read just below, so those
            // changes wake nobody: a wake-up would only poll hyper again, twice
            // per request for nothing.
            activity.watching.store(true, Ordering::SeqCst);
            let polled = conn.as_mut().poll(cx);
            activity.watching.store(false, Ordering::SeqCst);
            if let Poll::Ready(result) = polled {
                return Poll::Ready(ConnectionEnd::Served(result));
            }
            if !stopping && activity.is_stopping() {
                stopping = true;
                conn.as_mut().graceful_shutdown();
                // hyper acts on it when polled.
                continue;
            }
            if let Some(deadline) = activity.deadline(&options)
                && armed.is_none_or(|armed| deadline < armed)
            {
                sleep.as_mut().reset(deadline);
                armed = Some(deadline);
            }
            if armed.is_some() && sleep.as_mut().poll(cx).is_ready() {
                armed = None;
                match activity.expired(&options) {
                    Some("evicted") => return Poll::Ready(ConnectionEnd::Evicted),
                    Some(phase) => return Poll::Ready(ConnectionEnd::TimedOut(phase)),
                    // Fired early (the deadline moved later): set again.
                    None => continue,
                }
            }
            // What changes from elsewhere (eviction, the listener's stop, an
            // HTTP/2 stream ending on another task) wakes the connection.
            if changed.as_mut().poll(cx).is_ready() {
                changed.set(activity.changed.notified());
                continue;
            }
            return Poll::Pending;
        }
    });
    match end.await {
        ConnectionEnd::Served(Ok(())) => return,
        ConnectionEnd::Served(Err(error)) => {
            tracing::debug!(%error, "connection ended with an error");
            return;
        }
        ConnectionEnd::TimedOut(phase) => {
            metrics::counter!("idemgate_http_connection_timeouts_total", "phase" => phase)
                .increment(1);
            tracing::debug!(phase, "closing a connection past its timeout");
            return;
        }
        ConnectionEnd::Evicted => {}
    }
    metrics::counter!("idemgate_http_connections_evicted_total").increment(1);
    // hyper closes an idle HTTP/1 connection at once on a graceful shutdown and
    // finishes (flushes) a response in progress first; dropping `conn` instead
    // would cut a response whose last bytes are still buffered (the phase is
    // Idle as soon as hyper drops the body, before it has flushed it), and the
    // 503 of a head that completed as the connection was chosen.
    conn.as_mut().graceful_shutdown();
    // One more turn for hyper: a head that completed meanwhile gets its 503.
    let ended = std::future::poll_fn(|cx| Poll::Ready(conn.as_mut().poll(cx).is_ready())).await;
    if ended || !activity.lingers() {
        // Waiting for (the rest of) a head, nothing to finish: closed at once.
        tracing::debug!("evicted a connection to serve a new one at the bound");
        return;
    }
    if tokio::time::timeout(EVICTION_GRACE, conn).await.is_err() {
        tracing::debug!("evicted a connection that did not finish its response in time");
    } else {
        tracing::debug!("evicted a connection after finishing its response");
    }
}

/// Why the watchdog stopped watching a connection.
enum ConnectionEnd {
    /// hyper finished serving it (the client closed, or an error).
    Served(Result<(), Box<dyn std::error::Error + Send + Sync>>),
    /// Its header-read or idle timeout passed (the phase's name).
    TimedOut(&'static str),
    /// Chosen to make room at the connection bound.
    Evicted,
}

/// How long an evicted connection may take to finish the response it is
/// sending (or the 503 of a request refused by the eviction) before it is cut.
/// Short: eviction is there to free the connection for a new client.
pub(crate) const EVICTION_GRACE: Duration = Duration::from_secs(1);

/// One request, with the client's address as axum's `ConnectInfo` (the proxy's
/// `X-Forwarded-For`): its body under the body-read deadline, the service's answer
/// replaced by 408 when that deadline passed, the response body holding the
/// connection busy until hyper has taken it whole.
async fn serve_request(
    service: impl HttpService,
    mut request: Request<Incoming>,
    peer: SocketAddr,
    body_timeout: Duration,
    refusals: Arc<Refusals>,
    guard: RequestGuard,
) -> Result<Response<GuardedBody>, Infallible> {
    if guard.0.is_evicted() {
        // Its head completed as the connection was chosen for eviction: it is
        // refused unrun (`503 connection-limit`), like a connection shed at the
        // bound.
        return Ok(refusals
            .connection_limit()
            .map(|body| GuardedBody::new(body, guard)));
    }
    request.extensions_mut().insert(ConnectInfo(peer));
    let timed_out = Arc::new(AtomicBool::new(false));
    let request = request.map(|body| {
        Body::new(DeadlineBody::new(
            body,
            Instant::now() + body_timeout,
            Arc::clone(&timed_out),
        ))
    });
    let response = match service.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let response = if timed_out.load(Ordering::Acquire) {
        metrics::counter!("idemgate_http_body_timeouts_total").increment(1);
        refusals.body_timeout()
    } else {
        response
    };
    Ok(response.map(|body| GuardedBody::new(body, guard)))
}

/// What a connection is doing, for its watchdog and for eviction at the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Waiting for (the rest of) a request head, since this instant.
    Head(Instant),
    /// This many requests are in flight (more than one on HTTP/2).
    Busy(usize),
    /// Nothing in flight and nothing received, since this instant.
    Idle(Instant),
    /// Chosen to make room for a new connection at the bound: closed at once,
    /// and a request head that completes now is refused unrun.
    Evicted,
}

/// A connection's phase, shared by its I/O, its requests, its watchdog and the
/// listener's eviction.
pub(crate) struct Activity {
    phase: Mutex<Phase>,
    /// Woken when the phase changes in a way that moves the deadline, or the
    /// listener stops — unless the watchdog is polling the connection, which
    /// is where most changes come from ([`Activity::watching`]).
    changed: Notify,
    /// The watchdog is polling the connection, and reads the activity once
    /// that poll returns: a change made meanwhile needs no wake-up. Sequentially
    /// consistent with the change's own write (the phase's lock, `stopping`),
    /// so a change on another thread that sees it set is read by that read.
    watching: AtomicBool,
    /// Evicted with something to finish: it was idle (its last response may
    /// still be in hyper's buffer), or a head completed as it was evicted and
    /// its 503 is to be written. Its close is then graceful, within
    /// [`EVICTION_GRACE`].
    lingers: AtomicBool,
    /// Bytes were handed to the socket and not yet flushed: a response is still
    /// being sent although hyper has dropped its body. Such a connection is not
    /// evicted (a slow reader is bounded by the idle timeout, as before).
    unflushed: AtomicBool,
    /// The listener stopped: finish what is in flight, then close.
    stopping: AtomicBool,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Self {
            phase: Mutex::new(Phase::Head(Instant::now())),
            changed: Notify::new(),
            watching: AtomicBool::new(false),
            lingers: AtomicBool::new(false),
            unflushed: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        }
    }

    /// Tells the watchdog that the deadline may have moved or the listener
    /// stopped: a wake-up, unless it is polling the connection and so reads
    /// the activity next anyway.
    fn wake_watchdog(&self) {
        if !self.watching.load(Ordering::SeqCst) {
            self.changed.notify_one();
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
            Phase::Head(_) | Phase::Busy(_) | Phase::Evicted => false,
        });
        if woke {
            self.wake_watchdog();
        }
    }

    /// A request head is complete: no watchdog deadline until its response ends.
    pub(crate) fn begin_request(self: &Arc<Self>) -> RequestGuard {
        self.with_phase(|phase| {
            *phase = match *phase {
                Phase::Busy(requests) => Phase::Busy(requests + 1),
                Phase::Head(_) | Phase::Idle(_) => Phase::Busy(1),
                Phase::Evicted => {
                    self.lingers.store(true, Ordering::Release);
                    Phase::Evicted
                }
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
            Phase::Evicted => false,
            _ => {
                *phase = Phase::Idle(Instant::now());
                true
            }
        });
        if idle {
            self.wake_watchdog();
        }
    }

    fn deadline(&self, options: &ListenerOptions) -> Option<Instant> {
        self.with_phase(|phase| match *phase {
            Phase::Head(since) => Some(since + options.header_read_timeout),
            Phase::Idle(since) => Some(since + options.idle_timeout),
            Phase::Busy(_) => None,
            Phase::Evicted => Some(Instant::now()),
        })
    }

    /// The phase whose timeout has passed, if one has.
    fn expired(&self, options: &ListenerOptions) -> Option<&'static str> {
        let now = Instant::now();
        self.with_phase(|phase| match *phase {
            Phase::Head(since) if now >= since + options.header_read_timeout => Some("header"),
            Phase::Idle(since) if now >= since + options.idle_timeout => Some("idle"),
            Phase::Evicted => Some("evicted"),
            _ => None,
        })
    }

    /// The phase now.
    pub(crate) fn phase(&self) -> Phase {
        self.with_phase(|phase| *phase)
    }

    /// Whether a response is still being written (see [`Activity::unflushed`]).
    pub(crate) fn is_writing(&self) -> bool {
        self.unflushed.load(Ordering::Acquire)
    }

    /// Whether an evicted connection has a response to finish first.
    fn lingers(&self) -> bool {
        self.lingers.load(Ordering::Acquire)
    }

    /// Marks the connection evicted if it is still waiting for a head or idle
    /// with nothing left to send (not if a request began meanwhile); wakes its
    /// watchdog. Whether it was.
    pub(crate) fn evict(&self) -> bool {
        let writing = self.is_writing();
        let evicted = self.with_phase(|phase| match *phase {
            Phase::Head(_) => {
                *phase = Phase::Evicted;
                true
            }
            Phase::Idle(_) if !writing => {
                // Its last response may be flushed only just now: finish it.
                self.lingers.store(true, Ordering::Release);
                *phase = Phase::Evicted;
                true
            }
            Phase::Idle(_) | Phase::Busy(_) | Phase::Evicted => false,
        });
        if evicted {
            self.wake_watchdog();
        }
        evicted
    }

    /// Tells the connection that its listener stopped: it finishes the
    /// request in flight (an idle one closes at once) and closes.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.wake_watchdog();
    }

    fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    fn is_evicted(&self) -> bool {
        self.phase() == Phase::Evicted
    }

    /// Resolves once the connection is evicted (for the TLS handshake, before
    /// the watchdog runs).
    async fn evicted(&self) {
        while !self.is_evicted() {
            self.changed.notified().await;
        }
    }
}

/// Keeps its connection busy while its request is in flight.
pub(crate) struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.end_request();
    }
}

/// The connection's socket, telling its [`Activity`] when bytes arrive and
/// when writes are flushed, and closing it with a lingering close.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
    closing: Closing,
}

/// How long a lingering close reads (and discards) what the client still sends.
const LINGER_TIME: Duration = Duration::from_secs(2);
/// How long a lingering close waits for the next bytes (or the client's close)
/// before it closes: an upload in progress sends without such pauses, and a
/// keep-alive client that does not close at once on the FIN holds the
/// descriptor no longer than this (nginx's `lingering_timeout`).
const LINGER_QUIET: Duration = Duration::from_millis(500);
/// How much a lingering close reads at most before it closes anyway.
const LINGER_BYTES: usize = 8 * 1024 * 1024;

/// Where a connection's close is. A close with request bytes unread makes the
/// kernel answer them with a reset, and a reset makes the client's kernel
/// discard what it has not yet handed to the client: the 413 of a body refused
/// by its `Content-Length`, unread, would never be seen and the client would
/// retry. So, like nginx's `lingering_close`, the write side is shut down
/// first (the answer is followed by a FIN) and whatever the client is still
/// sending is read and discarded, within [`LINGER_TIME`] and [`LINGER_BYTES`],
/// until the client closes or pauses for [`LINGER_QUIET`], before the socket
/// closes. Whether input is still unread cannot be told from an empty receive
/// buffer (the next segment may be on its way), so every graceful close
/// lingers; a client that closes on the FIN (or had closed first) costs nothing.
enum Closing {
    Open,
    /// Discarding what the client still sends: until `quiet` passes without
    /// bytes, or `until`, or `drained` reaches [`LINGER_BYTES`].
    Draining {
        quiet: Pin<Box<tokio::time::Sleep>>,
        until: Instant,
        drained: usize,
    },
    Done,
}

impl Watched {
    /// Reads and discards from the socket: `Ready` with how many bytes (0 at
    /// the end or on an error), `Pending` when none are there now.
    fn poll_discard(&mut self, cx: &mut Context<'_>) -> Poll<usize> {
        let mut sink = [0_u8; 16 * 1024];
        let mut buf = ReadBuf::new(&mut sink);
        match Pin::new(&mut self.inner).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) => Poll::Ready(buf.filled().len()),
            Poll::Ready(Err(_)) => Poll::Ready(0),
            Poll::Pending => Poll::Pending,
        }
    }
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
        if !buf.is_empty() {
            self.activity.unflushed.store(true, Ordering::Release);
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if bufs.iter().any(|buf| !buf.is_empty()) {
            self.activity.unflushed.store(true, Ordering::Release);
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    /// hyper (and rustls) flush after writing out their buffers: only then is
    /// nothing of a response left to send.
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(result, Poll::Ready(Ok(()))) {
            self.activity.unflushed.store(false, Ordering::Release);
        }
        result
    }

    /// The lingering close (see [`Closing`]); without unread input (the usual
    /// case) it ends right after the write side is shut down.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            match &mut this.closing {
                Closing::Open => {
                    std::task::ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
                    let until = Instant::now() + LINGER_TIME;
                    this.closing = Closing::Draining {
                        quiet: Box::pin(tokio::time::sleep_until(
                            (Instant::now() + LINGER_QUIET).min(until),
                        )),
                        until,
                        drained: 0,
                    };
                }
                Closing::Draining {
                    quiet,
                    until,
                    drained,
                } => {
                    if *drained >= LINGER_BYTES || quiet.as_mut().poll(cx).is_ready() {
                        this.closing = Closing::Done;
                        continue;
                    }
                    let (before, until) = (*drained, *until);
                    match this.poll_discard(cx) {
                        Poll::Ready(0) => this.closing = Closing::Done,
                        Poll::Ready(n) => {
                            if before == 0 {
                                metrics::counter!("idemgate_http_lingering_closes_total")
                                    .increment(1);
                            }
                            if let Closing::Draining { quiet, drained, .. } = &mut this.closing {
                                *drained = before + n;
                                quiet
                                    .as_mut()
                                    .reset((Instant::now() + LINGER_QUIET).min(until));
                            }
                        }
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Closing::Done => return Poll::Ready(Ok(())),
            }
        }
    }
}

/// A response body that keeps its request's [`RequestGuard`] until hyper drops it.
struct GuardedBody {
    inner: Body,
    _guard: RequestGuard,
}

impl GuardedBody {
    /// `inner`, keeping `guard` (its connection busy) until the body is dropped.
    fn new(inner: Body, guard: RequestGuard) -> Self {
        Self {
            inner,
            _guard: guard,
        }
    }
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A head that completes as its connection is evicted is answered with the
    /// 503 (nothing run), not dropped unanswered: repeated, since the head and
    /// the eviction race.
    #[tokio::test]
    async fn a_head_completing_during_eviction_gets_its_503() {
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let router = axum::Router::new().route(
            "/",
            axum::routing::get({
                let ran = Arc::clone(&ran);
                move || async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    "ran"
                }
            }),
        );
        for round in 0..32 {
            let (mut client, server) = tokio::io::duplex(64 * 1024);
            let activity = Arc::new(Activity::new());
            let served = tokio::spawn(serve_connection(
                TokioIo::new(server),
                Arc::clone(&activity),
                "127.0.0.1:1".parse().unwrap(),
                auto::Builder::new(TokioExecutor::new()),
                router.clone(),
                ListenerOptions::default(),
                Arc::new(Refusals::new(&ListenerOptions::default())),
            ));
            // The connection waits for its head; the head arrives as it is evicted.
            tokio::task::yield_now().await;
            client
                .write_all(b"GET / HTTP/1.1\r\nhost: idemgate\r\n\r\n")
                .await
                .unwrap();
            assert!(activity.evict());
            let mut received = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut received))
                .await
                .expect("the evicted connection is closed within its grace");
            let text = String::from_utf8_lossy(&received);
            assert!(
                text.starts_with("HTTP/1.1 503") && text.contains("problems/connection-limit"),
                "round {round}: {text:?}"
            );
            served.await.unwrap();
        }
        assert_eq!(ran.load(Ordering::SeqCst), 0, "nothing run");
    }
}
