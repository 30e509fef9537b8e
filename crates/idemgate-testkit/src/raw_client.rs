//! An HTTP/1.1 client that sends exactly the bytes a test writes — request
//! targets no HTTP library would build (`//payments`, `/%2e%2e/x`, absolute
//! form), raw header bytes (`X-User: user\xff1`), broken chunked framing,
//! pipelined requests, upgrades — and reads back whatever arrives (feature
//! `upstreams`).
//!
//! ```ignore
//! let mut client = RawClient::connect(proxy_addr).await;
//! client.send(&RawRequest::new("POST", "//payments").body(b"{}").bytes()).await;
//! let response = client.response().await.expect("an answer");
//! assert_eq!(response.status, 400);
//! ```

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::http1::{read_chunked, read_head};

/// How long [`RawClient::response`] waits before giving up: generous, since a
/// test that expects an answer fails on this bound rather than hangs.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// A request, written byte for byte.
#[derive(Debug, Clone)]
pub struct RawRequest {
    start: Vec<u8>,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    body: Vec<u8>,
    framed: bool,
}

impl RawRequest {
    /// `METHOD TARGET HTTP/1.1` with `Host: idemgate.test`.
    pub fn new(method: &str, target: &str) -> Self {
        Self {
            start: format!("{method} {target} HTTP/1.1").into_bytes(),
            headers: vec![(b"Host".to_vec(), b"idemgate.test".to_vec())],
            body: Vec::new(),
            framed: false,
        }
    }

    /// Adds a header line (any bytes in the value).
    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        if name.eq_ignore_ascii_case("content-length")
            || name.eq_ignore_ascii_case("transfer-encoding")
        {
            self.framed = true;
        }
        self.headers
            .push((name.as_bytes().to_vec(), value.as_ref().to_vec()));
        self
    }

    /// Removes every `Host` line (to send absolute form or HTTP/1.0 without one).
    pub fn without_host(mut self) -> Self {
        self.headers
            .retain(|(name, _)| !name.eq_ignore_ascii_case(b"host"));
        self
    }

    /// The body; `Content-Length` is added unless a framing header was set, in
    /// which case the bytes go as they are (a chunked body, a lying length).
    pub fn body(mut self, body: impl AsRef<[u8]>) -> Self {
        self.body = body.as_ref().to_vec();
        self
    }

    /// The bytes on the wire.
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = self.start.clone();
        out.extend_from_slice(b"\r\n");
        for (name, value) in &self.headers {
            out.extend_from_slice(name);
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        if !self.framed && !self.body.is_empty() {
            out.extend_from_slice(format!("Content-Length: {}\r\n", self.body.len()).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
        out
    }
}

/// A response as it arrived.
#[derive(Debug, Clone)]
pub struct RawResponse {
    /// The status code.
    pub status: u16,
    /// Header names as sent, values as bytes.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body bytes that arrived.
    pub body: Vec<u8>,
    /// Whether the body arrived whole (its length, its last chunk); `false` when
    /// the connection broke off mid-body.
    pub complete: bool,
}

impl RawResponse {
    /// The first value of `name`, as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (panics if it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON ({}): {}", self.status, self.text()))
    }

    /// The slug of a problem+json answer's `type` (`missing-key`), if it is one.
    pub fn problem(&self) -> Option<String> {
        let is_problem = self
            .header("content-type")
            .is_some_and(|ct| ct.starts_with("application/problem+json"));
        if !is_problem {
            return None;
        }
        let json: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        json["type"]
            .as_str()
            .and_then(|uri| uri.rsplit('/').next())
            .map(str::to_owned)
    }

    /// Whether it is a replay (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed").as_deref() == Some("true")
    }
}

/// One client connection.
#[derive(Debug)]
pub struct RawClient {
    stream: BufReader<TcpStream>,
}

impl RawClient {
    /// Connects to `addr`.
    pub async fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr)
            .await
            .expect("connect to the proxy");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        Self {
            stream: BufReader::new(stream),
        }
    }

    /// Connects, sends `request`, reads its response (after a `HEAD`, a body is
    /// not expected).
    pub async fn exchange(addr: SocketAddr, request: &RawRequest) -> io::Result<RawResponse> {
        let mut client = Self::connect(addr).await;
        client.send(&request.bytes()).await?;
        let head_only = request.start.starts_with(b"HEAD ");
        client.response_to(head_only).await
    }

    /// Writes `bytes` as they are.
    pub async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.get_mut().write_all(bytes).await
    }

    /// Reads one response, within a generous bound.
    pub async fn response(&mut self) -> io::Result<RawResponse> {
        self.response_to(false).await
    }

    /// Reads one response; `head_only` for the answer to a `HEAD`.
    pub async fn response_to(&mut self, head_only: bool) -> io::Result<RawResponse> {
        tokio::time::timeout(ANSWER_WITHIN, self.read_response(head_only))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no response in time"))?
    }

    async fn read_response(&mut self, head_only: bool) -> io::Result<RawResponse> {
        let head = read_head(&mut self.stream).await?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::UnexpectedEof, "closed before a response")
        })?;
        let status = head
            .start
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad status line"))?;
        let no_body = head_only
            || status == 101
            || status == 204
            || status == 304
            || (100..200).contains(&status);
        let (body, complete) = if no_body {
            (Vec::new(), true)
        } else if head.chunked() {
            match read_chunked(&mut self.stream).await {
                Ok(body) => (body, true),
                Err(_) => (Vec::new(), false),
            }
        } else if let Some(length) = head.content_length() {
            let mut body = Vec::new();
            let read = (&mut self.stream)
                .take(length as u64)
                .read_to_end(&mut body)
                .await;
            let complete = read.is_ok() && body.len() == length;
            (body, complete)
        } else {
            let mut body = Vec::new();
            let complete = self.stream.read_to_end(&mut body).await.is_ok();
            (body, complete)
        };
        Ok(RawResponse {
            status,
            headers: head.headers,
            body,
            complete,
        })
    }

    /// Whether the server closes the connection within `within` (reading and
    /// discarding whatever comes first).
    pub async fn closed_within(&mut self, within: Duration) -> bool {
        let mut buf = [0; 4096];
        tokio::time::timeout(within, async {
            loop {
                match self.stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }

    /// Reads whatever bytes arrive within `within` (after the server's `101`,
    /// say).
    pub async fn read_some(&mut self, within: Duration) -> Vec<u8> {
        let mut buf = vec![0; 4096];
        match tokio::time::timeout(within, self.stream.read(&mut buf)).await {
            Ok(Ok(n)) => buf[..n].to_vec(),
            _ => Vec::new(),
        }
    }
}
