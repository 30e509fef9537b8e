//! Why stored bytes cannot be read back: the one error of every record codec
//! (the record's own fields, its response, its field digests), on every store.

/// A stored record that cannot be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecodable idempotency record: {0}")]
pub struct DecodeError(pub &'static str);
