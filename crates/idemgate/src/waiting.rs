//! Waiting for a running operation: the layer's one mechanism for a request that
//! finds its key in progress (PROTOCOL §6.3, wait mode).
//!
//! A [`Waiter`] holds no lock, no connection and no task of its own: it is a
//! deadline and a loop of two store calls, [`Store::wait_for_change`] (which each
//! store implements with its own notifications: an in-process signal, Redis
//! pub/sub, PostgreSQL `LISTEN/NOTIFY`, SQLite by polling its file) and
//! [`Store::get`]. Each [`Waiter::next`] sleeps until the record may have changed
//! and returns what the store holds then; the caller decides (with `decide`) what
//! the new state means. So what a waiter needs is written once, whatever it
//! waits for:
//!
//! - a duplicate waiting for the replay ([`crate::service`]) loops until the record
//!   is final, claimable, or the deadline passes;
//! - a later consumer that attaches to a running operation's output (a streamed
//!   response read while it is written) is the same loop on the same identity:
//!   every change a store announces for the record — the end of the run, and any
//!   write a store chooses to announce on it — wakes `next`, which hands back the
//!   newest snapshot to read from.
//!
//! Notifications are hints, never the only way out: every sleep is bounded by the
//! recheck interval (a lost notification costs at most that), by the deadline and
//! by the running lease's end (a holder that died announces nothing; at its
//! lease's end the record is claimable and the waiter must look).

use std::time::{Duration, Instant};

use idemgate_core::scope::IdentityDigest;
use idemgate_core::{Snapshot, Store, StoreError};

use crate::telemetry::timed;

/// How often a waiter looks at the record even when no notification came: a
/// safety net for notifications lost with a store connection, not the way
/// waiters learn of outcomes (those wake at once, on every store).
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// One request waiting on one record, until a deadline.
pub(crate) struct Waiter<'a> {
    store: &'a dyn Store,
    identity: &'a IdentityDigest,
    until: Instant,
    recheck: Duration,
}

impl<'a> Waiter<'a> {
    /// A waiter on `identity` that gives up at `until`.
    pub(crate) fn new(
        store: &'a dyn Store,
        identity: &'a IdentityDigest,
        until: Instant,
        recheck: Duration,
    ) -> Self {
        Self {
            store,
            identity,
            until,
            recheck,
        }
    }

    /// Sleeps until the record may have changed from `current` (or the recheck
    /// interval, the deadline or `current`'s lease end comes first), then reads
    /// it: `None` once the deadline has passed (nothing read), else what the
    /// store holds now (`Ok(None)`: the record is gone).
    pub(crate) async fn next(
        &self,
        current: &Snapshot,
    ) -> Option<Result<Option<Snapshot>, StoreError>> {
        let left = self.until.checked_duration_since(Instant::now())?;
        if left.is_zero() {
            return None;
        }
        let lease_left = current
            .record
            .locked_until()
            .map_or(Duration::ZERO, |until| until.duration_since(current.now));
        // A lapsed lease changes nothing in the store: look again when it ends
        // (a millisecond past it, so the store's clock has passed it too).
        let sleep = left
            .min(self.recheck)
            .min(lease_left + Duration::from_millis(1));
        self.store.wait_for_change(self.identity, sleep).await;
        Some(timed("get", self.store.get(self.identity)).await)
    }
}
