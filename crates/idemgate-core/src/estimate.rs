//! How long a running operation has left: the `Retry-After` of a 409 (PROTOCOL
//! §6.3). Pure: the layer feeds it the durations it measured and the record's
//! age, and answers with the result; nothing here keeps time or state of its own
//! beyond the window of recent durations.
//!
//! The lease left is a bound, not an estimate: with a 30 s lease a duplicate of
//! a 3 s operation was told to come back in 29 s. The estimate is a high
//! percentile of the route's recent executions minus how long the running one
//! has run, never more than the lease left (after it, the holder is presumed
//! dead and a retry takes over) and never under a second.

use std::collections::VecDeque;
use std::time::Duration;

/// How many recent executions a window keeps.
pub const WINDOW: usize = 32;

/// The percentile of the window the estimate uses: high enough that most
/// operations are done when the client comes back, low enough that one outlier
/// does not set the hint.
pub const PERCENTILE: f64 = 0.9;

/// The shortest hint: `Retry-After` counts whole seconds, and a client told 0
/// would retry at once, in a loop.
pub const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The durations of the last [`WINDOW`] executions of one route, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecentDurations {
    samples: VecDeque<Duration>,
}

impl RecentDurations {
    /// Adds one execution's duration, forgetting the oldest past [`WINDOW`].
    ///
    /// ```
    /// use std::time::Duration;
    /// let mut recent = idemgate_core::estimate::RecentDurations::default();
    /// recent.record(Duration::from_secs(3));
    /// assert_eq!(recent.typical(), Some(Duration::from_secs(3)));
    /// ```
    pub fn record(&mut self, duration: Duration) {
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(duration);
    }

    /// How many durations the window holds.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The [`PERCENTILE`] of the window (nearest rank); `None` when empty.
    pub fn typical(&self) -> Option<Duration> {
        if self.samples.is_empty() {
            return None;
        }
        let mut sorted: Vec<Duration> = self.samples.iter().copied().collect();
        sorted.sort_unstable();
        // Nearest rank: the smallest value with at least PERCENTILE of the
        // samples at or below it.
        let rank = (PERCENTILE * sorted.len() as f64).ceil() as usize;
        Some(sorted[rank.clamp(1, sorted.len()) - 1])
    }
}

/// The `Retry-After` of a 409: `typical` (the route's recent executions, see
/// [`RecentDurations::typical`]) minus `running_for`, at most `lease_left`, at
/// least [`MIN_RETRY_AFTER`]. Without history, the lease left.
///
/// ```
/// use std::time::Duration;
/// use idemgate_core::estimate::retry_after;
/// let s = Duration::from_secs;
/// // A 3 s operation that has run 1 s, under a 30 s lease: come back in 2 s.
/// assert_eq!(retry_after(s(29), Some(s(3)), s(1)), s(2));
/// // No history yet: the lease is all we know.
/// assert_eq!(retry_after(s(29), None, s(1)), s(29));
/// ```
pub fn retry_after(
    lease_left: Duration,
    typical: Option<Duration>,
    running_for: Duration,
) -> Duration {
    let estimate = typical.map_or(lease_left, |typical| typical.saturating_sub(running_for));
    estimate.min(lease_left).max(MIN_RETRY_AFTER)
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn s(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    #[test]
    fn the_hint_is_the_estimate_bounded_by_the_lease_and_a_second() {
        assert_eq!(retry_after(s(29), Some(s(3)), Duration::ZERO), s(3));
        assert_eq!(retry_after(s(29), Some(s(3)), s(2)), s(1));
        // Running longer than usual: soon, not never.
        assert_eq!(retry_after(s(29), Some(s(3)), s(10)), MIN_RETRY_AFTER);
        // Usually slower than the lease left: the lease bounds it.
        assert_eq!(retry_after(s(5), Some(s(60)), s(1)), s(5));
        assert_eq!(retry_after(Duration::ZERO, None, s(1)), MIN_RETRY_AFTER);
        assert_eq!(
            retry_after(s(29), Some(Duration::from_millis(200)), Duration::ZERO),
            MIN_RETRY_AFTER
        );
    }

    #[test]
    fn typical_is_the_ninetieth_percentile_of_the_last_window() {
        let mut recent = RecentDurations::default();
        assert_eq!(recent.typical(), None);
        for ms in 1..=10 {
            recent.record(Duration::from_millis(ms * 100));
        }
        assert_eq!(recent.typical(), Some(Duration::from_millis(900)));
        // One outlier in ten does not set it.
        recent.record(s(60));
        assert_eq!(recent.len(), 11);
        assert_eq!(recent.typical(), Some(s(1)));
        // Only the last WINDOW count.
        for _ in 0..WINDOW {
            recent.record(s(2));
        }
        assert_eq!(recent.len(), WINDOW);
        assert_eq!(recent.typical(), Some(s(2)));
    }
}
