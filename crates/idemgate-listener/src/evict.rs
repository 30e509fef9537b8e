//! The live connections of one listener, and which one to close when a new
//! connection arrives at the bound.
//!
//! Refusing the *new* connection at the bound (nginx's way) hands the listener
//! to whoever got there first: a thousand clients each holding half a request
//! head keep every legitimate client out until the header timeout cuts them,
//! and they reconnect at once. So at the bound the listener makes room instead:
//! it closes the connection that has waited longest without completing a
//! request head, else the keep-alive connection idle longest, and serves the
//! new one. Only when every connection is busy with a request — work that was
//! accepted and is being done — is the new one refused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::Instant;

use crate::connection::{Activity, Phase};

/// The listener's live connections, by a number of their own.
#[derive(Default)]
pub(crate) struct Connections {
    live: Mutex<Live>,
}

#[derive(Default)]
struct Live {
    next: u64,
    by_id: HashMap<u64, Arc<Activity>>,
}

/// A connection's place among the live ones; dropped when its task ends.
pub(crate) struct Registration {
    id: u64,
    connections: Arc<Connections>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.connections.lock().by_id.remove(&self.id);
    }
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many connections are live (not evicted, not ended).
    pub(crate) fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    /// Counts `activity` among the live connections until the registration drops.
    pub(crate) fn register(self: &Arc<Self>, activity: Arc<Activity>) -> Registration {
        let mut live = self.lock();
        let id = live.next;
        live.next += 1;
        live.by_id.insert(id, activity);
        Registration {
            id,
            connections: Arc::clone(self),
        }
    }

    /// Makes room for one connection: evicts the one that has waited longest
    /// for a request head, else the one idle longest. `false` when every
    /// connection is busy with a request (the new one must then be refused).
    pub(crate) fn evict_one(&self) -> bool {
        let mut live = self.lock();
        // A candidate may start a request between the choice and the eviction;
        // it is then busy, and the next candidate is tried.
        loop {
            let phases = live
                .by_id
                .iter()
                .map(|(id, activity)| (*id, activity.phase()));
            let Some(victim) = victim(phases) else {
                return false;
            };
            let activity = live.by_id.remove(&victim).expect("the victim is live");
            if activity.evict() {
                return true;
            }
            // Busy after all: keep counting it.
            live.by_id.insert(victim, activity);
        }
    }
}

/// Which connection to evict: the longest waiting for a head first (a client
/// that has not sent a request in all that time is the likeliest to be holding
/// the connection on purpose), then the longest idle keep-alive one; never a
/// busy one.
pub(crate) fn victim<K>(phases: impl IntoIterator<Item = (K, Phase)>) -> Option<K> {
    // (class, since): heads (0) before idles (1), older before newer.
    let mut best: Option<((u8, Instant), K)> = None;
    for (key, phase) in phases {
        let rank = match phase {
            Phase::Head(since) => (0, since),
            Phase::Idle(since) => (1, since),
            Phase::Busy(_) | Phase::Evicted => continue,
        };
        if best.as_ref().is_none_or(|(best, _)| rank < *best) {
            best = Some((rank, key));
        }
    }
    best.map(|(_, key)| key)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_longest_waiting_head_goes_first_then_the_longest_idle_never_a_busy_one() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let phases = [
            ("idle-oldest", Phase::Idle(at(0))),
            ("head-new", Phase::Head(at(30))),
            ("busy", Phase::Busy(1)),
            ("head-old", Phase::Head(at(10))),
            ("idle-new", Phase::Idle(at(40))),
        ];
        assert_eq!(victim(phases), Some("head-old"), "heads before idles");
        let without_heads = phases
            .into_iter()
            .filter(|(_, phase)| !matches!(phase, Phase::Head(_)));
        assert_eq!(victim(without_heads), Some("idle-oldest"));
        assert_eq!(
            victim([
                ("a", Phase::Busy(1)),
                ("b", Phase::Busy(3)),
                ("c", Phase::Evicted)
            ]),
            None,
            "every connection busy: nothing to evict"
        );
        assert_eq!(victim::<&str>([]), None);
    }

    #[tokio::test]
    async fn eviction_marks_the_victim_and_stops_counting_it() {
        let connections = Arc::new(Connections::default());
        let waiting = Arc::new(Activity::new());
        tokio::time::sleep(Duration::from_millis(5)).await;
        let newer = Arc::new(Activity::new());
        let busy = Arc::new(Activity::new());
        let _request = busy.begin_request();
        let _registrations = [
            connections.register(Arc::clone(&newer)),
            connections.register(Arc::clone(&busy)),
            connections.register(Arc::clone(&waiting)),
        ];
        assert_eq!(connections.len(), 3);
        assert!(connections.evict_one());
        assert_eq!(waiting.phase(), Phase::Evicted, "the one waiting longest");
        assert!(matches!(newer.phase(), Phase::Head(_)));
        assert_eq!(connections.len(), 2);
        assert!(connections.evict_one());
        assert_eq!(newer.phase(), Phase::Evicted);
        assert!(
            !connections.evict_one(),
            "only a busy connection left: the new one is refused"
        );
        assert!(matches!(busy.phase(), Phase::Busy(1)));
        assert_eq!(connections.len(), 1);
    }

    #[tokio::test]
    async fn a_registration_leaves_when_its_connection_ends() {
        let connections = Arc::new(Connections::default());
        let registration = connections.register(Arc::new(Activity::new()));
        assert_eq!(connections.len(), 1);
        drop(registration);
        assert_eq!(connections.len(), 0);
        assert!(!connections.evict_one());
    }
}
