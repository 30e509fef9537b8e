//! The HTTP API: routes, authentication, and the orders handlers.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use idemgate::transaction::TransactionSlot;
use idemgate::{
    DetachedTasks, Finality, IdempotencyLayer, OperationContext, Principal, ProblemDetails,
};
use metrics_exporter_prometheus::PrometheusHandle;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::gateway::{ChargeOutcome, ChargeRequest, Gateway};
use crate::orders::{InvalidOrder, NewOrder, Order};
use crate::repository::{OrdersDb, Placement, insert_postgres, insert_sqlite};

/// How the orders handler writes its order.
#[derive(Clone, Debug)]
pub enum OrderWrites {
    /// In the idempotency layer's transaction (SQLite): the order and the
    /// `COMPLETED` record commit together.
    SqliteTransaction(idemgate_sqlite::SqliteStore),
    /// The same on PostgreSQL.
    PostgresTransaction(idemgate_postgres::PostgresStore),
    /// Straight to the orders database, keyed by operation id (the idempotency
    /// records live elsewhere: memory or Redis).
    Direct,
}

/// What handlers share.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Orders storage.
    pub orders: OrdersDb,
    /// How orders are written.
    pub writes: OrderWrites,
    /// The payment gateway.
    pub gateway: Gateway,
    /// Renders `/metrics`; `None` when no recorder is installed.
    pub metrics: Option<PrometheusHandle>,
    /// The idempotency layer's detached handlers (for the in-flight gauges).
    pub tasks: DetachedTasks,
    /// The `Retry-After` of a 503 for an order that could not be stored: the one
    /// the idempotency layer sends for its store (`with_unavailable_retry_after`).
    pub unavailable_retry_after: Duration,
}

/// The whole service: `/api/v1/orders` behind bearer authentication and the
/// idempotency layer, plus `/healthz` and `/metrics`.
pub fn app(state: AppState, idempotency: IdempotencyLayer) -> Router {
    routes(state, Some(idempotency))
}

/// The same routes and handlers with no idempotency layer: the `bare` baseline
/// `idemgate-bench` measures the layer against (the hidden `--no-idempotency`).
/// Handlers then get no operation and no transaction slot, so orders are written
/// directly. Never for production: a retried POST charges and stores twice.
pub fn app_without_idempotency(state: AppState) -> Router {
    routes(state, None)
}

fn routes(state: AppState, idempotency: Option<IdempotencyLayer>) -> Router {
    let mut api = Router::new()
        .route("/api/v1/orders", get(list_orders).post(create_order))
        .route("/api/v1/orders/{id}", get(get_order));
    if let Some(idempotency) = idempotency {
        // Route layers: only matched routes reach them, so 404/405 are not stored.
        api = api.route_layer(idempotency);
    }
    let api = api.route_layer(middleware::from_fn(authenticate));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(render_metrics))
        .merge(crate::demo::routes())
        .merge(api)
        .with_state(Arc::new(state))
}

/// `Authorization: Bearer <token>`: the token names the principal; only its
/// SHA-256 is kept. Missing or empty → 401, two `Authorization` lines → 400
/// `ambiguous-header`, both before the idempotency layer.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let mut lines = request.headers().get_all(header::AUTHORIZATION).iter();
    let (first, second) = (lines.next(), lines.next());
    if second.is_some() {
        // Which credentials are meant is ambiguous: refused before any claim.
        return ProblemDetails::ambiguous_header(&header::AUTHORIZATION).into_response();
    }
    let token = first
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|token| !token.is_empty());
    let Some(token) = token else {
        return ProblemDetails::unauthenticated("send Authorization: Bearer <token>")
            .into_response();
    };
    let principal = bearer_principal(token);
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// The principal of a bearer token: `bearer:` and the token's SHA-256 in hex, so
/// the token itself is never stored (and `idemgate keys --bearer` finds its keys).
pub fn bearer_principal(token: &str) -> Principal {
    Principal::new(format!(
        "bearer:{}",
        hex::encode(Sha256::digest(token.as_bytes()))
    ))
}

async fn create_order(
    State(app): State<Arc<AppState>>,
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
    };
    // Without a key there is no record to commit with the order, so it is written
    // directly, as in the memory and Redis modes: a transaction would only add a
    // BEGIN and a COMMIT round trip and, on SQLite, hold the one write lock across
    // the insert and its read-back.
    let slot = slot
        .map(|Extension(slot)| slot)
        .filter(|_| operation.is_some());
    match store_order(&app, slot.as_ref(), placement, &order).await {
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
    app: &AppState,
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
    let location = HeaderValue::from_str(&format!("/api/v1/orders/{}", order.order_id))
        .unwrap_or_else(|_| HeaderValue::from_static("/api/v1/orders"));
    let body = serde_json::json!({
        "order_id": order.order_id,
        "amount": order.amount,
        "currency": order.currency,
        "status": order.status,
    });
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

async fn list_orders(
    State(app): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<serde_json::Value>, ProblemDetails> {
    let orders = app
        .orders
        .list(principal.as_str())
        .await
        .map_err(database_failure)?;
    Ok(Json(serde_json::json!({ "orders": orders })))
}

async fn get_order(
    State(app): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<i64>,
) -> Result<Json<Order>, ProblemDetails> {
    match app.orders.get(principal.as_str(), id).await {
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

async fn healthz(
    State(app): State<Arc<AppState>>,
) -> Result<Json<serde_json::Value>, ProblemDetails> {
    app.orders.ping().await.map_err(database_failure)?;
    Ok(Json(serde_json::json!({ "status": "ok" })))
}

async fn render_metrics(State(app): State<Arc<AppState>>) -> Response {
    app.tasks.record_gauges();
    crate::runtime::metrics_response(app.metrics.as_ref())
}
