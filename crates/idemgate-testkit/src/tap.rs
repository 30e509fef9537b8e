//! A TCP relay in front of a database server: it counts what clients send, and
//! freezes on demand.
//!
//! - **Counting**: [`Tap::client_sends`] counts the reads of client bytes it
//!   forwarded. A driver that waits for each answer before it writes again (sqlx,
//!   on PostgreSQL) writes once per round trip, so the count is the round trips,
//!   as `strace` would count the driver's `sendto`s.
//! - **Freezing**: [`Tap::freeze`] stops forwarding both ways while connections
//!   stay open, as a stopped (`SIGSTOP`) server does: the client's bytes are
//!   accepted by the kernel and nothing comes back. [`Tap::thaw`] resumes.
//!
//! ```ignore
//! let tap = Tap::start("127.0.0.1:5432".parse()?).await;
//! let url = format!("postgres://postgres@{}/test", tap.addr());
//! // … drive the client on `url` …
//! let round_trips = tap.client_sends();
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A relay on a loopback port in front of `upstream`; it stops when dropped
/// (its open connections close when their clients or the server close them).
#[derive(Debug)]
pub struct Tap {
    addr: SocketAddr,
    sends: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    frozen: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl Tap {
    /// Starts a tap to `upstream` on a free loopback port.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the tap");
        let addr = listener.local_addr().expect("tap address");
        let sends = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let (frozen, _) = watch::channel(false);
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream,
            Counters {
                sends: Arc::clone(&sends),
                connections: Arc::clone(&connections),
            },
            frozen.clone(),
        ));
        Self {
            addr,
            sends,
            connections,
            frozen,
            accept,
        }
    }

    /// Starts a tap to the first address `host` resolves to (a database URL's
    /// host and port).
    pub async fn start_to(host: &str, port: u16) -> Self {
        let upstream = tokio::net::lookup_host((host, port))
            .await
            .unwrap_or_else(|error| panic!("resolve {host}:{port}: {error}"))
            .next()
            .unwrap_or_else(|| panic!("{host}:{port} resolves to no address"));
        Self::start(upstream).await
    }

    /// The tap's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Reads of client bytes forwarded so far, on every connection: one per
    /// round trip for a client that waits for each answer.
    pub fn client_sends(&self) -> usize {
        self.sends.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Stops forwarding, both ways, on every connection, new ones included.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Forwards again.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

struct Counters {
    sends: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    counters: Counters,
    frozen: watch::Sender<bool>,
) {
    while let Ok((client, _)) = listener.accept().await {
        counters.connections.fetch_add(1, Ordering::SeqCst);
        let (sends, frozen) = (Arc::clone(&counters.sends), frozen.subscribe());
        tokio::spawn(async move {
            if let Ok(server) = TcpStream::connect(upstream).await {
                relay(client, server, &sends, frozen).await;
            }
        });
    }
}

/// Relays one connection until either side closes it.
async fn relay(
    mut client: TcpStream,
    mut server: TcpStream,
    sends: &AtomicUsize,
    mut frozen: watch::Receiver<bool>,
) {
    let (mut from_client, mut from_server) = (vec![0; 64 * 1024], vec![0; 64 * 1024]);
    loop {
        // While frozen, read nothing: the bytes wait in the kernel's buffers.
        while *frozen.borrow_and_update() {
            if frozen.changed().await.is_err() {
                return;
            }
        }
        tokio::select! {
            read = client.read(&mut from_client) => {
                let Ok(n @ 1..) = read else { return };
                sends.fetch_add(1, Ordering::SeqCst);
                if server.write_all(&from_client[..n]).await.is_err() {
                    return;
                }
            }
            read = server.read(&mut from_server) => {
                let Ok(n @ 1..) = read else { return };
                if client.write_all(&from_server[..n]).await.is_err() {
                    return;
                }
            }
            // A freeze stops the wait for either side at once.
            changed = frozen.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}
