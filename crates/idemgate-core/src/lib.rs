//! The idempotency-key protocol, without HTTP plumbing.
//!
//! This crate holds what every idemgate surface shares: parsing the
//! `Idempotency-Key` header ([`key`]), the canonical spelling of a path ([`path`]),
//! scoping keys by principal, method and path
//! ([`scope`]), fingerprinting requests ([`fingerprint`]), the record
//! ([`record`]), the pure decision over an existing record ([`decide()`]), the
//! [`Store`] trait every backend implements (records, and the resource leases
//! of [`resource_lease`] that serialise the writers of one resource),
//! [`MemoryStore`], and
//! [`cache::ReplayCache`], which answers replays from memory in front of any store.
//!
//! Applications add the `idemgate` crate (the tower layer), which re-exports this
//! one. Store authors depend on this crate alone, and prove their store with the
//! conformance suite in `idemgate-testkit`.
//!
//! ```
//! use idemgate_core::{Claim, ClaimRequest, MemoryStore, Store};
//! use idemgate_core::fingerprint::{Fingerprint, FingerprintInput};
//! use idemgate_core::key::IdempotencyKey;
//! use idemgate_core::scope::{Identity, Principal, Scope};
//! use std::time::Duration;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let scope = Scope { principal: Principal::new("user:42"), method: "POST".into(), path: "/orders".into() };
//! let key = IdempotencyKey::parse(b"9b1deb4d-3b7d-4bad-9bdd-2b0d7b3dcb6d", 255).unwrap();
//! let request = ClaimRequest {
//!     identity: Identity::new(scope, key),
//!     fingerprint: Fingerprint::of(FingerprintInput {
//!         method: "POST", path: "/orders", query: "", content_type: None, headers: &[], body: b"{}",
//!     }),
//!     field_digests: None,
//!     lease: Duration::from_secs(30),
//!     ttl: Duration::from_secs(86_400),
//!     route_template: None,
//! };
//! assert!(matches!(store.try_claim(&request).await.unwrap(), Claim::Acquired(_)));
//! assert!(matches!(store.try_claim(&request).await.unwrap(), Claim::Existing(_)));
//! # });
//! ```

pub mod audit;
pub mod cache;
pub mod compression;
pub mod deadline;
pub mod decide;
mod decode;
pub mod encoding;
pub mod estimate;
pub mod event_stream;
pub mod fingerprint;
pub mod hex_text;
pub mod key;
pub mod memory;
pub mod path;
pub mod record;
pub mod resource_lease;
pub mod scope;
pub mod signals;
pub mod store;
pub mod stream;
pub mod time;
pub mod transaction;
pub mod wire;

pub use decide::{Decision, decide};
pub use memory::MemoryStore;
pub use store::{
    BoxError, Claim, ClaimRequest, Completion, EvictMode, Eviction, FencedWrite, FinalStatus,
    Lease, LeaseOrigin, Snapshot, Store, StoreError,
};
