//! The idemgate protocol as models a model checker explores exhaustively.
//!
//! Tests sample interleavings; the bugs that double-charge are the rare ones (a
//! lease that lapses while a completion is in flight, a takeover racing a fenced
//! write, a store that applies a claim whose answer never arrives). This crate
//! states the protocol as [`stateright`] models and checks every interleaving of
//! small bounds:
//!
//! - [`protocol`]: clients that retry one logical request, layer instances that
//!   claim, run and settle it, one store, a downstream that dedupes by the
//!   operation id, a clock with leases — under instance crashes, pauses past the
//!   lease, lost and duplicated messages between clients, instances and the
//!   store, store answers lost after being applied, and downstream answers lost.
//! - [`conditional`]: two editors holding one `ETag` and compare-and-set
//!   transfers with `expected_balance` (PROTOCOL §17–§18), retried with their
//!   keys after lost responses, crashes and clients giving up; with the records
//!   in a store of their own, each edit records its answer by operation id with
//!   its write and a re-run answers it (the orders service's
//!   `operation_outcomes`, commit 67e779f: the design the model now checks,
//!   after it found the 412 the old one answered an applied edit).
//!
//! `docs/reliability.md`, "What is model-checked", lists the properties, the
//! bounds, the state counts and what is left out.
//!
//! # The model runs the real rules
//!
//! The transitions call `idemgate-core`'s own functions, not copies: the claim is
//! [`Record::claim_origin`](idemgate_core::record::Record::claim_origin), every
//! fenced write is
//! [`Record::admits_fenced_write`](idemgate_core::record::Record::admits_fenced_write),
//! what a request found answers is [`decide`](fn@idemgate_core::decide), the fenced
//! holder's answer is `decide` over the record it lost to, what the handler's
//! answer does to the record is the layer's own PROTOCOL §8 rule
//! ([`settlement_for`](idemgate::finality::settlement_for)), and replies travel as
//! [`StoredResponse`](idemgate_core::record::StoredResponse)s; the conditional
//! model evaluates `If-Match` with `idemgate::conditional::Preconditions`. A
//! change to those rules changes what the checker explores.
//!
//! Where a rule runs inside a database (the SQL stores' `ON CONFLICT … WHERE`,
//! the Redis Lua scripts, the orders service's `UPDATE … WHERE version = ?`),
//! the model states the store's contract instead — each store call is one atomic
//! step, a record past `expires_at` is absent, a takeover keeps the operation id
//! with a new token and `expires_at = max(expires_at, now + ttl)` — exactly as
//! the `Store` trait documents it. The link between that contract and every real
//! store is the store conformance suite
//! (`crates/idemgate-testkit/src/conformance.rs`), which holds `MemoryStore`,
//! SQLite, PostgreSQL and Redis to the same behaviour.
//!
//! # Running it
//!
//! `cargo test -p idemgate-model` checks the small bounds exhaustively and each
//! seeded guard removal (about 20 s in a debug build on 2 cores: the crate and
//! stateright are built with `opt-level = 2` in the test profile).
//! `scripts/model.sh` runs the protocol's ignored test: every fault at once,
//! exhaustively, then random walks of larger bounds.
//! `cargo test -p idemgate-model --test conditional -- --ignored` checks the
//! conditional model with every fault at once (about 40 s).

pub mod check;
pub mod conditional;
pub mod protocol;
