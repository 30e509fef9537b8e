//! Accounts and transfers in the orders database (PROTOCOL §18): the balance
//! moves only by a transfer whose precondition (`expected_balance`,
//! `expected_version`) and funds are checked by the debit itself, one
//! compare-and-set `UPDATE`, inside the transaction that records the transfer.

use sqlx::Row;

use crate::orders::db::OrdersConn;

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

fn account(row: &impl AccountRow) -> Result<Account, sqlx::Error> {
    row.account()
}

/// Decoding an account from either database's row.
trait AccountRow {
    fn account(&self) -> Result<Account, sqlx::Error>;
}

impl AccountRow for sqlx::sqlite::SqliteRow {
    fn account(&self) -> Result<Account, sqlx::Error> {
        Ok(Account {
            account_id: self.try_get("id")?,
            balance: self.try_get("balance")?,
            currency: self.try_get("currency")?,
            version: self.try_get("version")?,
        })
    }
}

impl AccountRow for sqlx::postgres::PgRow {
    fn account(&self) -> Result<Account, sqlx::Error> {
        Ok(Account {
            account_id: self.try_get("id")?,
            balance: self.try_get("balance")?,
            currency: self.try_get("currency")?,
            version: self.try_get("version")?,
        })
    }
}

/// Opens an account for `principal` under `operation_id` (a second insert for
/// the same operation inserts nothing and returns the first one's account).
pub(crate) async fn open(
    conn: &mut OrdersConn<'_>,
    principal: &str,
    operation_id: uuid::Uuid,
    balance: i64,
    currency: &str,
) -> Result<Account, sqlx::Error> {
    match conn {
        OrdersConn::Sqlite(conn) => {
            let operation_id = operation_id.to_string();
            sqlx::query(
                "INSERT INTO accounts (operation_id, principal, balance, currency) VALUES (?, ?, ?, ?)
                 ON CONFLICT (operation_id) DO NOTHING",
            )
            .bind(&operation_id)
            .bind(principal)
            .bind(balance)
            .bind(currency)
            .execute(&mut **conn)
            .await?;
            let row = sqlx::query(
                "SELECT id, balance, currency, version FROM accounts WHERE operation_id = ?",
            )
            .bind(&operation_id)
            .fetch_one(&mut **conn)
            .await?;
            account(&row)
        }
        OrdersConn::Postgres(conn) => {
            sqlx::query(
                "INSERT INTO accounts (operation_id, principal, balance, currency) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (operation_id) DO NOTHING",
            )
            .bind(operation_id)
            .bind(principal)
            .bind(balance)
            .bind(currency)
            .execute(&mut **conn)
            .await?;
            let row = sqlx::query(
                "SELECT id, balance, currency, version FROM accounts WHERE operation_id = $1",
            )
            .bind(operation_id)
            .fetch_one(&mut **conn)
            .await?;
            account(&row)
        }
    }
}

/// The account `id`, if it is `principal`'s (any principal's with `None`).
pub(crate) async fn get(
    conn: &mut OrdersConn<'_>,
    principal: Option<&str>,
    id: i64,
) -> Result<Option<Account>, sqlx::Error> {
    match conn {
        OrdersConn::Sqlite(conn) => sqlx::query(
            "SELECT id, balance, currency, version FROM accounts
             WHERE id = ? AND (? IS NULL OR principal = ?)",
        )
        .bind(id)
        .bind(principal)
        .bind(principal)
        .fetch_optional(&mut **conn)
        .await?
        .as_ref()
        .map(account)
        .transpose(),
        OrdersConn::Postgres(conn) => sqlx::query(
            "SELECT id, balance, currency, version FROM accounts
             WHERE id = $1 AND ($2::TEXT IS NULL OR principal = $2)",
        )
        .bind(id)
        .bind(principal)
        .fetch_optional(&mut **conn)
        .await?
        .as_ref()
        .map(account)
        .transpose(),
    }
}

/// A transfer from the principal's account `from`, in the caller's transaction:
/// the reference first (a used one answers its transfer or the differing
/// fields), then the credited account, then the debit that checks the
/// precondition and the funds in its `WHERE` — so of concurrent transfers that
/// expect one balance exactly one applies, and no balance goes negative — then
/// the credit and the record. Only [`TransferOutcome::Applied`] wrote; the
/// caller commits it and rolls back everything else.
pub(crate) async fn transfer(
    conn: &mut OrdersConn<'_>,
    principal: &str,
    from: i64,
    request: &TransferRequest,
) -> Result<TransferOutcome, sqlx::Error> {
    let Some(source) = get(conn, Some(principal), from).await? else {
        return Ok(TransferOutcome::NoSource);
    };
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
    lock_in_order(conn, from, request.to).await?;
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
    let decode = |id, to, amount, balance| Transfer {
        transfer_id: id,
        from,
        to,
        amount,
        balance,
    };
    Ok(match conn {
        OrdersConn::Sqlite(conn) => sqlx::query(
            "SELECT id, to_account, amount, balance_after FROM transfers
             WHERE from_account = ? AND reference_id = ?",
        )
        .bind(from)
        .bind(reference_id)
        .fetch_optional(&mut **conn)
        .await?
        .map(|row| -> Result<_, sqlx::Error> {
            Ok(decode(
                row.try_get("id")?,
                row.try_get("to_account")?,
                row.try_get("amount")?,
                row.try_get("balance_after")?,
            ))
        })
        .transpose()?,
        OrdersConn::Postgres(conn) => sqlx::query(
            "SELECT id, to_account, amount, balance_after FROM transfers
             WHERE from_account = $1 AND reference_id = $2",
        )
        .bind(from)
        .bind(reference_id)
        .fetch_optional(&mut **conn)
        .await?
        .map(|row| -> Result<_, sqlx::Error> {
            Ok(decode(
                row.try_get("id")?,
                row.try_get("to_account")?,
                row.try_get("amount")?,
                row.try_get("balance_after")?,
            ))
        })
        .transpose()?,
    })
}

/// On PostgreSQL, locks both accounts' rows in id order before the debit, so
/// two opposite transfers (A→B and B→A) wait for each other instead of
/// deadlocking between the debit's and the credit's row locks. SQLite needs
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
    match conn {
        OrdersConn::Sqlite(conn) => {
            sqlx::query_scalar(
                "UPDATE accounts SET balance = balance - ?1, version = version + 1
             WHERE id = ?2 AND balance >= ?1
               AND (?3 IS NULL OR balance = ?3) AND (?4 IS NULL OR version = ?4)
             RETURNING balance",
            )
            .bind(request.amount)
            .bind(from)
            .bind(request.expected_balance)
            .bind(request.expected_version)
            .fetch_optional(&mut **conn)
            .await
        }
        OrdersConn::Postgres(conn) => {
            sqlx::query_scalar(
                "UPDATE accounts SET balance = balance - $1, version = version + 1
             WHERE id = $2 AND balance >= $1
               AND ($3::BIGINT IS NULL OR balance = $3) AND ($4::BIGINT IS NULL OR version = $4)
             RETURNING balance",
            )
            .bind(request.amount)
            .bind(from)
            .bind(request.expected_balance)
            .bind(request.expected_version)
            .fetch_optional(&mut **conn)
            .await
        }
    }
}

async fn credit_and_record(
    conn: &mut OrdersConn<'_>,
    from: i64,
    request: &TransferRequest,
    balance: i64,
) -> Result<i64, sqlx::Error> {
    match conn {
        OrdersConn::Sqlite(conn) => {
            sqlx::query(
                "UPDATE accounts SET balance = balance + ?, version = version + 1 WHERE id = ?",
            )
            .bind(request.amount)
            .bind(request.to)
            .execute(&mut **conn)
            .await?;
            sqlx::query_scalar(
                "INSERT INTO transfers (from_account, to_account, amount, reference_id, balance_after)
                 VALUES (?, ?, ?, ?, ?) RETURNING id",
            )
            .bind(from)
            .bind(request.to)
            .bind(request.amount)
            .bind(&request.reference_id)
            .bind(balance)
            .fetch_one(&mut **conn)
            .await
        }
        OrdersConn::Postgres(conn) => {
            sqlx::query(
                "UPDATE accounts SET balance = balance + $1, version = version + 1 WHERE id = $2",
            )
            .bind(request.amount)
            .bind(request.to)
            .execute(&mut **conn)
            .await?;
            sqlx::query_scalar(
                "INSERT INTO transfers (from_account, to_account, amount, reference_id, balance_after)
                 VALUES ($1, $2, $3, $4, $5) RETURNING id",
            )
            .bind(from)
            .bind(request.to)
            .bind(request.amount)
            .bind(&request.reference_id)
            .bind(balance)
            .fetch_one(&mut **conn)
            .await
        }
    }
}
