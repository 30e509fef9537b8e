//! A fault-injecting TCP relay for client tests: between a client and a real
//! server, it loses responses, delays them, resets connections, and counts what
//! went through.
//!
//! It works on connections, not on HTTP: each accepted connection takes the next
//! queued [`Fault`] (or none), and [`Relay::connections`] counts them. So that one
//! connection is one attempt, give the client under test no connection reuse
//! (`reqwest::ClientBuilder::pool_max_idle_per_host(0)`); a test that counts
//! attempts then counts exactly.
//!
//! ```ignore
//! let relay = Relay::start(server_addr).await;
//! relay.inject(Fault::LoseResponse); // the next connection's answer never arrives
//! // … drive the client at relay.url(…) …
//! assert_eq!(relay.connections(), 2);
//! ```

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the relay does to one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward both ways untouched.
    Pass,
    /// Forward the request; when the server's answer starts to arrive (so the
    /// server has run the request and answered), close the client's connection
    /// without passing on a byte of it. The seeds' lost response.
    LoseResponse,
    /// Reset the client's connection (TCP RST) as soon as it is accepted; nothing
    /// reaches the server.
    Reset,
    /// Forward the request; hold the answer this long before passing it on.
    DelayResponse(Duration),
}

#[derive(Debug, Default)]
struct Shared {
    faults: Mutex<VecDeque<Fault>>,
    connections: AtomicUsize,
    forwarded: AtomicUsize,
}

/// A relay on a loopback port in front of `upstream`; it stops when dropped.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Relay {
    /// Starts a relay to `upstream` on a free loopback port.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let addr = listener.local_addr().expect("relay address");
        let shared = Arc::new(Shared::default());
        let accept = tokio::spawn(accept_loop(listener, upstream, Arc::clone(&shared)));
        Self {
            addr,
            shared,
            accept,
        }
    }

    /// The relay's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<relay address><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The next connection without a fault queued before it gets `fault`.
    pub fn inject(&self, fault: Fault) {
        self.shared.faults.lock().unwrap().push_back(fault);
    }

    /// Queues `fault` for each of the next `n` connections.
    pub fn inject_n(&self, fault: Fault, n: usize) {
        self.shared
            .faults
            .lock()
            .unwrap()
            .extend(std::iter::repeat_n(fault, n));
    }

    /// Connections accepted so far (attempts, for a client without reuse).
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Connections whose request bytes reached the server.
    pub fn forwarded(&self) -> usize {
        self.shared.forwarded.load(Ordering::SeqCst)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    while let Ok((client, _)) = listener.accept().await {
        shared.connections.fetch_add(1, Ordering::SeqCst);
        let fault = shared
            .faults
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Fault::Pass);
        tokio::spawn(relay(client, upstream, fault, Arc::clone(&shared)));
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, fault: Fault, shared: Arc<Shared>) {
    if fault == Fault::Reset {
        let _ = client.set_zero_linger();
        return; // dropped with SO_LINGER 0: an RST
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return; // the server is gone: the client sees its connection close
    };
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let upstream_copy = tokio::spawn(async move {
        let mut buf = vec![0; 16 * 1024];
        let mut counted = false;
        while let Ok(n @ 1..) = from_client.read(&mut buf).await {
            if to_server.write_all(&buf[..n]).await.is_err() {
                break;
            }
            if !counted {
                counted = true;
                shared.forwarded.fetch_add(1, Ordering::SeqCst);
            }
        }
        let _ = to_server.shutdown().await;
    });
    let mut buf = vec![0; 16 * 1024];
    let mut first = true;
    while let Ok(n @ 1..) = from_server.read(&mut buf).await {
        if first {
            first = false;
            match fault {
                Fault::LoseResponse => break,
                Fault::DelayResponse(delay) => tokio::time::sleep(delay).await,
                Fault::Pass | Fault::Reset => {}
            }
        }
        if to_client.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    // Both directions end with the connection: the client's, then the server's.
    upstream_copy.abort();
    drop(to_client);
}
