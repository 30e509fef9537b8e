//! Handlers run detached from the client connection (PROTOCOL §8, PITFALLS 5):
//! bounded in number, tracked so a graceful shutdown can wait for them.

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
    permits: Arc<Semaphore>,
    /// Start instants of running operations (with a tiebreak id), oldest first.
    in_flight: Mutex<BTreeSet<(Instant, u64)>>,
    next_id: AtomicU64,
}

impl DetachedTasks {
    pub(crate) fn new(max_in_flight: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                tracker: TaskTracker::new(),
                permits: Arc::new(Semaphore::new(max_in_flight)),
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

    pub(crate) fn try_permit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.inner.permits).try_acquire_owned().ok()
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
        let tasks = DetachedTasks::new(4);
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
        let tasks = DetachedTasks::new(4);
        tasks.spawn(tokio::time::sleep(Duration::from_secs(60)));
        assert!(!tasks.shutdown(Duration::from_millis(50)).await);
    }

    #[test]
    fn permits_are_bounded_and_in_flight_is_tracked() {
        let tasks = DetachedTasks::new(2);
        let a = tasks.try_permit();
        let b = tasks.try_permit();
        assert!(a.is_some() && b.is_some());
        assert!(tasks.try_permit().is_none());
        drop(a);
        assert!(tasks.try_permit().is_some());

        assert!(tasks.oldest_in_flight().is_none());
        let guard = tasks.enter();
        std::thread::sleep(Duration::from_millis(5));
        assert!(tasks.oldest_in_flight().unwrap() >= Duration::from_millis(5));
        drop(guard);
        assert!(tasks.oldest_in_flight().is_none());
    }
}
