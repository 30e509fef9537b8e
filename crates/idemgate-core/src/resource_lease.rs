//! Resource leases: mutual exclusion on a named resource, shared by every
//! process that uses the same store.
//!
//! An idempotency record serialises the runs of one *operation* (one key). Some
//! callers need to serialise every write to one *resource*, whatever key it
//! carries: the proxy's `If-Match` enforcement (PROTOCOL §17) reads a resource's
//! current `ETag` and forwards a write only while no other conditional write to
//! that resource runs. A [`ResourceLease`] is that lock, as a capability of the
//! [`Store`](crate::Store): [`Store::acquire_resource_lease`](crate::Store::acquire_resource_lease)
//! and [`Store::release_resource_lease`](crate::Store::release_resource_lease).
//!
//! # The contract every store keeps
//!
//! - **Mutual exclusion.** Acquiring is one atomic step in the backend (an
//!   upsert that takes a lapsed row, `SET NX PX`, a map entry under a lock): of
//!   any number of concurrent acquisitions of a free resource exactly one gets
//!   [`LeaseAcquisition::Acquired`], the others [`LeaseAcquisition::Held`].
//! - **Expiry.** A lease ends at its `until` (store clock) without anyone
//!   releasing it, so a holder that dies frees the resource after its TTL. A holder
//!   must finish its work well inside the TTL it asked for.
//! - **Fencing.** Every acquisition gets a fresh random [`LeaseToken`], and a
//!   release carries it: a holder whose lease lapsed and was acquired by another
//!   cannot release the new holder's lease
//!   ([`FencedWrite::Refused`](crate::FencedWrite::Refused)), nor can it release
//!   its own once lapsed.
//! - **No waiting.** The store never blocks an acquisition behind the holder; the
//!   caller decides how long to wait and how often to look again
//!   ([`LeaseAcquisition::Held`] says until when the current holder has it).
//!
//! Resources are named by a [`ResourceId`], the SHA-256 of the caller's name for
//! them, so any name fits every backend's key limits and a resource can never meet
//! an idempotency record's identity.
//!
//! ```
//! use idemgate_core::resource_lease::{LeaseAcquisition, ResourceId};
//! use idemgate_core::{FencedWrite, MemoryStore, Store};
//! use std::time::Duration;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let resource = ResourceId::new("orders.internal:8080/orders/42");
//! let LeaseAcquisition::Acquired(lease) =
//!     store.acquire_resource_lease(&resource, Duration::from_secs(10)).await.unwrap()
//! else {
//!     panic!("a free resource is acquired");
//! };
//! // A second writer finds it held, and until when.
//! assert!(matches!(
//!     store.acquire_resource_lease(&resource, Duration::from_secs(10)).await.unwrap(),
//!     LeaseAcquisition::Held { .. }
//! ));
//! assert_eq!(store.release_resource_lease(&lease).await.unwrap(), FencedWrite::Applied);
//! // Released: free again, and the old token releases nothing.
//! assert!(matches!(
//!     store.acquire_resource_lease(&resource, Duration::from_secs(10)).await.unwrap(),
//!     LeaseAcquisition::Acquired(_)
//! ));
//! assert_eq!(store.release_resource_lease(&lease).await.unwrap(), FencedWrite::Refused);
//! # });
//! ```

use std::fmt;

use sha2::{Digest, Sha256};

use crate::time::Timestamp;

/// What a resource's name is hashed with, so a resource digest can never equal
/// an idempotency identity's.
const DOMAIN: &[u8] = b"idemgate resource lease v1\0";

/// A resource a lease serialises the writers of: the SHA-256 of its name.
///
/// Fixed-size, so any name (a long path under an upstream's authority) fits
/// every backend's key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceId([u8; 32]);

impl ResourceId {
    /// The resource called `name`. Callers that share a store must spell one
    /// resource the same way (the proxy uses the upstream's authority and the
    /// canonical path).
    pub fn new(name: &str) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(DOMAIN);
        hasher.update(name.as_bytes());
        Self(hasher.finalize().into())
    }

    /// A resource from its 32 bytes (as a store read them back).
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The 32 bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex, 64 characters.
    pub fn to_hex(&self) -> String {
        crate::hex_text::encode(&self.0)
    }
}

impl fmt::Debug for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResourceId({}…)", &self.to_hex()[..12])
    }
}

/// Who holds a resource lease: 16 random bytes, fresh at every acquisition, so
/// no two acquisitions (of any process) share one. A release carries it and
/// applies only while the store still holds this token.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken([u8; 16]);

impl LeaseToken {
    /// A fresh random token (a store takes one per acquisition).
    pub fn random() -> Self {
        Self(*uuid::Uuid::new_v4().as_bytes())
    }

    /// A token from its 16 bytes (as a store read them back).
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The 16 bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A prefix is enough to tell two apart in a log.
        write!(f, "LeaseToken({}…)", &hex::encode(self.0)[..8])
    }
}

/// A held resource lease: the right to write the resource until `until`, and the
/// token its release carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceLease {
    /// The resource.
    pub resource: ResourceId,
    /// This acquisition's token.
    pub token: LeaseToken,
    /// When the lease ends on its own (store clock).
    pub until: Timestamp,
}

/// The answer to [`Store::acquire_resource_lease`](crate::Store::acquire_resource_lease).
///
/// Exhaustive on purpose, like every enum a store returns: a caller must handle
/// both answers, and there is no third.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseAcquisition {
    /// The caller holds the resource until the lease's `until`, or until it
    /// releases it.
    Acquired(ResourceLease),
    /// Another holder has it.
    Held {
        /// When the current holder's lease ends on its own (store clock), unless
        /// released before.
        until: Timestamp,
        /// The store's clock when it answered: `until - now` is the longest the
        /// caller may have to wait.
        now: Timestamp,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_are_named_by_a_domain_separated_digest() {
        let a = ResourceId::new("host:1/orders/1");
        assert_eq!(a, ResourceId::new("host:1/orders/1"));
        assert_ne!(a, ResourceId::new("host:1/orders/2"));
        let plain: [u8; 32] = Sha256::digest(b"host:1/orders/1").into();
        assert_ne!(
            a.as_bytes(),
            &plain,
            "the domain separates it from a plain hash"
        );
        assert_eq!(ResourceId::from_bytes(*a.as_bytes()), a);
        assert_eq!(a.to_hex().len(), 64);
    }

    #[test]
    fn tokens_are_fresh() {
        let a = LeaseToken::random();
        assert_ne!(a, LeaseToken::random());
        assert_eq!(LeaseToken::from_bytes(*a.as_bytes()), a);
        assert!(format!("{a:?}").starts_with("LeaseToken("));
    }
}
