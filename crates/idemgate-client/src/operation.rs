//! One logical action, one key (PROTOCOL §14).

use std::fmt;

use http::HeaderValue;
use idemgate_core::key::{DEFAULT_MAX_KEY_LENGTH, IdempotencyKey, KeyError};

/// One logical action of the user — the "Pay" click — and the `Idempotency-Key`
/// every attempt of it carries.
///
/// Make it when the user acts, not per HTTP attempt: every retry of the action must
/// carry the same key, or the server cannot tell a retry from a second purchase.
/// Store [`Operation::key`] beside the action (in an outbox row, in form state) to
/// survive a restart of your own process, and [`Operation::resume`] it.
///
/// `Debug` and `Display` show a digest of the key, never the key: keys are lookup
/// handles and do not belong in logs.
///
/// ```
/// use idemgate_client::Operation;
///
/// let checkout = Operation::new();
/// let saved = checkout.key().to_owned(); // persist with the pending order
/// let resumed = Operation::resume(&saved).unwrap();
/// assert_eq!(resumed, checkout);
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Operation {
    key: IdempotencyKey,
}

impl Operation {
    /// A new action under a fresh UUID v4 key.
    #[allow(clippy::new_without_default)] // a default would hide that each call is a new action
    pub fn new() -> Self {
        let key = uuid::Uuid::new_v4().to_string();
        Self::resume(&key).expect("a UUID is a valid bare key")
    }

    /// The action a stored key names, to retry it after a restart.
    ///
    /// The key must be one the server accepts as a bare header value: 1 to 255
    /// printable ASCII characters without `,`, `"` or spaces (PROTOCOL §2; a UUID
    /// always is). The server's rules decide, so both sides agree.
    pub fn resume(key: &str) -> Result<Self, KeyError> {
        let parsed = IdempotencyKey::parse(key.as_bytes(), DEFAULT_MAX_KEY_LENGTH)?;
        // `parse` also accepts the quoted sf-string form and surrounding spaces;
        // the key we send is the bare value, so it must read back as itself.
        if parsed.as_str() != key {
            return Err(KeyError::InvalidCharacter);
        }
        Ok(Self { key: parsed })
    }

    /// The key, to persist. Do not log it.
    pub fn key(&self) -> &str {
        self.key.as_str()
    }

    /// The header value every attempt sends.
    pub(crate) fn header_value(&self) -> HeaderValue {
        HeaderValue::from_str(self.key.as_str()).expect("a bare key is a valid header value")
    }
}

impl fmt::Debug for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Operation({:?})", self.key)
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "operation {}", self.key)
    }
}

#[cfg(test)]
mod tests {
    //! The keys `resume` takes and refuses, and the digest an operation shows
    //! instead of its key, are cases of `clients/retry-rules.json`
    //! (`crate::retry_rules`).

    use super::*;

    #[test]
    fn new_operations_have_distinct_uuid_keys() {
        let (a, b) = (Operation::new(), Operation::new());
        assert_ne!(a, b);
        let parsed = uuid::Uuid::parse_str(a.key()).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
    }
}
