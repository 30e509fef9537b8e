//! The orders API's handlers: create, list and read orders, health and metrics.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use idemgate::transaction::TransactionSlot;
use idemgate::{Finality, OperationContext, Principal, ProblemDetails};
use uuid::Uuid;

use crate::orders::db::{Placement, insert_postgres, insert_sqlite};
use crate::orders::order::{InvalidOrder, NewOrder, Order, check_client_order_id};
use crate::orders::payment::{ChargeOutcome, ChargeRequest};
use crate::orders::{OrderWrites, OrdersState};

/// `POST /api/v1/orders`: validate, charge once, store the order (in the
/// layer's transaction when the records share its database), answer 201.
pub(crate) async fn create_order(
    State(app): State<Arc<OrdersState>>,
    Extension(principal): Extension<Principal>,
    operation: Option<Extension<OperationContext>>,
    slot: Option<Extension<TransactionSlot>>,
    body: Bytes,
) -> Response {
    let order = match NewOrder::parse(&body) {
        Ok(order) => order,
        // Nothing happened yet: free the key so the client can fix the body.
        Err(error) => return (Finality::Rejected, invalid_order(&error)).into_response(),
    };
    place_order(&app, &principal, operation, slot, &order, None).await
}

/// `PUT /api/v1/orders/{order_id}`: the same order as `POST`, under an id the
/// client chose (a natural key, PROTOCOL §15). The idempotency layer keys this
/// route by the id, so a retry within the record's TTL is replayed (201, no
/// second charge). Past the TTL the orders table still knows the id (unique per
/// principal): the same order answers 200 with the order as it is now, another
/// one 409 naming the fields that differ — neither charges. Another principal's
/// order of that id is never found, so never revealed.
pub(crate) async fn put_order(
    State(app): State<Arc<OrdersState>>,
    Extension(principal): Extension<Principal>,
    Path(order_id): Path<String>,
    operation: Option<Extension<OperationContext>>,
    slot: Option<Extension<TransactionSlot>>,
    body: Bytes,
) -> Response {
    if let Err(error) = check_client_order_id(&order_id) {
        return (Finality::Rejected, invalid_order(&error)).into_response();
    }
    let order = match NewOrder::parse(&body) {
        Ok(order) => order,
        Err(error) => return (Finality::Rejected, invalid_order(&error)).into_response(),
    };
    match app
        .orders
        .get_by_client_id(principal.as_str(), &order_id)
        .await
    {
        Ok(Some(existing)) => {
            let differing = existing.differing_fields(&order);
            if differing.is_empty() {
                return (StatusCode::OK, Json(existing)).into_response();
            }
            // Nothing happened: the claim is undone, so the original body can
            // still be retried under this id.
            let answer = ProblemDetails::new(
                StatusCode::CONFLICT,
                "order-exists",
                "Order exists with other content",
                format!(
                    "order {order_id} already exists with another {}; use a new order id for a new order",
                    differing.join(", ")
                ),
            );
            return (Finality::Rejected, answer).into_response();
        }
        Ok(None) => {}
        Err(error) => return (Finality::Retryable, database_failure(error)).into_response(),
    }
    place_order(&app, &principal, operation, slot, &order, Some(&order_id)).await
}

/// Charges once and stores the order (in the layer's transaction when the
/// records share its database), answering 201.
async fn place_order(
    app: &OrdersState,
    principal: &Principal,
    operation: Option<Extension<OperationContext>>,
    slot: Option<Extension<TransactionSlot>>,
    order: &NewOrder,
    client_order_id: Option<&str>,
) -> Response {
    let operation = operation.map(|Extension(op)| op);
    let operation_id = operation
        .as_ref()
        .map_or_else(Uuid::new_v4, |op| op.operation_id.as_uuid());
    let downstream_key = operation.as_ref().map(OperationContext::downstream_key);
    let charge = ChargeRequest {
        order_ref: operation_id,
        amount: order.amount,
        currency: order.currency.clone(),
    };
    let charge_id = match app.gateway.charge(&charge, downstream_key.as_deref()).await {
        ChargeOutcome::Approved { charge_id } => charge_id,
        ChargeOutcome::Declined { reason } => {
            // Final: stored and replayed, the retry does not charge again.
            return ProblemDetails::new(
                StatusCode::PAYMENT_REQUIRED,
                "payment-declined",
                "Payment declined",
                reason,
            )
            .into_response();
        }
        ChargeOutcome::Failed { reason } => {
            tracing::warn!(%reason, "payment gateway failed");
            // The call carried the propagated key: a retry is folded into this
            // charge by the gateway, so the record is released.
            let answer = ProblemDetails::new(
                StatusCode::BAD_GATEWAY,
                "gateway-failed",
                "Payment gateway failed",
                reason,
            );
            return (Finality::Retryable, answer).into_response();
        }
        ChargeOutcome::TimedOut => {
            let answer = ProblemDetails::new(
                StatusCode::GATEWAY_TIMEOUT,
                "gateway-timeout",
                "Payment gateway timed out",
                "the payment gateway did not answer in time; retry with the same Idempotency-Key",
            );
            return (Finality::Retryable, answer).into_response();
        }
    };
    let placement = Placement {
        principal: principal.as_str(),
        operation_id,
        charge_id: charge_id.as_deref(),
        client_order_id,
    };
    // Without a key there is no record to commit with the order, so it is written
    // directly, as in the memory and Redis modes: a transaction would only add a
    // BEGIN and a COMMIT round trip and, on SQLite, hold the one write lock across
    // the insert and its read-back.
    let slot = slot
        .map(|Extension(slot)| slot)
        .filter(|_| operation.is_some());
    match store_order(app, slot.as_ref(), placement, order).await {
        Ok(order) => created(order),
        Err(error) => {
            tracing::error!(error = %error, cause = ?std::error::Error::source(&error), "storing the order failed");
            // The charge carried the propagated key; a retry re-runs and the
            // gateway folds it into this charge.
            let answer = ProblemDetails::store_unavailable(app.unavailable_retry_after);
            (Finality::Retryable, answer).into_response()
        }
    }
}

/// Writes the order: inside the layer's transaction when the records live in the
/// same database (begun only now, after the gateway call, so no database lock is
/// held while the gateway thinks), else directly.
async fn store_order(
    app: &OrdersState,
    slot: Option<&TransactionSlot>,
    placement: Placement<'_>,
    order: &NewOrder,
) -> Result<Order, StoreOrderError> {
    match (&app.writes, slot) {
        (OrderWrites::SqliteTransaction(store), Some(slot)) => {
            let mut tx = idemgate_sqlite::Tx::begin(store, slot)
                .await
                .map_err(StoreOrderError::SqliteBegin)?;
            Ok(insert_sqlite(&mut tx, placement, order).await?)
        }
        (OrderWrites::PostgresTransaction(store), Some(slot)) => {
            let mut tx = idemgate_postgres::Tx::begin(store, slot)
                .await
                .map_err(StoreOrderError::PostgresBegin)?;
            Ok(insert_postgres(&mut tx, placement, order).await?)
        }
        _ => Ok(app.orders.insert(placement, order).await?),
    }
}

#[derive(Debug, thiserror::Error)]
enum StoreOrderError {
    #[error("could not begin the order transaction")]
    SqliteBegin(#[source] idemgate_sqlite::TxRejection),
    #[error("could not begin the order transaction")]
    PostgresBegin(#[source] idemgate_postgres::TxRejection),
    #[error("order insert failed")]
    Insert(#[from] sqlx::Error),
}

fn created(order: Order) -> Response {
    let location = match &order.client_order_id {
        Some(id) => format!("/api/v1/orders/{id}"),
        None => format!("/api/v1/orders/{}", order.order_id),
    };
    let location = HeaderValue::from_str(&location)
        .unwrap_or_else(|_| HeaderValue::from_static("/api/v1/orders"));
    let mut body = serde_json::json!({
        "order_id": order.order_id,
        "amount": order.amount,
        "currency": order.currency,
        "status": order.status,
    });
    if let Some(id) = &order.client_order_id {
        body["client_order_id"] = serde_json::Value::from(id.as_str());
    }
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(body),
    )
        .into_response()
}

fn invalid_order(error: &InvalidOrder) -> ProblemDetails {
    ProblemDetails::new(
        StatusCode::BAD_REQUEST,
        "invalid-order",
        "Invalid order",
        error.to_string(),
    )
}

/// `GET /api/v1/orders`: the principal's orders, oldest first.
pub(crate) async fn list_orders(
    State(app): State<Arc<OrdersState>>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<serde_json::Value>, ProblemDetails> {
    let orders = app
        .orders
        .list(principal.as_str())
        .await
        .map_err(database_failure)?;
    Ok(Json(serde_json::json!({ "orders": orders })))
}

/// `GET /api/v1/orders/{order_id}`: one of the principal's orders, by the id the
/// client chose for it (`PUT`) or the one the server gave it (`POST`), else 404.
pub(crate) async fn get_order(
    State(app): State<Arc<OrdersState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Order>, ProblemDetails> {
    let by_client_id = match check_client_order_id(&id) {
        Ok(()) => app
            .orders
            .get_by_client_id(principal.as_str(), &id)
            .await
            .map_err(database_failure)?,
        Err(_) => None,
    };
    let found = match (by_client_id, id.parse::<i64>()) {
        (Some(order), _) => Ok(Some(order)),
        (None, Ok(number)) => app.orders.get(principal.as_str(), number).await,
        (None, Err(_)) => Ok(None),
    };
    match found {
        Ok(Some(order)) => Ok(Json(order)),
        Ok(None) => Err(ProblemDetails::new(
            StatusCode::NOT_FOUND,
            "order-not-found",
            "Order not found",
            format!("no order {id}"),
        )),
        Err(error) => Err(database_failure(error)),
    }
}

fn database_failure(error: sqlx::Error) -> ProblemDetails {
    tracing::error!(%error, "orders database failed");
    ProblemDetails::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "database-unavailable",
        "Database unavailable",
        "the orders database could not be reached",
    )
}

/// `/healthz`: ok while the orders database answers.
pub(crate) async fn healthz(
    State(app): State<Arc<OrdersState>>,
) -> Result<Json<serde_json::Value>, ProblemDetails> {
    app.orders.ping().await.map_err(database_failure)?;
    Ok(Json(serde_json::json!({ "status": "ok" })))
}

/// `/metrics`: the Prometheus text, in-flight gauges refreshed first.
pub(crate) async fn render_metrics(State(app): State<Arc<OrdersState>>) -> Response {
    app.tasks.record_gauges();
    crate::monitoring::metrics_response(app.metrics.as_ref())
}
