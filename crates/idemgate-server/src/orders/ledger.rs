//! Accounts and transfers in the orders database (PROTOCOL §18): the balance
//! moves only by a transfer whose precondition (`expected_balance`,
//! `expected_version`) and funds are checked by the debit itself, one
//! compare-and-set `UPDATE`, inside the transaction that records the transfer.
//!
//! The ledger's schema is its own migration, `0002_ledger.sql` in
//! `migrations/orders/{sqlite,postgres}/`; its statements are here, each as one
//! `Dialects` with SQLite's and PostgreSQL's text side by side.

use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::orders::db::{Dialects, OrdersConn, on_dialect};

/// An account, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Account {
    /// Its id.
    pub account_id: i64,
    /// In minor units; never negative (a `CHECK`, and the debit's condition).
    pub balance: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// 1 when opened, incremented by every debit and credit.
    pub version: i64,
}

/// A transfer, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Transfer {
    /// Its id.
    pub transfer_id: i64,
    /// The debited account.
    pub from: i64,
    /// The credited account.
    pub to: i64,
    /// In minor units.
    pub amount: i64,
    /// The debited account's balance right after this transfer.
    pub balance: i64,
}

/// A transfer as its accounts' holders read it (`GET
/// /api/v1/accounts/{id}/transfers`, `GET /api/v1/transfers/{id}`): what moved,
/// and, for the holder of the debited account only, the reference it was sent
/// under and that account's balance right after it — the credited side never
/// sees the sender's balance or reference.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TransferView {
    /// Its id.
    pub transfer_id: i64,
    /// The debited account.
    pub from: i64,
    /// The credited account.
    pub to: i64,
    /// In minor units.
    pub amount: i64,
    /// The debited account's balance right after this transfer (its holder only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balance: Option<i64>,
    /// The client's reference (the debited account's holder only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference_id: Option<String>,
}

/// The columns a [`TransferView`] is read from, `sent` saying whether the
/// reader holds the debited account.
macro_rules! transfer_view_columns {
    () => {
        "t.id, t.from_account, t.to_account, t.amount, t.reference_id, t.balance_after, "
    };
}

/// An account's transfers, both ways, newest first: those before a transfer
/// id (`NULL`: from the newest), at most a number. The reader holds the
/// account (the caller checked).
const ACCOUNT_TRANSFERS: Dialects = Dialects {
    sqlite: concat!(
        "SELECT ",
        transfer_view_columns!(),
        "(f.principal = ?2) AS sent FROM transfers t JOIN accounts f ON f.id = t.from_account
         WHERE (t.from_account = ?1 OR t.to_account = ?1) AND (?3 IS NULL OR t.id < ?3)
         ORDER BY t.id DESC LIMIT ?4"
    ),
    postgres: concat!(
        "SELECT ",
        transfer_view_columns!(),
        "(f.principal = $2) AS sent FROM transfers t JOIN accounts f ON f.id = t.from_account
         WHERE (t.from_account = $1 OR t.to_account = $1) AND ($3::BIGINT IS NULL OR t.id < $3)
         ORDER BY t.id DESC LIMIT $4"
    ),
};

/// One transfer, if the reader holds one of its two accounts.
const TRANSFER: Dialects = Dialects {
    sqlite: concat!(
        "SELECT ",
        transfer_view_columns!(),
        "(f.principal = ?2) AS sent FROM transfers t
         JOIN accounts f ON f.id = t.from_account JOIN accounts r ON r.id = t.to_account
         WHERE t.id = ?1 AND (f.principal = ?2 OR r.principal = ?2)"
    ),
    postgres: concat!(
        "SELECT ",
        transfer_view_columns!(),
        "(f.principal = $2) AS sent FROM transfers t
         JOIN accounts f ON f.id = t.from_account JOIN accounts r ON r.id = t.to_account
         WHERE t.id = $1 AND (f.principal = $2 OR r.principal = $2)"
    ),
};

/// A [`TransferView`] from a row of either database.
fn transfer_view<R: Row>(row: &R) -> Result<TransferView, sqlx::Error>
where
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> &'r str: Decode<'r, R::Database> + Type<R::Database>,
{
    let sent: bool = row.try_get("sent")?;
    Ok(TransferView {
        transfer_id: row.try_get("id")?,
        from: row.try_get("from_account")?,
        to: row.try_get("to_account")?,
        amount: row.try_get("amount")?,
        balance: sent.then(|| row.try_get("balance_after")).transpose()?,
        reference_id: sent
            .then(|| row.try_get::<&str, _>("reference_id").map(str::to_owned))
            .transpose()?,
    })
}

/// Up to `limit` of account `account`'s transfers (debits and credits), newest
/// first, those older than transfer `before` when given; as `principal`, who
/// holds the account, reads them.
pub(crate) async fn account_transfers(
    conn: &mut OrdersConn<'_>,
    principal: &str,
    account: i64,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<TransferView>, sqlx::Error> {
    on_dialect!(conn, sqlx::query, ACCOUNT_TRANSFERS, |query, on| query
        .bind(account)
        .bind(principal)
        .bind(before)
        .bind(limit)
        .fetch_all(on)
        .await?
        .iter()
        .map(transfer_view)
        .collect())
}

/// Transfer `id`, if `principal` holds its debited or its credited account.
pub(crate) async fn transfer_by_id(
    conn: &mut OrdersConn<'_>,
    principal: &str,
    id: i64,
) -> Result<Option<TransferView>, sqlx::Error> {
    on_dialect!(conn, sqlx::query, TRANSFER, |query, on| query
        .bind(id)
        .bind(principal)
        .fetch_optional(on)
        .await?
        .as_ref()
        .map(transfer_view)
        .transpose())
}

/// What a transfer asks for, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferRequest {
    /// The credited account.
    pub to: i64,
    /// Positive, minor units.
    pub amount: i64,
    /// Apply only if the debited balance is still this.
    pub expected_balance: Option<i64>,
    /// Apply only if the debited account is still at this version.
    pub expected_version: Option<i64>,
    /// The client's reference, unique per debited account.
    pub reference_id: String,
}

/// How a transfer ended. Only `Applied` wrote anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferOutcome {
    /// Debited, credited, recorded.
    Applied(Transfer),
    /// This reference already moved this amount to this account: that transfer.
    Existing(Transfer),
    /// This reference was used with another request: the fields that differ.
    ReferenceReused(Vec<&'static str>),
    /// No such account of the principal's.
    NoSource,
    /// No such account to credit.
    NoTarget,
    /// The credited account holds another currency.
    CurrencyMismatch,
    /// `expected_balance` / `expected_version` is false: the current account.
    PreconditionFailed(Account),
    /// Not enough funds: the current account.
    Insufficient(Account),
}

/// An account from a row of either database.
fn account<R: Row>(row: &R) -> Result<Account, sqlx::Error>
where
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> &'r str: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(Account {
        account_id: row.try_get("id")?,
        balance: row.try_get("balance")?,
        currency: row.try_get::<&str, _>("currency")?.to_owned(),
        version: row.try_get("version")?,
    })
}

/// A new account, nothing if its operation already opened one. The operation
/// id is bound as text: SQLite's column holds text, PostgreSQL's a UUID.
const OPEN: Dialects = Dialects {
    sqlite: "INSERT INTO accounts (operation_id, principal, balance, currency) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (operation_id) DO NOTHING",
    postgres: "INSERT INTO accounts (operation_id, principal, balance, currency) VALUES ($1::uuid, $2, $3, $4)
         ON CONFLICT (operation_id) DO NOTHING",
};

/// The account an operation opened.
const BY_OPERATION: Dialects = Dialects {
    sqlite: "SELECT id, balance, currency, version FROM accounts WHERE operation_id = ?1",
    postgres: "SELECT id, balance, currency, version FROM accounts WHERE operation_id = $1::uuid",
};

/// An account, if it is the principal's (any principal's when the principal
/// is `NULL`).
const GET: Dialects = Dialects {
    sqlite: "SELECT id, balance, currency, version FROM accounts
         WHERE id = ?1 AND (?2 IS NULL OR principal = ?2)",
    postgres: "SELECT id, balance, currency, version FROM accounts
         WHERE id = $1 AND ($2::TEXT IS NULL OR principal = $2)",
};

/// The transfer a reference made from an account.
const EXISTING: Dialects = Dialects {
    sqlite: "SELECT id, to_account, amount, balance_after FROM transfers
         WHERE from_account = ?1 AND reference_id = ?2",
    postgres: "SELECT id, to_account, amount, balance_after FROM transfers
         WHERE from_account = $1 AND reference_id = $2",
};

/// The compare-and-set debit: the new balance, no row when the funds or the
/// precondition (`NULL`: none) do not hold.
const DEBIT: Dialects = Dialects {
    sqlite: "UPDATE accounts SET balance = balance - ?1, version = version + 1
         WHERE id = ?2 AND balance >= ?1
           AND (?3 IS NULL OR balance = ?3) AND (?4 IS NULL OR version = ?4)
         RETURNING balance",
    postgres: "UPDATE accounts SET balance = balance - $1, version = version + 1
         WHERE id = $2 AND balance >= $1
           AND ($3::BIGINT IS NULL OR balance = $3) AND ($4::BIGINT IS NULL OR version = $4)
         RETURNING balance",
};

/// The credit of a transfer.
const CREDIT: Dialects = Dialects {
    sqlite: "UPDATE accounts SET balance = balance + ?1, version = version + 1 WHERE id = ?2",
    postgres: "UPDATE accounts SET balance = balance + $1, version = version + 1 WHERE id = $2",
};

/// The record of a transfer: its id.
const RECORD: Dialects = Dialects {
    sqlite: "INSERT INTO transfers (from_account, to_account, amount, reference_id, balance_after)
         VALUES (?1, ?2, ?3, ?4, ?5) RETURNING id",
    postgres:
        "INSERT INTO transfers (from_account, to_account, amount, reference_id, balance_after)
         VALUES ($1, $2, $3, $4, $5) RETURNING id",
};

/// Opens an account for `principal` under `operation_id` (a second insert for
/// the same operation inserts nothing and returns the first one's account, as
/// it is now), and whether this call opened it.
pub(crate) async fn open(
    conn: &mut OrdersConn<'_>,
    principal: &str,
    operation_id: uuid::Uuid,
    balance: i64,
    currency: &str,
) -> Result<(Account, bool), sqlx::Error> {
    let operation_id = operation_id.to_string();
    let inserted = on_dialect!(conn, sqlx::query, OPEN, |query, on| query
        .bind(&operation_id)
        .bind(principal)
        .bind(balance)
        .bind(currency)
        .execute(on)
        .await
        .map(|done| done.rows_affected() == 1))?;
    let account = on_dialect!(conn, sqlx::query, BY_OPERATION, |query, on| account(
        &query.bind(&operation_id).fetch_one(on).await?
    ))?;
    Ok((account, inserted))
}

/// The account `id`, if it is `principal`'s (any principal's with `None`).
pub(crate) async fn get(
    conn: &mut OrdersConn<'_>,
    principal: Option<&str>,
    id: i64,
) -> Result<Option<Account>, sqlx::Error> {
    on_dialect!(conn, sqlx::query, GET, |query, on| query
        .bind(id)
        .bind(principal)
        .fetch_optional(on)
        .await?
        .as_ref()
        .map(account)
        .transpose())
}

/// A transfer from the principal's account `from`, in the caller's transaction:
/// both accounts locked, then the reference (a used one answers its transfer or
/// the differing fields), then the credited account, then the debit that checks
/// the precondition and the funds in its `WHERE` — so of concurrent transfers
/// that expect one balance exactly one applies, and no balance goes negative —
/// then the credit and the record. Only [`TransferOutcome::Applied`] wrote; the
/// caller commits it and rolls back everything else.
///
/// The locks come before the reference is read: two transfers with one
/// reference that reach the ledger at once (the layer off, or its record
/// gone) are then one after the other, and the second finds the first's
/// transfer — not the reference's unique index (a `503`), nor a debit that
/// already changed the balance it expects (a false `409`).
pub(crate) async fn transfer(
    conn: &mut OrdersConn<'_>,
    principal: &str,
    from: i64,
    request: &TransferRequest,
) -> Result<TransferOutcome, sqlx::Error> {
    let Some(source) = get(conn, Some(principal), from).await? else {
        return Ok(TransferOutcome::NoSource);
    };
    lock_in_order(conn, from, request.to).await?;
    if let Some(transfer) = existing(conn, from, &request.reference_id).await? {
        let mut differing = Vec::new();
        if transfer.to != request.to {
            differing.push("to");
        }
        if transfer.amount != request.amount {
            differing.push("amount");
        }
        return Ok(if differing.is_empty() {
            TransferOutcome::Existing(transfer)
        } else {
            TransferOutcome::ReferenceReused(differing)
        });
    }
    match get(conn, None, request.to).await? {
        None => return Ok(TransferOutcome::NoTarget),
        Some(target) if target.currency != source.currency => {
            return Ok(TransferOutcome::CurrencyMismatch);
        }
        Some(_) => {}
    }
    let Some(balance) = debit(conn, from, request).await? else {
        // Nothing was debited: say why, with the account as it is now.
        let current = get(conn, Some(principal), from).await?.unwrap_or(source);
        let holds = request
            .expected_balance
            .is_none_or(|b| b == current.balance)
            && request
                .expected_version
                .is_none_or(|v| v == current.version);
        return Ok(if holds {
            TransferOutcome::Insufficient(current)
        } else {
            TransferOutcome::PreconditionFailed(current)
        });
    };
    let transfer_id = credit_and_record(conn, from, request, balance).await?;
    Ok(TransferOutcome::Applied(Transfer {
        transfer_id,
        from,
        to: request.to,
        amount: request.amount,
        balance,
    }))
}

async fn existing(
    conn: &mut OrdersConn<'_>,
    from: i64,
    reference_id: &str,
) -> Result<Option<Transfer>, sqlx::Error> {
    on_dialect!(conn, sqlx::query, EXISTING, |query, on| query
        .bind(from)
        .bind(reference_id)
        .fetch_optional(on)
        .await?
        .map(|row| -> Result<_, sqlx::Error> {
            Ok(Transfer {
                transfer_id: row.try_get("id")?,
                from,
                to: row.try_get("to_account")?,
                amount: row.try_get("amount")?,
                balance: row.try_get("balance_after")?,
            })
        })
        .transpose())
}

/// On PostgreSQL, locks both accounts' rows in id order before the reference
/// is read and the debit made, so two opposite transfers (A→B and B→A) wait
/// for each other instead of deadlocking between the debit's and the credit's
/// row locks, and two with one reference see each other ([`transfer`]). SQLite needs
/// nothing: its transaction holds the one write lock from the start.
async fn lock_in_order(conn: &mut OrdersConn<'_>, a: i64, b: i64) -> Result<(), sqlx::Error> {
    if let OrdersConn::Postgres(conn) = conn {
        sqlx::query("SELECT id FROM accounts WHERE id IN ($1, $2) ORDER BY id FOR UPDATE")
            .bind(a)
            .bind(b)
            .fetch_all(&mut **conn)
            .await?;
    }
    Ok(())
}

/// The compare-and-set debit: the new balance, or `None` when the
/// precondition or the funds do not hold (nothing written).
async fn debit(
    conn: &mut OrdersConn<'_>,
    from: i64,
    request: &TransferRequest,
) -> Result<Option<i64>, sqlx::Error> {
    on_dialect!(conn, sqlx::query_scalar, DEBIT, |query, on| query
        .bind(request.amount)
        .bind(from)
        .bind(request.expected_balance)
        .bind(request.expected_version)
        .fetch_optional(on)
        .await)
}

async fn credit_and_record(
    conn: &mut OrdersConn<'_>,
    from: i64,
    request: &TransferRequest,
    balance: i64,
) -> Result<i64, sqlx::Error> {
    on_dialect!(conn, sqlx::query, CREDIT, |query, on| query
        .bind(request.amount)
        .bind(request.to)
        .execute(on)
        .await
        .map(drop))?;
    on_dialect!(conn, sqlx::query_scalar, RECORD, |query, on| query
        .bind(from)
        .bind(request.to)
        .bind(request.amount)
        .bind(&request.reference_id)
        .bind(balance)
        .fetch_one(on)
        .await)
}
