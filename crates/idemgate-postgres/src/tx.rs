//! The transactional mode on PostgreSQL: `Tx`, and what it needs from the store.

use std::time::Duration;

use async_trait::async_trait;
use idemgate_core::audit::AuditRecord;
use idemgate_core::deadline::DeadlineExceeded;
use idemgate_core::signals::ChangeSignals;
use idemgate_core::{Claim, ClaimRequest, Completion, FencedWrite, Lease, StoreError};
use idemgate_sqlx::{ErrorCodes, SqlStore, begin_to_the_end, complete_then_append};
use sqlx::{PgConnection, PgPool, Postgres};

use crate::error::{SQLSTATES, store_error};
use crate::sql::OUTER_LOCK_TIMEOUT;
use crate::store::PostgresStore;

/// A business transaction that commits together with the idempotency record
/// ([`idemgate_sqlx::Tx`] on a [`PostgresStore`]).
///
/// Take it as an axum extractor (the state must provide a [`PostgresStore`] through
/// `FromRef`), or with `Tx::begin`. It dereferences to the transaction's
/// [`PgConnection`], so queries run with `.execute(&mut *tx)`. Do not commit it
/// yourself: when the handler drops it, the transaction goes back to the request's
/// [`TransactionSlot`](idemgate_core::transaction::TransactionSlot) uncommitted, and
/// the layer adds the fenced completion to it and commits both, or rolls both back.
/// One `Tx` per request.
///
/// A statement that fails inside the transaction aborts it (PostgreSQL refuses every
/// later statement in it, SQLSTATE `25P02`): return an error response then, so the
/// layer rolls back. A handler that swallows the error and answers 2xx anyway has
/// committed nothing: the completion in that transaction fails too, and the record
/// is not completed.
///
/// Its checkout and `BEGIN` together are bounded by the pool's acquire timeout:
/// a frozen or unreachable PostgreSQL makes it fail as unavailable (503) in
/// that time. The handler's own statements are its own to bound (the server's
/// `statement_timeout` does not help against a server that stopped answering).
///
/// Holding a `Tx` holds a pooled connection until the layer finishes the request:
/// size the pool for the transactional handlers that run at once plus the layer's
/// own claims and renewals.
///
/// Outside axum, `Tx::begin` lends the request's transaction from the slot and
/// begins it on the store's pool, as the extractor does:
///
/// ```no_run
/// # async fn run(store: idemgate_postgres::PostgresStore) -> Result<(), Box<dyn std::error::Error>> {
/// use idemgate_core::transaction::{SlotContents, TransactionSlot};
/// use idemgate_postgres::Tx;
///
/// let slot = TransactionSlot::new(); // the layer's, in real use
/// let mut tx = Tx::begin(&store, &slot).await?;
/// sqlx::query("INSERT INTO audit (note) VALUES ('hello')").execute(&mut *tx).await?;
/// drop(tx); // back to the slot, uncommitted
/// if let SlotContents::Returned(pending) = slot.take() {
///     pending.commit().await?; // the layer's job
/// }
/// # Ok(()) }
/// ```
pub type Tx = idemgate_sqlx::Tx<PostgresStore>;

impl PostgresStore {
    /// A checkout and its `BEGIN` (or `statement`), bounded by the pool's
    /// acquire timeout. The checkout pings only a connection that sat idle
    /// ([`PostgresStore::pool_options`]), so nothing else bounds a `BEGIN` sent
    /// to a frozen server: `statement_timeout` is enforced by the server itself.
    /// A `BEGIN` given up on is finished and rolled back in the background
    /// ([`begin_to_the_end`]), never pooled halfway.
    async fn within_acquire_timeout(
        &self,
        statement: Option<String>,
    ) -> Result<sqlx::Transaction<'static, Postgres>, StoreError> {
        let pool = PostgresStore::pool(self);
        let timeout = pool.options().get_acquire_timeout();
        match tokio::time::timeout(timeout, begin_to_the_end(pool, statement)).await {
            Ok(begun) => begun.map_err(store_error),
            Err(_elapsed) => Err(StoreError::unavailable(DeadlineExceeded {
                operation: "begin",
                timeout,
            })),
        }
    }
}

#[async_trait]
impl SqlStore for PostgresStore {
    type Database = Postgres;
    type Transaction = sqlx::Transaction<'static, Postgres>;

    const ERRORS: ErrorCodes = SQLSTATES;

    fn pool(&self) -> &PgPool {
        PostgresStore::pool(self)
    }

    async fn begin(&self) -> Result<Self::Transaction, StoreError> {
        self.within_acquire_timeout(None).await
    }

    /// `BEGIN` with the transaction's `lock_timeout` in the same round trip (one
    /// simple query): how long its claim waits for another transaction's
    /// uncommitted claim of the same key. At least 1 ms (`0` would mean no
    /// bound). The session's own is kept beside it, for the claim statement
    /// to restore once it holds the record (`Statements::claim_in_transaction`).
    async fn begin_claim(&self, lock_wait: Duration) -> Result<Self::Transaction, StoreError> {
        let ms = lock_wait.as_millis().clamp(1, i32::MAX as u128);
        self.within_acquire_timeout(Some(format!(
            "BEGIN; \
             SELECT set_config('{OUTER_LOCK_TIMEOUT}', current_setting('lock_timeout'), true); \
             SET LOCAL lock_timeout = {ms}"
        )))
        .await
    }

    async fn claim_in(
        &self,
        connection: &mut PgConnection,
        request: &ClaimRequest,
    ) -> Result<Option<Claim>, StoreError> {
        // The claim statement lifts the bound once it holds the record: the
        // handler's own statements (a row lock on a busy account) wait as they
        // would anywhere else.
        self.claim_on(connection, request).await
    }

    async fn complete_in(
        &self,
        connection: &mut PgConnection,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<FencedWrite, StoreError> {
        self.complete_on(connection, lease, completion).await
    }

    async fn complete_and_append_in(
        &self,
        transaction: &mut Self::Transaction,
        lease: &Lease,
        completion: &Completion,
        journal: &[AuditRecord],
    ) -> Result<FencedWrite, StoreError> {
        match self
            .complete_with_known_head(transaction, lease, completion, journal)
            .await?
        {
            Some(write) => Ok(write),
            None => complete_then_append(self, transaction, lease, completion, journal).await,
        }
    }

    /// Holds the entries' chain head until the commit (`crate::audit`): the
    /// business transactions of one chain commit one after another from
    /// this append on.
    async fn append_audit_in(
        &self,
        transaction: &mut Self::Transaction,
        records: &[AuditRecord],
    ) -> Result<(), StoreError> {
        self.append_audit_on(transaction, records).await
    }

    fn signals(&self) -> &ChangeSignals {
        PostgresStore::signals(self)
    }
}
