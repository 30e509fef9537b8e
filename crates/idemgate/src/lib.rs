//! Idempotency-Key middleware for tower and axum (work in progress).
pub use idemgate_core::*;
