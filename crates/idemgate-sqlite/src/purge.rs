//! The background purge task.

use std::future::Future;
use std::time::Duration;

use idemgate_core::StoreError;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

/// A running purge task (from [`crate::SqliteStore::spawn_purge`]). Dropping the
/// handle stops it, as does [`PurgeTask::abort`].
#[derive(Debug)]
#[must_use = "the purge task stops when its handle is dropped"]
pub struct PurgeTask {
    handle: JoinHandle<()>,
}

impl PurgeTask {
    pub(crate) fn spawn<F, Fut>(
        runtime: &tokio::runtime::Handle,
        every: Duration,
        mut run: F,
    ) -> Self
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<u64, StoreError>> + Send + 'static,
    {
        let every = every.max(Duration::from_millis(1));
        let handle = runtime.spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                match run().await {
                    Ok(0) => {}
                    Ok(purged) => tracing::debug!(purged, "purged expired idempotency records"),
                    Err(error) => {
                        tracing::warn!(%error, "purging expired idempotency records failed")
                    }
                }
            }
        });
        Self { handle }
    }

    /// Stops the task; a purge statement in flight is abandoned (its transaction
    /// rolls back or commits on its own; either is harmless).
    pub fn abort(&self) {
        self.handle.abort();
    }

    /// Whether the task has stopped.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

impl Drop for PurgeTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}
