//! Eviction at the connection bound over real sockets: a response still being
//! sent is never cut to make room.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::routing::get;
use idemgate_listener::{Listener, ListenerOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Far beyond the socket buffers: most of it is still in hyper's write buffer
/// when hyper drops the body (one chunk) and the connection counts as idle.
const LARGE: usize = 16 * 1024 * 1024;

async fn start(max_connections: usize) -> SocketAddr {
    let large = Bytes::from(vec![b'x'; LARGE]);
    let router = Router::new()
        .route("/large", get(move || async move { large.clone() }))
        .route("/small", get(|| async { "small" }));
    let options = ListenerOptions {
        max_connections,
        ..ListenerOptions::default()
    };
    let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), options)
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(listener.serve(router, std::future::pending()));
    addr
}

/// A connection with a small receive buffer, so the server cannot push the
/// whole response into the kernel.
async fn slow_reader(addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 * 1024).unwrap();
    socket.connect(addr).await.unwrap()
}

/// Sends a GET and reads its whole (small, keep-alive) answer.
async fn small_request(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /small HTTP/1.1\r\nhost: idemgate\r\n\r\n")
        .await
        .unwrap();
    let mut received = Vec::new();
    let mut buf = [0_u8; 4096];
    while !received.ends_with(b"small") {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("an answer in time")
            .unwrap();
        assert!(n > 0, "closed before the answer: {received:?}");
        received.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&received).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_of_a_large_response_gets_every_byte_while_the_bound_is_hit() {
    let addr = start(2).await;
    // The slow reader asks for the large response and reads only its start.
    let mut reader = slow_reader(addr).await;
    reader
        .write_all(b"GET /large HTTP/1.1\r\nhost: idemgate\r\n\r\n")
        .await
        .unwrap();
    let mut received = vec![0_u8; 16 * 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), reader.read(&mut received))
        .await
        .expect("the large response starts")
        .unwrap();
    received.truncate(n);
    assert!(received.starts_with(b"HTTP/1.1 200"));
    // A second, idle keep-alive connection fills the bound…
    let mut idle = TcpStream::connect(addr).await.unwrap();
    assert!(small_request(&mut idle).await.starts_with("HTTP/1.1 200"));
    // …and a third arrives at it: room is made, and it is served.
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert!(small_request(&mut third).await.starts_with("HTTP/1.1 200"));
    // The one evicted was the idle connection, not the one still sending.
    let mut rest = [0_u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut rest))
        .await
        .expect("the idle connection was evicted")
        .unwrap_or(0);
    assert_eq!(n, 0, "the idle keep-alive connection is closed");
    // The slow reader now reads the rest: every byte arrives.
    let mut buf = vec![0_u8; 256 * 1024];
    let head_end = loop {
        if let Some(at) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = tokio::time::timeout(Duration::from_secs(10), reader.read(&mut buf))
            .await
            .expect("the head's end arrives")
            .unwrap();
        assert!(n > 0);
        received.extend_from_slice(&buf[..n]);
    };
    let mut body = received.len() - head_end;
    while body < LARGE {
        let n = tokio::time::timeout(Duration::from_secs(10), reader.read(&mut buf))
            .await
            .expect("the rest of the response in time")
            .unwrap_or(0);
        if n == 0 {
            break;
        }
        body += n;
    }
    assert_eq!(body, LARGE, "the response was cut");
}
