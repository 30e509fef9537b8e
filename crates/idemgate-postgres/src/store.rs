//! `PostgresStore`: the [`Store`] on a `sqlx::PgPool`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::StatusCode;
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::record::{
    FencingToken, OperationId, RECORD_FORMAT_VERSION, Record, RecordStatus, StoredBody,
    StoredResponse,
};
use idemgate_core::scope::IdentityDigest;
use idemgate_core::signals::ChangeSignals;
use idemgate_core::time::Timestamp;
use idemgate_core::{
    Claim, ClaimRequest, Completion, FencedWrite, Lease, LeaseOrigin, Snapshot, Store, StoreError,
};
use idemgate_sqlx::PurgeTask;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{AssertSqlSafe, PgPool, Postgres, Row};

use crate::error::{ClaimContended, CorruptRecord, Error, store_error};
use crate::sql::{self, Names, Statements};

/// How often one claim re-runs when the record changes between its statements.
const CLAIM_ATTEMPTS: usize = 4;

/// Durations beyond this are clamped (100 years), so interval arithmetic never
/// overflows.
const MAX_MILLIS: i64 = 100 * 365 * 86_400_000;

/// Idempotency records in PostgreSQL.
///
/// Cheap to clone (an `Arc` inside): clones share the pool and the in-process
/// change signals. Configure with the `with_*` methods before cloning it around.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/app").await?;
/// let store = idemgate_postgres::PostgresStore::new(pool).with_schema("idemgate");
/// store.migrate().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    names: Names,
    sql: Statements,
    signals: ChangeSignals,
}

impl PostgresStore {
    /// A store on `pool`, with its records in `idemgate_records` on the connection's
    /// `search_path`. Call [`PostgresStore::migrate`] once before use.
    pub fn new(pool: PgPool) -> Self {
        Self::build(
            pool,
            Names {
                schema: None,
                table: sql::DEFAULT_TABLE.to_owned(),
            },
        )
    }

    fn build(pool: PgPool, names: Names) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool,
                sql: Statements::new(&names),
                names,
                signals: ChangeSignals::new(),
            }),
        }
    }

    fn rebuild(self, change: impl FnOnce(&mut Names)) -> Self {
        let mut names = self.inner.names.clone();
        change(&mut names);
        Self::build(self.inner.pool.clone(), names)
    }

    /// Keeps records in `table` instead of `idemgate_records`. The name is quoted, so
    /// any name is safe; the sequence and index are named after it.
    ///
    /// ```no_run
    /// # let pool: sqlx::PgPool = unimplemented!();
    /// let store = idemgate_postgres::PostgresStore::new(pool).with_table("payments_idempotency");
    /// ```
    pub fn with_table(self, table: impl Into<String>) -> Self {
        let table = table.into();
        self.rebuild(|names| names.table = table)
    }

    /// Keeps the record table (and the schema-version table) in `schema`, created by
    /// [`PostgresStore::migrate`] if missing, instead of the `search_path`.
    ///
    /// ```no_run
    /// # let pool: sqlx::PgPool = unimplemented!();
    /// let store = idemgate_postgres::PostgresStore::new(pool).with_schema("idemgate");
    /// ```
    pub fn with_schema(self, schema: impl Into<String>) -> Self {
        let schema = schema.into();
        self.rebuild(|names| names.schema = Some(schema))
    }

    /// The pool the store (and its [`crate::Tx`]) uses.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The record table's qualified, quoted name, for operational queries.
    pub fn table_name(&self) -> String {
        self.inner.names.table()
    }

    /// Creates the record table, its token sequence and its `expires_at` index if
    /// they are missing, and records the schema version in `idemgate_schema_versions`
    /// (never in sqlx's `_sqlx_migrations`, so it lives beside an application's own
    /// migrations). Safe to run from many instances at once: it runs in one
    /// transaction under a transaction-scoped advisory lock.
    ///
    /// Fails with [`Error::SchemaTooNew`] when a newer build already migrated the
    /// table further.
    pub async fn migrate(&self) -> Result<(), Error> {
        crate::migrate::run(&self.inner.pool, &self.inner.names).await
    }

    /// Deletes expired records, at most `batch` per statement, until none is left;
    /// returns how many went. Each batch is its own short statement and skips rows
    /// that a claim holds locked, so purging never blocks traffic for long.
    /// A `batch` of 0 deletes nothing.
    pub async fn purge_expired(&self, batch: usize) -> Result<u64, StoreError> {
        idemgate_sqlx::purge_in_batches(batch, |limit| async move {
            sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.purge)))
                .bind(limit)
                .execute(&self.inner.pool)
                .await
                .map(|done| done.rows_affected())
                .map_err(store_error)
        })
        .await
    }

    /// Runs [`PostgresStore::purge_expired`] every `every` on the current tokio
    /// runtime, until the returned handle is dropped or aborted. Failed runs are
    /// logged and retried at the next tick.
    ///
    /// ```no_run
    /// # async fn run(store: idemgate_postgres::PostgresStore) -> Result<(), idemgate_postgres::Error> {
    /// let purge = store.spawn_purge(std::time::Duration::from_secs(60), 1_000)?;
    /// // ... serve; dropping `purge` stops it.
    /// # Ok(()) }
    /// ```
    pub fn spawn_purge(&self, every: Duration, batch: usize) -> Result<PurgeTask, Error> {
        let store = self.clone();
        PurgeTask::spawn(every, move || {
            let store = store.clone();
            async move { store.purge_expired(batch).await }
        })
        .map_err(Error::NoRuntime)
    }

    pub(crate) fn signals(&self) -> &ChangeSignals {
        &self.inner.signals
    }

    /// The fenced completion, for the pool or a transaction.
    pub(crate) fn complete_query(
        &self,
        lease: &Lease,
        completion: &Completion,
    ) -> Option<sqlx::query::Query<'static, Postgres, PgArguments>> {
        let token = i64::try_from(lease.token.0).ok()?;
        let response = &completion.response;
        let status = RecordStatus::from(completion.status).as_str();
        let (body, retained) = match &response.body {
            StoredBody::Retained(body) => (Some(body.as_ref()), true),
            StoredBody::NotRetained => (None, false),
        };
        Some(
            sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.complete)))
                .bind(lease.identity.as_bytes().as_slice())
                .bind(lease.operation_id.as_uuid())
                .bind(token)
                .bind(status)
                .bind(i32::from(response.status.as_u16()))
                .bind(response.encode_headers())
                .bind(body)
                .bind(retained)
                .bind(millis(completion.ttl)),
        )
    }

    /// Runs a fenced statement whose parameters are the fence (`$1..$3`) and,
    /// optionally, one more bigint.
    async fn fenced(
        &self,
        sql: &Arc<str>,
        lease: &Lease,
        extra: Option<i64>,
    ) -> Result<FencedWrite, StoreError> {
        // A token the database cannot hold was never handed out by it.
        let Ok(token) = i64::try_from(lease.token.0) else {
            return Ok(FencedWrite::Refused);
        };
        let mut query = sqlx::query(AssertSqlSafe(Arc::clone(sql)))
            .bind(lease.identity.as_bytes().as_slice())
            .bind(lease.operation_id.as_uuid())
            .bind(token);
        if let Some(extra) = extra {
            query = query.bind(extra);
        }
        let done = query.execute(&self.inner.pool).await.map_err(store_error)?;
        Ok(applied(done.rows_affected()))
    }

    async fn read(&self, identity: &IdentityDigest) -> Result<Option<Snapshot>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.read)))
            .bind(identity.as_bytes().as_slice())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)?;
        row.as_ref().map(decode_snapshot).transpose()
    }
}

pub(crate) fn applied(rows: u64) -> FencedWrite {
    if rows == 1 {
        FencedWrite::Applied
    } else {
        FencedWrite::Refused
    }
}

/// A duration as whole milliseconds, clamped to [`MAX_MILLIS`].
fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).map_or(MAX_MILLIS, |ms| ms.min(MAX_MILLIS))
}

/// Whether `request` could claim the record `snapshot` shows (it changed between the
/// claim statement and the read).
fn claimable_by(snapshot: &Snapshot, request: &ClaimRequest) -> bool {
    let record = &snapshot.record;
    record.fingerprint == request.fingerprint
        && match record.status {
            RecordStatus::Released => true,
            RecordStatus::Processing => !record.lease_is_live(snapshot.now),
            RecordStatus::Completed | RecordStatus::Failed => false,
        }
}

fn corrupt(what: &'static str) -> StoreError {
    StoreError::corrupt(CorruptRecord(what))
}

fn column<'r, T>(row: &'r PgRow, name: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    row.try_get(name).map_err(StoreError::corrupt)
}

fn decode_lease(row: &PgRow, identity: IdentityDigest) -> Result<Lease, StoreError> {
    let operation_id: uuid::Uuid = column(row, "operation_id")?;
    let token: i64 = column(row, "token")?;
    let origin: String = column(row, "lease_origin")?;
    let locked_until: Option<i64> = column(row, "locked_until_ms")?;
    let origin = match origin.as_str() {
        "NEW" => LeaseOrigin::New,
        "RELEASED" => LeaseOrigin::Released,
        "TAKEN_OVER" => LeaseOrigin::TakenOver,
        _ => return Err(corrupt("unknown lease origin")),
    };
    Ok(Lease {
        identity,
        operation_id: OperationId::from(operation_id),
        token: FencingToken(u64::try_from(token).map_err(|_| corrupt("negative token"))?),
        origin,
        locked_until: Timestamp::from_millis(
            locked_until.ok_or_else(|| corrupt("claimed record without a lease"))?,
        ),
    })
}

fn decode_snapshot(row: &PgRow) -> Result<Snapshot, StoreError> {
    let fingerprint: Vec<u8> = column(row, "fingerprint")?;
    let format_version: i32 = column(row, "format_version")?;
    let operation_id: uuid::Uuid = column(row, "operation_id")?;
    let token: i64 = column(row, "token")?;
    let status: String = column(row, "status")?;
    let locked_until: Option<i64> = column(row, "locked_until_ms")?;
    let response_status: Option<i32> = column(row, "response_status")?;
    let headers: Option<Vec<u8>> = column(row, "response_headers")?;
    let body: Option<Vec<u8>> = column(row, "response_body")?;
    let retained: Option<bool> = column(row, "body_retained")?;
    let created: i64 = column(row, "created_ms")?;
    let expires: i64 = column(row, "expires_ms")?;
    let now: i64 = column(row, "now_ms")?;

    let status: RecordStatus = status.parse().map_err(StoreError::corrupt)?;
    let fingerprint: [u8; 32] = fingerprint
        .try_into()
        .map_err(|_| corrupt("fingerprint is not 32 bytes"))?;
    let response = if status.is_final() {
        let code = response_status
            .and_then(|code| u16::try_from(code).ok())
            .and_then(|code| StatusCode::from_u16(code).ok())
            .ok_or_else(|| corrupt("final record without a valid response status"))?;
        let headers = StoredResponse::decode_headers(
            headers
                .as_deref()
                .ok_or_else(|| corrupt("final record without headers"))?,
        )
        .map_err(StoreError::corrupt)?;
        let body = match (retained, body) {
            (Some(true), Some(body)) => StoredBody::Retained(Bytes::from(body)),
            (Some(false), _) => StoredBody::NotRetained,
            _ => return Err(corrupt("final record without a body")),
        };
        Some(StoredResponse {
            status: code,
            headers,
            body,
        })
    } else {
        None
    };
    Ok(Snapshot {
        record: Record {
            fingerprint: Fingerprint::from_bytes(fingerprint),
            format_version: u16::try_from(format_version)
                .map_err(|_| corrupt("format version out of range"))?,
            operation_id: OperationId::from(operation_id),
            token: FencingToken(u64::try_from(token).map_err(|_| corrupt("negative token"))?),
            status,
            locked_until: locked_until.map(Timestamp::from_millis),
            response,
            created_at: Timestamp::from_millis(created),
            expires_at: Timestamp::from_millis(expires),
        },
        now: Timestamp::from_millis(now),
    })
}

#[async_trait]
impl Store for PostgresStore {
    async fn try_claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        let identity = request.identity.digest();
        let scope = request.identity.scope();
        for attempt in 1..=CLAIM_ATTEMPTS {
            // One statement inserts, replaces an expired record, or takes over
            // (`claimed`); or returns the live record that blocks the claim
            // (`existing`, read without a write); or, when the record changed under
            // it, nothing.
            let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.claim)))
                .bind(identity.as_bytes().as_slice())
                .bind(scope.principal.as_str())
                .bind(scope.method.as_str())
                .bind(scope.path.as_str())
                .bind(request.identity.key().as_str())
                .bind(request.fingerprint.as_bytes().as_slice())
                .bind(i32::from(RECORD_FORMAT_VERSION))
                .bind(OperationId::random().as_uuid())
                .bind(millis(request.lease))
                .bind(millis(request.ttl))
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(store_error)?;
            if let Some(row) = row {
                let outcome: String = column(&row, "outcome")?;
                return if outcome == "claimed" {
                    decode_lease(&row, *identity).map(Claim::Acquired)
                } else {
                    decode_snapshot(&row).map(Claim::Existing)
                };
            }
            // The read only reports what blocked the claim; it never decides to
            // insert. If the record expired, went away or became claimable in
            // between, the claim statement runs again.
            match self.read(identity).await? {
                Some(snapshot)
                    if attempt == CLAIM_ATTEMPTS || !claimable_by(&snapshot, request) =>
                {
                    return Ok(Claim::Existing(snapshot));
                }
                _ => {}
            }
        }
        Err(StoreError::unavailable(ClaimContended))
    }

    async fn complete(
        &self,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<FencedWrite, StoreError> {
        let Some(query) = self.complete_query(lease, completion) else {
            return Ok(FencedWrite::Refused);
        };
        let done = query.execute(&self.inner.pool).await.map_err(store_error)?;
        let write = applied(done.rows_affected());
        if write == FencedWrite::Applied {
            self.inner.signals.notify(&lease.identity);
        }
        Ok(write)
    }

    async fn release(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        let write = self.fenced(&self.inner.sql.release, lease, None).await?;
        if write == FencedWrite::Applied {
            self.inner.signals.notify(&lease.identity);
        }
        Ok(write)
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<FencedWrite, StoreError> {
        self.fenced(&self.inner.sql.renew, lease, Some(millis(lease_for)))
            .await
    }

    async fn delete(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        let write = self.fenced(&self.inner.sql.delete, lease, None).await?;
        if write == FencedWrite::Applied {
            self.inner.signals.notify(&lease.identity);
        }
        Ok(write)
    }

    async fn get(&self, identity: &IdentityDigest) -> Result<Option<Snapshot>, StoreError> {
        self.read(identity).await
    }

    async fn wait_for_change(&self, identity: &IdentityDigest, timeout: Duration) {
        self.inner.signals.wait(identity, timeout).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_clamped() {
        assert_eq!(millis(Duration::from_millis(1_500)), 1_500);
        assert_eq!(millis(Duration::MAX), MAX_MILLIS);
        assert_eq!(applied(1), FencedWrite::Applied);
        assert_eq!(applied(0), FencedWrite::Refused);
    }
}
