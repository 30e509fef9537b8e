//! The recent execution durations of each route this layer runs, for the
//! `Retry-After` of a 409 ([`idemgate_core::estimate`] computes it from them).
//!
//! Per process: an instance estimates from the executions it ran itself, which
//! behind a load balancer are a fair sample of the route's. Bounded: at most
//! [`MAX_ROUTES`] routes are tracked (a path with ids in it makes a route per
//! id), and a route without history of its own borrows the layer-wide window.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use idemgate_core::Snapshot;
use idemgate_core::estimate::{RecentDurations, retry_after};
use idemgate_core::scope::Scope;

/// The most routes with a window of their own.
const MAX_ROUTES: usize = 1024;

/// Windows of recent durations: one per route (method and scope path), and one
/// over every route of the layer.
#[derive(Debug, Default)]
pub(crate) struct RouteDurations {
    windows: Mutex<Windows>,
}

#[derive(Debug, Default)]
struct Windows {
    routes: HashMap<String, RecentDurations>,
    all: RecentDurations,
}

impl RouteDurations {
    /// One execution of `route` took `duration`.
    pub(crate) fn record(&self, route: &str, duration: Duration) {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        windows.all.record(duration);
        if let Some(window) = windows.routes.get_mut(route) {
            window.record(duration);
        } else if windows.routes.len() < MAX_ROUTES {
            windows
                .routes
                .entry(route.to_owned())
                .or_default()
                .record(duration);
        }
    }

    /// The typical duration of `route`: its own window's, else the layer-wide
    /// one's; `None` before any execution.
    pub(crate) fn typical(&self, route: &str) -> Option<Duration> {
        let windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        windows
            .routes
            .get(route)
            .and_then(RecentDurations::typical)
            .or_else(|| windows.all.typical())
    }
    /// The `Retry-After` of a 409 for `snapshot`'s running operation on `route`
    /// (PROTOCOL §6.3): the route's typical duration less the operation's age (by
    /// the store's clock, like the lease), bounded by `lease_left`; see
    /// [`idemgate_core::estimate::retry_after`].
    pub(crate) fn in_progress_hint(
        &self,
        route: &str,
        snapshot: &Snapshot,
        lease_left: Duration,
    ) -> Duration {
        let running_for = snapshot.now.duration_since(snapshot.record.created_at);
        retry_after(lease_left, self.typical(route), running_for)
    }
}

/// The key of a route's window: its method and scope path.
pub(crate) fn route_key(scope: &Scope) -> String {
    format!("{} {}", scope.method, scope.path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_uses_its_own_window_else_the_layers() {
        let durations = RouteDurations::default();
        assert_eq!(durations.typical("POST /a"), None);
        durations.record("POST /a", Duration::from_secs(3));
        durations.record("POST /b", Duration::from_secs(1));
        assert_eq!(durations.typical("POST /a"), Some(Duration::from_secs(3)));
        assert_eq!(durations.typical("POST /b"), Some(Duration::from_secs(1)));
        assert_eq!(durations.typical("POST /c"), Some(Duration::from_secs(3)));
    }

    #[test]
    fn routes_beyond_the_bound_share_the_layers_window() {
        let durations = RouteDurations::default();
        for n in 0..MAX_ROUTES + 10 {
            durations.record(&format!("POST /orders/{n}"), Duration::from_secs(2));
        }
        let windows = durations.windows.lock().unwrap();
        assert_eq!(windows.routes.len(), MAX_ROUTES);
        assert_eq!(windows.all.len(), idemgate_core::estimate::WINDOW);
    }
}
