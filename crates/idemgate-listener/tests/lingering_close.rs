//! The lingering close over real sockets: an answer given before the request
//! body was read (a 413 by `Content-Length`) reaches the client instead of
//! being destroyed by the reset a close with unread input causes.

use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use idemgate_listener::{Listener, ListenerOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Beyond the socket buffers on both sides, within the lingering close's
/// bound (8 MiB).
const BODY: usize = 6 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_413_given_before_the_body_is_read_reaches_the_client() {
    // Refuses by the declared length, never reading the body (like the layer).
    let router = Router::new().route(
        "/upload",
        post(|| async { (StatusCode::PAYLOAD_TOO_LARGE, "too large") }),
    );
    let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), ListenerOptions::default())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(listener.serve(router, std::future::pending()));
    for round in 0..5 {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut reader, mut writer) = stream.into_split();
        // Sends the whole body like a client that does not wait for an early
        // answer (most do not), then reads the answer.
        let sending = tokio::spawn(async move {
            let head = format!(
                "POST /upload HTTP/1.1\r\nhost: idemgate\r\ncontent-length: {BODY}\r\n\r\n"
            );
            writer.write_all(head.as_bytes()).await?;
            let chunk = vec![b'x'; 64 * 1024];
            for _ in 0..BODY / chunk.len() {
                writer.write_all(&chunk).await?;
            }
            writer.flush().await
        });
        // Waits until the client has sent everything (or was cut off).
        let sent = tokio::time::timeout(Duration::from_secs(20), sending)
            .await
            .expect("the upload ends (sent or cut off) within 20 s")
            .unwrap();
        let mut received = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), reader.read_to_end(&mut received))
            .await
            .expect("closed in time");
        let text = String::from_utf8_lossy(&received);
        // A client that sees its upload cut (or the answer end in a reset)
        // reports a failure and retries; the listener reads the rest instead.
        assert!(
            text.starts_with("HTTP/1.1 413") && sent.is_ok() && read.is_ok(),
            "round {round}: sent {sent:?}, read {read:?}, received {text:?}"
        );
    }
}
