//! The harness every test binary of `idemgate-server` shares, loaded with `mod
//! support;`: the real binary as a process ([`server`], [`proxy`]), the counting
//! mocks of what is external to it (the payment gateway, [`gateway`]; an upstream
//! API, [`proxy::Upstream`]), an HTTP client for the orders API ([`client`]), and
//! sockets and waiting ([`net`], [`wait`]), webhook deliveries signed by the
//! providers' own libraries ([`webhooks`]), PostgreSQL databases of a test's
//! own ([`databases`]).
//!
//! Each binary uses part of it, so unused items are allowed here.

#![allow(dead_code, unreachable_pub)]

pub mod client;
pub mod databases;
pub mod gateway;
pub mod net;
pub mod proxy;
pub mod server;
pub mod webhooks;
