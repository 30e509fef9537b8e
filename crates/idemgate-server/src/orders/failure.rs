//! How the orders handlers answer when the orders database fails: one answer
//! for an order's transaction that could not begin, one for a statement that
//! failed, shared by the orders API and the payment webhook.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use idemgate::{Finality, ProblemDetails};

use crate::orders::OrdersState;

/// The order transaction could not begin: `503 store-unavailable`, retryable
/// (nothing ran).
pub(crate) fn tx_failure(app: &OrdersState, error: &dyn std::error::Error) -> Response {
    tracing::error!(%error, "could not begin the order transaction");
    let answer = ProblemDetails::store_unavailable(app.unavailable_retry_after);
    (Finality::Retryable, answer).into_response()
}

/// A statement of the orders database failed: `503 database-unavailable`,
/// with the `Retry-After` of every 503 for a store that failed.
pub(crate) fn database_failure(error: sqlx::Error) -> ProblemDetails {
    tracing::error!(%error, "orders database failed");
    ProblemDetails::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "database-unavailable",
        "Database unavailable",
        "the orders database could not be reached",
    )
    .with_retry_after(crate::idempotency::UNAVAILABLE_RETRY_AFTER)
}
