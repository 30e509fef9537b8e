//! The sqlx plumbing shared by idemgate's SQL stores.
//!
//! `idemgate-postgres` and `idemgate-sqlite` keep their records in different SQL
//! dialects, but their **transactional mode** is the same machinery: a handler takes
//! a [`Tx`], writes its business rows through it, drops it, and the idempotency layer
//! runs the fenced completion inside that same transaction and commits both — or
//! rolls both back. This crate holds that machinery once:
//!
//! - [`Tx`], the axum extractor (its transaction a store's [`SqlStore::Transaction`],
//!   finished through [`BusinessTransaction`]) (and [`Tx::begin`] outside axum), generic over the
//!   store; the store crates name it for their store (`idemgate_postgres::Tx`,
//!   `idemgate_sqlite::Tx`), and applications use those names;
//! - [`TxRejection`] and its `application/problem+json` answers ([`PROBLEM_NOT_BEHIND_LAYER`],
//!   [`PROBLEM_ALREADY_LENT`], [`PROBLEM_UNAVAILABLE`]);
//! - [`ErrorCodes`], [`ErrorClass`], [`classify`] and [`store_error`]: how a `sqlx`
//!   error becomes a [`StoreError`], by error variant and database code, never by message text (a
//!   missing table or a refused permission is [`StoreError::Misconfigured`], with a
//!   [`Misconfiguration`] that names the fix);
//! - [`PurgeTask`] and [`purge_in_batches`], the expiry purge both stores run;
//! - [`decode_snapshot`], [`decode_lease`], [`decode_eviction`], [`CompletionColumns`], [`millis`],
//!   [`applied`] and [`CorruptRecord`]: how a record row becomes a
//!   [`Snapshot`](idemgate_core::Snapshot) and back, whatever the dialect;
//! - [`schema_step`]: the schema-version rule every migration keeps;
//! - [`sql_store_methods!`]: the [`Store`] impl, fenced writes, reads and purges
//!   of a store whose writes run on its pool (PostgreSQL's); the SQLite store sends
//!   its writes through its one writer connection instead (group commit) and
//!   implements [`Store`] itself.
//!
//! A store plugs in by implementing [`SqlStore`]: its `sqlx` database, how it begins
//! a business transaction, its fenced completion inside one, its change signals and
//! its [`ErrorCodes`] (how it classifies its database's error codes). Everything
//! dialect-specific (the schema, the claim, the clock) stays in the store's own crate.

mod audit;
mod begin;
mod error;
mod problem;
mod purge;
mod record;
mod setup;
mod store_methods;
mod tx;

use std::ops::DerefMut;
use std::time::Duration;

use async_trait::async_trait;
use idemgate_core::audit::AuditRecord;
use idemgate_core::signals::ChangeSignals;
use idemgate_core::{Claim, ClaimRequest, Completion, FencedWrite, Lease, Store, StoreError};
use sqlx::{Database, Pool, Transaction};

pub use audit::{
    AUDIT_COLUMNS, AUDIT_ROWS_PER_INSERT, AuditColumns, chain_hash_of, decode_audit_entry,
    decode_audit_partition, partitions_statement, push_audit_rows,
};
pub use begin::{BeginToTheEnd, begin_to_the_end};
pub use error::{ErrorClass, ErrorCodes, Misconfiguration, classify, store_error};
pub use purge::{PurgeTask, purge_in_batches};
pub use record::{
    CompletionColumns, CorruptRecord, MAX_MILLIS, applied, corrupt, decode_eviction, decode_lease,
    decode_lease_acquisition, decode_snapshot, millis, token_param,
};
pub use setup::{SchemaStep, SchemaTooNew, SetupError, schema_step};

/// What [`sql_store_methods!`] expands to refers to, so a store crate needs no
/// matching dependency versions of its own. Not API.
#[doc(hidden)]
pub mod __private {
    pub use async_trait;
    pub use bytes;
    pub use idemgate_core;
    pub use sqlx;
    pub use tokio;
}
pub use tx::{
    PROBLEM_ALREADY_LENT, PROBLEM_NOT_BEHIND_LAYER, PROBLEM_OTHER_STORE, PROBLEM_UNAVAILABLE, Tx,
    TxRejection, claim_in_transaction,
};

/// A [`Store`] on a `sqlx` pool that can complete a record inside a business
/// transaction: what [`Tx`] needs from a store.
///
/// Implemented by `idemgate_postgres::PostgresStore` and `idemgate_sqlite::SqliteStore`.
/// Cheap to clone (a `Tx` keeps a clone until the layer finishes the request).
#[async_trait]
pub trait SqlStore: Store + Clone + Send + Sync + 'static {
    /// The `sqlx` database the store lives in.
    type Database: Database;

    /// The business transaction a [`Tx`] holds and the layer finishes: it
    /// dereferences to the connection the handler's statements run on. PostgreSQL
    /// uses a `sqlx::Transaction` on a pool connection of its own; SQLite lends the
    /// store's one writer connection, inside the writer's current batch, so
    /// transactional requests share its commits.
    type Transaction: BusinessTransaction<Self>
        + DerefMut<Target = <Self::Database as Database>::Connection>;

    /// How the store's database errors are classified (its error module's
    /// constant); see [`classify`].
    const ERRORS: ErrorCodes;

    /// The pool the store uses.
    fn pool(&self) -> &Pool<Self::Database>;

    /// Begins a business transaction (for [`Tx::begin`]).
    async fn begin(&self) -> Result<Self::Transaction, StoreError>;

    /// Begins the transaction a claim opens in the one-transaction mode
    /// ([`claim_in_transaction`]), its wait for another transaction's claim of
    /// the same key bounded by `lock_wait` where the database can bound it
    /// (PostgreSQL's `lock_timeout`). By default, [`SqlStore::begin`].
    async fn begin_claim(&self, lock_wait: Duration) -> Result<Self::Transaction, StoreError> {
        let _ = lock_wait;
        self.begin().await
    }

    /// Runs the claim on `connection` (a transaction from
    /// [`SqlStore::begin_claim`]), without committing. `None` when another
    /// transaction's uncommitted claim of the key held it past the wait.
    async fn claim_in(
        &self,
        connection: &mut <Self::Database as Database>::Connection,
        request: &ClaimRequest,
    ) -> Result<Option<Claim>, StoreError>;

    /// Runs the fenced completion of `lease` on `connection` (the business
    /// transaction), without committing: [`FencedWrite::Refused`] when the record no
    /// longer holds the lease's (operation id, fencing token).
    async fn complete_in(
        &self,
        connection: &mut <Self::Database as Database>::Connection,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<FencedWrite, StoreError>;

    /// Appends `records` to the store's journal in `transaction` (the
    /// business transaction), without committing: they commit or roll back
    /// with it. A store may write them then or with the commit.
    async fn append_audit_in(
        &self,
        transaction: &mut Self::Transaction,
        records: &[AuditRecord],
    ) -> Result<(), StoreError>;

    /// The fenced completion of `lease` ([`SqlStore::complete_in`]) and, if it
    /// applied, `journal` appended ([`SqlStore::append_audit_in`]), in
    /// `transaction`, without committing. By default the two one after the
    /// other; a store may send them as one statement (PostgreSQL: one round
    /// trip less per transactional request).
    async fn complete_and_append_in(
        &self,
        transaction: &mut Self::Transaction,
        lease: &Lease,
        completion: &Completion,
        journal: &[AuditRecord],
    ) -> Result<FencedWrite, StoreError> {
        complete_then_append(self, transaction, lease, completion, journal).await
    }

    /// The in-process change signals the store's waiters listen on; a transactional
    /// completion notifies them once it has committed.
    fn signals(&self) -> &ChangeSignals;
}

/// [`SqlStore::complete_and_append_in`] as two statements: the fenced
/// completion, then, if it applied, the journal's append. The trait's
/// default, and a store's way when it cannot send them as one.
pub async fn complete_then_append<S: SqlStore>(
    store: &S,
    transaction: &mut S::Transaction,
    lease: &Lease,
    completion: &Completion,
    journal: &[AuditRecord],
) -> Result<FencedWrite, StoreError> {
    let write = store
        .complete_in(&mut **transaction, lease, completion)
        .await?;
    if write == FencedWrite::Applied && !journal.is_empty() {
        store.append_audit_in(transaction, journal).await?;
    }
    Ok(write)
}

/// How the layer finishes a [`SqlStore::Transaction`]: commit it, or roll it back.
#[async_trait]
pub trait BusinessTransaction<S: SqlStore>: Send + 'static {
    /// Commits the business writes (and the completion run on it, if any). `Ok`
    /// only once they are durable.
    async fn commit(self) -> Result<(), StoreError>;

    /// Rolls the business writes back.
    async fn rollback(self) -> Result<(), StoreError>;
}

/// A plain `sqlx` transaction on a pool connection (PostgreSQL's).
#[async_trait]
impl<S: SqlStore> BusinessTransaction<S> for Transaction<'static, S::Database> {
    async fn commit(self) -> Result<(), StoreError> {
        Transaction::commit(self)
            .await
            .map_err(StoreError::unavailable)
    }

    async fn rollback(self) -> Result<(), StoreError> {
        Transaction::rollback(self).await.map_err(store_error::<S>)
    }
}
