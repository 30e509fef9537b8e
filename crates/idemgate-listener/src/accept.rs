//! The accept loop: bind, accept within the connection bound (at the bound, the
//! connection waiting longest for a request head, else the longest idle, is
//! evicted for the new one; a canned 503 only when every connection is busy),
//! survive descriptor exhaustion, and drain on shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_util::task::TaskTracker;

use crate::connection::{Activity, EVICTION_GRACE, connection};
use crate::evict::{Connections, EVICTING_ALLOWANCE, head_grace};
use crate::limits::{FD_RESERVE, fd_limit};
use crate::refusal::Refusals;
use crate::{HttpService, ListenerOptions};

/// How long the accept loop pauses after an error that is not one connection's
/// (out of descriptors, out of memory), so it neither spins nor dies.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A bound TCP listener that serves an [`HttpService`] within its [`ListenerOptions`].
///
/// The socket is registered with a runtime only when [`Listener::serve`] runs,
/// so a listener bound on one thread can be served by a worker's own runtime
/// ([`crate::Workers`]): its connections then never leave that thread.
pub struct Listener {
    tcp: std::net::TcpListener,
    options: ListenerOptions,
    max_connections: usize,
    /// Set: every connection speaks TLS, its handshake within the header-read
    /// timeout.
    tls: Option<Arc<ServerConfig>>,
    /// Every open connection of this listener — and of the other listeners
    /// of its group ([`Listener::bind_group`]), so the bound counts them all.
    live: Arc<Connections>,
    /// Its own answers (shed, evicted, body too slow), rendered once.
    refusals: Arc<Refusals>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("tcp", &self.tcp)
            .field("options", &self.options)
            .field("max_connections", &self.max_connections)
            .field("tls", &self.tls.is_some())
            .field("open_connections", &self.live.len())
            .finish()
    }
}

/// The pending-connection queue of each listening socket (what `listen(2)`
/// calls the backlog), as tokio's own `bind` asks for.
const BACKLOG: i32 = 1024;

impl Listener {
    /// Binds `addr`. The connection bound is capped here at the soft descriptor
    /// limit minus a reserve, so call [`raise_fd_limit`](crate::raise_fd_limit) first.
    pub async fn bind(addr: SocketAddr, options: ListenerOptions) -> std::io::Result<Self> {
        let tcp = listening_socket(addr, false)?;
        Ok(Self {
            tcp,
            max_connections: capped(options.max_connections),
            refusals: Arc::new(Refusals::new(&options)),
            options,
            tls: None,
            live: Arc::new(Connections::default()),
        })
    }

    /// Binds `count` listeners (at least one) to `addr` with `SO_REUSEPORT`, so
    /// the kernel spreads new connections over them, one per worker as nginx's
    /// `reuseport` does. They share one connection bound: at the bound, a
    /// connection of any of them may be evicted for a new one on another. Port
    /// 0 picks one free port for all.
    pub async fn bind_group(
        addr: SocketAddr,
        options: ListenerOptions,
        count: usize,
    ) -> std::io::Result<Vec<Self>> {
        let first = listening_socket(addr, true)?;
        let addr = first.local_addr()?;
        let mut sockets = vec![first];
        for _ in 1..count {
            sockets.push(listening_socket(addr, true)?);
        }
        let live = Arc::new(Connections::default());
        let max_connections = capped(options.max_connections);
        let refusals = Arc::new(Refusals::new(&options));
        Ok(sockets
            .into_iter()
            .map(|tcp| Self {
                tcp,
                options: options.clone(),
                max_connections,
                tls: None,
                live: Arc::clone(&live),
                refusals: Arc::clone(&refusals),
            })
            .collect())
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

    /// Serves `service` (HTTP/1.1 and HTTP/2, upgrades allowed) until `shutdown`
    /// resolves, then stops accepting, lets open requests finish (idle
    /// connections close at once) and returns when every connection is closed.
    /// Put a deadline around it: a client still sending is bounded only by the
    /// timeouts.
    pub async fn serve(self, service: impl HttpService, shutdown: impl Future<Output = ()>) {
        let tcp = match TcpListener::from_std(self.tcp) {
            Ok(tcp) => tcp,
            Err(error) => {
                // Only without a runtime's I/O driver, which `serve` is not.
                tracing::error!(%error, "cannot register the listening socket");
                return;
            }
        };
        let live = self.live;
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // The watchdog below times the head; hyper's timer would also cut idle
        // keep-alive connections at the header timeout.
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(None);
        builder.http2().timer(TokioTimer::new());
        let connections = TaskTracker::new();
        let head_grace = head_grace(self.options.header_read_timeout);
        let mut accept_errors = AcceptErrors::default();
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                biased;
                () = &mut shutdown => break,
                accepted = tcp.accept() => accepted,
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
            // At the bound, room is made by evicting one; while too many
            // evicted ones are still closing (their descriptors still open),
            // the accept loop first waits for them, briefly.
            if live.len() >= self.max_connections {
                if live.evicting() >= EVICTING_ALLOWANCE {
                    live.wait_for_evicting_below(EVICTING_ALLOWANCE, EVICTION_GRACE)
                        .await;
                }
                if live.evicting() >= EVICTING_ALLOWANCE || !live.evict_one(head_grace) {
                    shed(&stream, &self.refusals);
                    continue;
                }
            }
            let _ = stream.set_nodelay(true);
            let activity = Arc::new(Activity::new());
            let registration = live.register(Arc::clone(&activity));
            let serve = connection(
                stream,
                peer,
                self.tls.clone().map(TlsAcceptor::from),
                builder.clone(),
                service.clone(),
                self.options.clone(),
                Arc::clone(&self.refusals),
                activity,
            );
            connections.spawn(async move {
                serve.await;
                drop(registration);
            });
        }
        drop(tcp);
        live.stop_all();
        connections.close();
        connections.wait().await;
    }
}

/// A non-blocking listening socket on `addr`, with `SO_REUSEADDR` (a restart
/// binds while old connections linger in `TIME_WAIT`) and, for a group,
/// `SO_REUSEPORT`.
fn listening_socket(addr: SocketAddr, reuse_port: bool) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// `configured` capped at the soft descriptor limit minus a reserve.
fn capped(configured: usize) -> usize {
    let Some(limit) = fd_limit() else {
        return configured;
    };
    let cap = usize::try_from(limit.saturating_sub(FD_RESERVE).max(1)).unwrap_or(usize::MAX);
    if cap < configured {
        tracing::warn!(
            configured,
            cap,
            open_file_limit = limit,
            "the connection bound is capped by the open-file limit"
        );
        return cap;
    }
    configured
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

/// Over the bound with every connection busy: an immediate canned 503 and a close, without waiting on the
/// client. Whatever the client already sent is drained (without waiting) so the
/// close is a FIN, not a reset that could destroy the 503 before it is read.
fn shed(stream: &TcpStream, refusals: &Refusals) {
    metrics::counter!("idemgate_http_connections_shed_total").increment(1);
    let _ = stream.try_write(refusals.shed());
    let mut sink = [0_u8; 4096];
    for _ in 0..4 {
        match stream.try_read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
}
