//! Whose key it is: principal, scope and identity (PROTOCOL §3).

use std::fmt;

use sha2::{Digest, Sha256};

use crate::key::IdempotencyKey;

/// Who sends the request: an opaque subject id chosen by the application
/// (`"user:42"`, `"tenant:7/user:42"`, or an HMAC of a credential).
///
/// Put one in the request extensions from an authentication layer and the
/// idempotency layer scopes keys by it. Never put a raw credential here: the
/// principal is stored with every record.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Principal(String);

impl Principal {
    /// A principal from an application-chosen subject id.
    pub fn new(subject: impl Into<String>) -> Self {
        Self(subject.into())
    }

    /// The subject id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Principal + method + path: a key means something only inside its scope.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Scope {
    /// Who sent the request.
    pub principal: Principal,
    /// The request method, upper case (`POST`).
    pub method: String,
    /// The normalized path (see [`normalize_path`]) or the matched route template.
    pub path: String,
}

/// The SHA-256 of an [`Identity`]: what stores index records by.
///
/// Fixed-size, so long paths and keys never hit a database's index row limits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdentityDigest([u8; 32]);

impl IdentityDigest {
    /// A digest from its 32 bytes (as a store read them back).
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

impl fmt::Debug for IdentityDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdentityDigest({}…)", &self.to_hex()[..12])
    }
}

/// Scope + key: one operation's name. Two requests share a record exactly when their
/// identities are equal.
#[derive(Clone, Debug)]
pub struct Identity {
    scope: Scope,
    key: IdempotencyKey,
    digest: IdentityDigest,
}

impl Identity {
    /// Names the operation `key` within `scope`.
    pub fn new(scope: Scope, key: IdempotencyKey) -> Self {
        Self::in_domain(b"idemgate/identity/v1", scope, key)
    }

    /// The name an operation seen in observe mode is recorded under (PROTOCOL
    /// §16): never equal to [`Identity::new`]'s for the same scope and key, so
    /// enforcement — after a switch from observing — never reads an observed
    /// record, which holds no response, as an outcome to replay.
    pub fn observed(scope: Scope, key: IdempotencyKey) -> Self {
        Self::in_domain(b"idemgate/identity/observed/v1", scope, key)
    }

    fn in_domain(domain: &[u8], scope: Scope, key: IdempotencyKey) -> Self {
        let mut hasher = Sha256::new();
        // Length-prefixed fields: ("a", "bc") and ("ab", "c") must not collide.
        for part in [
            domain,
            scope.principal.as_str().as_bytes(),
            scope.method.as_bytes(),
            scope.path.as_bytes(),
            key.as_str().as_bytes(),
        ] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        let digest = IdentityDigest(hasher.finalize().into());
        Self { scope, key, digest }
    }

    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The client's key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The digest stores index by.
    pub fn digest(&self) -> &IdentityDigest {
        &self.digest
    }
}

/// The path a scope names (PROTOCOL §3): the request path in its canonical
/// spelling, refusing nothing. Defined with the rest of path canonicalization, in
/// [`crate::path`]; re-exported here, where scopes are built.
pub use crate::path::normalize_path;

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(principal: &str, method: &str, path: &str, key: &str) -> Identity {
        Identity::new(
            Scope {
                principal: Principal::new(principal),
                method: method.into(),
                path: path.into(),
            },
            IdempotencyKey::parse(key.as_bytes(), 255).unwrap(),
        )
    }

    #[test]
    fn an_observed_operation_is_never_its_enforced_namesake() {
        let enforced = identity("alice", "POST", "/orders", "k1");
        let observed = Identity::observed(enforced.scope().clone(), enforced.key().clone());
        assert_ne!(enforced.digest(), observed.digest());
        assert_eq!(observed.scope(), enforced.scope());
        assert_eq!(observed.key(), enforced.key());
    }

    #[test]
    fn every_part_of_the_identity_separates_operations() {
        let base = identity("alice", "POST", "/orders", "k1");
        assert_eq!(
            base.digest(),
            identity("alice", "POST", "/orders", "k1").digest()
        );
        for other in [
            identity("bob", "POST", "/orders", "k1"),
            identity("alice", "PATCH", "/orders", "k1"),
            identity("alice", "POST", "/payments", "k1"),
            identity("alice", "POST", "/orders", "k2"),
        ] {
            assert_ne!(base.digest(), other.digest());
        }
    }

    #[test]
    fn fields_are_length_prefixed() {
        assert_ne!(
            identity("ab", "POST", "/c", "k").digest(),
            identity("a", "POST", "b/c", "k").digest()
        );
    }
}
