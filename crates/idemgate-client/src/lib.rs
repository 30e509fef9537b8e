//! The client half of the `Idempotency-Key` protocol (PROTOCOL §14): one key per
//! user action, retries that are safe, and outcomes that say what happened.
//!
//! A request that timed out may have run. Sent again with the same key and the
//! same bytes, an idemgate server runs it at most once and answers the retry with
//! the first outcome (`Idempotent-Replayed: true`). This crate makes sending it
//! again right by construction:
//!
//! - an [`Operation`] is one logical action ("Pay"): one UUID v4 key made once,
//!   sent on every attempt; [`Operation::resume`] picks it up after a restart;
//! - every attempt sends the same body bytes; a stream body, which cannot be sent
//!   twice, is refused before the first attempt ([`Error::BodyNotReplayable`]);
//! - the [`RetryPolicy`] retries transport failures, `409` in progress (after its
//!   `Retry-After`, capped), and `5xx` that are not replays, with exponential
//!   backoff and full jitter under a total deadline — never `422`, other `4xx`, or
//!   a replayed outcome; `max_retries(0)` is one attempt;
//! - a `POST`/`PATCH` without an operation is sent exactly once;
//! - a streamed answer (`text/event-stream`, [`RequestBuilder::send_events`]) is
//!   read event by event; a connection that drops mid-stream is resumed with the
//!   same key and `Last-Event-ID`, each event handed on once, in order;
//! - outcomes are typed: a [`Response`] (with [`Response::replayed`]) or an
//!   [`Error`] — [`KeyReused`](Error::KeyReused), [`StillInProgress`](Error::StillInProgress),
//!   [`Rejected`](Error::Rejected), [`Transport`](Error::Transport) — that tells
//!   whether the operation [may have run](Error::may_have_run).
//!
//! # Quick start
//!
//! ```no_run
//! use idemgate_client::{Client, Operation};
//!
//! # async fn checkout() -> Result<(), idemgate_client::Error> {
//! let client = Client::new(reqwest::Client::new());
//! let pay = Operation::new(); // when the user clicks "Pay"; persist pay.key() to resume
//! let order = serde_json::json!({"items": [{"id": 42, "quantity": 1}], "currency": "RUB", "amount": 1500});
//! let response = client.post("http://127.0.0.1:8080/api/v1/orders")
//!     .bearer_auth("alice").json(&order).operation(&pay)
//!     .send().await?; // lost answers, 409s and 5xx were retried under pay's key
//! println!("{} (replayed: {})", response.status(), response.replayed());
//! # Ok(()) }
//! ```
//!
//! `examples/checkout.rs` is a checkout that survives a flaky network, against a
//! running `idemgate serve`.
//!
//! # With other middlewares
//!
//! [`Client::new`] takes a `reqwest_middleware::ClientWithMiddleware`, whose
//! middlewares (tracing, auth) then run on every attempt. [`RetryMiddleware`] is
//! the same retry policy as a middleware, for a chain you call yourself.
//!
//! # Features
//!
//! None for applications. The crate uses `reqwest` without default features: plain
//! HTTP/1, no TLS stack of its own. For HTTPS, build the `reqwest::Client` you pass
//! in with a TLS feature of your own `reqwest` dependency.
//!
//! `tonic`: the module `grpc`, keys and retries for tonic gRPC clients (an
//! interceptor, and the retry loop of an [`Operation`]).
//!
//! `case-files` is for this repository's test suites: the module `case_files`
//! reads the retry-policy settings of the shared case files
//! (`clients/retry-rules.json`, `clients/scenarios.json`).

mod answer;
mod attempt;
#[cfg(any(test, feature = "case-files"))]
pub mod case_files;
mod client;
mod error;
mod events;
#[cfg(feature = "tonic")]
pub mod grpc;
mod middleware;
mod operation;
mod policy;
#[cfg(test)]
mod retry_rules;

pub use client::{Client, RequestBuilder, Response};
pub use error::{Error, Problem};
pub use events::{Event, Events};
pub use idemgate_core::key::KeyError;
pub use middleware::RetryMiddleware;
pub use operation::Operation;
pub use policy::RetryPolicy;
