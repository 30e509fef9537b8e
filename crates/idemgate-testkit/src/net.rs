//! Ports for the servers a test starts.

use std::net::TcpListener;

/// A loopback port nobody listens on right now, for a server a test starts that
/// must be told its port (a `redis-server`, a PostgreSQL, a Prometheus): the
/// ephemeral port the OS gives a listener, which is closed again at once.
///
/// Another process may take the port before the server binds it; the server then
/// fails to start, loudly, and the test with it.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("bind an ephemeral loopback port")
        .port()
}
