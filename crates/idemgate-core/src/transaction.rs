//! The hand-over between a handler's business transaction and the layer's completion
//! (the transactional mode of the SQL stores).
//!
//! The layer puts a [`TransactionSlot`] in every keyed request. A transactional store's
//! extractor (`idemgate_postgres::Tx`, `idemgate_sqlite::Tx`) lends itself a database
//! transaction from it; when the handler returns, the transaction comes back to the
//! slot as a [`PendingTransaction`], and the layer adds the fenced completion to that
//! same transaction and commits both — or rolls both back. The order row and the
//! `COMPLETED` record therefore commit together or not at all.
//!
//! Requests without a key get a slot too, on the methods the layer covers: their
//! transaction is committed when the response is not a 5xx, rolled back otherwise.
//!
//! In the **one-transaction mode** (PROTOCOL §23) the order is turned around: the
//! store opens the transaction and claims inside it
//! ([`Store::claim_in_transaction`](crate::Store::claim_in_transaction)), the layer
//! [offers](TransactionSlot::offer) that transaction in the slot, and the handler's
//! extractor takes it instead of beginning one. The claim, the business writes and
//! the completion then commit once, together.

use std::sync::{Arc, Mutex, PoisonError};

// The Store trait's side of the hand-over, kept with it in `crate::store` (its
// methods return them); named here too, where the slot that holds them is.
pub use crate::store::{ClaimInTransaction, OneTransactionUnsupported, PendingTransaction};

/// What a slot holds when the layer looks at it after the handler.
///
/// Exhaustive on purpose: the layer must handle each case.
pub enum SlotContents {
    /// The handler opened no transaction.
    Unused,
    /// The handler's transaction, back and uncommitted.
    Returned(Box<dyn PendingTransaction>),
    /// The handler took a transaction and has not given it back (it moved it into a
    /// task that outlived the handler). Its writes will roll back when it is dropped,
    /// so the operation must be treated as not done.
    StillLent,
}

impl std::fmt::Debug for SlotContents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The transaction itself is opaque: only which case this is.
        f.write_str(match self {
            Self::Unused => "Unused",
            Self::Returned(_) => "Returned(..)",
            Self::StillLent => "StillLent",
        })
    }
}

enum State {
    Unused,
    /// The layer's own transaction, holding the claim (the one-transaction
    /// mode), waiting for the handler to take it — or for the layer, if it never does.
    Offered(Box<dyn PendingTransaction>),
    Lent,
    Returned(Box<dyn PendingTransaction>),
    Taken,
}

/// One request's transaction hand-over point. Cloning shares it.
#[derive(Clone)]
pub struct TransactionSlot(Arc<Mutex<State>>);

impl Default for TransactionSlot {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(State::Unused)))
    }
}

impl std::fmt::Debug for TransactionSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TransactionSlot")
    }
}

/// Why a transaction cannot be lent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this request already took its transaction: one transactional extractor per handler")]
pub struct AlreadyLent;

impl TransactionSlot {
    /// A fresh, unused slot.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts the transaction the claim was made in (the one-transaction mode) in
    /// the slot, for the handler's extractor to take with [`TransactionSlot::lend`].
    pub fn offer(&self, transaction: Box<dyn PendingTransaction>) {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *state = State::Offered(transaction);
    }

    /// Marks the slot lent. `Ok(None)`: the extractor begins its own
    /// transaction; `Ok(Some(_))`: it continues the [offered](TransactionSlot::offer)
    /// one. Fails if the request already took one: two transactions could not
    /// commit atomically with one completion.
    pub fn lend(&self) -> Result<Option<Box<dyn PendingTransaction>>, AlreadyLent> {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(&mut *state, State::Lent) {
            State::Unused => Ok(None),
            State::Offered(transaction) => Ok(Some(transaction)),
            other => {
                *state = other;
                Err(AlreadyLent)
            }
        }
    }

    /// Gives the transaction back (the extractor does this when dropped).
    pub fn give_back(&self, transaction: Box<dyn PendingTransaction>) {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(*state, State::Lent) {
            *state = State::Returned(transaction);
        }
        // Otherwise the layer already decided without it; dropping the transaction
        // here rolls it back.
    }

    /// Whether the handler took a transaction (lent, or given back and not
    /// yet taken): its writes then wait for the settlement.
    pub fn is_in_use(&self) -> bool {
        let state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        matches!(*state, State::Offered(_) | State::Lent | State::Returned(_))
    }

    /// Takes what the slot holds; later `give_back`s are rolled back by drop.
    pub fn take(&self) -> SlotContents {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(&mut *state, State::Taken) {
            State::Unused | State::Taken => SlotContents::Unused,
            State::Lent => SlotContents::StillLent,
            // The handler never took it: the layer finishes it all the same.
            State::Offered(transaction) | State::Returned(transaction) => {
                SlotContents::Returned(transaction)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::any::Any;

    use async_trait::async_trait;

    use super::*;
    use crate::audit::AuditRecord;
    use crate::store::{Completion, FencedWrite, Lease, StoreError};

    struct Fake;

    #[async_trait]
    impl PendingTransaction for Fake {
        async fn complete_and_commit(
            self: Box<Self>,
            _: &Lease,
            _: &Completion,
            _: &[AuditRecord],
        ) -> Result<FencedWrite, StoreError> {
            Ok(FencedWrite::Applied)
        }
        async fn commit(self: Box<Self>) -> Result<(), StoreError> {
            Ok(())
        }
        async fn rollback(self: Box<Self>) -> Result<(), StoreError> {
            Ok(())
        }
        fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
            self
        }
    }

    #[test]
    fn one_lend_per_request() {
        let slot = TransactionSlot::new();
        assert!(matches!(slot.lend(), Ok(None)));
        assert!(matches!(slot.lend(), Err(AlreadyLent)));
    }

    #[test]
    fn take_reports_each_state() {
        let slot = TransactionSlot::new();
        assert!(matches!(slot.take(), SlotContents::Unused));

        let slot = TransactionSlot::new();
        slot.lend().unwrap();
        assert!(matches!(slot.take(), SlotContents::StillLent));
        slot.give_back(Box::new(Fake)); // too late: dropped, not kept
        assert!(matches!(slot.take(), SlotContents::Unused));

        let slot = TransactionSlot::new();
        slot.lend().unwrap();
        slot.give_back(Box::new(Fake));
        assert!(matches!(slot.take(), SlotContents::Returned(_)));
    }

    #[test]
    fn an_offered_transaction_is_lent_once_and_finished_by_the_layer_if_never_taken() {
        let slot = TransactionSlot::new();
        slot.offer(Box::new(Fake));
        assert!(slot.is_in_use());
        let lent = slot.lend().unwrap().expect("the offered transaction");
        assert!(lent.into_any().downcast::<Fake>().is_ok());
        assert!(matches!(slot.lend(), Err(AlreadyLent)));

        let slot = TransactionSlot::new();
        slot.offer(Box::new(Fake));
        assert!(matches!(slot.take(), SlotContents::Returned(_)));
    }
}
