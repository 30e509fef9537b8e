//! The transactional mode on SQLite: `Tx`, and what it needs from the store.

use std::fmt;
use std::ops::{Deref, DerefMut};

use async_trait::async_trait;
use idemgate_core::signals::ChangeSignals;
use idemgate_core::{Completion, FencedWrite, Lease, StoreError};
use idemgate_sqlx::{BusinessTransaction, ErrorClass, SqlStore};
use sqlx::{Sqlite, SqliteConnection, SqlitePool};
use tokio::sync::oneshot;

use crate::error::classify_result_code;
use crate::store::SqliteStore;
use crate::writer::WriterGone;

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

    const BACKEND: &'static str = "SQLite";

    fn pool(&self) -> &SqlitePool {
        SqliteStore::pool(self)
    }

    /// A turn on the writer's connection, inside its batch's `IMMEDIATE`
    /// transaction (the write lock taken up front, as for every write).
    async fn begin(&self) -> Result<WriterTransaction, StoreError> {
        self.lend_writer().await
    }

    async fn complete_in(
        &self,
        connection: &mut SqliteConnection,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<FencedWrite, StoreError> {
        self.complete_on(connection, lease, completion).await
    }

    fn signals(&self) -> &ChangeSignals {
        SqliteStore::signals(self)
    }

    fn classify_code(code: &str) -> ErrorClass {
        classify_result_code(code)
    }
}

/// The transaction a SQLite [`Tx`] holds ([`SqlStore::Transaction`]): the store's
/// writer connection, lent for one turn inside the writer's current batch.
///
/// It dereferences to the [`SqliteConnection`]; the handler's statements run in a
/// savepoint of the batch's transaction. Committing it releases the savepoint into
/// the batch and waits for the batch's one `COMMIT`; rolling it back (or dropping
/// it) rolls back to the savepoint. Either way the connection goes back to the
/// writer, which goes on with the batch. Never run `COMMIT`, `ROLLBACK` or
/// `RELEASE` on it yourself: that fails the whole batch.
pub struct WriterTransaction {
    /// `Some` until it goes back to the writer.
    connection: Option<SqliteConnection>,
    back: Option<oneshot::Sender<Returned>>,
    /// The batch's commit, for a turn whose writes were kept.
    committed: oneshot::Receiver<Result<(), StoreError>>,
}

/// A lent connection on its way back to the writer.
pub(crate) struct Returned {
    pub(crate) connection: SqliteConnection,
    /// Keep the turn's writes (release its savepoint) or roll them back.
    pub(crate) keep: bool,
}

impl WriterTransaction {
    pub(crate) fn new(
        connection: SqliteConnection,
        back: oneshot::Sender<Returned>,
        committed: oneshot::Receiver<Result<(), StoreError>>,
    ) -> Self {
        Self {
            connection: Some(connection),
            back: Some(back),
            committed,
        }
    }

    /// Hands the connection back to the writer; `false` if the writer stopped
    /// waiting for it (the connection then closes, rolling everything back).
    fn give_back(&mut self, keep: bool) -> bool {
        match (self.connection.take(), self.back.take()) {
            (Some(connection), Some(back)) => back.send(Returned { connection, keep }).is_ok(),
            _ => false,
        }
    }
}

impl Deref for WriterTransaction {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        // Invariant: `connection` is `Some` until `commit`, `rollback` or `drop`,
        // which consume the transaction.
        self.connection
            .as_ref()
            .expect("WriterTransaction used after it was handed back")
    }
}

impl DerefMut for WriterTransaction {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.connection
            .as_mut()
            .expect("WriterTransaction used after it was handed back")
    }
}

impl Drop for WriterTransaction {
    fn drop(&mut self) {
        self.give_back(false);
    }
}

impl fmt::Debug for WriterTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriterTransaction")
            .field("lent", &self.connection.is_some())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl BusinessTransaction<SqliteStore> for WriterTransaction {
    async fn commit(mut self) -> Result<(), StoreError> {
        if !self.give_back(true) {
            return Err(StoreError::unavailable(WriterGone));
        }
        (&mut self.committed)
            .await
            .map_err(|_| StoreError::unavailable(WriterGone))?
    }

    async fn rollback(mut self) -> Result<(), StoreError> {
        // Rolled back to the savepoint by the writer; if the writer is gone, the
        // connection closed and rolled back the batch with it.
        self.give_back(false);
        Ok(())
    }
}
