//! The live connections of one listener, and which one to close when a new
//! connection arrives at the bound.
//!
//! Refusing the *new* connection at the bound (nginx's way) hands the listener
//! to whoever got there first: a thousand clients each holding half a request
//! head keep every legitimate client out until the header timeout cuts them,
//! and they reconnect at once. So at the bound the listener makes room instead:
//! it closes the connection that has waited longest without completing a
//! request head (once it has waited past a grace period: every connection
//! starts waiting for a head at accept, a keep-alive one at its first byte, and
//! ordinary traffic should not evict a client sending its request right now),
//! else the keep-alive connection idle longest, else the youngest heads, and
//! serves the new one. Only when every connection is busy with a request (or
//! still sending a response) — work that was accepted and is being done — is
//! the new one refused.
//!
//! An evicted connection keeps its descriptor until its task ends (at once for
//! a head, within [`EVICTION_GRACE`](crate::connection::EVICTION_GRACE) for a
//! connection finishing a response), so it is counted until then, and at most
//! [`EVICTING_ALLOWANCE`] of them may be over the bound at once: a burst of new
//! connections cannot eat the descriptor reserve.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::connection::{Activity, Phase};
use crate::limits::FD_RESERVE;

/// How many evicted connections still closing may take the total over the
/// bound: half the descriptor reserve.
pub(crate) const EVICTING_ALLOWANCE: usize = (FD_RESERVE / 2) as usize;

/// The listener's live connections, by a number of their own.
#[derive(Default)]
pub(crate) struct Connections {
    live: Mutex<Live>,
    /// Woken when an evicted connection's task ends.
    closed: Notify,
}

#[derive(Default)]
struct Live {
    next: u64,
    /// The connections that may be evicted or are busy.
    by_id: HashMap<u64, Arc<Activity>>,
    /// Evicted, their tasks not yet ended (their descriptors still open).
    evicting: usize,
    /// The candidates in eviction order, as of `built`: a scan of every
    /// connection per accept at the bound would be O(n) under the lock.
    order: VecDeque<(u64, Phase)>,
    built: Option<Instant>,
}

/// How long an eviction order is used before it is built again. Entries are
/// checked before use (a connection whose phase changed since is skipped), so
/// the order is at most this stale for connections that changed or arrived.
const ORDER_MAX_AGE: Duration = Duration::from_millis(100);

/// A connection's place among the live ones; dropped when its task ends.
pub(crate) struct Registration {
    id: u64,
    connections: Arc<Connections>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut live = self.connections.lock();
        if live.by_id.remove(&self.id).is_none() {
            // Evicted: its descriptor closes now.
            live.evicting -= 1;
            drop(live);
            self.connections.closed.notify_waiters();
        }
    }
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many connections hold a descriptor: live ones and evicted ones
    /// still closing.
    pub(crate) fn len(&self) -> usize {
        let live = self.lock();
        live.by_id.len() + live.evicting
    }

    /// How many evicted connections are still closing.
    pub(crate) fn evicting(&self) -> usize {
        self.lock().evicting
    }

    /// Waits (at most `timeout`) until fewer than `limit` evicted connections
    /// are still closing. Most close within a turn of their task; one finishing
    /// a response within the eviction grace.
    pub(crate) async fn wait_for_evicting_below(&self, limit: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let closed = self.closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if self.evicting() < limit {
                return;
            }
            if tokio::time::timeout_at(deadline, closed).await.is_err() {
                return;
            }
        }
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

    /// Tells every live connection that the listener stopped
    /// ([`Activity::stop`]); the evicted ones are closing already.
    pub(crate) fn stop_all(&self) {
        for activity in self.lock().by_id.values() {
            activity.stop();
        }
    }

    /// Makes room for one connection: evicts the first by [`victim`]'s order.
    /// `false` when every connection is busy with a request or a response (the
    /// new one must then be refused).
    pub(crate) fn evict_one(&self, head_grace: Duration) -> bool {
        let mut live = self.lock();
        let now = Instant::now();
        let mut fresh = false;
        if live
            .built
            .is_none_or(|built| now.saturating_duration_since(built) >= ORDER_MAX_AGE)
        {
            live.rebuild(now, head_grace);
            fresh = true;
        }
        loop {
            while let Some((id, phase)) = live.order.pop_front() {
                // Ended, evicted, or its phase changed since the order was
                // built (a request began, or it went idle again): skipped. A
                // candidate may also start a request (or a write) right now;
                // `evict` then refuses it.
                let Some(activity) = live.by_id.get(&id) else {
                    continue;
                };
                if activity.phase() != phase || activity.is_writing() || !activity.evict() {
                    continue;
                }
                live.by_id.remove(&id);
                live.evicting += 1;
                return true;
            }
            if fresh {
                // A scan of every connection found none: all busy.
                return false;
            }
            live.rebuild(now, head_grace);
            fresh = true;
        }
    }
}

impl Live {
    /// The eviction order of every connection now.
    fn rebuild(&mut self, now: Instant, head_grace: Duration) {
        let phases = self.by_id.iter().map(|(id, activity)| {
            let phase = activity.phase();
            ((*id, phase), phase, activity.is_writing())
        });
        self.order = ranked(phases, now, head_grace).into();
        self.built = Some(now);
    }
}

/// How long a connection may wait for a request head before it is preferred
/// for eviction over idle keep-alive ones: a tenth of the header-read timeout,
/// at least 1 s (a TLS handshake and a request on a slow link).
pub(crate) fn head_grace(header_read_timeout: Duration) -> Duration {
    (header_read_timeout / 10).max(Duration::from_secs(1))
}

/// Which connection to evict, from each one's phase and whether it is still
/// writing a response: first the longest waiting for a head past `head_grace`
/// (a client that has not sent a request in all that time is the likeliest to
/// be holding the connection on purpose), then the longest idle keep-alive one,
/// then the longest waiting for a head within the grace (a client sending its
/// request right now is cut last); never a busy one, nor an idle one whose
/// last response is still being sent.
#[cfg(test)]
pub(crate) fn victim<K>(
    phases: impl IntoIterator<Item = (K, Phase, bool)>,
    now: Instant,
    head_grace: Duration,
) -> Option<K> {
    ranked(phases, now, head_grace).into_iter().next()
}

/// Every candidate in [`victim`]'s order, first to evict first.
fn ranked<K>(
    phases: impl IntoIterator<Item = (K, Phase, bool)>,
    now: Instant,
    head_grace: Duration,
) -> Vec<K> {
    // (class, since): stale heads (0), idles (1), young heads (2); older first.
    let mut candidates: Vec<((u8, Instant), K)> = phases
        .into_iter()
        .filter_map(|(key, phase, writing)| {
            let rank = match phase {
                Phase::Head(since) if now.saturating_duration_since(since) >= head_grace => {
                    (0, since)
                }
                Phase::Head(since) => (2, since),
                Phase::Idle(since) if !writing => (1, since),
                Phase::Idle(_) | Phase::Busy(_) | Phase::Evicted => return None,
            };
            Some((rank, key))
        })
        .collect();
    // Stable: equal ranks keep their order.
    candidates.sort_by_key(|(rank, _)| *rank);
    candidates.into_iter().map(|(_, key)| key).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(1);

    #[test]
    fn stale_heads_go_first_then_idles_then_young_heads_never_a_busy_or_writing_one() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(10);
        let at = |ms| t0 + Duration::from_millis(ms);
        let phases = [
            ("idle-oldest", Phase::Idle(at(0)), false),
            ("idle-writing", Phase::Idle(at(0)), true),
            ("head-stale-new", Phase::Head(at(3_000)), false),
            ("busy", Phase::Busy(1), false),
            ("head-stale-old", Phase::Head(at(1_000)), false),
            ("idle-new", Phase::Idle(at(4_000)), false),
            ("head-young-old", Phase::Head(at(9_100)), false),
            ("head-young-new", Phase::Head(at(9_900)), false),
        ];
        let order = |mut phases: Vec<(&'static str, Phase, bool)>| {
            let mut order = Vec::new();
            while let Some(next) = victim(phases.iter().copied(), now, GRACE) {
                order.push(next);
                phases.retain(|(key, _, _)| *key != next);
            }
            order
        };
        assert_eq!(
            order(phases.to_vec()),
            [
                "head-stale-old",
                "head-stale-new",
                "idle-oldest",
                "idle-new",
                "head-young-old",
                "head-young-new",
            ],
            "stale heads, idles, young heads; each oldest first; never busy or writing"
        );
        // A head exactly at the grace is stale.
        assert_eq!(
            victim(
                [
                    ("idle", Phase::Idle(at(0)), false),
                    ("head", Phase::Head(now - GRACE), false)
                ],
                now,
                GRACE
            ),
            Some("head")
        );
        assert_eq!(
            victim(
                [
                    ("a", Phase::Busy(1), false),
                    ("b", Phase::Busy(3), false),
                    ("c", Phase::Evicted, false),
                    ("d", Phase::Idle(at(0)), true),
                ],
                now,
                GRACE
            ),
            None,
            "every connection busy or sending: nothing to evict"
        );
        assert_eq!(victim::<&str>([], now, GRACE), None);
    }

    #[test]
    fn the_head_grace_is_a_tenth_of_the_header_timeout_at_least_a_second() {
        assert_eq!(head_grace(Duration::from_secs(10)), Duration::from_secs(1));
        assert_eq!(head_grace(Duration::from_secs(2)), Duration::from_secs(1));
        assert_eq!(head_grace(Duration::from_secs(60)), Duration::from_secs(6));
    }

    #[tokio::test]
    async fn an_evicted_connection_counts_until_its_task_ends() {
        let connections = Arc::new(Connections::default());
        let waiting = Arc::new(Activity::new());
        tokio::time::sleep(Duration::from_millis(5)).await;
        let newer = Arc::new(Activity::new());
        let busy = Arc::new(Activity::new());
        let _request = busy.begin_request();
        let newer_registration = connections.register(Arc::clone(&newer));
        let _busy_registration = connections.register(Arc::clone(&busy));
        let waiting_registration = connections.register(Arc::clone(&waiting));
        assert_eq!(connections.len(), 3);
        assert!(connections.evict_one(GRACE));
        assert_eq!(waiting.phase(), Phase::Evicted, "the one waiting longest");
        assert!(matches!(newer.phase(), Phase::Head(_)));
        assert_eq!(connections.len(), 3, "evicted, its descriptor still open");
        assert_eq!(connections.evicting(), 1);
        drop(waiting_registration);
        assert_eq!(connections.len(), 2);
        assert_eq!(connections.evicting(), 0);
        assert!(connections.evict_one(GRACE), "a young head, last resort");
        assert_eq!(newer.phase(), Phase::Evicted);
        assert!(
            !connections.evict_one(GRACE),
            "only a busy connection left: the new one is refused"
        );
        assert!(matches!(busy.phase(), Phase::Busy(1)));
        assert_eq!(connections.len(), 2);
        drop(newer_registration);
        assert_eq!(connections.len(), 1);
    }

    #[tokio::test]
    async fn the_kept_order_skips_connections_that_changed_and_finds_new_ones() {
        let connections = Arc::new(Connections::default());
        let first = Arc::new(Activity::new());
        let second = Arc::new(Activity::new());
        let third = Arc::new(Activity::new());
        let _registrations = [
            connections.register(Arc::clone(&first)),
            connections.register(Arc::clone(&second)),
            connections.register(Arc::clone(&third)),
        ];
        assert!(connections.evict_one(GRACE), "builds the order");
        assert_eq!(first.phase(), Phase::Evicted);
        // The second starts a request and goes idle again: its entry in the
        // kept order is stale, and is skipped rather than trusted.
        drop(second.begin_request());
        assert!(connections.evict_one(GRACE));
        assert_eq!(third.phase(), Phase::Evicted, "the unchanged entry");
        assert!(matches!(second.phase(), Phase::Idle(_)));
        // The kept order is used up: a new scan finds the idle one, and a
        // connection registered after the order was built.
        let later = Arc::new(Activity::new());
        let _later = connections.register(Arc::clone(&later));
        assert!(connections.evict_one(GRACE));
        assert_eq!(second.phase(), Phase::Evicted, "idle before a young head");
        assert!(connections.evict_one(GRACE));
        assert_eq!(later.phase(), Phase::Evicted);
        assert!(!connections.evict_one(GRACE));
    }

    #[tokio::test]
    async fn waiting_for_closing_victims_ends_when_one_closes() {
        let connections = Arc::new(Connections::default());
        let registration = connections.register(Arc::new(Activity::new()));
        assert!(connections.evict_one(GRACE));
        let closing = tokio::spawn(async move {
            tokio::task::yield_now().await;
            drop(registration);
        });
        // Far longer than the test may take: it returns because one closed.
        tokio::time::timeout(
            Duration::from_secs(30),
            connections.wait_for_evicting_below(1, Duration::from_secs(60)),
        )
        .await
        .expect("woken by the close");
        assert_eq!(connections.evicting(), 0);
        closing.await.unwrap();
    }

    #[tokio::test]
    async fn a_registration_leaves_when_its_connection_ends() {
        let connections = Arc::new(Connections::default());
        let registration = connections.register(Arc::new(Activity::new()));
        assert_eq!(connections.len(), 1);
        drop(registration);
        assert_eq!(connections.len(), 0);
        assert!(!connections.evict_one(GRACE));
    }
}
