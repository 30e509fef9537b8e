//! What each write of the orders service answered, by operation id: one
//! outcome per operation, recorded in the transaction of the write it answers.
//!
//! A keyed write commits, then the layer completes its record. When the
//! instance dies between the two (or the commit's acknowledgement is lost and
//! the record released), the retry runs the same operation again — same
//! operation id, a takeover or a release (PROTOCOL §6.2). A conditional edit
//! evaluated again would compare its now stale `If-Match` with the order its
//! own first run changed and answer `412`, although the edit was applied. So an
//! edit, a cancellation and an account's opening record their answer here (the
//! status and the exact body), and a run that is not its operation's first
//! (`LeaseOrigin::TakenOver` / `Released`) looks here before anything else:
//! found, it answers what the first run answered (PROTOCOL §17: the journal
//! comes first). Orders themselves are found by their own `operation_id`
//! column ([`db`](super::db)); transfers by their `reference_id`
//! ([`ledger`](super::ledger)).
//!
//! Retention: a run of an operation can only come while its record lives, at
//! most the layer's TTL after the claim; the outcome is written after the claim.
//! Rows older than the TTL plus [`CLOCK_MARGIN`] are deleted, a bounded batch
//! at a time, by about one write in [`PURGE_ONE_IN`] (so no task of its own).
//!
//! The schema is `0003_operation_outcomes.sql` in
//! `migrations/orders/{sqlite,postgres}/`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use idemgate::{LeaseOrigin, OperationContext};
use uuid::Uuid;

use crate::orders::db::{Dialects, OrdersConn, on_dialect};

/// Added to the TTL before an outcome is purged: instances' clocks differ.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(300);

/// About one recorded outcome in this many also purges expired ones.
pub const PURGE_ONE_IN: u128 = 64;

/// The most expired outcomes one purge deletes.
const PURGE_BATCH: i64 = 1000;

/// What an earlier run of an operation answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Its status.
    pub status: StatusCode,
    /// Its body, byte for byte (JSON).
    pub body: String,
}

impl Outcome {
    /// The body as JSON (for the `ETag`, the `Location`).
    pub fn json(&self) -> Result<serde_json::Value, sqlx::Error> {
        serde_json::from_str(&self.body).map_err(|error| sqlx::Error::Decode(Box::new(error)))
    }
}

/// Whether this run may follow an earlier run of its operation (a takeover or
/// a release), which may have written and recorded its outcome.
pub fn may_follow_a_run(operation: Option<&OperationContext>) -> bool {
    operation.is_some_and(|operation| operation.origin != LeaseOrigin::New)
}

/// An outcome, nothing if its operation recorded one already. The operation
/// id is bound as text: SQLite's column holds text, PostgreSQL's a UUID.
const RECORD: Dialects = Dialects {
    sqlite: "INSERT INTO operation_outcomes (operation_id, principal, status, body, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (operation_id) DO NOTHING",
    postgres: "INSERT INTO operation_outcomes (operation_id, principal, status, body, created_at)
         VALUES ($1::uuid, $2, $3, $4, $5) ON CONFLICT (operation_id) DO NOTHING",
};

/// The outcome of an operation of the principal's.
const FIND: Dialects = Dialects {
    sqlite: "SELECT status, body FROM operation_outcomes WHERE operation_id = ?1 AND principal = ?2",
    postgres: "SELECT status, body FROM operation_outcomes WHERE operation_id = $1::uuid AND principal = $2",
};

/// A bounded batch of the outcomes written before a time.
const PURGE: Dialects = Dialects {
    sqlite: "DELETE FROM operation_outcomes WHERE operation_id IN
         (SELECT operation_id FROM operation_outcomes WHERE created_at < ?1 LIMIT ?2)",
    postgres: "DELETE FROM operation_outcomes WHERE operation_id IN
         (SELECT operation_id FROM operation_outcomes WHERE created_at < $1 LIMIT $2)",
};

fn unix_millis(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |since| {
        i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
    })
}

/// Records what `operation_id` answered, in the caller's transaction (the one
/// of the write it answers), and now and then purges outcomes older than
/// `retention` plus [`CLOCK_MARGIN`].
pub async fn record(
    conn: &mut OrdersConn<'_>,
    operation_id: Uuid,
    principal: &str,
    outcome: &Outcome,
    retention: Duration,
) -> Result<(), sqlx::Error> {
    let now = SystemTime::now();
    let id = operation_id.to_string();
    on_dialect!(conn, sqlx::query, RECORD, |query, on| query
        .bind(&id)
        .bind(principal)
        .bind(i32::from(outcome.status.as_u16()))
        .bind(&outcome.body)
        .bind(unix_millis(now))
        .execute(on)
        .await
        .map(drop))?;
    // Operation ids are random: their low bits pick the writes that purge.
    if operation_id.as_u128() % PURGE_ONE_IN == 0 {
        let before = unix_millis(
            now.checked_sub(retention + CLOCK_MARGIN)
                .unwrap_or(UNIX_EPOCH),
        );
        purge(conn, before).await?;
    }
    Ok(())
}

/// Deletes up to a batch of the outcomes written before `before` (Unix ms);
/// how many.
pub async fn purge(conn: &mut OrdersConn<'_>, before: i64) -> Result<u64, sqlx::Error> {
    on_dialect!(conn, sqlx::query, PURGE, |query, on| query
        .bind(before)
        .bind(PURGE_BATCH)
        .execute(on)
        .await
        .map(|done| done.rows_affected()))
}

/// What `operation_id` of `principal`'s answered, if an earlier run recorded it.
pub async fn find(
    conn: &mut OrdersConn<'_>,
    operation_id: Uuid,
    principal: &str,
) -> Result<Option<Outcome>, sqlx::Error> {
    use sqlx::Row as _;
    let id = operation_id.to_string();
    let row = on_dialect!(conn, sqlx::query, FIND, |query, on| {
        match query.bind(&id).bind(principal).fetch_optional(on).await? {
            Some(row) => Some((
                row.try_get::<i32, _>("status")?,
                row.try_get::<String, _>("body")?,
            )),
            None => None,
        }
    });
    row.map(|(status, body)| {
        let status = u16::try_from(status)
            .ok()
            .and_then(|status| StatusCode::from_u16(status).ok())
            .ok_or_else(|| {
                sqlx::Error::Decode(format!("operation outcome with status {status}").into())
            })?;
        Ok(Outcome { status, body })
    })
    .transpose()
}
