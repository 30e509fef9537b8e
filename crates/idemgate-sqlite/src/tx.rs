//! The transactional mode on SQLite: `Tx`, and what it needs from the store (its
//! [`SqlStore`] impl). The transaction a `Tx` holds is a turn of the writer
//! ([`WriterTransaction`], with the writer's lending protocol in `writer.rs`).

use async_trait::async_trait;
use idemgate_core::audit::AuditRecord;
use idemgate_core::signals::ChangeSignals;
use idemgate_core::{Claim, ClaimRequest, Completion, FencedWrite, Lease, StoreError};
use idemgate_sqlx::{BusinessTransaction, ErrorCodes, SqlStore};
use sqlx::{Sqlite, SqliteConnection, SqlitePool};

use crate::error::RESULT_CODES;
use crate::store::SqliteStore;
use crate::writer::WriterTransaction;

/// A business transaction that commits together with the idempotency record
/// ([`idemgate_sqlx::Tx`] on a [`SqliteStore`]).
///
/// Take it as an axum extractor (the state must provide a [`SqliteStore`] through
/// `FromRef`), or with `Tx::begin`. It dereferences to the transaction's
/// [`SqliteConnection`], so queries run with `.execute(&mut *tx)`. Do not commit it
/// yourself: when the handler drops it, the transaction goes back to the request's
/// [`TransactionSlot`](idemgate_core::transaction::TransactionSlot) uncommitted, and
/// the layer adds the fenced completion to it and commits both, or rolls both back.
/// One `Tx` per request.
///
/// It runs on the store's one writer connection, lent to the handler for a turn
/// inside the writer's current batch (a savepoint of its transaction; see
/// [`WriterTransaction`]): from `Tx::begin` until the layer commits or rolls it back,
/// every other write through the store (claims of other requests, renewals) waits
/// for it, and the transaction commits with the batch's other writes, in one
/// `fsync`. Keep transactional handlers short: a turn held longer than the busy
/// timeout is taken back, and it and its batch answer 503. Do not make writes
/// through the store (or open a second `Tx`) while holding one: they queue behind
/// it.
///
/// Outside axum, `Tx::begin` lends the request's transaction from the slot and
/// begins it on the store's pool, as the extractor does:
///
/// ```no_run
/// # async fn run(store: idemgate_sqlite::SqliteStore) -> Result<(), Box<dyn std::error::Error>> {
/// use idemgate_core::transaction::{SlotContents, TransactionSlot};
/// use idemgate_sqlite::Tx;
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
pub type Tx = idemgate_sqlx::Tx<SqliteStore>;

#[async_trait]
impl SqlStore for SqliteStore {
    type Database = Sqlite;
    type Transaction = WriterTransaction;

    const ERRORS: ErrorCodes = RESULT_CODES;

    fn pool(&self) -> &SqlitePool {
        SqliteStore::pool(self)
    }

    /// A turn on the writer's connection, inside its batch's `IMMEDIATE`
    /// transaction (the write lock taken up front, as for every write).
    async fn begin(&self) -> Result<WriterTransaction, StoreError> {
        self.lend_writer().await
    }

    async fn claim_in(
        &self,
        connection: &mut SqliteConnection,
        request: &ClaimRequest,
    ) -> Result<Option<Claim>, StoreError> {
        self.claim_in_turn(connection, request).await.map(Some)
    }

    async fn complete_in(
        &self,
        connection: &mut SqliteConnection,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<FencedWrite, StoreError> {
        self.complete_on(connection, lease, completion).await
    }

    /// Handed to the writer with the turn: it appends them with the rest of
    /// its batch's entries, in one statement before the batch's commit —
    /// so they commit exactly when the turn's writes do, and the turn holds
    /// the writer for one statement less.
    async fn append_audit_in(
        &self,
        transaction: &mut WriterTransaction,
        records: &[AuditRecord],
    ) -> Result<(), StoreError> {
        transaction.journal(records);
        Ok(())
    }

    fn signals(&self) -> &ChangeSignals {
        SqliteStore::signals(self)
    }
}

/// The layer finishes a SQLite [`Tx`] through the writer's lending protocol.
#[async_trait]
impl BusinessTransaction<SqliteStore> for WriterTransaction {
    async fn commit(self) -> Result<(), StoreError> {
        self.keep().await
    }

    async fn rollback(self) -> Result<(), StoreError> {
        self.discard();
        Ok(())
    }
}
