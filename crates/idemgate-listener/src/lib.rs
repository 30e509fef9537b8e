//! Accepting HTTP connections with the limits every public listener needs, in one
//! place for `serve` and for the proxy's public and admin listeners.
//!
//! A server that waits forever for a client is a server a few slow clients can
//! take down: 100 connections dribbling one header byte per second, or 20 bodies
//! sent at 1 B/s, hold a connection (and a file descriptor) each for as long as
//! they like, and once the descriptors run out nobody else is served. So every
//! connection accepted here is bounded in time and in number:
//!
//! - **header-read timeout**: from accept (before the first byte), and from the
//!   first byte of each later request, the request head must be complete within
//!   it;
//! - **idle timeout**: a keep-alive connection with no request in flight and no
//!   byte received is closed after it;
//! - **body-read timeout**: the whole request body must arrive within it, counted
//!   from the end of the head (a total, not a per-read timer: a per-read timer
//!   never fires for a client sending one byte per second); past it the answer is
//!   `408` `body-timeout` problem+json and the connection is closed;
//! - **connection bound**: when a new connection arrives at it, the connection
//!   that has waited longest without completing a request head past a grace is
//!   closed (else the keep-alive connection idle longest, else the head waiting
//!   longest within the grace; never one still sending a response; an evicted
//!   one finishes a response in progress within a second) and the new one is served, so
//!   clients holding half a head cannot keep everyone else out until the header
//!   timeout cuts them; only when every connection is busy with a request is the
//!   new one answered at once with a canned `503` `connection-limit` and closed,
//!   without reading from it, so the accept loop never waits on a client;
//! - **lingering close**: a connection closed with request bytes unread (a body
//!   refused by its length) shuts its write side down and discards what still
//!   arrives, within 2 s and 8 MiB (until the client closes or pauses 500 ms), so the client reads the answer, not a reset;
//! - the accept loop survives `EMFILE`/`ENFILE` (it pauses briefly instead of
//!   spinning or dying), and [`raise_fd_limit`] lifts the soft `RLIMIT_NOFILE` to
//!   the hard limit at startup; the connection bound is capped below that limit
//!   so connections alone cannot exhaust the descriptors the stores and the
//!   payment gateway client need.
//!
//! Why not hyper's own `header_read_timeout`: hyper (1.x) starts that timer when it
//! starts waiting for a request head, which includes the wait of an idle
//! keep-alive connection for its next request, so it cannot be shorter than the
//! idle timeout without also cutting keep-alive short (behind a load balancer with
//! a 60 s idle timeout the backend must keep connections longer than that). The
//! watchdog here tells the two phases apart by the bytes it sees.
//!
//! The listener's own refusals (`503 connection-limit`, `408 body-timeout`) are
//! `application/problem+json` under the operator's problem type base
//! ([`ListenerOptions::with_problem_type_base`]), rendered here: the listener
//! sits below any application and knows no idempotency layer.
//!
//! What a listener serves is any [`HttpService`]: an axum `Router`, or a
//! service of the same shape with no router in front of it (the proxy's
//! dispatcher, whose every path belongs to the upstream).
//!
//! The pieces, one module each: [`ListenerOptions`] (the limits), the accept loop
//! and shedding ([`Listener`]), eviction at the bound, one connection and its
//! watchdog, the refusals, the request and response bodies, the descriptor limit
//! ([`raise_fd_limit`]), TLS loading ([`tls::server_config`]), and the worker
//! threads that serve one address from several `SO_REUSEPORT` listeners
//! ([`Workers`]).
//!
//! ```no_run
//! # async fn run(router: axum::Router) -> std::io::Result<()> {
//! use idemgate_listener::{Listener, ListenerOptions, raise_fd_limit};
//!
//! raise_fd_limit();
//! let listener = Listener::bind("127.0.0.1:8080".parse().unwrap(), ListenerOptions::default()).await?;
//! listener.serve(router, std::future::pending::<()>()).await;
//! # Ok(())
//! # }
//! ```

mod accept;
mod body;
mod connection;
mod evict;
mod limits;
mod options;
mod refusal;
mod service;
pub mod tls;
mod workers;

pub use accept::Listener;
pub use body::BodyReadTimeout;
pub use limits::raise_fd_limit;
pub use options::ListenerOptions;
pub use service::HttpService;
pub use workers::Workers;
