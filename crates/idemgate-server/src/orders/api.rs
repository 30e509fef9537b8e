//! The orders API's handlers: create, list and read orders, health and metrics.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use idemgate::conditional::{Preconditions, Refusal, Validators};
use idemgate::transaction::TransactionSlot;
use idemgate::{Finality, OperationContext, Principal, ProblemDetails};
use uuid::Uuid;

use crate::orders::db::{OrdersConn, OrdersDb, Placement, insert_postgres, insert_sqlite};
use crate::orders::order::{
    CANCELLED, InvalidOrder, InvalidPatch, NewOrder, Order, OrderChange, OrderPatch,
    check_client_order_id,
};
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
    preconditions: Result<Preconditions, ProblemDetails>,
    operation: Option<Extension<OperationContext>>,
    slot: Option<Extension<TransactionSlot>>,
    body: Bytes,
) -> Response {
    let preconditions = match preconditions {
        Ok(preconditions) => preconditions,
        Err(problem) => return (Finality::Rejected, problem).into_response(),
    };
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
            // `If-None-Match: *` (create only) on an order that exists, or an
            // `If-Match` it no longer matches: 412 with its ETag, nothing done
            // (PROTOCOL §17). A retry of the create itself never gets here: the
            // journal replays its 201 first.
            let current = Validators::etag(existing.etag());
            if let Err(refusal) = preconditions.check(&Method::PUT, Some(&current)) {
                return refusal.into_response();
            }
            let differing = existing.differing_fields(&order);
            if differing.is_empty() {
                return representation(StatusCode::OK, &existing);
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
        Ok(None) => {
            // An `If-Match` names a representation that does not exist: 412.
            if let Err(refusal) = preconditions.check(&Method::PUT, None) {
                return refusal.into_response();
            }
        }
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
    (
        StatusCode::CREATED,
        [
            (header::LOCATION, location),
            (header::ETAG, order.etag().to_header_value()),
        ],
        Json(order.representation()),
    )
        .into_response()
}

/// An order's representation with its `ETag`: what every answer about one
/// order sends, so the tag a client holds is always the digest of the body it
/// read.
fn representation(status: StatusCode, order: &Order) -> Response {
    (
        status,
        [(header::ETAG, order.etag().to_header_value())],
        Json(order.representation()),
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

/// The principal's order a path names: by the id the client chose for it
/// (`PUT`), else by the number the server gave it (`POST`); `None` if there is
/// none (another principal's order is never found).
async fn find_order(
    app: &OrdersState,
    principal: &Principal,
    id: &str,
) -> Result<Option<Order>, sqlx::Error> {
    if check_client_order_id(id).is_ok()
        && let Some(order) = app.orders.get_by_client_id(principal.as_str(), id).await?
    {
        return Ok(Some(order));
    }
    match id.parse::<i64>() {
        Ok(number) => app.orders.get(principal.as_str(), number).await,
        Err(_) => Ok(None),
    }
}

/// `GET /api/v1/orders/{order_id}`: one of the principal's orders (by the id the
/// client chose or the server's number) with its `ETag`, 304 when
/// `If-None-Match` (or `If-Modified-Since`) names it, else 404.
pub(crate) async fn get_order(
    State(app): State<Arc<OrdersState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    preconditions: Preconditions,
) -> Result<Response, ProblemDetails> {
    match find_order(&app, &principal, &id).await {
        Ok(Some(order)) => {
            let validators = Validators::etag(order.etag());
            Ok(match preconditions.check(&Method::GET, Some(&validators)) {
                Ok(()) => representation(StatusCode::OK, &order),
                Err(refusal) => refusal.into_response(),
            })
        }
        Ok(None) => Err(order_not_found(&id)),
        Err(error) => Err(database_failure(error)),
    }
}

fn order_not_found(id: &str) -> ProblemDetails {
    ProblemDetails::new(
        StatusCode::NOT_FOUND,
        "order-not-found",
        "Order not found",
        format!("no order {id}"),
    )
}

/// What a conditional write does to an order.
#[derive(Debug)]
enum Edit {
    /// `PATCH`: a merge patch of the mutable fields.
    Patch(OrderPatch),
    /// `DELETE`: cancel it.
    Cancel,
}

/// `PATCH /api/v1/orders/{id}`: a JSON merge patch (RFC 7396) of `note` and
/// `shipping_address`, `If-Match` required (PROTOCOL §17). Behind the
/// idempotency layer, so a retry of a patch that succeeded replays its 200
/// before its now-stale `If-Match` is looked at.
pub(crate) async fn patch_order(
    State(app): State<Arc<OrdersState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    preconditions: Result<Preconditions, ProblemDetails>,
    slot: Option<Extension<TransactionSlot>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(|essence| essence.trim().to_ascii_lowercase());
    if !matches!(
        content_type.as_deref(),
        Some("application/merge-patch+json" | "application/json")
    ) {
        let problem = ProblemDetails::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-patch",
            "Unsupported patch format",
            "send the patch as application/merge-patch+json (or application/json)",
        );
        return (Finality::Rejected, problem).into_response();
    }
    let patch = match OrderPatch::parse(&body) {
        Ok(patch) => patch,
        Err(error) => return (Finality::Rejected, invalid_patch(&error)).into_response(),
    };
    edit(
        &app,
        &principal,
        &id,
        preconditions,
        slot,
        Method::PATCH,
        Edit::Patch(patch),
    )
    .await
}

/// `DELETE /api/v1/orders/{id}`: cancels the order, `If-Match` required; 200
/// with the cancelled representation (a cancelled order stays readable).
pub(crate) async fn cancel_order(
    State(app): State<Arc<OrdersState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    preconditions: Result<Preconditions, ProblemDetails>,
    slot: Option<Extension<TransactionSlot>>,
) -> Response {
    edit(
        &app,
        &principal,
        &id,
        preconditions,
        slot,
        Method::DELETE,
        Edit::Cancel,
    )
    .await
}

/// The conditional write both methods share: `If-Match` required (428), the
/// current order read and its preconditions evaluated (412 with the current
/// `ETag`), then the change written only if the order is still at the version
/// read (a concurrent writer that won in between makes this one a 412 too).
/// Every refusal is [`Finality::Rejected`]: nothing changed, so the key is free
/// for the client's re-read and retry.
async fn edit(
    app: &OrdersState,
    principal: &Principal,
    named: &str,
    preconditions: Result<Preconditions, ProblemDetails>,
    slot: Option<Extension<TransactionSlot>>,
    method: Method,
    edit: Edit,
) -> Response {
    // The path names the order by its client-chosen id or its number; the
    // write below goes by the number.
    let id = match find_order(app, principal, named).await {
        Ok(Some(order)) => order.order_id,
        Ok(None) => return (Finality::Rejected, order_not_found(named)).into_response(),
        Err(error) => return (Finality::Retryable, database_failure(error)).into_response(),
    };
    let preconditions = match preconditions {
        Ok(preconditions) => preconditions,
        Err(problem) => return (Finality::Rejected, problem).into_response(),
    };
    if let Err(refusal) = preconditions.require_if_match() {
        return refusal.into_response();
    }
    let slot = slot.map(|Extension(slot)| slot);
    let edited = match (&app.writes, slot.as_ref()) {
        (OrderWrites::SqliteTransaction(store), Some(slot)) => {
            match idemgate_sqlite::Tx::begin(store, slot).await {
                Ok(mut tx) => {
                    let mut conn = OrdersConn::Sqlite(&mut tx);
                    write_edit(&mut conn, principal, id, &preconditions, &method, &edit).await
                }
                Err(error) => return tx_failure(app, &error),
            }
        }
        (OrderWrites::PostgresTransaction(store), Some(slot)) => {
            match idemgate_postgres::Tx::begin(store, slot).await {
                Ok(mut tx) => {
                    let mut conn = OrdersConn::Postgres(&mut tx);
                    write_edit(&mut conn, principal, id, &preconditions, &method, &edit).await
                }
                Err(error) => return tx_failure(app, &error),
            }
        }
        _ => match &app.orders {
            OrdersDb::Sqlite(pool) => match pool.acquire().await {
                Ok(mut conn) => {
                    let mut conn = OrdersConn::Sqlite(&mut conn);
                    write_edit(&mut conn, principal, id, &preconditions, &method, &edit).await
                }
                Err(error) => Err(error),
            },
            OrdersDb::Postgres(pool) => match pool.acquire().await {
                Ok(mut conn) => {
                    let mut conn = OrdersConn::Postgres(&mut conn);
                    write_edit(&mut conn, principal, id, &preconditions, &method, &edit).await
                }
                Err(error) => Err(error),
            },
        },
    };
    match edited {
        Ok(Edited::Done(order)) => representation(StatusCode::OK, &order),
        Ok(Edited::NotFound) => (Finality::Rejected, order_not_found(named)).into_response(),
        Ok(Edited::Refused(refusal)) => refusal.into_response(),
        Ok(Edited::Invalid(error)) => (Finality::Rejected, invalid_patch(&error)).into_response(),
        Ok(Edited::Cancelled) => {
            let problem = ProblemDetails::new(
                StatusCode::CONFLICT,
                "order-cancelled",
                "Order cancelled",
                format!("order {named} is cancelled and can no longer change"),
            );
            (Finality::Rejected, problem).into_response()
        }
        // Nothing was written (the update failed or never committed): release,
        // so the retry with the same key runs.
        Err(error) => (Finality::Retryable, database_failure(error)).into_response(),
    }
}

fn tx_failure(app: &OrdersState, error: &dyn std::error::Error) -> Response {
    tracing::error!(%error, "could not begin the order transaction");
    let answer = ProblemDetails::store_unavailable(app.unavailable_retry_after);
    (Finality::Retryable, answer).into_response()
}

/// How a conditional write ended.
#[derive(Debug)]
enum Edited {
    Done(Order),
    NotFound,
    Refused(Refusal),
    Invalid(InvalidPatch),
    Cancelled,
}

async fn write_edit(
    conn: &mut OrdersConn<'_>,
    principal: &Principal,
    id: i64,
    preconditions: &Preconditions,
    method: &Method,
    edit: &Edit,
) -> Result<Edited, sqlx::Error> {
    let principal = principal.as_str();
    let Some(current) = conn.get(principal, id).await? else {
        return Ok(Edited::NotFound);
    };
    let validators = Validators::etag(current.etag());
    if let Err(refusal) = preconditions.check(method, Some(&validators)) {
        return Ok(Edited::Refused(refusal));
    }
    let change = match edit {
        Edit::Cancel if current.status == CANCELLED => return Ok(Edited::Done(current)),
        Edit::Cancel => OrderChange {
            status: CANCELLED.to_owned(),
            ..current.change()
        },
        Edit::Patch(_) if current.status == CANCELLED => return Ok(Edited::Cancelled),
        Edit::Patch(patch) => match patch.apply(&current) {
            Ok(change) => change,
            Err(error) => return Ok(Edited::Invalid(error)),
        },
    };
    if !conn
        .update_if_version(principal, id, current.version, &change)
        .await?
    {
        // Another writer changed it after our read: its If-Match named the
        // version that writer replaced.
        let etag = conn.get(principal, id).await?.map(|order| order.etag());
        return Ok(Edited::Refused(Refusal::PreconditionFailed(etag)));
    }
    Ok(match conn.get(principal, id).await? {
        Some(order) => Edited::Done(order),
        None => Edited::NotFound,
    })
}

fn invalid_patch(error: &InvalidPatch) -> ProblemDetails {
    let problem = ProblemDetails::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid-patch",
        "Invalid patch",
        error.to_string(),
    );
    match error.field() {
        Some(field) => problem.with_member("field", field),
        None => problem,
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
