//! The idemgate orders service: the seeds' running example as a real service.
//!
//! `POST /api/v1/orders` charges a payment gateway and stores an order, exactly
//! once per `Idempotency-Key`, whatever the network, the client or the process
//! does. By default everything lives in one SQLite file, and each order commits in
//! the same transaction as its idempotency record.
//!
//! `main.rs` only parses the command line; [`http::app`] builds the router that
//! tests drive, [`listener`] accepts connections within their limits, and
//! [`server::run`] wires stores, gateway and shutdown.

/// The workspace README's examples, compiled as doctests here, where every store
/// crate is a dependency.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub mod admin;
pub mod cli;
pub mod demo;
pub mod gateway;
pub mod http;
pub mod keys;
pub mod keys_cli;
pub mod listener;
pub mod orders;
pub mod proxy;
pub mod repository;
mod runtime;
pub mod server;
mod stores;
pub mod telemetry;
