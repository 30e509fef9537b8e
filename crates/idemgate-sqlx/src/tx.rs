//! The transactional mode: `Tx`, the business transaction the layer completes.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::{FromRef, FromRequestParts};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;
use idemgate_core::audit::AuditRecord;
use idemgate_core::transaction::{
    AlreadyLent, ClaimInTransaction, PendingTransaction, TransactionSlot,
};
use idemgate_core::{Claim, ClaimRequest, Completion, FencedWrite, Lease, StoreError};
use sqlx::Database;

use crate::problem::Problem;
use crate::{BusinessTransaction, SqlStore};

/// The problem `type` of [`TxRejection::NotBehindLayer`].
pub const PROBLEM_NOT_BEHIND_LAYER: &str = "/problems/transaction-without-layer";
/// The problem `type` of [`TxRejection::AlreadyLent`].
pub const PROBLEM_ALREADY_LENT: &str = "/problems/transaction-already-taken";
/// The problem `type` of [`TxRejection::OtherStore`].
pub const PROBLEM_OTHER_STORE: &str = "/problems/transaction-of-another-store";
/// The problem `type` of [`TxRejection::Unavailable`].
pub const PROBLEM_UNAVAILABLE: &str = "/problems/store-unavailable";

/// A business transaction that commits together with the idempotency record.
///
/// Applications use their store crate's name for it, `idemgate_postgres::Tx` or
/// `idemgate_sqlite::Tx` (this type for their store), whose docs say what holding one
/// costs on that database.
///
/// Take it as an axum extractor (the state must provide the store `S` through
/// `FromRef`), or with [`Tx::begin`]. It dereferences to the transaction's
/// connection (`PgConnection`, `SqliteConnection`), so queries run with
/// `.execute(&mut *tx)`. Do not commit it yourself: when the handler drops it, the
/// transaction goes back to the request's [`TransactionSlot`] uncommitted, and the
/// layer adds the fenced completion to it and commits both, or rolls both back. One
/// `Tx` per request.
pub struct Tx<S: SqlStore> {
    /// `Some` from `begin` until `drop`.
    transaction: Option<S::Transaction>,
    slot: TransactionSlot,
    store: S,
}

impl<S: SqlStore> Tx<S> {
    /// Lends the request's transaction from `slot` and begins it on `store`'s pool
    /// (what the extractor does; for code outside axum).
    /// In the one-transaction mode it continues the transaction the claim was
    /// made in, which the layer offered in the slot.
    pub async fn begin(store: &S, slot: &TransactionSlot) -> Result<Self, TxRejection> {
        if let Some(offered) = slot.lend()? {
            // Not this store's transaction (the layer's store is another
            // one): dropped here, it rolls back and takes the claim with it,
            // and the layer settles the run as one whose transaction never
            // came back.
            let transaction = offered
                .into_any()
                .downcast::<Pending<S>>()
                .ok()
                .and_then(|pending| pending.transaction)
                .ok_or(TxRejection::OtherStore)?;
            return Ok(Self {
                transaction: Some(transaction),
                slot: slot.clone(),
                store: store.clone(),
            });
        }
        // Until the transaction began, the slot gets an empty one back if this
        // is given up on (a deadline around the handler cut it short): nothing
        // was written, and the layer must not think the handler kept it.
        let nothing_written = NothingWritten { slot, store };
        match store.begin().await {
            Ok(transaction) => {
                nothing_written.defuse();
                Ok(Self {
                    transaction: Some(transaction),
                    slot: slot.clone(),
                    store: store.clone(),
                })
            }
            // Dropped: the empty transaction goes back, so the layer knows no
            // business write can be pending.
            Err(err) => Err(TxRejection::Unavailable(err)),
        }
    }
}

/// Gives an empty transaction back to the slot when dropped: a [`Tx::begin`]
/// that failed, or that was given up on before its `BEGIN` answered.
struct NothingWritten<'a, S: SqlStore> {
    slot: &'a TransactionSlot,
    store: &'a S,
}

impl<S: SqlStore> NothingWritten<'_, S> {
    /// The transaction began: the `Tx` gives it back from now on.
    fn defuse(self) {
        std::mem::forget(self);
    }
}

impl<S: SqlStore> Drop for NothingWritten<'_, S> {
    fn drop(&mut self) {
        self.slot.give_back(Box::new(Pending {
            transaction: None,
            store: self.store.clone(),
        }));
    }
}

impl<S: SqlStore> Deref for Tx<S> {
    type Target = <S::Database as Database>::Connection;

    fn deref(&self) -> &Self::Target {
        // Invariant: `transaction` is `Some` from `begin` until `drop` takes it.
        self.transaction
            .as_deref()
            .expect("Tx used after it was handed back")
    }
}

impl<S: SqlStore> DerefMut for Tx<S> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.transaction
            .as_deref_mut()
            .expect("Tx used after it was handed back")
    }
}

impl<S: SqlStore> Drop for Tx<S> {
    fn drop(&mut self) {
        if let Some(transaction) = self.transaction.take() {
            self.slot.give_back(Box::new(Pending {
                transaction: Some(transaction),
                store: self.store.clone(),
            }));
        }
    }
}

impl<S: SqlStore> fmt::Debug for Tx<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx")
            .field("open", &self.transaction.is_some())
            .finish_non_exhaustive()
    }
}

impl<S, State> FromRequestParts<State> for Tx<S>
where
    S: SqlStore + FromRef<State>,
    State: Send + Sync,
{
    type Rejection = TxRejection;

    async fn from_request_parts(parts: &mut Parts, state: &State) -> Result<Self, Self::Rejection> {
        let slot = parts
            .extensions
            .get::<TransactionSlot>()
            .cloned()
            .ok_or(TxRejection::NotBehindLayer)?;
        let store = S::from_ref(state);
        Self::begin(&store, &slot).await
    }
}

/// Why a [`Tx`] could not be had. As a response: `application/problem+json`, 500 for
/// the two programming errors, 503 with `Retry-After: 1` when the database is
/// unavailable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TxRejection {
    /// The request has no [`TransactionSlot`]: the route is not behind
    /// `IdempotencyLayer` (or the method is not one it covers).
    #[error("route is not behind IdempotencyLayer: the request has no transaction slot")]
    NotBehindLayer,
    /// The handler already took its transaction.
    #[error(transparent)]
    AlreadyLent(#[from] AlreadyLent),
    /// The transaction could not begin.
    #[error("could not begin the business transaction")]
    Unavailable(#[source] StoreError),
    /// The layer claimed in a transaction of another store than the extractor's
    /// (the one-transaction mode): the handler's writes could not commit with
    /// the claim.
    #[error(
        "the layer claimed in another store's transaction: the handler's Tx must name the layer's store"
    )]
    OtherStore,
}

impl IntoResponse for TxRejection {
    fn into_response(self) -> Response {
        let detail = self.to_string();
        let problem = match self {
            Self::NotBehindLayer => Problem {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                kind: PROBLEM_NOT_BEHIND_LAYER,
                title: "Transactional handler without idempotency layer",
                detail,
                retry_after: None,
            },
            Self::OtherStore => Problem {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                kind: PROBLEM_OTHER_STORE,
                title: "Transaction of another store",
                detail,
                retry_after: None,
            },
            Self::AlreadyLent(_) => Problem {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                kind: PROBLEM_ALREADY_LENT,
                title: "Transaction already taken",
                detail,
                retry_after: None,
            },
            Self::Unavailable(_) => Problem {
                status: StatusCode::SERVICE_UNAVAILABLE,
                kind: PROBLEM_UNAVAILABLE,
                title: "Store unavailable",
                detail,
                retry_after: Some(1),
            },
        };
        problem.into_response()
    }
}

/// A handler's transaction, back in the slot and waiting for the layer; or, in
/// the one-transaction mode, the claim's, offered to the handler.
pub(crate) struct Pending<S: SqlStore> {
    /// `None` when the transaction never began (nothing to commit).
    transaction: Option<S::Transaction>,
    store: S,
}

#[async_trait]
impl<S: SqlStore> PendingTransaction for Pending<S> {
    async fn complete_and_commit(
        self: Box<Self>,
        lease: &Lease,
        completion: &Completion,
        journal: &[AuditRecord],
    ) -> Result<FencedWrite, StoreError> {
        let Self { transaction, store } = *self;
        let mut transaction = match transaction {
            Some(transaction) => transaction,
            None if journal.is_empty() => return store.complete(lease, completion).await,
            // No business writes, but entries that must not go without the
            // completion: a transaction of their own.
            None => store.begin().await?,
        };
        // An error drops the transaction, which rolls it back.
        let write = store
            .complete_and_append_in(&mut transaction, lease, completion, journal)
            .await?;
        if write == FencedWrite::Refused {
            // The record moved on: the business writes go with the refused result.
            // A failed rollback leaves nothing committed either (the connection
            // rolls back when it is dropped), so the answer stays `Refused`.
            if let Err(error) = BusinessTransaction::<S>::rollback(transaction).await {
                tracing::warn!(%error, "rolling back a refused transactional completion failed");
            }
            return Ok(FencedWrite::Refused);
        }
        BusinessTransaction::<S>::commit(transaction).await?;
        store.signals().notify(&lease.identity);
        Ok(FencedWrite::Applied)
    }

    async fn commit(self: Box<Self>) -> Result<(), StoreError> {
        match self.transaction {
            Some(transaction) => BusinessTransaction::<S>::commit(transaction).await,
            None => Ok(()),
        }
    }

    async fn rollback(self: Box<Self>) -> Result<(), StoreError> {
        match self.transaction {
            Some(transaction) => BusinessTransaction::<S>::rollback(transaction).await,
            None => Ok(()),
        }
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

/// [`Store::claim_in_transaction`](idemgate_core::Store::claim_in_transaction)
/// for a SQL store: a transaction begun for the claim
/// ([`SqlStore::begin_claim`]), the claim its first statement
/// ([`SqlStore::claim_in`]); kept open when the claim is acquired, rolled back
/// otherwise.
pub async fn claim_in_transaction<S: SqlStore>(
    store: &S,
    request: &ClaimRequest,
    lock_wait: Duration,
) -> Result<ClaimInTransaction, StoreError> {
    let mut transaction = store.begin_claim(lock_wait).await?;
    // An error drops the transaction, which rolls it back.
    let claim = store.claim_in(&mut transaction, request).await?;
    match claim {
        Some(Claim::Acquired(lease)) => Ok(ClaimInTransaction::Acquired {
            lease,
            transaction: Box::new(Pending {
                transaction: Some(transaction),
                store: store.clone(),
            }),
        }),
        other => {
            // Nothing was written that should stay; a failed rollback leaves
            // nothing either (the connection rolls back when it is dropped).
            if let Err(error) = BusinessTransaction::<S>::rollback(transaction).await {
                tracing::warn!(%error, "rolling back an unclaimed transaction failed");
            }
            Ok(match other {
                Some(Claim::Existing(snapshot)) => ClaimInTransaction::Existing(snapshot),
                _ => ClaimInTransaction::Locked,
            })
        }
    }
}
