//! In-process wake-ups for requests waiting on another request's record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::scope::IdentityDigest;

/// Wakes waiters when a record changes on this instance.
///
/// Stores call [`ChangeSignals::notify`] after each completion, release or delete,
/// and implement [`crate::Store::wait_for_change`] with [`ChangeSignals::wait`].
/// Waiters on other instances are not reached by it: a shared store announces its
/// changes through the backend (Redis pub/sub, PostgreSQL `LISTEN/NOTIFY`) and its
/// listener calls [`ChangeSignals::notify`] here. A wait is always bounded by its
/// timeout, since every announcement is a hint.
#[derive(Default, Debug)]
pub struct ChangeSignals {
    waiting: Mutex<HashMap<IdentityDigest, Arc<Notify>>>,
}

impl ChangeSignals {
    /// Signals with no waiters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits for a change to `identity`, at most `timeout`.
    pub async fn wait(&self, identity: &IdentityDigest, timeout: Duration) {
        let (notify, notified) = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            let notify = Arc::clone(waiting.entry(*identity).or_default());
            // Registered before the lock is released, so a `notify` that runs right
            // after cannot slip between registration and the wait.
            let notified = Arc::clone(&notify).notified_owned();
            (notify, notified)
        };
        let _ = tokio::time::timeout(timeout, notified).await;
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        // The map's reference and ours: no one else waits, so forget the entry.
        if Arc::strong_count(&notify) == 2 {
            waiting.remove(identity);
        }
    }

    /// Wakes everyone waiting on `identity`.
    pub fn notify(&self, identity: &IdentityDigest) {
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(notify) = waiting.get(identity) {
            notify.notify_waiters();
        }
    }

    /// Wakes every waiter, on every identity: what changed is unknown (a store's
    /// announcements may have been lost), so each looks again.
    pub fn notify_all(&self) {
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        for notify in waiting.values() {
            notify.notify_waiters();
        }
    }

    /// How many identities have waiters (for tests and metrics).
    pub fn waiting_identities(&self) -> usize {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[tokio::test]
    async fn notify_wakes_a_waiter_early_and_the_entry_is_dropped() {
        let signals = Arc::new(ChangeSignals::new());
        let id = IdentityDigest::from_bytes([7; 32]);
        let waiter = {
            let signals = Arc::clone(&signals);
            tokio::spawn(async move {
                let start = Instant::now();
                signals.wait(&id, Duration::from_secs(10)).await;
                start.elapsed()
            })
        };
        while signals.waiting_identities() == 0 {
            tokio::task::yield_now().await;
        }
        signals.notify(&id);
        let waited = waiter.await.unwrap();
        assert!(waited < Duration::from_secs(5), "woke after {waited:?}");
        assert_eq!(signals.waiting_identities(), 0);
    }

    #[tokio::test]
    async fn wait_is_bounded_by_its_timeout() {
        let signals = ChangeSignals::new();
        let start = Instant::now();
        signals
            .wait(
                &IdentityDigest::from_bytes([1; 32]),
                Duration::from_millis(20),
            )
            .await;
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert_eq!(signals.waiting_identities(), 0);
    }
}
