//! A minimal HTTP/1.1 keep-alive client: one request at a time per connection,
//! responses framed by `Content-Length` or chunked encoding. Small on purpose: the
//! load generator shares two cores with the server it measures, so every cycle it
//! spends is one the server does not get.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the benchmark needs to know about a response.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reply {
    /// The status code.
    pub(crate) status: u16,
    /// Whether `Idempotent-Replayed: true` was present.
    pub(crate) replayed: bool,
}

/// One keep-alive connection.
pub(crate) struct Connection {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Bytes of `buf` already consumed by earlier responses.
    start: usize,
    /// The server said `Connection: close`: reconnect before the next request.
    pub(crate) closed: bool,
    /// The last `Content-Length` body, kept only for [`Connection::send_reading`].
    last_body: Vec<u8>,
    keep_body: bool,
}

impl Connection {
    pub(crate) async fn connect(addr: SocketAddr) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: Vec::with_capacity(16 * 1024),
            start: 0,
            closed: false,
            last_body: Vec::new(),
            keep_body: false,
        })
    }

    /// Sends one request (complete bytes) and reads its whole response.
    pub(crate) async fn send(&mut self, request: &[u8]) -> io::Result<Reply> {
        self.stream.write_all(request).await?;
        self.read_response().await
    }

    /// [`Connection::send`], with the response's body (framed by
    /// `Content-Length`; for the setup requests, not the measured ones).
    pub(crate) async fn send_reading(&mut self, request: &[u8]) -> io::Result<(Reply, Vec<u8>)> {
        self.stream.write_all(request).await?;
        self.keep_body = true;
        let reply = self.read_response().await;
        self.keep_body = false;
        Ok((reply?, std::mem::take(&mut self.last_body)))
    }

    async fn fill(&mut self) -> io::Result<()> {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        let len = self.buf.len();
        self.buf.resize(len + 8192, 0);
        let read = self.stream.read(&mut self.buf[len..]).await;
        let n = match read {
            Ok(n) => n,
            Err(error) => {
                self.buf.truncate(len);
                return Err(error);
            }
        };
        self.buf.truncate(len + n);
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed mid-response",
            ));
        }
        Ok(())
    }

    async fn read_response(&mut self) -> io::Result<Reply> {
        let (head_len, status, replayed, framing) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut response = httparse::Response::new(&mut headers);
            match response.parse(&self.buf[self.start..]) {
                Ok(httparse::Status::Complete(head_len)) => {
                    let status = response.code.unwrap_or(0);
                    let mut replayed = false;
                    let mut framing = Framing::Length(0);
                    for header in response.headers.iter() {
                        let name = header.name;
                        if name.eq_ignore_ascii_case("content-length") {
                            let length = std::str::from_utf8(header.value)
                                .ok()
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .ok_or_else(|| invalid("bad content-length"))?;
                            framing = Framing::Length(length);
                        } else if name.eq_ignore_ascii_case("transfer-encoding")
                            && header.value.eq_ignore_ascii_case(b"chunked")
                        {
                            framing = Framing::Chunked;
                        } else if name.eq_ignore_ascii_case("idempotent-replayed") {
                            replayed = header.value.eq_ignore_ascii_case(b"true");
                        } else if name.eq_ignore_ascii_case("connection")
                            && header.value.eq_ignore_ascii_case(b"close")
                        {
                            self.closed = true;
                        }
                    }
                    break (head_len, status, replayed, framing);
                }
                Ok(httparse::Status::Partial) => self.fill().await?,
                Err(error) => return Err(invalid(&format!("bad response head: {error}"))),
            }
        };
        self.start += head_len;
        match framing {
            Framing::Length(length) => {
                while self.buf.len() - self.start < length {
                    self.fill().await?;
                }
                if self.keep_body {
                    self.last_body = self.buf[self.start..self.start + length].to_vec();
                }
                self.start += length;
            }
            Framing::Chunked => self.skip_chunks().await?,
        }
        Ok(Reply { status, replayed })
    }

    /// Consumes a chunked body, trailers included.
    async fn skip_chunks(&mut self) -> io::Result<()> {
        loop {
            let line = loop {
                if let Some(end) = find_crlf(&self.buf[self.start..]) {
                    break end;
                }
                self.fill().await?;
            };
            let size_text = std::str::from_utf8(&self.buf[self.start..self.start + line])
                .map_err(|_| invalid("bad chunk size"))?;
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| invalid("bad chunk size"))?;
            self.start += line + 2;
            if size == 0 {
                // Trailers, then an empty line.
                loop {
                    let end = loop {
                        if let Some(end) = find_crlf(&self.buf[self.start..]) {
                            break end;
                        }
                        self.fill().await?;
                    };
                    self.start += end + 2;
                    if end == 0 {
                        return Ok(());
                    }
                }
            }
            while self.buf.len() - self.start < size + 2 {
                self.fill().await?;
            }
            self.start += size + 2;
        }
    }
}

enum Framing {
    Length(usize),
    Chunked,
}

fn find_crlf(bytes: &[u8]) -> Option<usize> {
    bytes.windows(2).position(|w| w == b"\r\n")
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

/// Builds the workload's requests into a reused buffer.
pub(crate) struct RequestTemplate {
    head: Vec<u8>,
    body: &'static [u8],
    /// The header the key goes in (`Idempotency-Key: `, or a webhook's id).
    key_header: &'static [u8],
}

/// The proxy suite's webhook route's secret (GitHub's scheme).
pub(crate) const WEBHOOK_SECRET: &str = "idemgate-bench-webhook-secret";

/// `X-Hub-Signature-256` of [`ORDER_BODY`] under [`WEBHOOK_SECRET`]: the body
/// never changes, so neither does the signature (checked by a test with the
/// layer's own verifier); each delivery differs by its `X-GitHub-Delivery`.
pub(crate) const WEBHOOK_SIGNATURE: &str =
    "sha256=70352c209f3facac647f5f209591202506c965b18bf0c05d6884ef1eedf79158";

/// The README's order, the body of every request.
pub(crate) const ORDER_BODY: &[u8] =
    br#"{"items":[{"id":42,"quantity":1}],"currency":"RUB","amount":1500}"#;

impl RequestTemplate {
    /// `POST /api/v1/orders` as `principal`, with the README's body.
    pub(crate) fn orders(addr: SocketAddr, principal: &str) -> Self {
        let head = format!(
            "POST /api/v1/orders HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {principal}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n",
            ORDER_BODY.len()
        );
        Self {
            head: head.into_bytes(),
            body: ORDER_BODY,
            key_header: b"Idempotency-Key: ",
        }
    }

    /// The same body as a GitHub webhook delivery, signed with
    /// [`WEBHOOK_SECRET`]; the key goes in `X-GitHub-Delivery`.
    pub(crate) fn webhook(addr: SocketAddr) -> Self {
        let head = format!(
            "POST /api/v1/orders HTTP/1.1\r\nHost: {addr}\r\nX-Hub-Signature-256: {WEBHOOK_SIGNATURE}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n",
            ORDER_BODY.len()
        );
        Self {
            head: head.into_bytes(),
            body: ORDER_BODY,
            key_header: b"X-GitHub-Delivery: ",
        }
    }

    /// The request into `out`, with `Idempotency-Key: key` when given.
    pub(crate) fn write(&self, out: &mut Vec<u8>, key: Option<&str>) {
        out.clear();
        out.extend_from_slice(&self.head);
        if let Some(key) = key {
            out.extend_from_slice(self.key_header);
            out.extend_from_slice(key.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(self.body);
    }
}

/// Builds ledger transfers (and the accounts they move money between) as
/// `principal`: `POST /api/v1/accounts/{from}/transfers`, keyed by the body's
/// `reference_id` (the route's key source), no `Idempotency-Key`.
pub(crate) struct TransferTemplate {
    /// The headers every request shares: `Host`, the bearer token, the
    /// content type.
    headers: Vec<u8>,
}

impl TransferTemplate {
    pub(crate) fn new(addr: SocketAddr, principal: &str) -> Self {
        let headers = format!(
            "Host: {addr}\r\nAuthorization: Bearer {principal}\r\nContent-Type: application/json\r\n"
        );
        Self {
            headers: headers.into_bytes(),
        }
    }

    /// A transfer of 1 from `from` to `to` under `reference`, into `out`.
    pub(crate) fn write(&self, out: &mut Vec<u8>, from: &str, to: &str, reference: &str) {
        use std::io::Write as _;
        let body_len = r#"{"to":,"amount":1,"reference_id":""}"#.len() + to.len() + reference.len();
        out.clear();
        let _ = write!(out, "POST /api/v1/accounts/{from}/transfers HTTP/1.1\r\n");
        out.extend_from_slice(&self.headers);
        let _ = write!(
            out,
            "Content-Length: {body_len}\r\n\r\n{{\"to\":{to},\"amount\":1,\"reference_id\":\"{reference}\"}}"
        );
    }

    /// `POST /api/v1/accounts` of an account holding more than any run moves,
    /// into `out`, with a fresh key (the server without the layer ignores it).
    pub(crate) fn open_account(&self, out: &mut Vec<u8>) {
        use std::io::Write as _;
        const BODY: &str = r#"{"balance":1000000000000,"currency":"RUB"}"#;
        out.clear();
        out.extend_from_slice(b"POST /api/v1/accounts HTTP/1.1\r\n");
        out.extend_from_slice(&self.headers);
        let _ = write!(
            out,
            "Idempotency-Key: {}\r\nContent-Length: {}\r\n\r\n{BODY}",
            uuid::Uuid::new_v4(),
            BODY.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    #[test]
    fn the_webhook_signature_is_the_bodys() {
        use idemgate::webhook::{Provider, Webhook};
        let webhook = Webhook::new(Provider::Github, [WEBHOOK_SECRET]).unwrap();
        let mut headers = http::HeaderMap::new();
        headers.insert("x-hub-signature-256", WEBHOOK_SIGNATURE.parse().unwrap());
        assert_eq!(
            webhook.verify(&headers, ORDER_BODY, std::time::SystemTime::now()),
            Ok(())
        );
    }

    #[test]
    fn a_transfer_is_framed_by_its_content_length() {
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let mut out = Vec::new();
        TransferTemplate::new(addr, "bench-1").write(&mut out, "7", "1234", "abc123");
        let text = String::from_utf8(out).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("POST /api/v1/accounts/7/transfers HTTP/1.1\r\n"));
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"to": 1234, "amount": 1, "reference_id": "abc123"})
        );
    }

    #[tokio::test]
    async fn reads_length_and_chunked_responses_on_one_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = socket.read(&mut buf).await.unwrap();
            socket
                .write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 5\r\nidempotent-replayed: true\r\n\r\nhello")
                .await
                .unwrap();
            let _ = socket.read(&mut buf).await.unwrap();
            socket
                .write_all(b"HTTP/1.1 409 Conflict\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
                .await
                .unwrap();
        });
        let mut connection = Connection::connect(addr).await.unwrap();
        let template = RequestTemplate::orders(addr, "t");
        let mut request = Vec::new();
        template.write(&mut request, Some("k"));
        let first = connection.send(&request).await.unwrap();
        assert_eq!((first.status, first.replayed), (201, true));
        let second = connection.send(&request).await.unwrap();
        assert_eq!((second.status, second.replayed), (409, false));
        server.await.unwrap();
    }
}
