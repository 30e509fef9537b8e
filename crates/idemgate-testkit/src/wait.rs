//! Waiting for a condition with a bound, instead of sleeping a guessed time.

use std::time::{Duration, Instant};

/// Polls `ready` every 10 ms until it holds, or panics naming `what` after
/// `limit`.
pub async fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "{what} not ready within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
