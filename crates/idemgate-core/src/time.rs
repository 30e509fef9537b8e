//! Wall-clock instants as stores keep them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
///
/// Every store can hold and compare an `i64`, and every store clock
/// (`clock_timestamp()`, Redis `TIME`, `SystemTime`) converts to it, so leases and
/// expiries mean the same thing in every backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    /// An instant from milliseconds since the Unix epoch.
    pub const fn from_millis(millis: i64) -> Self {
        Self(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// This process's wall clock. Stores with a clock of their own use that instead,
    /// so instances with skewed clocks agree (PROTOCOL §6.4).
    pub fn now() -> Self {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Self(i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX))
    }

    /// This instant moved `duration` later, saturating instead of overflowing.
    pub fn saturating_add(self, duration: Duration) -> Self {
        let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        Self(self.0.saturating_add(millis))
    }

    /// How long from `earlier` to `self`; zero when `earlier` is not earlier.
    pub fn duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_millis(1_000);
        assert_eq!(
            t.saturating_add(Duration::from_millis(500)).as_millis(),
            1_500
        );
        assert_eq!(
            t.duration_since(Timestamp::from_millis(400)),
            Duration::from_millis(600)
        );
        assert_eq!(
            t.duration_since(Timestamp::from_millis(4_000)),
            Duration::ZERO
        );
        assert_eq!(
            Timestamp::from_millis(i64::MAX)
                .saturating_add(Duration::MAX)
                .as_millis(),
            i64::MAX
        );
    }
}
