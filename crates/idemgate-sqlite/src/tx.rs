//! The transactional mode on SQLite: `Tx`, and what it needs from the store.

use async_trait::async_trait;
use idemgate_core::signals::ChangeSignals;
use idemgate_core::{Completion, FencedWrite, Lease, StoreError};
use idemgate_sqlx::{ErrorClass, SqlStore};
use sqlx::{Sqlite, SqliteConnection, SqlitePool, Transaction};

use crate::error::classify_result_code;
use crate::sql::BEGIN_IMMEDIATE;
use crate::store::SqliteStore;

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
/// The transaction begins `IMMEDIATE`: it holds SQLite's one write lock from the
/// start until the layer commits or rolls it back, so every other write to the file
/// (claims of other requests, renewals) waits for it, up to the busy timeout. Keep
/// transactional handlers short; a slow one turns other requests' claims into 503s
/// once the busy timeout passes.
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

    const BACKEND: &'static str = "SQLite";

    fn pool(&self) -> &SqlitePool {
        SqliteStore::pool(self)
    }

    /// `BEGIN IMMEDIATE`: the write lock up front, so the transaction never has to
    /// upgrade a read lock (which fails at once with `SQLITE_BUSY` instead of
    /// waiting for the busy timeout).
    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        SqliteStore::pool(self).begin_with(BEGIN_IMMEDIATE).await
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
