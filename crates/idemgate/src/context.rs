//! What the handler learns about the operation it runs.

use idemgate_core::LeaseOrigin;
use idemgate_core::record::{FencingToken, OperationId};

/// The operation a handler runs, as a request extension (PROTOCOL §8, §11).
///
/// With axum: `Extension(op): Extension<OperationContext>` (present only on requests
/// that carried an `Idempotency-Key`; use `Option<Extension<…>>` otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationContext {
    /// The operation's id: the same on every run of one operation (after a crash, a
    /// takeover or a release), new once its record expired. Key business writes by
    /// it (a unique column), so a second run cannot write twice.
    pub operation_id: OperationId,
    /// This run's fencing token.
    pub token: FencingToken,
    /// How this run came about: a new operation, a released one run again, or a
    /// lapsed lease taken over (an earlier run may have done part of the work).
    pub origin: LeaseOrigin,
}

impl OperationContext {
    /// The key to send to a downstream service (a payment gateway) for this
    /// operation: the operation id. It is the same for every run of the operation,
    /// differs across principals (operation ids are random), is never the client's
    /// raw key, and is new once the record expired — so the downstream service folds
    /// exactly this operation's runs together, and nothing else (PITFALLS 8).
    pub fn downstream_key(&self) -> String {
        self.operation_id.to_string()
    }
}
