//! `ReplayCache` over `MemoryStore`: the conformance suite through the cache, and
//! what only the cache promises, with the inner store's calls counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::StatusCode;
use idemgate_core::audit::{AuditEntry, AuditPartition, AuditQuery, AuditRecord, AuditSecret};
use idemgate_core::cache::{ReplayCache, ReplayCacheConfig};
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::record::{RecordStatus, StoredBody, StoredResponse};
use idemgate_core::resource_lease::{LeaseAcquisition, ResourceId, ResourceLease};
use idemgate_core::scope::IdentityDigest;
use idemgate_core::time::Timestamp;
use idemgate_core::{
    Claim, ClaimRequest, Completion, Decision, EvictMode, Eviction, FencedWrite, FinalStatus,
    Lease, MemoryStore, Snapshot, Store, StoreError, decide,
};
use idemgate_testkit::fixtures::{acquire, awkward_response, completion, fresh_request};

async fn cached_store() -> Arc<dyn Store> {
    idemgate_testkit::cache::cached(Arc::new(MemoryStore::new()))
}

mod conformance {
    idemgate_testkit::store_conformance!(super::cached_store);
}

/// A `MemoryStore` that counts the calls that reach it.
#[derive(Debug, Default)]
struct Counting {
    inner: MemoryStore,
    calls: AtomicUsize,
}

impl Counting {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Store for Counting {
    async fn try_claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        self.count();
        self.inner.try_claim(request).await
    }
    async fn complete(&self, lease: &Lease, c: &Completion) -> Result<FencedWrite, StoreError> {
        self.count();
        self.inner.complete(lease, c).await
    }
    async fn append_stream_piece(
        &self,
        lease: &Lease,
        index: u32,
        piece: &bytes::Bytes,
    ) -> Result<FencedWrite, StoreError> {
        self.count();
        self.inner.append_stream_piece(lease, index, piece).await
    }
    async fn read_stream_pieces(
        &self,
        stream: &idemgate_core::stream::StreamId,
        from: u32,
        limit: u32,
    ) -> Result<Vec<bytes::Bytes>, StoreError> {
        self.count();
        self.inner.read_stream_pieces(stream, from, limit).await
    }
    async fn release(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        self.count();
        self.inner.release(lease).await
    }
    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<FencedWrite, StoreError> {
        self.count();
        self.inner.renew(lease, lease_for).await
    }
    async fn delete(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        self.count();
        self.inner.delete(lease).await
    }
    async fn evict(&self, id: &IdentityDigest, mode: EvictMode) -> Result<Eviction, StoreError> {
        self.count();
        self.inner.evict(id, mode).await
    }
    async fn get(&self, identity: &IdentityDigest) -> Result<Option<Snapshot>, StoreError> {
        self.count();
        self.inner.get(identity).await
    }
    async fn acquire_resource_lease(
        &self,
        resource: &ResourceId,
        ttl: Duration,
    ) -> Result<LeaseAcquisition, StoreError> {
        self.count();
        self.inner.acquire_resource_lease(resource, ttl).await
    }
    async fn release_resource_lease(
        &self,
        lease: &ResourceLease,
    ) -> Result<FencedWrite, StoreError> {
        self.count();
        self.inner.release_resource_lease(lease).await
    }
    async fn append_audit(&self, records: &[AuditRecord]) -> Result<(), StoreError> {
        self.inner.append_audit(records).await
    }

    async fn read_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        self.inner.read_audit(query).await
    }

    async fn audit_partitions(&self) -> Result<Vec<AuditPartition>, StoreError> {
        self.inner.audit_partitions().await
    }

    async fn trim_audit(
        &self,
        instance: Option<&str>,
        before: Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.inner.trim_audit(instance, before, limit).await
    }

    async fn audit_secret(&self) -> Result<AuditSecret, StoreError> {
        self.inner.audit_secret().await
    }

    async fn record_duration(
        &self,
        route: &str,
        duration: std::time::Duration,
    ) -> Result<(), idemgate_core::StoreError> {
        self.inner.record_duration(route, duration).await
    }

    async fn route_durations(
        &self,
        route: &str,
    ) -> Result<Vec<std::time::Duration>, idemgate_core::StoreError> {
        self.inner.route_durations(route).await
    }
}

fn cache_over(config: ReplayCacheConfig) -> (Arc<Counting>, ReplayCache) {
    let inner = Arc::new(Counting::default());
    let cache = ReplayCache::new(Arc::clone(&inner) as Arc<dyn Store>, config);
    (inner, cache)
}

fn config(entries: usize, bytes: u64, max_age: Duration) -> ReplayCacheConfig {
    ReplayCacheConfig {
        entries,
        bytes,
        max_age,
    }
}

async fn existing(store: &dyn Store, request: &ClaimRequest) -> Snapshot {
    match store.try_claim(request).await.expect("claim") {
        Claim::Existing(snapshot) => snapshot,
        Claim::Acquired(lease) => panic!("expected an existing record, acquired {lease:?}"),
    }
}

/// Claims and completes `request` through `store` with `response`, kept for `ttl`.
async fn completed(store: &dyn Store, request: &ClaimRequest, status: FinalStatus, ttl: Duration) {
    let lease = acquire(store, request).await;
    let done = Completion {
        status,
        ttl,
        ..completion(awkward_response())
    };
    assert_eq!(
        store.complete(&lease, &done).await.expect("complete"),
        FencedWrite::Applied
    );
}

#[tokio::test]
async fn a_final_record_is_answered_with_no_store_call() {
    let (inner, cache) = cache_over(ReplayCacheConfig::default());
    for status in [FinalStatus::Completed, FinalStatus::Failed] {
        let request = fresh_request();
        completed(&cache, &request, status, Duration::from_secs(3_600)).await;
        let first = existing(&cache, &request).await; // the read that fills
        let before = inner.calls();
        for _ in 0..10 {
            let snapshot = existing(&cache, &request).await;
            assert_eq!(
                snapshot.record, first.record,
                "the cache changed the record"
            );
            assert_eq!(
                decide(&snapshot, &request.fingerprint),
                Decision::Replay(&awkward_response())
            );
            let read = cache.get(request.identity.digest()).await.expect("get");
            assert_eq!(read.expect("cached").record, first.record);
        }
        // Another body under the same key is still told apart: 422 stays exact.
        let changed = ClaimRequest {
            fingerprint: Fingerprint::from_bytes([9; 32]),
            ..request.clone()
        };
        assert_eq!(
            decide(&existing(&cache, &changed).await, &changed.fingerprint),
            Decision::Mismatch
        );
        assert_eq!(
            inner.calls(),
            before,
            "{status:?}: a cached record still reached the store"
        );
    }
}

#[tokio::test]
async fn a_completion_fills_the_cache_for_the_first_retry() {
    let (inner, cache) = cache_over(ReplayCacheConfig::default());
    for status in [FinalStatus::Completed, FinalStatus::Failed] {
        let request = fresh_request();
        completed(&cache, &request, status, Duration::from_secs(3_600)).await;
        let before = inner.calls();
        let first = existing(&cache, &request).await;
        assert_eq!(
            inner.calls(),
            before,
            "{status:?}: the first retry after the completion reached the store"
        );
        assert_eq!(
            decide(&first, &request.fingerprint),
            Decision::Replay(&awkward_response())
        );
        // The store's record field for field, but for `expires_at`: a lower bound.
        let stored = inner
            .get(request.identity.digest())
            .await
            .expect("get")
            .expect("completed");
        assert!(first.record.expires_at <= stored.record.expires_at);
        let mut expected = stored.record;
        expected.expires_at = first.record.expires_at;
        assert_eq!(first.record, expected);
    }
}

#[tokio::test]
async fn a_completion_committed_in_the_handlers_transaction_fills_the_cache() {
    let (inner, cache) = cache_over(ReplayCacheConfig::default());
    let request = fresh_request();
    let lease = acquire(&cache, &request).await;
    // The transactional mode: the record is completed by the handler's transaction,
    // not through the cache, which is told afterwards.
    let done = completion(awkward_response());
    assert_eq!(
        inner.complete(&lease, &done).await.expect("complete"),
        FencedWrite::Applied
    );
    cache.completed_in_transaction(&lease, &done);
    let before = inner.calls();
    let first = existing(&cache, &request).await;
    assert_eq!(inner.calls(), before, "the first retry reached the store");
    assert_eq!(
        decide(&first, &request.fingerprint),
        Decision::Replay(&awkward_response())
    );
}

#[tokio::test]
async fn a_released_claims_completion_is_read_back_before_it_is_cached() {
    let (inner, cache) = cache_over(ReplayCacheConfig::default());
    let request = fresh_request();
    let first = acquire(&cache, &request).await;
    assert_eq!(
        cache.release(&first).await.expect("release"),
        FencedWrite::Applied
    );
    // Claimed again: its `created_at` is the first claim's, which the cache does
    // not know, so the completion does not fill and the first retry reads.
    completed(
        &cache,
        &request,
        FinalStatus::Completed,
        Duration::from_secs(3_600),
    )
    .await;
    let before = inner.calls();
    existing(&cache, &request).await;
    assert_eq!(
        inner.calls(),
        before + 1,
        "a released claim's completion was cached"
    );
    existing(&cache, &request).await;
    assert_eq!(inner.calls(), before + 1, "the read did not fill");
}

#[tokio::test]
async fn processing_and_released_records_are_never_cached() {
    let (inner, cache) = cache_over(ReplayCacheConfig::default());
    let request = fresh_request();
    let lease = acquire(&cache, &request).await;
    for _ in 0..3 {
        let before = inner.calls();
        assert_eq!(
            existing(&cache, &request).await.record.status(),
            RecordStatus::Processing
        );
        let _ = cache.get(request.identity.digest()).await.expect("get");
        assert_eq!(inner.calls(), before + 2, "a PROCESSING record was cached");
    }
    assert_eq!(
        cache.release(&lease).await.expect("release"),
        FencedWrite::Applied
    );
    // Another body sees the released record without claiming it.
    let other = ClaimRequest {
        fingerprint: Fingerprint::from_bytes([9; 32]),
        ..request.clone()
    };
    for _ in 0..3 {
        let before = inner.calls();
        assert_eq!(
            existing(&cache, &other).await.record.status(),
            RecordStatus::Released
        );
        assert_eq!(inner.calls(), before + 1, "a RELEASED record was cached");
    }
    assert!(cache.is_empty(), "{} entries cached", cache.len());
}

#[tokio::test]
async fn an_entry_ends_at_the_records_expiry() {
    let (inner, cache) = cache_over(config(100, 1 << 20, Duration::from_secs(60)));
    let request = fresh_request();
    completed(
        &cache,
        &request,
        FinalStatus::Completed,
        Duration::from_millis(400),
    )
    .await;
    let first = existing(&cache, &request).await;
    let before = inner.calls();
    let _ = existing(&cache, &request).await;
    assert_eq!(inner.calls(), before, "not cached");
    tokio::time::sleep(Duration::from_millis(450)).await;
    let again = acquire(&cache, &request).await;
    assert_ne!(
        again.operation_id, first.record.operation_id,
        "the cache answered for an expired record"
    );
}

#[tokio::test]
async fn the_entry_bound_holds() {
    let (_inner, cache) = cache_over(config(16, 1 << 30, Duration::from_secs(60)));
    for _ in 0..200 {
        let request = fresh_request();
        completed(
            &cache,
            &request,
            FinalStatus::Completed,
            Duration::from_secs(60),
        )
        .await;
        let _ = existing(&cache, &request).await;
    }
    assert!(cache.len() <= 16, "{} entries, bound 16", cache.len());
    assert!(!cache.is_empty());
}

#[tokio::test]
async fn the_byte_bound_holds() {
    let bound = 100_000;
    let (inner, cache) = cache_over(config(100_000, bound, Duration::from_secs(60)));
    let big = StoredResponse {
        trailers: Vec::new(),
        status: StatusCode::OK,
        headers: vec![],
        body: StoredBody::Retained(Bytes::from(vec![7u8; 4_000])),
    };
    for _ in 0..200 {
        let request = fresh_request();
        let lease = acquire(&*inner, &request).await;
        let done = completion(big.clone());
        assert_eq!(
            inner.complete(&lease, &done).await.expect("complete"),
            FencedWrite::Applied
        );
        let _ = existing(&cache, &request).await;
    }
    assert!(!cache.is_empty(), "nothing cached");
    assert!(
        cache.weight() <= bound,
        "{} bytes, bound {bound}",
        cache.weight()
    );
    assert!(
        cache.len() < 200 && cache.len() * 4_000 <= bound as usize,
        "{} entries of 4 kB under a {bound}-byte bound",
        cache.len()
    );
}

#[tokio::test]
async fn an_eviction_reaches_another_instances_cache_within_its_max_age() {
    idemgate_testkit::cache::eviction_elsewhere_is_seen_within_max_age(
        Arc::new(MemoryStore::new()),
    )
    .await;
}

#[tokio::test]
async fn local_evict_and_delete_drop_the_entry() {
    let (inner, cache) = cache_over(ReplayCacheConfig::default());
    let request = fresh_request();
    completed(
        &cache,
        &request,
        FinalStatus::Completed,
        Duration::from_secs(60),
    )
    .await;
    let first = existing(&cache, &request).await;
    assert_eq!(cache.len(), 1);
    assert_eq!(
        cache
            .evict(request.identity.digest(), EvictMode::UnlessRunning)
            .await
            .expect("evict"),
        Eviction::Evicted {
            status: RecordStatus::Completed
        }
    );
    assert!(
        cache
            .get(request.identity.digest())
            .await
            .expect("get")
            .is_none()
    );
    let lease = acquire(&cache, &request).await;
    assert_ne!(lease.operation_id, first.record.operation_id);

    // A delete drops the entry even when the store refused it (a stale lease):
    // the cache never keeps what a local write may have changed.
    assert_eq!(
        cache
            .complete(&lease, &completion(awkward_response()))
            .await
            .expect("complete"),
        FencedWrite::Applied
    );
    let _ = existing(&cache, &request).await;
    assert_eq!(cache.len(), 1);
    assert_eq!(
        cache.delete(&lease).await.expect("delete"),
        FencedWrite::Refused
    );
    assert!(cache.is_empty());
    let before = inner.calls();
    let _ = existing(&cache, &request).await;
    assert_eq!(inner.calls(), before + 1, "a deleted entry still answered");
}
