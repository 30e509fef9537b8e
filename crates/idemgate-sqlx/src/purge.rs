//! Purging expired records: the batch loop and the background task.

use std::future::Future;
use std::time::Duration;

use idemgate_core::StoreError;
use tokio::runtime::{Handle, TryCurrentError};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

/// Deletes expired records in bounded batches until a batch comes back short, and
/// returns how many went. `delete_batch(limit)` runs one delete statement of at most
/// `limit` rows and answers how many it deleted; each batch is its own short
/// statement, so purging never holds locks for long. A `batch` of 0 deletes nothing.
pub async fn purge_in_batches<F, Fut>(batch: usize, mut delete_batch: F) -> Result<u64, StoreError>
where
    F: FnMut(i64) -> Fut,
    Fut: Future<Output = Result<u64, StoreError>>,
{
    let limit = i64::try_from(batch).unwrap_or(i64::MAX);
    if limit == 0 {
        return Ok(0);
    }
    let mut total = 0;
    loop {
        let deleted = delete_batch(limit).await?;
        total += deleted;
        if deleted < limit.unsigned_abs() {
            return Ok(total);
        }
    }
}

/// A running purge task (from a store's `spawn_purge`). Dropping the handle stops
/// it, as does [`PurgeTask::abort`].
#[derive(Debug)]
#[must_use = "the purge task stops when its handle is dropped"]
pub struct PurgeTask {
    handle: JoinHandle<()>,
}

impl PurgeTask {
    /// Runs `run` (one purge) every `every` (at least 1 ms) on the current tokio
    /// runtime, until the handle is dropped or aborted. Failed runs are logged and
    /// retried at the next tick. Fails outside a tokio runtime.
    pub fn spawn<F, Fut>(every: Duration, mut run: F) -> Result<Self, TryCurrentError>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<u64, StoreError>> + Send + 'static,
    {
        let runtime = Handle::try_current()?;
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
        Ok(Self { handle })
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Pretends to hold `expired` rows and records the limits it was asked for.
    async fn purge(expired: u64, batch: usize) -> (u64, Vec<i64>) {
        let left = Mutex::new(expired);
        let limits = Mutex::new(Vec::new());
        let total = purge_in_batches(batch, |limit| {
            limits.lock().unwrap().push(limit);
            let mut left = left.lock().unwrap();
            let deleted = (*left).min(limit.unsigned_abs());
            *left -= deleted;
            async move { Ok(deleted) }
        })
        .await
        .expect("purge");
        (total, limits.into_inner().unwrap())
    }

    #[tokio::test]
    async fn batches_until_one_comes_back_short() {
        assert_eq!(purge(25, 10).await, (25, vec![10, 10, 10]));
        assert_eq!(purge(20, 10).await, (20, vec![10, 10, 10]));
        assert_eq!(purge(0, 10).await, (0, vec![10]));
        assert_eq!(
            purge(5, 0).await,
            (0, vec![]),
            "a batch of 0 deletes nothing"
        );
        assert_eq!(purge(3, usize::MAX).await, (3, vec![i64::MAX]));
    }

    #[test]
    fn spawning_outside_a_runtime_is_an_error() {
        let spawned = PurgeTask::spawn(Duration::from_secs(1), || async { Ok(0) });
        assert!(spawned.is_err());
    }
}
