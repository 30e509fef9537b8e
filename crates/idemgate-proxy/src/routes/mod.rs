//! Per-route policies (`idemgate proxy --config FILE`): which requests the
//! idempotency layer covers, and how, by method and path.
//!
//! - [`policy`]: the one [`Policy`] type — every setting a route can override,
//!   resolved — and the [`PolicyOverride`] a route file's table lays over it.
//! - [`pattern`]: what a route's `path` matches.
//! - [`file`]: the route file's TOML, checked and resolved into [`Routes`].
//! - [`dispatch`]: the resolved routes as services, the default route last,
//!   swapped whole on a reload ([`RouteTable`]).
//!
//! The file is TOML, one `[[route]]` table per route, tried in order; the first
//! whose method and path pattern match decides. A request no route matches gets
//! the default route (the command line's settings: `POST`, `PUT`, `PATCH` and
//! `DELETE` covered when they carry a key).
//! The keys are documented in `docs/proxy.md`.

pub(crate) mod dispatch;
mod file;
mod pattern;
mod policy;

pub use dispatch::{Proxy, RouteTable};
pub use file::{Routes, RoutesError};
pub use pattern::RoutePattern;
pub use policy::{Conditional, Policy, PolicyOverride};
