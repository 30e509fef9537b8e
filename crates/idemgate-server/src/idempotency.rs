//! The idempotency layer as the flags configure it, for `serve` and `proxy`
//! alike: the replay cache in front of the store, the record timing, and the
//! `Retry-After` of a store that failed.

use std::sync::Arc;
use std::time::Duration;

use idemgate::cache::{ReplayCache, ReplayCacheConfig};
use idemgate::{IdempotencyLayer, Store};

use crate::config::LayerSettings;

/// The `Retry-After` of every 503 for a store that failed: the idempotency
/// layer's, the orders handler's when its order could not be stored, and the
/// admin listener's.
pub const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// `store` behind the replay cache, when one is configured. The layer and the
/// admin key API share the result, so a local eviction drops the cached record.
pub fn with_replay_cache(
    store: Arc<dyn Store>,
    config: Option<ReplayCacheConfig>,
) -> Arc<dyn Store> {
    match config {
        Some(config) => Arc::new(ReplayCache::new(store, config)),
        None => store,
    }
}

/// The idempotency layer over `store` with the flags' timing. Publishes the
/// lease as `idemgate_lease_seconds`, so an alert compares the oldest in-flight
/// age with the lease this instance really runs with.
pub fn layer(store: Arc<dyn Store>, settings: &LayerSettings) -> IdempotencyLayer {
    metrics::gauge!("idemgate_lease_seconds").set(settings.lease.as_secs_f64());
    let layer = IdempotencyLayer::from_arc(store)
        .with_ttl(settings.ttl)
        .with_lease(settings.lease)
        .with_store_timeout(settings.store_timeout)
        .with_unavailable_retry_after(UNAVAILABLE_RETRY_AFTER)
        .with_problem_type_base(settings.problem_style.base())
        .with_problem_link(settings.problem_style.link())
        .with_problem_shape(settings.problem_style.shape())
        .with_replayed_headers(settings.replayed_headers.clone());
    match settings.wait {
        Some(wait) => layer.with_wait(wait),
        None => layer,
    }
}
