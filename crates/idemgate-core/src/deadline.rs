//! A deadline on every store operation.
//!
//! A store that stops answering — a frozen PostgreSQL, a Redis whose host
//! vanished, a SQLite file locked by another process — must not hold requests (and
//! their connections) until the client gives up: past the deadline the operation
//! fails with [`StoreError::Unavailable`], which the layer answers 503 with
//! `Retry-After`, the handler not run. Backends keep their own timeouts (pool
//! acquire, statement, response, busy); this bound holds whatever they are set to.
//!
//! A timed-out write may still land in the store. That is safe by construction: a
//! claim that landed is a `Processing` record no one runs, which answers 409 until
//! its lease lapses and a retry takes it over with the same operation id; a fenced
//! write that landed is what the caller's retry would have written anyway.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::audit::{AuditEntry, AuditPartition, AuditQuery, AuditRecord, AuditSecret};
use crate::resource_lease::{LeaseAcquisition, ResourceId, ResourceLease};
use crate::scope::IdentityDigest;
use crate::store::{
    Claim, ClaimRequest, Completion, EvictMode, Eviction, FencedWrite, Lease, Snapshot, Store,
    StoreError,
};
use crate::stream::StreamId;
use crate::time::Timestamp;

/// The default bound on one store operation: well under the few seconds after which
/// clients usually give up, well above a healthy store's milliseconds.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// Wraps a store so that every operation but [`Store::wait_for_change`] (which has
/// its own timeout) fails as `Unavailable` after `timeout`.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use idemgate_core::{MemoryStore, Store, deadline::WithDeadline};
///
/// let store: Arc<dyn Store> = Arc::new(WithDeadline::new(Arc::new(MemoryStore::new()), Duration::from_secs(1)));
/// ```
#[derive(Clone)]
pub struct WithDeadline {
    inner: Arc<dyn Store>,
    timeout: Duration,
}

impl std::fmt::Debug for WithDeadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithDeadline")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The cause of an `Unavailable` error from [`WithDeadline`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the idempotency store did not answer {operation} within {timeout:?}")]
pub struct DeadlineExceeded {
    /// The store operation that timed out.
    pub operation: &'static str,
    /// The deadline it had.
    pub timeout: Duration,
}

impl WithDeadline {
    /// `inner`, with every operation bounded by `timeout`.
    pub fn new(inner: Arc<dyn Store>, timeout: Duration) -> Self {
        Self { inner, timeout }
    }

    /// The bound on one operation.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The same store under another bound.
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            timeout,
        }
    }

    async fn bounded<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_elapsed) => Err(StoreError::unavailable(DeadlineExceeded {
                operation,
                timeout: self.timeout,
            })),
        }
    }
}

#[async_trait]
impl Store for WithDeadline {
    async fn try_claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        self.bounded("try_claim", self.inner.try_claim(request))
            .await
    }

    async fn try_claim_journaled(
        &self,
        request: &ClaimRequest,
        entry: &AuditRecord,
    ) -> Result<(Claim, bool), StoreError> {
        self.bounded("try_claim", self.inner.try_claim_journaled(request, entry))
            .await
    }

    async fn complete(
        &self,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<FencedWrite, StoreError> {
        self.bounded("complete", self.inner.complete(lease, completion))
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        self.bounded("release", self.inner.release(lease)).await
    }

    async fn append_stream_piece(
        &self,
        lease: &Lease,
        index: u32,
        piece: &Bytes,
    ) -> Result<FencedWrite, StoreError> {
        self.bounded(
            "append_stream_piece",
            self.inner.append_stream_piece(lease, index, piece),
        )
        .await
    }

    async fn read_stream_pieces(
        &self,
        stream: &StreamId,
        from: u32,
        limit: u32,
    ) -> Result<Vec<Bytes>, StoreError> {
        self.bounded(
            "read_stream_pieces",
            self.inner.read_stream_pieces(stream, from, limit),
        )
        .await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<FencedWrite, StoreError> {
        self.bounded("renew", self.inner.renew(lease, lease_for))
            .await
    }

    async fn delete(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        self.bounded("delete", self.inner.delete(lease)).await
    }

    async fn evict(
        &self,
        identity: &IdentityDigest,
        mode: EvictMode,
    ) -> Result<Eviction, StoreError> {
        self.bounded("evict", self.inner.evict(identity, mode))
            .await
    }

    async fn get(&self, identity: &IdentityDigest) -> Result<Option<Snapshot>, StoreError> {
        self.bounded("get", self.inner.get(identity)).await
    }

    async fn acquire_resource_lease(
        &self,
        resource: &ResourceId,
        ttl: Duration,
    ) -> Result<LeaseAcquisition, StoreError> {
        self.bounded(
            "acquire_resource_lease",
            self.inner.acquire_resource_lease(resource, ttl),
        )
        .await
    }

    async fn release_resource_lease(
        &self,
        lease: &ResourceLease,
    ) -> Result<FencedWrite, StoreError> {
        self.bounded(
            "release_resource_lease",
            self.inner.release_resource_lease(lease),
        )
        .await
    }

    async fn append_audit(&self, records: &[AuditRecord]) -> Result<(), StoreError> {
        self.bounded("append_audit", self.inner.append_audit(records))
            .await
    }

    async fn read_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        self.bounded("read_audit", self.inner.read_audit(query))
            .await
    }

    async fn audit_partitions(&self) -> Result<Vec<AuditPartition>, StoreError> {
        self.bounded("audit_partitions", self.inner.audit_partitions())
            .await
    }

    async fn trim_audit(
        &self,
        instance: Option<&str>,
        before: Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.bounded("trim_audit", self.inner.trim_audit(instance, before, limit))
            .await
    }

    async fn audit_secret(&self) -> Result<AuditSecret, StoreError> {
        self.bounded("audit_secret", self.inner.audit_secret())
            .await
    }

    async fn record_duration(&self, route: &str, duration: Duration) -> Result<(), StoreError> {
        self.bounded(
            "record_duration",
            self.inner.record_duration(route, duration),
        )
        .await
    }

    async fn route_durations(&self, route: &str) -> Result<Vec<Duration>, StoreError> {
        self.bounded("route_durations", self.inner.route_durations(route))
            .await
    }

    fn journal_expiries(&self, journal: crate::audit::ExpiryJournal) {
        self.inner.journal_expiries(journal);
    }

    fn completed_in_transaction(&self, lease: &Lease, completion: &Completion) {
        self.inner.completed_in_transaction(lease, completion);
    }

    fn supports_one_transaction(&self) -> bool {
        self.inner.supports_one_transaction()
    }

    /// Bounded by the store timeout on top of the lock wait: the database bounds
    /// the wait for a concurrent transaction itself; a frozen one answers nothing.
    async fn claim_in_transaction(
        &self,
        request: &ClaimRequest,
        lock_wait: Duration,
    ) -> Result<crate::transaction::ClaimInTransaction, StoreError> {
        let bound = self.timeout + lock_wait;
        match tokio::time::timeout(bound, self.inner.claim_in_transaction(request, lock_wait)).await
        {
            Ok(result) => result,
            Err(_elapsed) => Err(StoreError::unavailable(DeadlineExceeded {
                operation: "claim_in_transaction",
                timeout: bound,
            })),
        }
    }

    fn rolled_back_in_transaction(&self, lease: &Lease) {
        self.inner.rolled_back_in_transaction(lease);
    }

    async fn transaction_journal_entries(
        &self,
        lease: &Lease,
        completion: &Completion,
    ) -> Vec<crate::audit::AuditRecord> {
        self.inner
            .transaction_journal_entries(lease, completion)
            .await
    }

    async fn wait_for_change(&self, identity: &IdentityDigest, timeout: Duration) {
        self.inner.wait_for_change(identity, timeout).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;
    use crate::fingerprint::Fingerprint;
    use crate::key::IdempotencyKey;
    use crate::record::{FencingToken, OperationId, StoredBody, StoredResponse};
    use crate::scope::{Identity, Principal, Scope};
    use crate::store::LeaseOrigin;
    use crate::time::Timestamp;

    /// A store that never answers, as a frozen backend does.
    struct Frozen;

    #[async_trait]
    impl Store for Frozen {
        async fn try_claim(&self, _: &ClaimRequest) -> Result<Claim, StoreError> {
            std::future::pending().await
        }
        async fn complete(&self, _: &Lease, _: &Completion) -> Result<FencedWrite, StoreError> {
            std::future::pending().await
        }
        async fn release(&self, _: &Lease) -> Result<FencedWrite, StoreError> {
            std::future::pending().await
        }
        async fn append_stream_piece(
            &self,
            _: &Lease,
            _: u32,
            _: &Bytes,
        ) -> Result<FencedWrite, StoreError> {
            std::future::pending().await
        }
        async fn read_stream_pieces(
            &self,
            _: &StreamId,
            _: u32,
            _: u32,
        ) -> Result<Vec<Bytes>, StoreError> {
            std::future::pending().await
        }
        async fn renew(&self, _: &Lease, _: Duration) -> Result<FencedWrite, StoreError> {
            std::future::pending().await
        }
        async fn delete(&self, _: &Lease) -> Result<FencedWrite, StoreError> {
            std::future::pending().await
        }
        async fn evict(&self, _: &IdentityDigest, _: EvictMode) -> Result<Eviction, StoreError> {
            std::future::pending().await
        }
        async fn get(&self, _: &IdentityDigest) -> Result<Option<Snapshot>, StoreError> {
            std::future::pending().await
        }
        async fn acquire_resource_lease(
            &self,
            _: &ResourceId,
            _: Duration,
        ) -> Result<LeaseAcquisition, StoreError> {
            std::future::pending().await
        }
        async fn release_resource_lease(
            &self,
            _: &ResourceLease,
        ) -> Result<FencedWrite, StoreError> {
            std::future::pending().await
        }
        async fn append_audit(&self, _: &[AuditRecord]) -> Result<(), StoreError> {
            std::future::pending().await
        }

        async fn read_audit(&self, _: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
            std::future::pending().await
        }

        async fn audit_partitions(&self) -> Result<Vec<AuditPartition>, StoreError> {
            std::future::pending().await
        }

        async fn trim_audit(
            &self,
            _: Option<&str>,
            _: Timestamp,
            _: usize,
        ) -> Result<u64, StoreError> {
            std::future::pending().await
        }

        async fn audit_secret(&self) -> Result<AuditSecret, StoreError> {
            std::future::pending().await
        }

        async fn record_duration(&self, _: &str, _: Duration) -> Result<(), StoreError> {
            std::future::pending().await
        }

        async fn route_durations(&self, _: &str) -> Result<Vec<Duration>, StoreError> {
            std::future::pending().await
        }
    }

    fn request() -> ClaimRequest {
        let scope = Scope {
            principal: Principal::new("user:1"),
            method: "POST".into(),
            path: "/orders".into(),
        };
        let key =
            IdempotencyKey::parse(OperationId::generate().to_string().as_bytes(), 255).unwrap();
        ClaimRequest {
            identity: Identity::new(scope, key),
            fingerprint: Fingerprint::from_bytes([7; 32]),
            field_digests: None,
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(60),
            route_template: None,
        }
    }

    fn timed_out(error: StoreError, operation: &str) {
        let StoreError::Unavailable(cause) = error else {
            panic!("expected Unavailable, got {error:?}");
        };
        let cause = cause
            .downcast_ref::<DeadlineExceeded>()
            .expect("a DeadlineExceeded cause");
        assert_eq!(cause.operation, operation);
    }

    #[tokio::test]
    async fn every_operation_of_a_frozen_store_fails_as_unavailable() {
        let store = WithDeadline::new(Arc::new(Frozen), Duration::from_millis(20));
        let request = request();
        let lease = Lease {
            identity: *request.identity.digest(),
            operation_id: OperationId::generate(),
            token: FencingToken(1),
            origin: LeaseOrigin::New,
            locked_until: Timestamp::from_millis(0),
        };
        timed_out(store.try_claim(&request).await.unwrap_err(), "try_claim");
        let completion = Completion {
            status: crate::FinalStatus::Completed,
            response: StoredResponse {
                trailers: Vec::new(),
                status: http::StatusCode::CREATED,
                headers: vec![],
                body: StoredBody::Retained("done".into()),
            },
            ttl: Duration::from_secs(60),
        };
        timed_out(
            store.complete(&lease, &completion).await.unwrap_err(),
            "complete",
        );
        timed_out(store.release(&lease).await.unwrap_err(), "release");
        timed_out(
            store
                .renew(&lease, Duration::from_secs(1))
                .await
                .unwrap_err(),
            "renew",
        );
        timed_out(store.delete(&lease).await.unwrap_err(), "delete");
        timed_out(
            store
                .evict(&lease.identity, EvictMode::Force)
                .await
                .unwrap_err(),
            "evict",
        );
        timed_out(store.get(&lease.identity).await.unwrap_err(), "get");
    }

    #[tokio::test]
    async fn a_healthy_store_answers_through_the_deadline() {
        let store = WithDeadline::new(Arc::new(MemoryStore::new()), Duration::from_secs(5));
        let request = request();
        assert!(matches!(
            store.try_claim(&request).await.unwrap(),
            Claim::Acquired(_)
        ));
        assert!(matches!(
            store.try_claim(&request).await.unwrap(),
            Claim::Existing(_)
        ));
    }
}
