//! The keep-alive connections to the upstream: per thread, each one a hyper
//! [`SendRequest`] over its own TCP connection, with nothing in between.
//!
//! A worker (`idemgate_listener::Workers`, one current-thread runtime per
//! thread) sends every request over connections whose tasks run on its own
//! thread, as an nginx worker keeps its own upstream connections. A request
//! takes an idle connection from its thread's list, or opens one, and hands it
//! back as soon as the response head has arrived: the connection stays in the
//! list while its body streams and is taken again once hyper reports it ready
//! for the next request. There is no pool task, no lock and no channel besides
//! the one between a `SendRequest` and its own connection — what hyper-util's
//! pooled client added per request (a checkout, a dispatch hop, a task to hand
//! the connection back).
//!
//! On a multi-thread runtime each of its threads has a list, which only costs
//! some reuse.

use std::cell::RefCell;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use http::{Method, Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How long an idle connection to the upstream is reused. Below the common
/// keep-alive timeouts of upstream servers (Node's is 5 s, most others more),
/// so the proxy rarely sends on a connection the upstream is closing; when it
/// does, [`UpstreamPools::send`] says what goes out again.
const IDLE_REUSE: Duration = Duration::from_secs(4);

/// Idle at least this long, a reused connection may have been closed by the
/// upstream's keep-alive timeout just as a request is written to it (no server
/// times an idle connection out sooner). A body-less safe request sent on such
/// a connection is kept, to be sent once more should the connection turn out
/// closed before any answer; a busy connection costs no copy.
const MAY_HAVE_TIMED_OUT: Duration = Duration::from_millis(250);

/// Why a request got no response from the upstream.
#[derive(Debug)]
pub(crate) enum SendError {
    /// No connection could be opened: nothing was sent.
    Connect(io::Error),
    /// The exchange failed once the request was on a connection: it may have
    /// been received and run.
    Exchange(hyper::Error),
}

/// One forwarder's connections to its upstream; its clones share them.
#[derive(Clone, Debug)]
pub(crate) struct UpstreamPools {
    /// Which forwarder's connections these are, in every thread's list.
    id: u64,
    /// The upstream's host (an IPv6 address without brackets) and port.
    host: String,
    port: u16,
}

/// The ids of [`UpstreamPools`], unique in the process.
static NEXT_POOLS: AtomicU64 = AtomicU64::new(0);

/// A connection in a thread's list: idle, or still reading a response body.
struct Pooled {
    sender: SendRequest<Body>,
    /// When its last response head arrived.
    since: Instant,
}

thread_local! {
    /// This thread's connections of each forwarder that has used it.
    static POOLS: RefCell<Vec<(u64, Vec<Pooled>)>> = const { RefCell::new(Vec::new()) };
}

impl UpstreamPools {
    /// The connections to `authority` (`host[:port]`, port 80 when absent).
    pub(crate) fn new(authority: &http::uri::Authority) -> Self {
        let host = authority.host();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        Self {
            id: NEXT_POOLS.fetch_add(1, Ordering::Relaxed),
            host: host.to_owned(),
            port: authority.port_u16().unwrap_or(80),
        }
    }

    /// Sends `request` (origin-form URI, `Host` set) over an idle connection of
    /// this thread, or a new one. A reused connection can turn out closed by
    /// the upstream (its keep-alive timeout) as the request goes out; then the
    /// request goes out once more, on a new connection, when nothing can have
    /// run: hyper gave it back unsent, or it is a body-less safe request
    /// (RFC 9110 §9.2.2) that got no byte of an answer. Anything else that was
    /// sent is never sent again: the upstream may have run it.
    pub(crate) async fn send(
        &self,
        request: Request<Body>,
    ) -> Result<Response<Incoming>, SendError> {
        let Some((mut sender, idle)) = self.checkout() else {
            // Connecting (name resolution included) is boxed apart: it is rare
            // on keep-alive connections, and its state would enlarge every
            // request's.
            let sender = Box::pin(self.connect()).await?;
            return self.exchange(sender, request).await;
        };
        let copy = (idle >= MAY_HAVE_TIMED_OUT)
            .then(|| replayable_copy(&request))
            .flatten();
        let again = match sender.try_send_request(request).await {
            Ok(response) => {
                self.checkin(sender);
                return Ok(response);
            }
            Err(mut failed) => match (failed.take_message(), copy) {
                (Some(unsent), _) => unsent,
                (None, Some(copy)) if failed.error().is_incomplete_message() => copy,
                _ => return Err(SendError::Exchange(failed.into_error())),
            },
        };
        tracing::debug!(
            "a reused upstream connection was closed as the request went out; sending it on a new one"
        );
        let sender = Box::pin(self.connect()).await?;
        self.exchange(sender, again).await
    }

    /// One request on `sender`, handed back to the list once answered.
    async fn exchange(
        &self,
        mut sender: SendRequest<Body>,
        request: Request<Body>,
    ) -> Result<Response<Incoming>, SendError> {
        let response = sender
            .send_request(request)
            .await
            .map_err(SendError::Exchange)?;
        self.checkin(sender);
        Ok(response)
    }

    /// A ready connection from this thread's list and how long it has been
    /// idle, dropping on the way the closed ones and those idle longer than
    /// [`IDLE_REUSE`].
    fn checkout(&self) -> Option<(SendRequest<Body>, Duration)> {
        let now = Instant::now();
        POOLS.with_borrow_mut(|pools| {
            let (_, list) = pools.iter_mut().find(|(id, _)| *id == self.id)?;
            list.retain(|pooled| {
                let stale = pooled.sender.is_ready() && now - pooled.since > IDLE_REUSE;
                !pooled.sender.is_closed() && !stale
            });
            let ready = list.iter().rposition(|pooled| pooled.sender.is_ready())?;
            let pooled = list.swap_remove(ready);
            Some((pooled.sender, now - pooled.since))
        })
    }

    /// Puts a connection whose response head has arrived back in this
    /// thread's list; it is taken again once its body is read.
    fn checkin(&self, sender: SendRequest<Body>) {
        let pooled = Pooled {
            sender,
            since: Instant::now(),
        };
        POOLS.with_borrow_mut(
            |pools| match pools.iter_mut().find(|(id, _)| *id == self.id) {
                Some((_, list)) => list.push(pooled),
                None => pools.push((self.id, vec![pooled])),
            },
        );
    }

    /// A new connection, its task spawned on this thread's runtime. Upgrades
    /// are enabled: a WebSocket the upstream accepts takes the connection over.
    async fn connect(&self) -> Result<SendRequest<Body>, SendError> {
        let stream = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(SendError::Connect)?;
        stream.set_nodelay(true).map_err(SendError::Connect)?;
        // An HTTP/1 handshake does no I/O; it fails only when hyper cannot
        // build the connection, before anything is sent.
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| SendError::Connect(io::Error::other(error)))?;
        tokio::spawn(async move {
            if let Err(error) = connection.with_upgrades().await {
                tracing::debug!(error = ?error, "an upstream connection ended with an error");
            }
        });
        Ok(sender)
    }
}

/// A copy of `request` to send again, if it is safe and has no body.
fn replayable_copy(request: &Request<Body>) -> Option<Request<Body>> {
    use http_body::Body as _;
    let safe = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    );
    if !safe || request.body().size_hint().exact() != Some(0) {
        return None;
    }
    let mut copy = Request::new(Body::empty());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    Some(copy)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::Barrier;

    use super::*;

    /// An upstream answering every `GET` with `200 ok` on keep-alive
    /// connections, counting the connections it accepts and the requests it
    /// answers. With `together`, it answers only once that many requests are
    /// in (each on its own connection); with `close_after`, it closes each
    /// connection that long after its first answer, without saying so.
    struct Upstream {
        pools: UpstreamPools,
        connections: Arc<AtomicUsize>,
        answered: Arc<AtomicUsize>,
    }

    impl Upstream {
        async fn start(together: Option<usize>, close_after: Option<Duration>) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let authority = listener.local_addr().unwrap().to_string().parse().unwrap();
            let connections = Arc::new(AtomicUsize::new(0));
            let answered = Arc::new(AtomicUsize::new(0));
            let barrier = together.map(|n| Arc::new(Barrier::new(n)));
            let (accepted, counted) = (Arc::clone(&connections), Arc::clone(&answered));
            tokio::spawn(async move {
                loop {
                    let (mut stream, _) = listener.accept().await.unwrap();
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let (barrier, counted) = (barrier.clone(), Arc::clone(&counted));
                    tokio::spawn(async move {
                        let mut seen = Vec::new();
                        let mut buffer = [0; 1024];
                        loop {
                            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                                match stream.read(&mut buffer).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) => seen.extend_from_slice(&buffer[..n]),
                                }
                            }
                            let end = seen.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
                            seen.drain(..end + 4);
                            if let Some(barrier) = &barrier {
                                barrier.wait().await;
                            }
                            counted.fetch_add(1, Ordering::SeqCst);
                            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if stream.write_all(answer).await.is_err() {
                                return;
                            }
                            if let Some(pause) = close_after {
                                tokio::time::sleep(pause).await;
                                return;
                            }
                        }
                    });
                }
            });
            Self {
                pools: UpstreamPools::new(&authority),
                connections,
                answered,
            }
        }

        /// One `GET /` through the pool, its body read to the end.
        async fn get(&self) -> Vec<u8> {
            let request = Request::get("/")
                .header(http::header::HOST, "upstream")
                .body(Body::empty())
                .unwrap();
            let response = self.pools.send(request).await.unwrap();
            let body = response.into_body().collect().await.unwrap();
            body.to_bytes().to_vec()
        }

        /// Yields until a connection of this thread's list is ready, without
        /// turning the runtime's I/O driver more than the yields do.
        async fn until_one_is_ready(&self) {
            for _ in 0..1000 {
                let ready = POOLS.with_borrow(|pools| {
                    pools.iter().any(|(id, list)| {
                        *id == self.pools.id && list.iter().any(|p| p.sender.is_ready())
                    })
                });
                if ready {
                    return;
                }
                tokio::task::yield_now().await;
            }
            panic!("no connection became ready");
        }

        fn connections(&self) -> usize {
            self.connections.load(Ordering::SeqCst)
        }
    }

    /// Lets the connection tasks see what the last exchange left (a body
    /// read, a close) before the next checkout.
    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    #[tokio::test]
    async fn requests_one_after_another_share_one_connection() {
        let upstream = Upstream::start(None, None).await;
        for _ in 0..10 {
            assert_eq!(upstream.get().await, b"ok");
        }
        assert_eq!(upstream.answered.load(Ordering::SeqCst), 10);
        assert_eq!(upstream.connections(), 1);
    }

    #[tokio::test]
    async fn concurrent_requests_each_get_a_connection_then_reuse_them() {
        let upstream = Arc::new(Upstream::start(Some(8), None).await);
        for round in 1..=2 {
            let requests: Vec<_> = (0..8)
                .map(|_| {
                    let upstream = Arc::clone(&upstream);
                    tokio::spawn(async move { upstream.get().await })
                })
                .collect();
            for request in requests {
                assert_eq!(request.await.unwrap(), b"ok");
            }
            assert_eq!(upstream.answered.load(Ordering::SeqCst), 8 * round);
            // The second round's eight, in flight together, rode the first
            // round's eight connections.
            assert_eq!(upstream.connections(), 8, "round {round}");
            settle().await;
        }
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_is_not_sent_on() {
        let upstream = Upstream::start(None, Some(Duration::ZERO)).await;
        for _ in 0..3 {
            assert_eq!(upstream.get().await, b"ok");
            settle().await;
        }
        assert_eq!(upstream.answered.load(Ordering::SeqCst), 3);
        assert_eq!(upstream.connections(), 3);
    }

    /// Sends a `GET`, lets its connection go idle and ready, holds this
    /// (current-thread) runtime still while the upstream — on threads of its
    /// own — closes that connection, then sends `second` through the pool: the
    /// close race, made deterministic.
    fn after_the_upstream_closed_the_idle_connection(
        second: Request<Body>,
    ) -> (Upstream, Result<Vec<u8>, SendError>) {
        let upstream_runtime = tokio::runtime::Runtime::new().unwrap();
        let upstream =
            upstream_runtime.block_on(Upstream::start(None, Some(Duration::from_millis(50))));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let answer = runtime.block_on(async {
            assert_eq!(upstream.get().await, b"ok");
            upstream.until_one_is_ready().await;
            std::thread::sleep(Duration::from_millis(300));
            let response = upstream.pools.send(second).await?;
            Ok(response
                .into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .to_vec())
        });
        (upstream, answer)
    }

    #[test]
    fn a_body_less_get_on_a_connection_the_upstream_just_closed_goes_out_again() {
        let get = Request::get("/")
            .header(http::header::HOST, "upstream")
            .body(Body::empty())
            .unwrap();
        let (upstream, answer) = after_the_upstream_closed_the_idle_connection(get);
        // Written to the closed connection, it got no answer; it went out once
        // more, on a new connection.
        assert_eq!(answer.unwrap(), b"ok");
        assert_eq!(upstream.answered.load(Ordering::SeqCst), 2);
        assert_eq!(upstream.connections(), 2);
    }

    #[test]
    fn a_request_with_a_body_is_never_sent_twice() {
        let post = Request::post("/orders")
            .header(http::header::HOST, "upstream")
            .body(Body::from("{}"))
            .unwrap();
        let (upstream, answer) = after_the_upstream_closed_the_idle_connection(post);
        // It may have run (as far as the proxy can tell): the failure is the
        // answer, for the layer's policy to settle.
        assert!(matches!(answer, Err(SendError::Exchange(_))), "{answer:?}");
        assert_eq!(upstream.answered.load(Ordering::SeqCst), 1);
        assert_eq!(upstream.connections(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_idle_past_the_reuse_limit_is_replaced() {
        let upstream = Upstream::start(None, None).await;
        assert_eq!(upstream.get().await, b"ok");
        tokio::time::advance(IDLE_REUSE - Duration::from_millis(100)).await;
        assert_eq!(upstream.get().await, b"ok");
        assert_eq!(upstream.connections(), 1, "reused within the limit");
        tokio::time::advance(IDLE_REUSE + Duration::from_millis(100)).await;
        assert_eq!(upstream.get().await, b"ok");
        assert_eq!(upstream.connections(), 2, "replaced past it");
    }

    #[tokio::test]
    async fn an_upstream_that_refuses_connections_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string().parse().unwrap();
        drop(listener);
        let pools = UpstreamPools::new(&authority);
        let request = Request::get("/")
            .header(http::header::HOST, "x")
            .body(Body::empty())
            .unwrap();
        assert!(matches!(
            pools.send(request).await,
            Err(SendError::Connect(_))
        ));
    }

    #[test]
    fn an_ipv6_upstream_is_connected_to_without_brackets() {
        let pools = UpstreamPools::new(&"[::1]:8080".parse().unwrap());
        assert_eq!((pools.host.as_str(), pools.port), ("::1", 8080));
        let pools = UpstreamPools::new(&"api.internal".parse().unwrap());
        assert_eq!((pools.host.as_str(), pools.port), ("api.internal", 80));
    }
}
