//! Three HTTP/1.1 upstreams to put behind `idemgate proxy`, each reading requests
//! the way a family of real servers does, and each recording every request it
//! parsed — as it read it — so a test can assert what the upstream *ran*, not
//! only what the proxy answered (feature `upstreams`).
//!
//! - [`UpstreamKind::Strict`]: reads bodies by `Content-Length` or chunked,
//!   routes by the raw path byte for byte (no decoding, no merging).
//! - [`UpstreamKind::Lenient`]: reads like strict, but routes the way popular
//!   frameworks do: `;params` stripped (Tomcat), every escape decoded (`%2F`
//!   too), `\` read as `/`, slashes merged, dot segments resolved, lower-cased
//!   (Express); it honours `X-HTTP-Method-Override` and its cousins, and reads
//!   header names CGI-style (`_` as `-`, so `Idempotency_Key` is
//!   `idempotency-key`).
//! - [`UpstreamKind::Naive`]: keep-alive, but never reads a body on `GET`,
//!   `HEAD`, `OPTIONS` or `DELETE`, nor a chunked one (Python's `http.server`):
//!   those bytes are parsed as the next request on the connection.
//!
//! Behaviours by the path as the upstream reads it:
//!
//! | path | answer |
//! |---|---|
//! | `/stall` | `200`, `Content-Length: 1000`, 10 bytes, then nothing until the peer closes ([`TestUpstream::stalls_cut`] counts that) |
//! | `/trickle` | `200` chunked, one byte every 100 ms until the peer closes (counted the same way) |
//! | `/ws` | with `Upgrade: websocket` and a key: `101` with the right `Sec-WebSocket-Accept`, then echoes bytes |
//! | `/ws-wrong-accept` | the same with a wrong accept value |
//! | `/switch-anyway` | `101 Switching Protocols` whatever was asked, then reads HTTP/1.1 requests on the stream again |
//! | any other, with an `Upgrade` header | `101` to that protocol (h2c, say), then reads HTTP/1.1 requests on the stream again — so a tunnel the proxy opened shows as requests it never saw |
//! | any other | `201`, JSON `{"upstream", "n", "method", "path"}` |
//!
//! ```ignore
//! let upstream = TestUpstream::start(UpstreamKind::Lenient).await;
//! // … the proxy in front of upstream.url() …
//! assert!(upstream.seen().iter().filter(|s| s.is("POST", "/payments")).all(|s| s.header("idempotency-key").is_some()));
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use sha1::{Digest, Sha1};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::http1::{Head, read_chunked, read_exact, read_head};

/// How an upstream reads requests; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamKind {
    /// Exact raw paths, correct body framing.
    Strict,
    /// Framework-style routing: decodes, merges, resolves, strips `;params`,
    /// lower-cases, honours method overrides, reads `_` as `-`.
    Lenient,
    /// Keep-alive that ignores bodies on safe methods and chunked bodies.
    Naive,
}

/// One request an upstream parsed, as it read it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The method it ran (after an override, for the lenient one).
    pub method: String,
    /// The path it routed by.
    pub path: String,
    /// The request target as it arrived.
    pub target: String,
    /// Header names as it reads them (lower case; the lenient one maps `_` to
    /// `-`), values as bytes, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body it read (empty when it read none).
    pub body: Vec<u8>,
    /// Which connection it came on (1, 2, …).
    pub connection: usize,
}

impl Seen {
    /// Whether this request ran as `method` on `path`.
    pub fn is(&self, method: &str, path: &str) -> bool {
        self.method == method && self.path == path
    }

    /// Every value of a header as this upstream reads it.
    pub fn headers_named(&self, name: &str) -> Vec<&[u8]> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
            .collect()
    }

    /// The first value of a header, as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers_named(name)
            .first()
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

#[derive(Debug, Default)]
struct Shared {
    seen: Mutex<Vec<Seen>>,
    connections: AtomicUsize,
    stalls_cut: AtomicUsize,
}

/// A running upstream on a loopback port; stops when dropped.
#[derive(Debug)]
pub struct TestUpstream {
    kind: UpstreamKind,
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl TestUpstream {
    /// Starts an upstream of `kind` on a free loopback port.
    pub async fn start(kind: UpstreamKind) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the test upstream");
        let addr = listener.local_addr().expect("upstream address");
        let shared = Arc::new(Shared::default());
        let accept = tokio::spawn(accept_loop(listener, kind, Arc::clone(&shared)));
        Self {
            kind,
            addr,
            shared,
            accept,
        }
    }

    /// Which kind it is.
    pub fn kind(&self) -> UpstreamKind {
        self.kind
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<address>`, for the proxy's `--upstream`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request parsed so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }

    /// How many requests it parsed and ran as `method` on `path`.
    pub fn ran(&self, method: &str, path: &str) -> usize {
        self.seen().iter().filter(|s| s.is(method, path)).count()
    }

    /// How many requests it parsed in all.
    pub fn count(&self) -> usize {
        self.shared.seen.lock().unwrap().len()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// `/stall` and `/trickle` responses whose connection the peer closed.
    pub fn stalls_cut(&self) -> usize {
        self.shared.stalls_cut.load(Ordering::SeqCst)
    }
}

impl Drop for TestUpstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, kind: UpstreamKind, shared: Arc<Shared>) {
    while let Ok((stream, _)) = listener.accept().await {
        let connection = shared.connections.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::spawn(serve(stream, kind, Arc::clone(&shared), connection));
    }
}

/// Serves one connection: request after request until it closes or breaks.
async fn serve(stream: TcpStream, kind: UpstreamKind, shared: Arc<Shared>, connection: usize) {
    let mut stream = BufReader::new(stream);
    loop {
        let Ok(Some(head)) = read_head(&mut stream).await else {
            return;
        };
        let Some((method, target)) = request_line(&head.start) else {
            let _ = respond(&mut stream, 400, "Bad Request", b"bad request line").await;
            return;
        };
        let body = match read_body(&mut stream, kind, &method, &head).await {
            Ok(body) => body,
            Err(_) => {
                let _ = respond(&mut stream, 400, "Bad Request", b"bad body").await;
                return;
            }
        };
        let seen = reading(kind, &method, &target, &head, body, connection);
        let n = {
            let mut all = shared.seen.lock().unwrap();
            all.push(seen.clone());
            all.len()
        };
        if !answer(&mut stream, kind, &seen, &head, n, &shared).await {
            return;
        }
    }
}

fn request_line(start: &str) -> Option<(String, String)> {
    let mut parts = start.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    (version.starts_with("HTTP/1.") && parts.next().is_none() && !method.is_empty())
        .then(|| (method.to_owned(), target.to_owned()))
}

async fn read_body(
    stream: &mut BufReader<TcpStream>,
    kind: UpstreamKind,
    method: &str,
    head: &Head,
) -> std::io::Result<Vec<u8>> {
    let ignores_body = kind == UpstreamKind::Naive
        && (matches!(method, "GET" | "HEAD" | "OPTIONS" | "DELETE") || head.chunked());
    if ignores_body {
        return Ok(Vec::new());
    }
    if head.chunked() {
        if kind == UpstreamKind::Strict && head.get("content-length").is_some() {
            return Err(std::io::Error::other("both Content-Length and chunked"));
        }
        return read_chunked(stream).await;
    }
    match head.content_length() {
        Some(length) => read_exact(stream, length).await,
        None if head.get("content-length").is_some() => {
            Err(std::io::Error::other("bad Content-Length"))
        }
        None => Ok(Vec::new()),
    }
}

/// The request as `kind` reads it.
fn reading(
    kind: UpstreamKind,
    method: &str,
    target: &str,
    head: &Head,
    body: Vec<u8>,
    connection: usize,
) -> Seen {
    let raw_path = origin_path(target);
    let mut headers: Vec<(String, Vec<u8>)> = head
        .headers
        .iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), value.clone()))
        .collect();
    let (method, path) = match kind {
        UpstreamKind::Strict | UpstreamKind::Naive => (method.to_owned(), raw_path.to_owned()),
        UpstreamKind::Lenient => {
            for (name, _) in &mut headers {
                *name = name.replace('_', "-");
            }
            let overridden = headers
                .iter()
                .find(|(name, _)| {
                    matches!(
                        name.as_str(),
                        "x-http-method-override" | "x-http-method" | "x-method-override"
                    )
                })
                .map(|(_, value)| String::from_utf8_lossy(value).trim().to_ascii_uppercase());
            (
                overridden.unwrap_or_else(|| method.to_ascii_uppercase()),
                lenient_path(raw_path),
            )
        }
    };
    Seen {
        method,
        path,
        target: target.to_owned(),
        headers,
        body,
        connection,
    }
}

/// The path of a request target: origin form as is, absolute form's path, no
/// query or fragment.
fn origin_path(target: &str) -> &str {
    let path = match target.find("://") {
        Some(scheme_end) => {
            let rest = &target[scheme_end + 3..];
            rest.find('/').map_or("/", |slash| &rest[slash..])
        }
        None => target,
    };
    let end = path.find(['?', '#']).unwrap_or(path.len());
    &path[..end]
}

/// How framework routers read a path: `;params` stripped from each segment
/// (before decoding, as Tomcat does), every escape decoded (lossy UTF-8), `\`
/// as `/`, empty segments dropped, dot segments resolved (clamped at the root),
/// lower-cased; no trailing slash.
///
/// ```
/// use idemgate_testkit::upstreams::lenient_path;
/// assert_eq!(lenient_path("//x/..;/PAY%2fments;v=1/./"), "/pay/ments");
/// ```
pub fn lenient_path(raw: &str) -> String {
    let stripped: Vec<&str> = raw
        .split('/')
        .map(|segment| segment.split(';').next().unwrap_or_default())
        .collect();
    let decoded = percent_decode(stripped.join("/").as_bytes());
    let decoded = String::from_utf8_lossy(&decoded).replace('\\', "/");
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            other => segments.push(other),
        }
    }
    format!("/{}", segments.join("/")).to_lowercase()
}

fn percent_decode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).and_then(|b| hex(*b)),
                bytes.get(i + 2).and_then(|b| hex(*b)),
            )
        {
            out.push((hi << 4 | lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// Answers one request; `false` when the connection is done.
async fn answer(
    stream: &mut BufReader<TcpStream>,
    kind: UpstreamKind,
    seen: &Seen,
    head: &Head,
    n: usize,
    shared: &Shared,
) -> bool {
    let upgrade = head
        .get("upgrade")
        .map(|v| String::from_utf8_lossy(v).into_owned());
    let key = head.get("sec-websocket-key").map(<[u8]>::to_vec);
    match (seen.path.as_str(), upgrade, key) {
        ("/stall", _, _) => {
            let head = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 1000\r\n\r\n0123456789";
            if stream.get_mut().write_all(head).await.is_ok() {
                wait_for_close(stream, shared).await;
            }
            false
        }
        ("/trickle", _, _) => {
            let head = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n";
            if stream.get_mut().write_all(head).await.is_err() {
                return false;
            }
            loop {
                if stream.get_mut().write_all(b"1\r\nx\r\n").await.is_err() {
                    shared.stalls_cut.fetch_add(1, Ordering::SeqCst);
                    return false;
                }
                let mut probe = [0; 1];
                let read =
                    tokio::time::timeout(Duration::from_millis(100), stream.read(&mut probe)).await;
                if let Ok(Ok(0) | Err(_)) = read {
                    shared.stalls_cut.fetch_add(1, Ordering::SeqCst);
                    return false;
                }
            }
        }
        (path @ ("/ws" | "/ws-wrong-accept"), Some(protocol), Some(key))
            if protocol.eq_ignore_ascii_case("websocket") =>
        {
            let accept = if path == "/ws" {
                websocket_accept(&key)
            } else {
                "d3JvbmcgYWNjZXB0IHZhbHVlISE=".to_owned()
            };
            let response = format!(
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {accept}\r\n\r\n"
            );
            if stream
                .get_mut()
                .write_all(response.as_bytes())
                .await
                .is_err()
            {
                return false;
            }
            echo(stream).await;
            false
        }
        ("/switch-anyway", upgrade, _) => {
            let protocol = upgrade.unwrap_or_else(|| "websocket".to_owned());
            switch_and_go_on(stream, &protocol).await
        }
        (_, Some(protocol), _) => switch_and_go_on(stream, &protocol).await,
        _ => {
            let body = format!(
                r#"{{"upstream":"{}","n":{n},"method":"{}","path":{:?}}}"#,
                match kind {
                    UpstreamKind::Strict => "strict",
                    UpstreamKind::Lenient => "lenient",
                    UpstreamKind::Naive => "naive",
                },
                seen.method,
                seen.path,
            );
            respond(stream, 201, "Created", body.as_bytes())
                .await
                .is_ok()
        }
    }
}

/// Answers `101` to `protocol` and keeps reading HTTP/1.1 on the stream.
async fn switch_and_go_on(stream: &mut BufReader<TcpStream>, protocol: &str) -> bool {
    let response = format!(
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: {protocol}\r\nconnection: Upgrade\r\n\r\n"
    );
    stream
        .get_mut()
        .write_all(response.as_bytes())
        .await
        .is_ok()
}

async fn respond(
    stream: &mut BufReader<TcpStream>,
    status: u16,
    reason: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let stream = stream.get_mut();
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await
}

/// Holds a stalled response until the peer closes, then counts the cut.
async fn wait_for_close(stream: &mut BufReader<TcpStream>, shared: &Shared) {
    let mut buf = [0; 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => {
                shared.stalls_cut.fetch_add(1, Ordering::SeqCst);
                return;
            }
            Ok(_) => {}
        }
    }
}

/// Copies every byte back until the peer closes.
async fn echo(stream: &mut BufReader<TcpStream>) {
    let mut buf = [0; 4096];
    while let Ok(n @ 1..) = stream.read(&mut buf).await {
        if stream.get_mut().write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// `Sec-WebSocket-Accept` for `key` (RFC 6455 §4.2.2).
pub fn websocket_accept(key: &[u8]) -> String {
    let mut hash = Sha1::new();
    hash.update(key);
    hash.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD.encode(hash.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lenient_router_reads_paths_as_frameworks_do() {
        for (raw, read) in [
            ("/payments", "/payments"),
            ("//payments", "/payments"),
            ("/./payments/", "/payments"),
            ("/webhooks/../payments", "/payments"),
            ("/x%2F..%2Fpayments", "/payments"),
            ("/payments;jsessionid=1", "/payments"),
            ("/x/..;/payments", "/payments"),
            ("/PAYMENTS", "/payments"),
            ("/pay\\ments", "/pay/ments"),
            ("/../payments", "/payments"),
        ] {
            assert_eq!(lenient_path(raw), read, "{raw}");
        }
        assert_eq!(origin_path("http://h:1//a?b#c"), "//a");
        assert_eq!(origin_path("/a?b"), "/a");
    }

    #[test]
    fn the_rfc_6455_example_accept() {
        assert_eq!(
            websocket_accept(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }
}
