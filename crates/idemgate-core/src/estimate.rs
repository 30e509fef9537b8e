//! How long a running operation has left: the `Retry-After` of a 409 (PROTOCOL
//! §6.3). Pure: the layer feeds it the route's execution history (kept in the
//! store, [`crate::Store::route_durations`]) and the record's age, and answers
//! with the result.
//!
//! The lease left is a bound, not an estimate: with a 30 s lease a duplicate of
//! a 3 s operation was told to come back in 29 s, and SDKs that cap their sleep
//! (at 60 s, say) gave up on a longer one. So the hint is the [`PERCENTILE`] of
//! the route's recorded executions minus how long the running one has run — the
//! time it plausibly still needs — and the lease left only when no instance
//! sharing the store has recorded the route yet; always within
//! [[`MIN_RETRY_AFTER`], [`MAX_RETRY_AFTER`]].

use std::time::Duration;

/// How many durations the store keeps per route: a new one replaces the oldest
/// (or, in the SQL stores, a random slot) once the route has this many.
pub const WINDOW: usize = 32;

/// How many routes the store keeps history for: a route first recorded when
/// this many already are takes the place of the least recently recorded one,
/// so a path with ids in it cannot grow the history without bound, and routes
/// no longer served make way. Where concurrent first records of new routes
/// race (PostgreSQL), the count may pass it by the number of racing writers
/// until the next new route.
pub const MAX_ROUTES: usize = 1024;

/// The longest route key the store keeps (bytes): a longer one is truncated at
/// a character boundary.
pub const MAX_ROUTE_LEN: usize = 512;

/// The percentile of the history the estimate uses: high enough that most
/// operations are done when the client comes back, low enough that one outlier
/// does not set the hint.
pub const PERCENTILE: f64 = 0.9;

/// The shortest hint: `Retry-After` counts whole seconds, and a client told 0
/// would retry at once, in a loop.
pub const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The longest hint: SDKs cap their sleep (some ignore a longer `Retry-After`
/// and fail at once, some sleep it whole); a client told 60 s comes back and
/// is told again.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// `route` as the store keys it: at most [`MAX_ROUTE_LEN`] bytes.
pub fn route_key(route: &str) -> &str {
    if route.len() <= MAX_ROUTE_LEN {
        return route;
    }
    let mut end = MAX_ROUTE_LEN;
    while !route.is_char_boundary(end) {
        end -= 1;
    }
    &route[..end]
}

/// The [`PERCENTILE`] of `samples` (nearest rank); `None` when empty.
///
/// ```
/// use std::time::Duration;
/// let ms = Duration::from_millis;
/// let samples: Vec<Duration> = (1..=10).map(|n| ms(n * 100)).collect();
/// assert_eq!(idemgate_core::estimate::typical(&samples), Some(ms(900)));
/// ```
pub fn typical(samples: &[Duration]) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    // Nearest rank: the smallest value with at least PERCENTILE of the samples
    // at or below it.
    let rank = (PERCENTILE * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The `Retry-After` of a 409: with history (`typical`, see [`typical`]), the
/// time the running attempt plausibly still needs — `typical` minus
/// `running_for` — never the lease left; without history anywhere, the lease
/// left. Either way within [[`MIN_RETRY_AFTER`], [`MAX_RETRY_AFTER`]].
///
/// ```
/// use std::time::Duration;
/// use idemgate_core::estimate::retry_after;
/// let s = Duration::from_secs;
/// // A 3 s operation that has run 1 s, under a 30 s lease: come back in 2 s.
/// assert_eq!(retry_after(s(29), Some(s(3)), s(1)), s(2));
/// // No history yet: the lease is all we know.
/// assert_eq!(retry_after(s(29), None, s(1)), s(29));
/// // A 90 s lease: never more than a minute.
/// assert_eq!(retry_after(s(89), None, s(1)), s(60));
/// ```
pub fn retry_after(
    lease_left: Duration,
    typical: Option<Duration>,
    running_for: Duration,
) -> Duration {
    let estimate = typical.map_or(lease_left, |typical| typical.saturating_sub(running_for));
    estimate.clamp(MIN_RETRY_AFTER, MAX_RETRY_AFTER)
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn s(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    #[test]
    fn with_history_the_hint_is_what_the_attempt_still_needs() {
        assert_eq!(retry_after(s(29), Some(s(3)), Duration::ZERO), s(3));
        assert_eq!(retry_after(s(29), Some(s(3)), s(2)), s(1));
        // Its age against the p90: a 20 s operation 5 s in needs 15 s more.
        assert_eq!(retry_after(s(25), Some(s(20)), s(5)), s(15));
        // Running longer than usual: soon, not never.
        assert_eq!(retry_after(s(29), Some(s(3)), s(10)), MIN_RETRY_AFTER);
        assert_eq!(
            retry_after(s(29), Some(Duration::from_millis(200)), Duration::ZERO),
            MIN_RETRY_AFTER
        );
    }

    #[test]
    fn with_history_the_lease_left_is_never_the_hint() {
        // Usually slower than the lease left: the estimate, not the lease.
        assert_eq!(retry_after(s(5), Some(s(20)), s(1)), s(19));
        // Fast history under a long lease: the history, not the 29 s left.
        assert_eq!(
            retry_after(s(29), Some(Duration::from_millis(300)), s(0)),
            s(1)
        );
        assert_eq!(retry_after(Duration::ZERO, Some(s(4)), s(1)), s(3));
    }

    #[test]
    fn every_hint_is_within_one_and_sixty_seconds() {
        // Without history: the lease left, clamped.
        assert_eq!(retry_after(s(29), None, s(1)), s(29));
        assert_eq!(retry_after(Duration::ZERO, None, s(1)), MIN_RETRY_AFTER);
        assert_eq!(retry_after(s(89), None, s(1)), MAX_RETRY_AFTER);
        // With history longer than a minute: a minute.
        assert_eq!(retry_after(s(300), Some(s(240)), s(10)), MAX_RETRY_AFTER);
        for lease_left in [0, 1, 30, 61, 3600] {
            for typical in [None, Some(0), Some(2), Some(59), Some(61), Some(7200)] {
                for running_for in [0, 1, 100] {
                    let hint = retry_after(s(lease_left), typical.map(s), s(running_for));
                    assert!(
                        (MIN_RETRY_AFTER..=MAX_RETRY_AFTER).contains(&hint),
                        "{hint:?} for {lease_left} {typical:?} {running_for}"
                    );
                }
            }
        }
    }

    #[test]
    fn typical_is_the_ninetieth_percentile() {
        assert_eq!(typical(&[]), None);
        let mut samples: Vec<Duration> =
            (1..=10).map(|ms| Duration::from_millis(ms * 100)).collect();
        assert_eq!(typical(&samples), Some(Duration::from_millis(900)));
        // One outlier in eleven does not set it.
        samples.push(s(60));
        assert_eq!(typical(&samples), Some(s(1)));
        assert_eq!(typical(&[s(3)]), Some(s(3)));
    }

    #[test]
    fn route_keys_are_bounded_at_a_character_boundary() {
        assert_eq!(route_key("POST /orders"), "POST /orders");
        let long = format!("POST /{}", "é".repeat(400));
        let key = route_key(&long);
        assert!(key.len() <= MAX_ROUTE_LEN && key.len() >= MAX_ROUTE_LEN - 1);
        assert!(long.starts_with(key));
    }
}
