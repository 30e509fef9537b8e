//! How much each fault test does, and the random choices it makes: small and fast by
//! default, the published counts with `IDEMGATE_FAULTS_FULL=1`; every choice comes
//! from a seeded generator so a failing run can be replayed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng};

/// `IDEMGATE_FAULTS_FULL=1`: the long variant.
pub fn full() -> bool {
    std::env::var("IDEMGATE_FAULTS_FULL").is_ok_and(|v| v == "1")
}

/// `small` by default, `large` in the full variant.
pub fn count(small: usize, large: usize) -> usize {
    if full() { large } else { small }
}

/// The same, for a duration.
pub fn span(small: Duration, large: Duration) -> Duration {
    if full() { large } else { small }
}

/// A seeded generator: the same seed makes the same kill moments and outages.
pub struct Rng(StdRng);

impl Rng {
    /// Seeded from `IDEMGATE_FAULTS_SEED`, else from the clock; prints the seed.
    pub fn for_test(test: &str) -> Self {
        let seed = std::env::var("IDEMGATE_FAULTS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64)
            });
        eprintln!("[faults] {test}: IDEMGATE_FAULTS_SEED={seed}");
        Self(StdRng::seed_from_u64(seed))
    }

    /// A duration in `[low, high)` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(self.0.random_range(low..high.max(low + 1)))
    }
}

/// Prints one line of figures for `docs/reliability.md` (`--nocapture` shows them).
pub fn report(test: &str, figures: std::fmt::Arguments<'_>) {
    eprintln!("[faults] {test}: {figures}");
}
