//! The replay cache over a real store: the conformance suite through it, and what
//! two instances' caches over one store promise each other. A store's tests get
//! both with one line ([`crate::cached_conformance!`]):
//!
//! ```ignore
//! async fn store() -> std::sync::Arc<dyn idemgate_core::Store> { /* … */ }
//! idemgate_testkit::store_conformance!(store);
//! idemgate_testkit::cached_conformance!(store);
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use idemgate_core::cache::{ReplayCache, ReplayCacheConfig};
use idemgate_core::record::RecordStatus;
use idemgate_core::{Claim, EvictMode, Eviction, FencedWrite, Store};

use crate::fixtures::{acquire, awkward_response, completion, fresh_request};

/// Instantiates, in a module `cached`, the whole conformance suite for one store
/// behind the replay cache ([`cached`](crate::cache::cached)), and
/// [`eviction_elsewhere_is_seen_within_max_age`](crate::cache::eviction_elsewhere_is_seen_within_max_age)
/// for it. `$factory` names an async fn of the calling module returning
/// `Arc<dyn Store>`; it is called once per test.
///
/// The calling crate needs `tokio` (with `macros` and `rt-multi-thread`) among its
/// dev-dependencies.
#[macro_export]
macro_rules! cached_conformance {
    ($factory:ident) => {
        mod cached {
            async fn cached_store() -> ::std::sync::Arc<dyn $crate::__private::Store> {
                $crate::cache::cached(super::$factory().await)
            }

            $crate::store_conformance!(cached_store);

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_eviction_reaches_another_instances_cache_within_its_max_age() {
                $crate::cache::eviction_elsewhere_is_seen_within_max_age(super::$factory().await)
                    .await;
            }
        }
    };
}

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
