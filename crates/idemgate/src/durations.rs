//! The execution history of each route, for the `Retry-After` of a 409
//! ([`idemgate_core::estimate`] computes it): kept in the store
//! ([`Store::record_duration`], [`Store::route_durations`]), so it survives
//! restarts and every instance on the store shares it.
//!
//! This process keeps only what saves store round trips, bounded by
//! [`MAX_ROUTES`] routes (a full map is cleared):
//! - the route's typical duration as last read, reused for [`FRESH_FOR`]: a
//!   burst of duplicates costs one store read per route per second, and a hint
//!   reflects executions recorded at most that long ago (plus the write's own
//!   delay) — the bounded staleness;
//! - when this process last recorded the route: it records at most one
//!   execution per route per [`RECORD_EVERY`], so a busy route adds at most
//!   ten small writes a second per instance, not one per request. The window of
//!   [`idemgate_core::estimate::WINDOW`] durations still turns over in seconds.
//!
//! A write runs on a task of its own after the answer is settled, off the
//! request's path; a failed write or read is logged and only costs the hint
//! its history (the lease left, clamped).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use idemgate_core::estimate::{MAX_ROUTES, retry_after, typical};
use idemgate_core::{ClaimRequest, Snapshot, Store};

/// How long a route's typical duration read from the store is reused.
pub(crate) const FRESH_FOR: Duration = Duration::from_secs(1);

/// The shortest interval between two durations of one route this process
/// records.
pub(crate) const RECORD_EVERY: Duration = Duration::from_millis(100);

/// What this process remembers of the routes' histories; shared by the layer's
/// clones.
#[derive(Debug, Default)]
pub(crate) struct RouteDurations {
    routes: Mutex<HashMap<String, Known>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Known {
    /// The typical duration last read from the store, and when.
    read: Option<(Instant, Option<Duration>)>,
    /// When this process last recorded a duration of the route.
    recorded: Option<Instant>,
}

impl RouteDurations {
    fn update<T>(&self, route: &str, change: impl FnOnce(&mut Known) -> T) -> T {
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        if !routes.contains_key(route) && routes.len() >= MAX_ROUTES {
            routes.clear();
        }
        change(routes.entry(route.to_owned()).or_default())
    }

    /// One execution of `route` took `duration`: recorded in `store` on a task
    /// of its own, unless this process recorded the route within
    /// [`RECORD_EVERY`].
    pub(crate) fn record<S: Store + ?Sized>(
        &self,
        store: &Arc<S>,
        route: &str,
        duration: Duration,
    ) {
        let now = Instant::now();
        let due = self.update(route, |known| {
            let due = known
                .recorded
                .is_none_or(|last| now.duration_since(last) >= RECORD_EVERY);
            if due {
                known.recorded = Some(now);
            }
            due
        });
        if !due {
            return;
        }
        let store = Arc::clone(store);
        let route = route.to_owned();
        tokio::spawn(async move {
            if let Err(error) = store.record_duration(&route, duration).await {
                tracing::debug!(%error, route, "recording the route's execution time failed");
            }
        });
    }

    /// The typical duration of `route` ([`typical`] of its history in the
    /// store), read at most once per [`FRESH_FOR`]; `None` without history.
    pub(crate) async fn typical(&self, store: &dyn Store, route: &str) -> Option<Duration> {
        let now = Instant::now();
        let cached = self.update(route, |known| known.read);
        if let Some((read_at, typical)) = cached
            && now.duration_since(read_at) < FRESH_FOR
        {
            return typical;
        }
        let found = match store.route_durations(route).await {
            Ok(durations) => typical(&durations),
            Err(error) => {
                tracing::debug!(%error, route, "reading the route's execution times failed");
                return None;
            }
        };
        self.update(route, |known| known.read = Some((now, found)));
        found
    }

    /// The `Retry-After` of a 409 for `snapshot`'s running operation on `route`
    /// (PROTOCOL §6.3): the route's typical duration less the operation's age
    /// (by the store's clock, like the lease); the lease left only without
    /// history; within [1, 60] s. See [`idemgate_core::estimate::retry_after`].
    pub(crate) async fn in_progress_hint(
        &self,
        store: &dyn Store,
        route: &str,
        snapshot: &Snapshot,
        lease_left: Duration,
    ) -> Duration {
        let running_for = snapshot.now.duration_since(snapshot.record.created_at);
        retry_after(lease_left, self.typical(store, route).await, running_for)
    }
}

/// The key of a route's history: its method and template (the scope's path
/// where no template is known, [`ClaimRequest::route`]).
pub(crate) fn route_key(claim: &ClaimRequest) -> String {
    format!("{} {}", claim.identity.scope().method, claim.route())
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_core::MemoryStore;

    #[tokio::test]
    async fn history_is_the_stores_and_read_once_per_interval() {
        let store = Arc::new(MemoryStore::new());
        let durations = RouteDurations::default();
        assert_eq!(durations.typical(store.as_ref(), "POST /a").await, None);
        // Recorded by another instance: seen once the cached read is stale.
        store
            .record_duration("POST /a", Duration::from_secs(3))
            .await
            .unwrap();
        assert_eq!(durations.typical(store.as_ref(), "POST /a").await, None);
        durations.update("POST /a", |known| {
            known.read = Some((Instant::now() - FRESH_FOR, None));
        });
        assert_eq!(
            durations.typical(store.as_ref(), "POST /a").await,
            Some(Duration::from_secs(3))
        );
    }

    #[tokio::test]
    async fn a_route_is_recorded_at_most_once_per_interval() {
        let store = Arc::new(MemoryStore::new());
        let durations = RouteDurations::default();
        for _ in 0..5 {
            durations.record(&store, "POST /a", Duration::from_secs(2));
        }
        durations.record(&store, "POST /b", Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(store.route_durations("POST /a").await.unwrap().len(), 1);
        assert_eq!(store.route_durations("POST /b").await.unwrap().len(), 1);
        tokio::time::sleep(RECORD_EVERY).await;
        durations.record(&store, "POST /a", Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(store.route_durations("POST /a").await.unwrap().len(), 2);
    }

    #[test]
    fn the_map_is_bounded() {
        let durations = RouteDurations::default();
        for n in 0..MAX_ROUTES + 10 {
            durations.update(&format!("POST /orders/{n}"), |_| ());
        }
        assert!(durations.routes.lock().unwrap().len() <= MAX_ROUTES);
    }
}
