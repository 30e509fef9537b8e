//! Sockets: reading a raw HTTP head (a free port is `idemgate_testkit::free_port`).

/// Reads from `stream` until the end of an HTTP head (`\r\n\r\n`), returning what
/// was read; `None` if the peer closed or failed first.
pub async fn read_head(stream: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut buffer = [0_u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buffer[..n]),
        }
    }
    Some(head)
}
