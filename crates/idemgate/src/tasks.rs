//! Handlers run detached from the client connection (PROTOCOL §8, PITFALLS 5):
//! bounded in number ([`InFlightLimit`]), tracked so a graceful shutdown can wait
//! for them ([`DetachedTasks`]).
//!
//! The two are separate on purpose: the limit is layer configuration, replaced by
//! `with_max_in_flight`, while the tracker is created once per layer and shared by
//! every handle taken from it, whatever the builder order.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

/// The layer's detached handler tasks. Cloning shares them.
///
/// A server's shutdown stops accepting connections, lets open ones finish, then calls
/// [`DetachedTasks::shutdown`] so handlers whose clients went away still store their
/// results:
///
/// ```
/// # async fn run() {
/// let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
/// let tasks = layer.detached_tasks();
/// // … axum::serve(listener, app).with_graceful_shutdown(signal).await …
/// let all_finished = tasks.shutdown(std::time::Duration::from_secs(30)).await;
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct DetachedTasks {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tracker: TaskTracker,
    /// Start instants of running operations (with a tiebreak id), oldest first.
    in_flight: Mutex<BTreeSet<(Instant, u64)>>,
    next_id: AtomicU64,
}

impl DetachedTasks {
    pub(crate) fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                tracker: TaskTracker::new(),
                in_flight: Mutex::default(),
                next_id: AtomicU64::new(0),
            }),
        }
    }

    /// Handler tasks still running.
    pub fn running(&self) -> usize {
        self.inner.tracker.len()
    }

    /// How long this process's oldest running operation has been running.
    pub fn oldest_in_flight(&self) -> Option<Duration> {
        let in_flight = self
            .inner
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        in_flight.first().map(|(started, _)| started.elapsed())
    }

    /// Sets the `idemgate_in_flight` and `idemgate_oldest_in_flight_seconds` gauges;
    /// call it before rendering metrics so the age is current.
    pub fn record_gauges(&self) {
        self.change_in_flight(|_| {});
    }

    /// Changes the set of running operations and sets the gauges from it, under
    /// one lock.
    fn change_in_flight(&self, change: impl FnOnce(&mut BTreeSet<(Instant, u64)>)) {
        let (count, oldest) = {
            let mut in_flight = self
                .inner
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            change(&mut in_flight);
            (
                in_flight.len(),
                in_flight.first().map(|(started, _)| started.elapsed()),
            )
        };
        metrics::gauge!("idemgate_in_flight").set(count as f64);
        metrics::gauge!("idemgate_oldest_in_flight_seconds")
            .set(oldest.map_or(0.0, |d| d.as_secs_f64()));
    }

    /// Waits up to `deadline` for every detached handler to finish and store its
    /// result. Returns whether all did. Requests arriving meanwhile still run.
    pub async fn shutdown(&self, deadline: Duration) -> bool {
        self.inner.tracker.close();
        let finished = tokio::time::timeout(deadline, self.inner.tracker.wait())
            .await
            .is_ok();
        self.inner.tracker.reopen();
        finished
    }

    pub(crate) fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.inner.tracker.spawn(task)
    }

    /// Registers a running operation until the guard drops.
    pub(crate) fn enter(&self) -> InFlight {
        let entry = (
            Instant::now(),
            self.inner.next_id.fetch_add(1, Ordering::Relaxed),
        );
        self.change_in_flight(|in_flight| {
            in_flight.insert(entry);
        });
        InFlight {
            tasks: self.clone(),
            entry,
        }
    }
}

/// The most keyed requests running at once; a request that finds no free slot is
/// answered 503 before any claim. Clones share the slots.
#[derive(Clone, Debug)]
pub(crate) struct InFlightLimit {
    permits: Arc<Semaphore>,
}

impl InFlightLimit {
    /// `max` slots (at least one, so the layer can run anything at all).
    pub(crate) fn new(max: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(max.max(1))),
        }
    }

    /// A slot, held until the permit drops; `None` when all are taken.
    pub(crate) fn try_permit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.permits).try_acquire_owned().ok()
    }
}

/// A running operation, counted until dropped.
pub(crate) struct InFlight {
    tasks: DetachedTasks,
    entry: (Instant, u64),
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let entry = self.entry;
        self.tasks.change_in_flight(|in_flight| {
            in_flight.remove(&entry);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn shutdown_waits_for_detached_tasks() {
        let tasks = DetachedTasks::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tasks.spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = tx.send(());
        });
        assert_eq!(tasks.running(), 1);
        assert!(tasks.shutdown(Duration::from_secs(5)).await);
        assert!(
            rx.await.is_ok(),
            "the task finished before shutdown returned"
        );
    }

    #[tokio::test]
    async fn shutdown_gives_up_at_the_deadline() {
        let tasks = DetachedTasks::new();
        tasks.spawn(tokio::time::sleep(Duration::from_secs(60)));
        assert!(!tasks.shutdown(Duration::from_millis(50)).await);
    }

    #[test]
    fn permits_are_bounded_and_in_flight_is_tracked() {
        let limit = InFlightLimit::new(2);
        let a = limit.try_permit();
        let b = limit.try_permit();
        assert!(a.is_some() && b.is_some());
        assert!(limit.try_permit().is_none());
        drop(a);
        assert!(limit.try_permit().is_some());
        assert!(
            InFlightLimit::new(0).try_permit().is_some(),
            "at least one slot"
        );

        let tasks = DetachedTasks::new();
        assert!(tasks.oldest_in_flight().is_none());
        let guard = tasks.enter();
        std::thread::sleep(Duration::from_millis(5));
        assert!(tasks.oldest_in_flight().unwrap() >= Duration::from_millis(5));
        drop(guard);
        assert!(tasks.oldest_in_flight().is_none());
    }
}
