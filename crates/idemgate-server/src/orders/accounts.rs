//! Accounts and compare-and-set transfers (PROTOCOL §18): `POST
//! /api/v1/accounts`, `GET /api/v1/accounts/{id}`, `POST
//! /api/v1/accounts/{id}/transfers`, and what moved: `GET
//! /api/v1/accounts/{id}/transfers` (newest first, by pages) and `GET
//! /api/v1/transfers/{id}`.
//!
//! Order of work for a transfer: the idempotency layer claims or replays first;
//! then, in the same database transaction as the transfer (the layer's, when
//! the records share the orders database), the debit checks the precondition. A
//! false one is a rejection before anything happened (§8: the claim is undone),
//! 409 `precondition-failed` with the current balance and version, so the client
//! re-reads and retries the same `reference_id`.
//!
//! Keying: the route is keyed by the body's `reference_id` (the layer's
//! `json:/reference_id` key source, PROTOCOL §15), so the client's reference is
//! the idempotency key and no header is needed (an `Idempotency-Key` that
//! differs from it is 400 `ambiguous-key`). Within the record's TTL a used
//! reference with another body is the layer's 422 `key-reused`; the database
//! also keeps `reference_id` unique per debited account, so after the TTL the
//! same transfer answers the one it made and another one is 422
//! `reference-reused` naming the differing fields — never a second debit.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use idemgate::transaction::TransactionSlot;
use idemgate::{Finality, OperationContext, Principal, ProblemDetails};
use serde::Deserialize;
use uuid::Uuid;

use crate::orders::db::{OrdersConn, OrdersDb, OwnTransaction};
use crate::orders::ledger::{self, TransferOutcome, TransferRequest};
use crate::orders::outcome::{self, Outcome};
use crate::orders::{OrderWrites, OrdersState};

/// Why an account or transfer request was refused (400/422, before anything).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    /// Not JSON of the expected shape.
    #[error("the body is not a valid request: {0}")]
    Malformed(String),
    /// A query parameter the route does not take.
    #[error("{0}")]
    Query(String),
    /// A field's value is out of range.
    #[error("{field} {why}")]
    Field {
        /// The field.
        field: &'static str,
        /// What it must be.
        why: &'static str,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewAccount {
    balance: i64,
    currency: String,
}

fn parse_account(body: &[u8]) -> Result<(i64, String), InvalidRequest> {
    let account: NewAccount = serde_json::from_slice(body)
        .map_err(|error| InvalidRequest::Malformed(error.to_string()))?;
    if account.balance < 0 {
        return Err(InvalidRequest::Field {
            field: "balance",
            why: "must not be negative",
        });
    }
    if account.currency.len() != 3 || !account.currency.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(InvalidRequest::Field {
            field: "currency",
            why: "must be a three-letter ISO 4217 code",
        });
    }
    Ok((account.balance, account.currency.to_ascii_uppercase()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TransferBody {
    to: i64,
    amount: i64,
    expected_balance: Option<i64>,
    expected_version: Option<i64>,
    reference_id: String,
}

/// Parses and checks a transfer request from account `from`.
pub fn parse_transfer(from: i64, body: &[u8]) -> Result<TransferRequest, InvalidRequest> {
    let body: TransferBody = serde_json::from_slice(body)
        .map_err(|error| InvalidRequest::Malformed(error.to_string()))?;
    let field = |field, why| Err(InvalidRequest::Field { field, why });
    if body.amount <= 0 {
        return field("amount", "must be positive");
    }
    if body.to == from {
        return field("to", "must be another account");
    }
    if body.reference_id.is_empty() || body.reference_id.len() > 255 {
        return field("reference_id", "must be 1 to 255 bytes");
    }
    if body.expected_balance.is_some_and(|balance| balance < 0) {
        return field("expected_balance", "must not be negative");
    }
    Ok(TransferRequest {
        to: body.to,
        amount: body.amount,
        expected_balance: body.expected_balance,
        expected_version: body.expected_version,
        reference_id: body.reference_id,
    })
}

fn invalid(error: &InvalidRequest) -> Response {
    let problem = ProblemDetails::new(
        StatusCode::BAD_REQUEST,
        "invalid-request",
        "Invalid request",
        error.to_string(),
    );
    let problem = match error {
        InvalidRequest::Field { field, .. } => problem.with_member("field", *field),
        InvalidRequest::Malformed(_) | InvalidRequest::Query(_) => problem,
    };
    // Nothing happened: free the key so the client can fix the body.
    (Finality::Rejected, problem).into_response()
}

fn database_failure(error: &sqlx::Error) -> Response {
    tracing::error!(%error, "accounts database failed");
    let problem = ProblemDetails::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "database-unavailable",
        "Database unavailable",
        "the orders database failed; nothing was changed, retry with the same key",
    )
    .with_retry_after(crate::idempotency::UNAVAILABLE_RETRY_AFTER);
    // Nothing committed (the transaction is rolled back): the retry runs.
    (Finality::Retryable, problem).into_response()
}

/// Runs `$body` with `$conn: &mut OrdersConn` in the layer's transaction when
/// there is one (the layer commits it with the record, or rolls it back), else
/// in a transaction of its own, committed when `$commit(&outcome)` says the
/// outcome wrote. Evaluates to `Result<outcome, Response>`. On PostgreSQL the
/// whole of it is bounded by the store timeout ([`OrdersDb::bounded`]).
macro_rules! in_transaction {
    ($app:expr, $slot:expr, |$conn:ident| $body:expr, $commit:expr) => {{
        let app: &OrdersState = $app;
        let run = async {
            match (&app.writes, $slot) {
                (OrderWrites::SqliteTransaction(store), Some(slot)) => {
                    match idemgate_sqlite::Tx::begin(store, slot).await {
                        Ok(mut tx) => {
                            let $conn = &mut OrdersConn::Sqlite(&mut tx);
                            $body.await.map_err(|error| database_failure(&error))
                        }
                        Err(error) => Err(tx_failure(app, &error)),
                    }
                }
                (OrderWrites::PostgresTransaction(store), Some(slot)) => {
                    match idemgate_postgres::Tx::begin(store, slot).await {
                        Ok(mut tx) => {
                            let $conn = &mut OrdersConn::Postgres(&mut tx);
                            $body.await.map_err(|error| database_failure(&error))
                        }
                        Err(error) => Err(tx_failure(app, &error)),
                    }
                }
                _ => match &app.orders {
                    // In this process's turn to write the file (`SqliteOrders`).
                    OrdersDb::Sqlite(db) => match db.begin_immediate().await {
                        Ok(mut tx) => {
                            let outcome = {
                                let $conn = &mut OrdersConn::Sqlite(&mut tx);
                                $body.await
                            };
                            finish(outcome, tx, $commit).await
                        }
                        Err(error) => Err(database_failure(&error)),
                    },
                    OrdersDb::Postgres(pool) => {
                        match idemgate_sqlx::begin_to_the_end(pool, None).await {
                            Ok(mut tx) => {
                                let outcome = {
                                    let $conn = &mut OrdersConn::Postgres(&mut tx);
                                    $body.await
                                };
                                finish(outcome, tx, $commit).await
                            }
                            Err(error) => Err(database_failure(&error)),
                        }
                    }
                },
            }
        };
        match app.orders.bounded(run).await {
            Ok(outcome) => outcome,
            Err(timed_out) => Err(database_failure(&timed_out.into())),
        }
    }};
}

/// Commits `tx` when the outcome wrote, else rolls it back (by dropping it).
async fn finish<T>(
    outcome: Result<T, sqlx::Error>,
    tx: impl OwnTransaction,
    wrote: impl FnOnce(&T) -> bool,
) -> Result<T, Response> {
    match outcome {
        Ok(outcome) if wrote(&outcome) => match tx.commit().await {
            Ok(()) => Ok(outcome),
            Err(error) => Err(database_failure(&error)),
        },
        Ok(outcome) => Ok(outcome),
        Err(error) => Err(database_failure(&error)),
    }
}

fn tx_failure(app: &OrdersState, error: &dyn std::error::Error) -> Response {
    tracing::error!(%error, "could not begin the accounts transaction");
    let answer = ProblemDetails::store_unavailable(app.unavailable_retry_after);
    (Finality::Retryable, answer).into_response()
}

fn account_not_found(id: i64) -> ProblemDetails {
    ProblemDetails::new(
        StatusCode::NOT_FOUND,
        "account-not-found",
        "Account not found",
        format!("no account {id}"),
    )
}

/// `POST /api/v1/accounts {"balance": 500, "currency": "RUB"}`: 201 with the
/// account at version 1. The answer is recorded by operation id with the
/// account ([`outcome`]), so a run of the same operation after a crash answers
/// the account as it was opened, not as transfers have left it since.
pub(crate) async fn open_account(
    State(app): State<Arc<OrdersState>>,
    Extension(principal): Extension<Principal>,
    operation: Option<Extension<OperationContext>>,
    slot: Option<Extension<TransactionSlot>>,
    body: Bytes,
) -> Response {
    let (balance, currency) = match parse_account(&body) {
        Ok(account) => account,
        Err(error) => return invalid(&error),
    };
    let operation = operation.map(|Extension(op)| op);
    if outcome::may_follow_a_run(operation.as_ref())
        && let Some(op) = &operation
    {
        let operation_id = op.operation_id.as_uuid();
        let earlier = app
            .orders
            .on_connection(async |conn| outcome::find(conn, operation_id, principal.as_str()).await)
            .await;
        match earlier {
            Ok(Some(earlier)) => return opened(&earlier),
            Ok(None) => {}
            Err(error) => return database_failure(&error),
        }
    }
    let keyed = operation.is_some();
    let operation_id = operation.map_or_else(Uuid::new_v4, |op| op.operation_id.as_uuid());
    let slot = slot.as_ref().map(|Extension(slot)| slot);
    let retention = app.outcome_retention;
    let opened_now = in_transaction!(
        &app,
        slot,
        |conn| open_recorded(
            conn,
            principal.as_str(),
            operation_id,
            keyed,
            (balance, &currency),
            retention
        ),
        |_: &Outcome| true
    );
    match opened_now {
        Ok(answer) => opened(&answer),
        Err(response) => response,
    }
}

/// Opens the account and, for a keyed request, records the answer in the
/// same transaction; a second run of the operation answers the recorded one.
async fn open_recorded(
    conn: &mut OrdersConn<'_>,
    principal: &str,
    operation_id: Uuid,
    keyed: bool,
    (balance, currency): (i64, &str),
    retention: std::time::Duration,
) -> Result<Outcome, sqlx::Error> {
    let (account, inserted) =
        ledger::open(conn, principal, operation_id, balance, currency).await?;
    if !inserted && let Some(earlier) = outcome::find(conn, operation_id, principal).await? {
        return Ok(earlier);
    }
    let answer = Outcome {
        status: StatusCode::CREATED,
        body: serde_json::to_string(&account)
            .map_err(|error| sqlx::Error::Encode(Box::new(error)))?,
    };
    if keyed && inserted {
        outcome::record(conn, operation_id, principal, &answer, retention).await?;
    }
    Ok(answer)
}

/// The answer of an account's opening: its status and body as recorded, with
/// the account's `Location`.
fn opened(answer: &Outcome) -> Response {
    let id = answer
        .json()
        .ok()
        .and_then(|account| account["account_id"].as_i64());
    let location = id
        .and_then(|id| HeaderValue::from_str(&format!("/api/v1/accounts/{id}")).ok())
        .unwrap_or_else(|| HeaderValue::from_static("/api/v1/accounts"));
    (
        answer.status,
        [
            (header::LOCATION, location),
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
        ],
        answer.body.clone(),
    )
        .into_response()
}

/// `GET /api/v1/accounts/{id}`: one of the principal's accounts.
pub(crate) async fn get_account(
    State(app): State<Arc<OrdersState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<i64>,
) -> Response {
    let read = app
        .orders
        .on_connection(async |conn| ledger::get(conn, Some(principal.as_str()), id).await)
        .await;
    match read {
        Ok(Some(account)) => Json(account).into_response(),
        Ok(None) => account_not_found(id).into_response(),
        Err(error) => database_failure(&error),
    }
}

/// How many transfers a page holds when the request does not say.
pub const DEFAULT_PAGE: i64 = 50;
/// The most transfers one page holds (`limit`).
pub const MAX_PAGE: i64 = 100;

/// A page of an account's transfers, as the query asks: `limit` (1 to
/// [`MAX_PAGE`], default [`DEFAULT_PAGE`]) and `before` (a transfer id: only
/// older ones). Any other parameter, or one given twice, is refused.
fn parse_page(pairs: &[(String, String)]) -> Result<(i64, Option<i64>), InvalidRequest> {
    let (mut limit, mut before) = (None, None);
    for (name, value) in pairs {
        let (slot, field, why) = match name.as_str() {
            "limit" => (&mut limit, "limit", "must be an integer from 1 to 100"),
            "before" => (&mut before, "before", "must be a transfer id"),
            _ => {
                return Err(InvalidRequest::Query(format!(
                    "unknown query parameter {name:?}; expected limit and before"
                )));
            }
        };
        if slot.is_some() {
            return Err(InvalidRequest::Field {
                field,
                why: "must be given once",
            });
        }
        *slot = Some(
            value
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 1 && (field != "limit" || *n <= MAX_PAGE))
                .ok_or(InvalidRequest::Field { field, why })?,
        );
    }
    Ok((limit.unwrap_or(DEFAULT_PAGE), before))
}

/// `GET /api/v1/accounts/{id}/transfers?limit=50&before=ID`: the transfers
/// from and to one of the principal's accounts, newest first, `{"transfers":
/// [...], "next_before": ID | null}` — pass `next_before` as `before` for the
/// next page (keyset paging: transfers made meanwhile never shift a page). Each
/// transfer is `{transfer_id, from, to, amount}`, with the debited account's
/// `balance` after it and its `reference_id` when the principal holds that
/// account. Another principal's account is 404, as `GET /api/v1/accounts/{id}`.
pub(crate) async fn list_transfers(
    State(app): State<Arc<OrdersState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<i64>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let (limit, before) = match parse_page(&query) {
        Ok(page) => page,
        Err(error) => return invalid(&error),
    };
    let principal = principal.as_str();
    let read = app
        .orders
        .on_connection(async |conn| {
            if ledger::get(conn, Some(principal), id).await?.is_none() {
                return Ok(None);
            }
            // One more than the page: whether there is a next one.
            let mut page =
                ledger::account_transfers(conn, principal, id, before, limit + 1).await?;
            let more = page.len() > limit as usize;
            page.truncate(limit as usize);
            Ok(Some((page, more)))
        })
        .await;
    match read {
        Ok(Some((page, more))) => {
            let next_before = page.last().filter(|_| more).map(|last| last.transfer_id);
            Json(serde_json::json!({ "transfers": page, "next_before": next_before }))
                .into_response()
        }
        Ok(None) => account_not_found(id).into_response(),
        Err(error) => database_failure(&error),
    }
}

/// `GET /api/v1/transfers/{id}`: one transfer, in the shape of the list's, if
/// the principal holds its debited or its credited account; else 404
/// `transfer-not-found` (another principal's transfer is never revealed).
pub(crate) async fn get_transfer(
    State(app): State<Arc<OrdersState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<i64>,
) -> Response {
    let read = app
        .orders
        .on_connection(async |conn| ledger::transfer_by_id(conn, principal.as_str(), id).await)
        .await;
    match read {
        Ok(Some(transfer)) => Json(transfer).into_response(),
        Ok(None) => ProblemDetails::new(
            StatusCode::NOT_FOUND,
            "transfer-not-found",
            "Transfer not found",
            format!("no transfer {id}"),
        )
        .into_response(),
        Err(error) => database_failure(&error),
    }
}

/// `POST /api/v1/accounts/{id}/transfers`: 201 `{transfer_id, from, to,
/// amount, balance}`; a false `expected_balance` / `expected_version` → 409
/// `precondition-failed` with the current `balance` and `version`, undone.
pub(crate) async fn create_transfer(
    State(app): State<Arc<OrdersState>>,
    Extension(principal): Extension<Principal>,
    Path(from): Path<i64>,
    slot: Option<Extension<TransactionSlot>>,
    body: Bytes,
) -> Response {
    let request = match parse_transfer(from, &body) {
        Ok(request) => request,
        Err(error) => return invalid(&error),
    };
    let slot = slot.as_ref().map(|Extension(slot)| slot);
    let outcome = in_transaction!(
        &app,
        slot,
        |conn| ledger::transfer(conn, principal.as_str(), from, &request),
        |outcome: &TransferOutcome| matches!(outcome, TransferOutcome::Applied(_))
    );
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(response) => return response,
    };
    let refused = |problem: ProblemDetails| (Finality::Rejected, problem).into_response();
    match outcome {
        TransferOutcome::Applied(transfer) | TransferOutcome::Existing(transfer) => {
            (StatusCode::CREATED, Json(transfer)).into_response()
        }
        TransferOutcome::PreconditionFailed(account) => refused(
            ProblemDetails::new(
                StatusCode::CONFLICT,
                "precondition-failed",
                "Precondition failed",
                "the account's balance or version is no longer the expected one; nothing was transferred: read it again and retry the same reference_id",
            )
            .with_member("balance", account.balance)
            .with_member("version", account.version),
        ),
        TransferOutcome::Insufficient(account) => refused(
            ProblemDetails::new(
                StatusCode::CONFLICT,
                "insufficient-funds",
                "Insufficient funds",
                format!("the account holds {} and cannot send {}", account.balance, request.amount),
            )
            .with_member("balance", account.balance)
            .with_member("version", account.version),
        ),
        TransferOutcome::ReferenceReused(fields) => refused(
            ProblemDetails::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "reference-reused",
                "reference_id reused with a different transfer",
                format!(
                    "reference_id {:?} was used for a transfer with another {}",
                    request.reference_id,
                    fields.join(" and ")
                ),
            )
            // The pointers as a 422 within the record's TTL names them
            // (`differing`, PROTOCOL §6): one answer on either side of it.
            .with_member("differing", pointers(&fields))
            .with_member("differing_complete", true)
            .with_member("fields", fields),
        ),
        TransferOutcome::NoSource => refused(account_not_found(from)),
        TransferOutcome::NoTarget => refused(
            ProblemDetails::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-request",
                "Invalid request",
                format!("to: no account {}", request.to),
            )
            .with_member("field", "to"),
        ),
        TransferOutcome::CurrencyMismatch => refused(
            ProblemDetails::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-request",
                "Invalid request",
                "to: the account holds another currency",
            )
            .with_member("field", "to"),
        ),
    }
}

/// Top-level body fields as the JSON pointers a `key-reused` 422 lists.
pub(crate) fn pointers(fields: &[&str]) -> Vec<String> {
    fields.iter().map(|field| format!("/{field}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_transfer_and_names_the_broken_field() {
        let ok = parse_transfer(
            1,
            br#"{"to":2,"amount":100,"expected_balance":500,"reference_id":"tx_789"}"#,
        )
        .unwrap();
        assert_eq!(ok.expected_balance, Some(500));
        assert_eq!(ok.expected_version, None);
        let cases = [
            (r#"{"to":2,"amount":0,"reference_id":"r"}"#, "amount"),
            (r#"{"to":1,"amount":5,"reference_id":"r"}"#, "to"),
            (r#"{"to":2,"amount":5,"reference_id":""}"#, "reference_id"),
            (
                r#"{"to":2,"amount":5,"reference_id":"r","expected_balance":-1}"#,
                "expected_balance",
            ),
        ];
        for (body, expected) in cases {
            match parse_transfer(1, body.as_bytes()) {
                Err(InvalidRequest::Field { field, .. }) => assert_eq!(field, expected, "{body}"),
                other => panic!("{body}: {other:?}"),
            }
        }
        assert!(matches!(
            parse_transfer(1, br#"{"to":2,"amount":5}"#),
            Err(InvalidRequest::Malformed(_))
        ));
        assert!(matches!(
            parse_account(br#"{"balance":-1,"currency":"RUB"}"#),
            Err(InvalidRequest::Field {
                field: "balance",
                ..
            })
        ));
        assert_eq!(
            parse_account(br#"{"balance":500,"currency":"rub"}"#).unwrap(),
            (500, "RUB".to_owned())
        );
    }
}
