//! What hyper's own `header_read_timeout` does, checked rather than assumed: it
//! runs before the first byte and also while a keep-alive connection waits for its
//! next request, which is why the listener's watchdog times heads and idleness
//! itself.

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
    let n = tokio::time::timeout(Duration::from_secs(10), kept.read(&mut buf))
        .await
        .expect("an answer")
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let idle_since = Instant::now();
    // Idle after a complete exchange: hyper closes it at the header timeout.
    assert!(closed_after(&mut kept, idle_since).await < TIMEOUT * 5);
}
