//! The replay cache over a real store: the conformance suite through it, and what
//! two instances' caches over one store promise each other.
//!
//! ```ignore
//! async fn cached_store() -> std::sync::Arc<dyn idemgate_core::Store> {
//!     idemgate_testkit::cache::cached(store().await)
//! }
//! mod cached {
//!     idemgate_testkit::store_conformance!(super::cached_store);
//! }
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use idemgate_core::cache::{ReplayCache, ReplayCacheConfig};
use idemgate_core::record::RecordStatus;
use idemgate_core::{Claim, EvictMode, Eviction, FencedWrite, Store};

use crate::fixtures::{acquire, awkward_response, completion, fresh_request};

/// `store` behind a replay cache with the default bounds.
pub fn cached(store: Arc<dyn Store>) -> Arc<dyn Store> {
    Arc::new(ReplayCache::new(store, ReplayCacheConfig::default()))
}

/// Two instances, each with its own cache (max age 500 ms), over one `store`: both
/// answer a completed key from memory; an operator evicts it through the first,
/// which sees the key absent at once; the second keeps answering from its cache
/// for at most the max age, then sees the key absent and claims it anew.
pub async fn eviction_elsewhere_is_seen_within_max_age(store: Arc<dyn Store>) {
    let max_age = Duration::from_millis(500);
    let config = ReplayCacheConfig {
        max_age,
        ..ReplayCacheConfig::default()
    };
    let here = ReplayCache::new(Arc::clone(&store), config);
    let there = ReplayCache::new(store, config);
    let request = fresh_request();
    let digest = *request.identity.digest();
    let lease = acquire(&here, &request).await;
    assert_eq!(
        here.complete(&lease, &completion(awkward_response()))
            .await
            .expect("complete"),
        FencedWrite::Applied
    );
    for cache in [&here, &there] {
        let found = cache.get(&digest).await.expect("get").expect("completed");
        assert_eq!(found.record.status(), RecordStatus::Completed);
        assert_eq!(cache.len(), 1, "a completed record read was not cached");
    }
    let evicted_at = Instant::now();
    assert_eq!(
        here.evict(&digest, EvictMode::UnlessRunning)
            .await
            .expect("evict"),
        Eviction::Evicted {
            status: RecordStatus::Completed
        }
    );
    assert!(
        here.get(&digest).await.expect("get").is_none(),
        "the evicting instance still answers from its cache"
    );
    // Still cached on the other instance: this is the window the max age bounds.
    let stale = there.get(&digest).await.expect("get");
    assert!(
        stale.is_some_and(|s| s.record.operation_id == lease.operation_id),
        "the other instance's cache was not in effect"
    );
    loop {
        match there.try_claim(&request).await.expect("claim") {
            Claim::Acquired(again) => {
                assert_ne!(again.operation_id, lease.operation_id);
                break;
            }
            Claim::Existing(snapshot) => {
                assert_eq!(snapshot.record.operation_id, lease.operation_id);
                assert!(
                    evicted_at.elapsed() <= max_age + Duration::from_millis(200),
                    "the other instance answered an evicted key {:?} after the eviction (max age {max_age:?})",
                    evicted_at.elapsed()
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
