//! A fault-injecting TCP relay for client tests: between a client and a real
//! server, it loses responses, delays them, resets connections, and counts what
//! went through.
//!
//! Faults are queued two ways:
//!
//! - per **connection** ([`Relay::inject`]): each accepted connection takes the next
//!   queued [`Fault`] (or none). So that one connection is one attempt, give the
//!   client under test no connection reuse
//!   (`reqwest::ClientBuilder::pool_max_idle_per_host(0)`); [`Relay::connections`]
//!   then counts attempts exactly.
//! - per **request** ([`Relay::inject_request`]): the relay follows the HTTP/1.1
//!   framing of what the client sends (request heads, `Content-Length` bodies), so
//!   a fault can target the next request on whatever connection it comes, and
//!   [`Relay::requests`] counts requests on reused connections too. That is what a
//!   client with a connection pool (a browser, Node's `fetch`, `httpx`) needs. A
//!   request whose body is chunked ends the tracking of its connection: its later
//!   requests are neither counted nor faulted.
//!
//! ```ignore
//! let relay = Relay::start(server_addr).await;
//! relay.inject(Fault::LoseResponse); // the next connection's answer never arrives
//! // … drive the client at relay.url(…) …
//! assert_eq!(relay.connections(), 2);
//! ```
//!
//! The `idemgate-relay` binary of this crate is this relay for test suites in
//! other languages, controlled over its standard input.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the relay does to one connection, or to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward both ways untouched.
    Pass,
    /// Forward the request; when the server's answer starts to arrive (so the
    /// server has run the request and answered), close the client's connection
    /// without passing on a byte of it. The seeds' lost response.
    LoseResponse,
    /// Reset the client's connection (TCP RST): for a connection as soon as it is
    /// accepted, for a request as soon as its head has arrived. Either way the
    /// request does not reach the server whole, so it does not run.
    Reset,
    /// Forward the request; hold the answer this long before passing it on.
    DelayResponse(Duration),
    /// Forward the request; pass the answer on one byte per interval, each byte
    /// well inside any read timeout: the server that trickles its answer, which
    /// only a deadline over the whole attempt (head and body) cuts short. It lasts
    /// until the next request on the connection.
    Trickle(Duration),
    /// Forward the request; pass on the answer's head and the first byte of its
    /// body, then close the client's connection: an answer cut off halfway, after
    /// the server ran the request. An answer without a body (`204`, `304`,
    /// `Content-Length: 0`) has nothing to cut: it passes whole and the fault is
    /// spent, so it never lands on the next answer of a kept-alive connection.
    CutBody,
    /// As [`CutBody`](Self::CutBody), with this many bytes of the body passed on
    /// as they arrive (the raw bytes, chunked framing and all) before the
    /// client's connection closes: a stream that breaks off after its first
    /// events.
    CutAfter(usize),
}

impl Fault {
    /// Reads a fault in the words the `idemgate-relay` binary and the shared case
    /// files (`clients/scenarios.json`) write it: `pass`, `lose-response`, `reset`,
    /// `cut-body`, `delay MILLISECONDS`, `trickle MILLISECONDS` (more than 0). It
    /// takes only the fault's own words from `words`. The errors are fixed texts,
    /// safe inside a JSON string.
    pub fn from_words<'a>(words: &mut impl Iterator<Item = &'a str>) -> Result<Self, &'static str> {
        match words.next() {
            Some("pass") => Ok(Self::Pass),
            Some("lose-response") => Ok(Self::LoseResponse),
            Some("reset") => Ok(Self::Reset),
            Some("cut-body") => Ok(Self::CutBody),
            Some("delay") => {
                let millis = words
                    .next()
                    .and_then(|ms| ms.parse().ok())
                    .ok_or("delay takes milliseconds: delay 1500")?;
                Ok(Self::DelayResponse(Duration::from_millis(millis)))
            }
            Some("cut-after") => {
                let bytes = words
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n: &usize| n > 0)
                    .ok_or("cut-after takes the body bytes to pass: cut-after 120")?;
                Ok(Self::CutAfter(bytes))
            }
            Some("trickle") => {
                let millis = words
                    .next()
                    .and_then(|ms| ms.parse().ok())
                    .filter(|&ms: &u64| ms > 0)
                    .ok_or("trickle takes milliseconds per byte: trickle 100")?;
                Ok(Self::Trickle(Duration::from_millis(millis)))
            }
            _ => Err(
                "FAULT is one of: pass, lose-response, reset, delay MILLISECONDS, trickle MILLISECONDS, cut-body, cut-after BYTES",
            ),
        }
    }
}

impl std::str::FromStr for Fault {
    type Err = &'static str;

    /// A fault's words ([`Fault::from_words`]) and nothing after them.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut words = text.split_whitespace();
        let fault = Self::from_words(&mut words)?;
        match words.next() {
            Some(_) => Err("unexpected words after the fault"),
            None => Ok(fault),
        }
    }
}

/// A fault for the next request, of one method or of any.
#[derive(Debug, Clone)]
struct RequestFault {
    fault: Fault,
    method: Option<String>,
}

#[derive(Debug, Default)]
struct Shared {
    faults: Mutex<VecDeque<Fault>>,
    request_faults: Mutex<VecDeque<RequestFault>>,
    connections: AtomicUsize,
    forwarded: AtomicUsize,
    requests: AtomicUsize,
    open: AtomicUsize,
}

impl Shared {
    /// The first queued request fault this request matches, taken off the queue.
    fn take_request_fault(&self, method: &str) -> Option<Fault> {
        let mut queue = self.request_faults.lock().unwrap();
        let index = queue.iter().position(|queued| {
            queued
                .method
                .as_deref()
                .is_none_or(|wanted| wanted.eq_ignore_ascii_case(method))
        })?;
        queue.remove(index).map(|queued| queued.fault)
    }
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

    /// The next request without a fault queued before it gets `fault`, on any
    /// connection, new or reused. With `method` (`"POST"`), only a request of that
    /// method takes it: the requests of other methods pass it by.
    pub fn inject_request(&self, fault: Fault, method: Option<&str>) {
        self.shared
            .request_faults
            .lock()
            .unwrap()
            .push_back(RequestFault {
                fault,
                method: method.map(str::to_owned),
            });
    }

    /// Connections accepted so far (attempts, for a client without reuse).
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Connections whose request bytes reached the server.
    pub fn forwarded(&self) -> usize {
        self.shared.forwarded.load(Ordering::SeqCst)
    }

    /// Request heads received from clients so far, on new and reused connections:
    /// the attempts of a client that pools its connections.
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Client connections open now.
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
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
        shared.open.fetch_add(1, Ordering::SeqCst);
        let fault = shared
            .faults
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Fault::Pass);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            relay(client, upstream, fault, &shared).await;
            shared.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Relays one connection. `fault` is the connection's; the requests on it may
/// take request faults as their heads arrive. Both directions run in one loop, so
/// a fault armed by a request head is in place before the server can answer it.
async fn relay(client: TcpStream, upstream: SocketAddr, fault: Fault, shared: &Shared) {
    if fault == Fault::Reset {
        let _ = client.set_zero_linger();
        return; // dropped with SO_LINGER 0: an RST
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return; // the server is gone: the client sees its connection close
    };
    let mut client = client;
    // What the next bytes of the server's answer meet.
    let mut armed = (fault != Fault::Pass).then_some(fault);
    // The interval of a trickling answer, while one trickles.
    let mut trickle = None;
    // The answer's bytes so far, while an answer's head is awaited to cut it;
    // how many bytes of its body pass before the cut; how many are still to
    // pass once its head went out.
    let mut cutting: Option<Vec<u8>> = None;
    let mut cut_after = 1;
    let mut passing: Option<usize> = None;
    let mut framing = Framing::default();
    let mut forwarded = false;
    let mut client_open = true;
    let (mut from_client, mut from_server) = (vec![0; 16 * 1024], vec![0; 16 * 1024]);
    loop {
        tokio::select! {
            read = client.read(&mut from_client), if client_open => {
                let Ok(n @ 1..) = read else {
                    // The client is done sending; the server may still answer.
                    client_open = false;
                    let _ = server.shutdown().await;
                    continue;
                };
                for method in framing.feed(&from_client[..n]) {
                    shared.requests.fetch_add(1, Ordering::SeqCst);
                    trickle = None; // a trickled answer ends with its request
                    match shared.take_request_fault(&method) {
                        Some(Fault::Reset) => {
                            let _ = client.set_zero_linger();
                            return; // both dropped: an RST to the client, the server sees EOF
                        }
                        Some(Fault::Pass) | None => {}
                        Some(other) => armed = Some(other),
                    }
                }
                if server.write_all(&from_client[..n]).await.is_err() {
                    return;
                }
                if !forwarded {
                    forwarded = true;
                    shared.forwarded.fetch_add(1, Ordering::SeqCst);
                }
            }
            read = server.read(&mut from_server) => {
                let Ok(n @ 1..) = read else {
                    return; // the server closed: so does the client's connection
                };
                match armed.take() {
                    Some(Fault::LoseResponse) => return,
                    Some(Fault::DelayResponse(delay)) => tokio::time::sleep(delay).await,
                    Some(Fault::Trickle(interval)) => trickle = Some(interval),
                    Some(Fault::CutBody) => (cutting, cut_after) = (Some(Vec::new()), 1),
                    Some(Fault::CutAfter(bytes)) => (cutting, cut_after) = (Some(Vec::new()), bytes),
                    Some(Fault::Pass | Fault::Reset) | None => {}
                }
                if let Some(answer) = cutting.as_mut() {
                    answer.extend_from_slice(&from_server[..n]);
                    let mut spent = false;
                    while let Some(end) = find_head_end(answer, 0) {
                        match answer_body(&answer[..end]) {
                            AnswerBody::Interim => {
                                // A `100 Continue` passes; the answer comes after it.
                                if client.write_all(&answer[..end]).await.is_err() {
                                    return;
                                }
                                answer.drain(..end);
                            }
                            AnswerBody::Empty => {
                                // Nothing to cut: the answer (and whatever follows
                                // it) passes, and the fault is spent.
                                if client.write_all(answer).await.is_err() {
                                    return;
                                }
                                spent = true;
                                break;
                            }
                            AnswerBody::Some if answer.len() >= end + cut_after => {
                                let _ = client.write_all(&answer[..end + cut_after]).await;
                                let _ = client.flush().await;
                                return; // the head and the body's first bytes, then the end
                            }
                            AnswerBody::Some if answer.len() > end => {
                                // The head and what came of the body pass now;
                                // the rest of the bytes to pass, as they come.
                                if client.write_all(answer).await.is_err() {
                                    return;
                                }
                                passing = Some(end + cut_after - answer.len());
                                spent = true;
                                break;
                            }
                            AnswerBody::Some => break, // its first body byte is still to come
                        }
                    }
                    if spent {
                        cutting = None;
                    }
                } else if let Some(left) = passing.as_mut() {
                    let pass = n.min(*left);
                    if client.write_all(&from_server[..pass]).await.is_err() {
                        return;
                    }
                    *left -= pass;
                    if *left == 0 {
                        let _ = client.flush().await;
                        return; // the bytes passed: the end
                    }
                } else if let Some(interval) = trickle {
                    for byte in from_server[..n].chunks(1) {
                        tokio::time::sleep(interval).await;
                        if client.write_all(byte).await.is_err() || client.flush().await.is_err() {
                            return; // the client gave up on the answer
                        }
                    }
                } else if client.write_all(&from_server[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Follows the requests a client sends on one connection: where each head starts
/// and ends, and how long its body is, so each new request is seen once.
#[derive(Debug, Default)]
enum Framing {
    /// Between requests: the next byte starts a head.
    #[default]
    Idle,
    /// Inside a head: the bytes so far.
    Head(Vec<u8>),
    /// Inside a body: this many bytes left.
    Body(u64),
    /// Lost track (a chunked body, a head that does not parse): nothing more is
    /// counted on this connection.
    Opaque,
}

/// Longer heads than this are not tracked (a client's heads are a few hundred bytes).
const MAX_HEAD: usize = 64 * 1024;

impl Framing {
    /// Takes the next bytes from the client; returns the method of each request
    /// whose head they complete.
    fn feed(&mut self, mut bytes: &[u8]) -> Vec<String> {
        let mut completed = Vec::new();
        while !bytes.is_empty() {
            match self {
                Self::Opaque => break,
                Self::Idle => *self = Self::Head(Vec::new()),
                Self::Body(left) => {
                    let take = (*left).min(bytes.len() as u64);
                    bytes = &bytes[take as usize..];
                    *left -= take;
                    if *left == 0 {
                        *self = Self::Idle;
                    }
                }
                Self::Head(head) => {
                    // The end of the head may straddle what came before.
                    let seen = head.len();
                    head.extend_from_slice(bytes);
                    let Some(end) = find_head_end(head, seen.saturating_sub(3)) else {
                        if head.len() > MAX_HEAD {
                            *self = Self::Opaque;
                        }
                        break;
                    };
                    let used = end - seen;
                    let parsed = parse_head(&head[..end]);
                    bytes = &bytes[used..];
                    *self = match parsed {
                        Some((method, Some(0))) => {
                            completed.push(method);
                            Self::Idle
                        }
                        Some((method, Some(length))) => {
                            completed.push(method);
                            Self::Body(length)
                        }
                        Some((method, None)) => {
                            completed.push(method);
                            Self::Opaque
                        }
                        None => Self::Opaque,
                    };
                }
            }
        }
        completed
    }
}

/// The index just past the `\r\n\r\n` that ends a head, searching from `from`.
fn find_head_end(head: &[u8], from: usize) -> Option<usize> {
    head.get(from..)?
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .map(|at| from + at + 4)
}

/// What follows a response head, for [`Fault::CutBody`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AnswerBody {
    /// An interim `1xx` (not `101`): no body, and the real answer still to come.
    Interim,
    /// None (`101`, `204`, `304`, `Content-Length: 0`, RFC 9112 §6.3): nothing to cut.
    Empty,
    /// A body (or a head that does not parse: cut as before). The request's
    /// method is not followed, so the answer to a `HEAD` with a length counts too.
    Some,
}

/// What follows the complete response head `head`.
fn answer_body(head: &[u8]) -> AnswerBody {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    let (Ok(httparse::Status::Complete(_)), Some(code)) = (response.parse(head), response.code)
    else {
        return AnswerBody::Some;
    };
    match code {
        101 | 204 | 304 => return AnswerBody::Empty,
        100..200 => return AnswerBody::Interim,
        _ => {}
    }
    let mut length = None;
    for header in response.headers.iter() {
        if header.name.eq_ignore_ascii_case("transfer-encoding") {
            return AnswerBody::Some;
        }
        if header.name.eq_ignore_ascii_case("content-length") {
            length = std::str::from_utf8(header.value)
                .ok()
                .and_then(|value| value.trim().parse::<u64>().ok());
        }
    }
    if length == Some(0) {
        AnswerBody::Empty
    } else {
        AnswerBody::Some
    }
}

/// A complete head's method and body length (`None`: chunked, not followed).
fn parse_head(head: &[u8]) -> Option<(String, Option<u64>)> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(_) = request.parse(head).ok()? else {
        return None;
    };
    let method = request.method?.to_owned();
    let mut length = Some(0);
    for header in request.headers.iter() {
        if header.name.eq_ignore_ascii_case("transfer-encoding") {
            length = None;
            break;
        }
        if header.name.eq_ignore_ascii_case("content-length") {
            length = Some(
                std::str::from_utf8(header.value)
                    .ok()?
                    .trim()
                    .parse()
                    .ok()?,
            );
        }
    }
    Some((method, length))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_sees_each_request_once_however_the_bytes_are_cut() {
        let stream: &[u8] = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n\
            POST /orders HTTP/1.1\r\nContent-Length: 12\r\n\r\n{\"amount\":1}\
            PATCH /b HTTP/1.1\r\ncontent-length: 0\r\n\r\n";
        for cut in 1..stream.len() {
            let mut framing = Framing::default();
            let mut methods = Vec::new();
            for chunk in stream.chunks(cut) {
                methods.extend(framing.feed(chunk));
            }
            assert_eq!(methods, ["GET", "POST", "PATCH"], "chunks of {cut}");
            assert!(matches!(framing, Framing::Idle), "chunks of {cut}");
        }
    }

    #[test]
    fn a_body_that_looks_like_a_head_is_a_body() {
        let mut framing = Framing::default();
        let body = b"GET /x HTTP/1.1\r\n\r\n";
        let head = format!("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len());
        assert_eq!(framing.feed(head.as_bytes()), ["POST"]);
        assert!(framing.feed(body).is_empty());
        assert_eq!(framing.feed(b"DELETE / HTTP/1.1\r\n\r\n"), ["DELETE"]);
    }

    #[test]
    fn a_chunked_body_ends_the_tracking() {
        let mut framing = Framing::default();
        let head = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
        assert_eq!(framing.feed(head), ["POST"]);
        assert!(framing.feed(b"GET / HTTP/1.1\r\n\r\n").is_empty());
        assert!(matches!(framing, Framing::Opaque));
    }

    #[test]
    fn request_faults_go_to_the_first_request_they_match() {
        let shared = Shared::default();
        shared.request_faults.lock().unwrap().extend([
            RequestFault {
                fault: Fault::LoseResponse,
                method: Some("POST".to_owned()),
            },
            RequestFault {
                fault: Fault::Reset,
                method: None,
            },
        ]);
        assert_eq!(shared.take_request_fault("GET"), Some(Fault::Reset));
        assert_eq!(shared.take_request_fault("GET"), None);
        assert_eq!(shared.take_request_fault("post"), Some(Fault::LoseResponse));
        assert_eq!(shared.take_request_fault("POST"), None);
    }

    /// An HTTP/1.1 upstream with kept-alive connections that answers the n-th
    /// bodiless request it reads (on any connection) with `answers[n]`.
    async fn scripted_upstream(answers: &'static [&'static [u8]]) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let next = Arc::new(AtomicUsize::new(0));
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let next = Arc::clone(&next);
                tokio::spawn(async move {
                    let (mut buf, mut chunk) = (Vec::new(), [0; 1024]);
                    while let Ok(n @ 1..) = stream.read(&mut chunk).await {
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = find_head_end(&buf, 0) {
                            buf.drain(..end);
                            let answer = answers[next.fetch_add(1, Ordering::SeqCst)];
                            if stream.write_all(answer).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    /// Sends a bodiless GET on `stream`, then reads until `expected.len()` bytes
    /// came, the connection ended, or nothing came for 10 s (a swallowed answer
    /// fails the test rather than hanging it).
    async fn exchange(stream: &mut TcpStream, expected: &[u8]) -> Vec<u8> {
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: relay\r\n\r\n")
            .await
            .unwrap();
        let (mut answer, mut chunk) = (Vec::new(), [0; 1024]);
        while answer.len() < expected.len() {
            let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk));
            match read.await {
                Ok(Ok(n @ 1..)) => answer.extend_from_slice(&chunk[..n]),
                _ => break,
            }
        }
        answer
    }

    #[tokio::test]
    async fn cut_body_passes_a_bodyless_answer_and_is_spent_by_it() {
        const NO_CONTENT: &[u8] = b"HTTP/1.1 204 No Content\r\nx-run: 1\r\n\r\n";
        const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        const NOT_MODIFIED: &[u8] = b"HTTP/1.1 304 Not Modified\r\netag: \"a\"\r\n\r\n";
        const EMPTY: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        const CONTINUED: &[u8] =
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok";
        let upstream =
            scripted_upstream(&[NO_CONTENT, OK, NOT_MODIFIED, EMPTY, OK, CONTINUED]).await;
        let relay = Relay::start(upstream).await;
        let mut stream = TcpStream::connect(relay.addr()).await.unwrap();

        relay.inject_request(Fault::CutBody, None);
        assert_eq!(
            exchange(&mut stream, NO_CONTENT).await,
            NO_CONTENT,
            "passed whole"
        );
        assert_eq!(
            exchange(&mut stream, OK).await,
            OK,
            "the next answer on the connection is not cut: the fault was spent"
        );
        for bodyless in [NOT_MODIFIED, EMPTY] {
            relay.inject_request(Fault::CutBody, None);
            assert_eq!(exchange(&mut stream, bodyless).await, bodyless);
        }
        // An answer with a body is still cut after its first byte, and an interim
        // 100 before it neither spends the fault nor is cut.
        relay.inject_request(Fault::CutBody, None);
        assert_eq!(exchange(&mut stream, OK).await, &OK[..OK.len() - 1], "cut");
        let mut stream = TcpStream::connect(relay.addr()).await.unwrap();
        relay.inject_request(Fault::CutBody, None);
        assert_eq!(
            exchange(&mut stream, CONTINUED).await,
            &CONTINUED[..CONTINUED.len() - 1],
            "the 100 and the head pass, the body is cut"
        );
        assert_eq!(relay.requests(), 6);
    }
    #[tokio::test]
    async fn cut_after_passes_that_many_body_bytes_as_they_come() {
        const WHOLE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n0123456789";
        let relay = Relay::start(scripted_upstream(&[WHOLE]).await).await;
        let mut stream = TcpStream::connect(relay.addr()).await.unwrap();
        relay.inject_request(Fault::CutAfter(4), None);
        assert_eq!(
            exchange(&mut stream, WHOLE).await,
            &WHOLE[..WHOLE.len() - 6],
            "the head and 4 body bytes, arrived at once"
        );

        // The head first, then the body in pieces: each piece passes as it
        // arrives, until 4 bytes of the body did.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0; 1024];
            let _ = stream.read(&mut request).await;
            for piece in [&WHOLE[..WHOLE.len() - 10], b"01", b"23", b"45", b"6789"] {
                if stream.write_all(piece).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        });
        let relay = Relay::start(upstream).await;
        let mut stream = TcpStream::connect(relay.addr()).await.unwrap();
        relay.inject_request(Fault::CutAfter(4), None);
        assert_eq!(
            exchange(&mut stream, WHOLE).await,
            &WHOLE[..WHOLE.len() - 6],
            "the head, then 01 and 23, then the end"
        );
        assert_eq!("cut-after 120".parse(), Ok(Fault::CutAfter(120)));
        assert!("cut-after 0".parse::<Fault>().is_err());
    }
}
