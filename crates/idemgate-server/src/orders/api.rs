//! The orders API's handlers: create, list and read orders, health and metrics.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use idemgate::conditional::{EntityTag, Preconditions, Refusal, Validators};
use idemgate::transaction::TransactionSlot;
use idemgate::{Finality, OperationContext, Principal, ProblemDetails};
use idemgate_sqlx::begin_to_the_end;
use uuid::Uuid;

use crate::orders::db::{
    OrdersConn, OrdersDb, OwnTransaction, Placement, insert_postgres, insert_sqlite,
};
use crate::orders::failure::{database_failure, tx_failure};
use crate::orders::fault::EditFault;
use crate::orders::order::{
    CANCELLED, InvalidOrder, InvalidPatch, NewOrder, Order, OrderChange, OrderPatch,
    check_client_order_id,
};
use crate::orders::outcome::{self, Outcome};
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
    // A run after a crash or a release: the order this operation created, as
    // created — never the preconditions evaluated against it (an `If-None-Match:
    // *` would now be false).
    if let Some(answer) = earlier_create(&app, operation.as_ref().map(|Extension(op)| op)).await {
        return answer;
    }
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
            )
            .with_member("differing", super::accounts::pointers(&differing))
            .with_member("differing_complete", true);
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
    // A run after a crash or a release whose first run stored the order: its
    // answer, with no second charge.
    if let Some(answer) = earlier_create(app, operation.as_ref()).await {
        return answer;
    }
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
    let stored = app
        .orders
        .bounded(store_order(app, slot.as_ref(), placement, order))
        .await
        .unwrap_or_else(|timed_out| Err(StoreOrderError::Insert(timed_out.into())));
    match stored {
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

/// When this run may follow an earlier run of its operation (a takeover or a
/// release): the order that run created, answered as its create answered it
/// (`None`: there is none, or this is the operation's first run). A failed read
/// is `None` too: the run goes on, and its insert, keyed by the operation id,
/// finds that order again.
async fn earlier_create(
    app: &OrdersState,
    operation: Option<&OperationContext>,
) -> Option<Response> {
    let operation = operation.filter(|op| outcome::may_follow_a_run(Some(op)))?;
    let earlier = app
        .orders
        .bounded(app.orders.by_operation(operation.operation_id.as_uuid()))
        .await
        .unwrap_or_else(|timed_out| Err(timed_out.into()));
    match earlier {
        Ok(order) => order.map(|order| created(order.as_created())),
        Err(error) => {
            tracing::warn!(%error, "reading the order of an earlier run failed; running again");
            None
        }
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
#[allow(clippy::too_many_arguments)] // axum extractors, one per argument
pub(crate) async fn patch_order(
    State(app): State<Arc<OrdersState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    preconditions: Result<Preconditions, ProblemDetails>,
    operation: Option<Extension<OperationContext>>,
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
        operation.map(|Extension(op)| op),
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
    operation: Option<Extension<OperationContext>>,
    slot: Option<Extension<TransactionSlot>>,
) -> Response {
    edit(
        &app,
        &principal,
        &id,
        preconditions,
        operation.map(|Extension(op)| op),
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
///
/// With a key, the write and its answer commit together: the answer is
/// recorded by operation id ([`outcome`]), in the layer's transaction when it
/// lends one, else in a transaction of the edit's own. A run of the same
/// operation after a crash between that commit and the record's completion (a
/// takeover, or a release) answers the recorded 200 — the order as that write
/// left it, its `ETag` — before any precondition is looked at (PROTOCOL §17:
/// the journal comes first), and again instead of a refusal, in case the first
/// run committed while this one read.
#[allow(clippy::too_many_arguments)] // the two handlers' extractors, passed on
async fn edit(
    app: &OrdersState,
    principal: &Principal,
    named: &str,
    preconditions: Result<Preconditions, ProblemDetails>,
    operation: Option<OperationContext>,
    slot: Option<Extension<TransactionSlot>>,
    method: Method,
    edit: Edit,
) -> Response {
    let follows_a_run = outcome::may_follow_a_run(operation.as_ref());
    let operation_id = operation.as_ref().map(|op| op.operation_id.as_uuid());
    if let (true, Some(operation_id)) = (follows_a_run, operation_id) {
        match earlier_edit(app, principal, operation_id).await {
            Ok(Some(answer)) => return answer,
            Ok(None) => {}
            Err(error) => return (Finality::Retryable, database_failure(error)).into_response(),
        }
    }
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
    let write = EditWrite {
        principal: principal.as_str(),
        id,
        preconditions: &preconditions,
        method: &method,
        edit: &edit,
        record: operation_id.map(|operation_id| (operation_id, app.outcome_retention)),
    };
    let slot = slot.map(|Extension(slot)| slot);
    // `Err(answer)`: the layer's transaction could not begin.
    let edit = async {
        match (&app.writes, slot.as_ref()) {
            // The layer commits its transaction with the record.
            (OrderWrites::SqliteTransaction(store), Some(slot)) => {
                match idemgate_sqlite::Tx::begin(store, slot).await {
                    Ok(mut tx) => Ok(write.run(&mut OrdersConn::Sqlite(&mut tx)).await),
                    Err(error) => Err(tx_failure(app, &error)),
                }
            }
            (OrderWrites::PostgresTransaction(store), Some(slot)) => {
                match idemgate_postgres::Tx::begin(store, slot).await {
                    Ok(mut tx) => Ok(write.run(&mut OrdersConn::Postgres(&mut tx)).await),
                    Err(error) => Err(tx_failure(app, &error)),
                }
            }
            // A transaction of the edit's own: the change and its recorded answer
            // commit together. IMMEDIATE on SQLite: the write lock from the start,
            // so the read before the write cannot fail to upgrade.
            _ => Ok(match &app.orders {
                OrdersDb::Sqlite(db) => match db.begin_immediate().await {
                    Ok(mut tx) => {
                        let edited = write.run(&mut OrdersConn::Sqlite(&mut tx)).await;
                        commit_if_done(edited, tx).await
                    }
                    Err(error) => Err(error),
                },
                OrdersDb::Postgres(pool) => match begin_to_the_end(pool, None).await {
                    Ok(mut tx) => {
                        let edited = write.run(&mut OrdersConn::Postgres(&mut tx)).await;
                        commit_if_done(edited, tx).await
                    }
                    Err(error) => Err(error),
                },
            }),
        }
    };
    let edited = match app.orders.bounded(edit).await {
        Ok(Ok(edited)) => edited,
        Ok(Err(answer)) => return answer,
        Err(timed_out) => Err(timed_out.into()),
    };
    if matches!(edited, Ok(Edited::Done(_)))
        && let Some(answer) = EditFault::strike(app.edit_fault).await
    {
        return answer;
    }
    let refused = matches!(edited, Ok(ref edited) if !matches!(edited, Edited::Done(_)));
    if let (true, true, Some(operation_id)) = (refused, follows_a_run, operation_id)
        && let Ok(Some(answer)) = earlier_edit(app, principal, operation_id).await
    {
        // The first run committed while this one read: its answer.
        return answer;
    }
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
        // Nothing was written (the update failed or never committed), or the
        // commit's outcome is unknown: release, so the retry with the same key
        // runs again — and finds this run's recorded answer if it landed.
        Err(error) => (Finality::Retryable, database_failure(error)).into_response(),
    }
}

/// What an earlier run of this edit's operation answered, if it wrote.
async fn earlier_edit(
    app: &OrdersState,
    principal: &Principal,
    operation_id: Uuid,
) -> Result<Option<Response>, sqlx::Error> {
    let found = app
        .orders
        .on_connection(async |conn| outcome::find(conn, operation_id, principal.as_str()).await)
        .await?;
    found.map(|outcome| recorded_order(&outcome)).transpose()
}

/// A recorded answer about one order, as it was sent: its status, its body
/// byte for byte, the `ETag` of that body.
fn recorded_order(outcome: &Outcome) -> Result<Response, sqlx::Error> {
    let etag = EntityTag::of_json(&outcome.json()?);
    Ok((
        outcome.status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::ETAG, etag.to_header_value()),
        ],
        outcome.body.clone(),
    )
        .into_response())
}

/// Commits the edit's own transaction when it changed the order, else rolls
/// it back (by dropping it).
async fn commit_if_done(
    edited: Result<Edited, sqlx::Error>,
    tx: impl OwnTransaction,
) -> Result<Edited, sqlx::Error> {
    match edited {
        Ok(Edited::Done(order)) => tx.commit().await.map(|()| Edited::Done(order)),
        other => other,
    }
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

/// One conditional write, on whichever connection runs it.
struct EditWrite<'a> {
    principal: &'a str,
    id: i64,
    preconditions: &'a Preconditions,
    method: &'a Method,
    edit: &'a Edit,
    /// The operation to record the answer under, and how long to keep it;
    /// `None` without a key.
    record: Option<(Uuid, std::time::Duration)>,
}

impl EditWrite<'_> {
    async fn run(&self, conn: &mut OrdersConn<'_>) -> Result<Edited, sqlx::Error> {
        let (principal, id) = (self.principal, self.id);
        let Some(current) = conn.get(principal, id).await? else {
            return Ok(Edited::NotFound);
        };
        let validators = Validators::etag(current.etag());
        if let Err(refusal) = self.preconditions.check(self.method, Some(&validators)) {
            return Ok(Edited::Refused(refusal));
        }
        let change = match self.edit {
            // Nothing to write, and nothing to record: evaluated again, a
            // cancelled order (which never changes) answers the same.
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
        let Some(order) = conn.get(principal, id).await? else {
            return Ok(Edited::NotFound);
        };
        if let Some((operation_id, retention)) = self.record {
            let answer = Outcome {
                status: StatusCode::OK,
                body: order.representation().to_string(),
            };
            outcome::record(conn, operation_id, principal, &answer, retention).await?;
        }
        Ok(Edited::Done(order))
    }
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
