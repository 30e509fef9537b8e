//! The `idemgate` binary as a library: `serve` (the orders service of the design
//! articles), `proxy` (the Idempotency-Key protocol in front of any HTTP API) and
//! `keys` (an operator's look at one key). `main.rs` only parses the command line
//! and hands it to the subcommand's module.
//!
//! The modules, top to bottom — each imports only modules below it
//! (`CONTRIBUTING.md`, "Layers of the binary"):
//!
//! | layer | modules | what they hold |
//! |---|---|---|
//! | command line | [`cli`] | every clap type; the checks of the argument groups the subcommands share |
//! | subcommands | [`cmd::serve`], [`cmd::proxy`], [`cmd::keys`], [`cmd::completions`], [`cmd::man`] | each one's checked settings and its run |
//! | the demo | [`orders`], [`demo`] | the orders service: API, authentication, database, payment gateway client; the checkout page that drives it from a browser |
//! | services | [`process`], [`store`], [`idempotency`], [`admin`], [`inspect`], [`principal`], [`route_file`], [`monitoring`], [`telemetry`], [`database`] | process lifecycle, the one store opener, the layer as configured, the admin API, key inspection, principal rules, the proxy's route file (load, check, reload), metrics, logs and spans, SQL pools |
//! | leaf | [`config`] | checked values everything shares; imports nothing of this crate |
//!
//! The hardened listener both servers use is its own crate, `idemgate-listener`;
//! the proxy's forwarding service and route policies are `idemgate-proxy`.

/// The workspace README's examples, compiled as doctests here, where every store
/// crate is a dependency.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub mod admin;
pub mod audit;
pub mod cli;
pub mod cmd;
pub mod config;
pub mod database;
pub mod demo;
pub mod idempotency;
pub mod inspect;
pub mod monitoring;
pub mod orders;
pub mod principal;
pub mod process;
pub mod route_file;
pub mod store;
pub mod telemetry;
