//! How much each fault test does, and the random choices it makes: small and fast by
//! default, the published counts with `IDEMGATE_FAULTS_FULL=1`; every choice comes
//! from a seeded generator so a failing run can be replayed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// A small seeded generator (SplitMix64): enough to pick kill moments, no dependency.
pub struct Rng(u64);

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
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A duration in `[low, high)` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.next() % (high - low).max(1))
    }
}

/// Prints one line of figures for `docs/reliability.md` (`--nocapture` shows them).
pub fn report(test: &str, figures: std::fmt::Arguments<'_>) {
    eprintln!("[faults] {test}: {figures}");
}
