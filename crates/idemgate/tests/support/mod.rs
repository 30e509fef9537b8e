//! A real axum app behind the layer, with a counting mock "payment" handler.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json};
use idemgate::audit::AuditRecord;
use idemgate::resource_lease::{LeaseAcquisition, ResourceId, ResourceLease};
use idemgate::scope::IdentityDigest;
use idemgate::transaction::{PendingTransaction, TransactionSlot};
use idemgate::{
    Claim, ClaimRequest, Completion, FencedWrite, Finality, IdempotencyLayer, Lease, MemoryStore,
    OperationContext, Principal, Snapshot, Store, StoreError,
};
pub use idemgate_testkit::Answer;
use tower::ServiceExt;

/// The mock payment gateway: counts charges, optionally slowly.
#[derive(Default)]
pub struct Gateway {
    pub charges: AtomicUsize,
    pub delay_ms: AtomicUsize,
    /// Signalled when a charge starts.
    pub charging: tokio::sync::Notify,
}

impl Gateway {
    pub fn charges(&self) -> usize {
        self.charges.load(Ordering::SeqCst)
    }
}

/// Builds the app: auth from `x-user` (no header → no principal), the layer as a
/// route layer, and handlers that charge the gateway.
pub fn app(layer: IdempotencyLayer, gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/orders", post(create_order))
        .route("/status/{code}", post(answer_with_status))
        .route("/mark/{mark}/{code}", post(answer_with_mark))
        .route("/panic", post(panic_after_charge))
        .route("/big/{bytes}", post(big_response))
        .route("/switch", post(switch_protocols))
        .route("/broken-body/{bytes}", post(body_breaks_off))
        .route("/{*rest}", post(create_order))
        .route("/transactional/{code}", post(transactional))
        .route_layer(layer)
        .layer(middleware::from_fn(authenticate))
        .with_state(gateway)
}

pub async fn authenticate(mut request: Request, next: Next) -> Response {
    if let Some(user) = request
        .headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
    {
        let principal = Principal::new(format!("user:{user}"));
        request.extensions_mut().insert(principal);
    }
    next.run(request).await
}

async fn charge(gateway: &Gateway) -> usize {
    gateway.charging.notify_waiters();
    let delay = gateway.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay as u64)).await;
    }
    gateway.charges.fetch_add(1, Ordering::SeqCst) + 1
}

async fn create_order(
    State(gateway): State<Arc<Gateway>>,
    operation: Option<Extension<OperationContext>>,
    body: Bytes,
) -> Response {
    let charge_no = charge(&gateway).await;
    let operation_id = operation.map(|Extension(op)| op.operation_id.to_string());
    let mut headers = HeaderMap::new();
    headers.insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/orders/{charge_no}")).unwrap(),
    );
    headers.append("x-tag", HeaderValue::from_static("first"));
    headers.append("x-tag", HeaderValue::from_static("second"));
    headers.insert(
        header::SET_COOKIE,
        HeaderValue::from_static("session=secret"),
    );
    let json = serde_json::json!({
        "order": charge_no,
        "operation_id": operation_id,
        "body_len": body.len(),
    });
    (StatusCode::CREATED, headers, Json(json)).into_response()
}

async fn answer_with_status(
    State(gateway): State<Arc<Gateway>>,
    Path(code): Path<u16>,
) -> Response {
    let n = charge(&gateway).await;
    (StatusCode::from_u16(code).unwrap(), format!("run {n}")).into_response()
}

async fn answer_with_mark(
    State(gateway): State<Arc<Gateway>>,
    Path((mark, code)): Path<(String, u16)>,
    Extension(op): Extension<OperationContext>,
) -> Response {
    let n = charge(&gateway).await;
    let mark = match mark.as_str() {
        "final" => Finality::Final,
        "retryable" => Finality::Retryable,
        "rejected" => Finality::Rejected,
        other => panic!("unknown mark {other}"),
    };
    (
        StatusCode::from_u16(code).unwrap(),
        mark,
        format!("run {n} op {}", op.operation_id),
    )
        .into_response()
}

async fn panic_after_charge(State(gateway): State<Arc<Gateway>>) -> Response {
    charge(&gateway).await;
    panic!("the handler blew up after charging");
}

async fn big_response(State(gateway): State<Arc<Gateway>>, Path(bytes): Path<usize>) -> Response {
    charge(&gateway).await;
    let body: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    (StatusCode::OK, body).into_response()
}

/// Charges, then answers `101 Switching Protocols` (as an upstream that upgrades
/// whatever asks): a response that must never be stored.
async fn switch_protocols(State(gateway): State<Arc<Gateway>>) -> Response {
    charge(&gateway).await;
    (
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (header::UPGRADE, "websocket"),
            (header::CONNECTION, "upgrade"),
        ],
    )
        .into_response()
}

/// Charges, then answers 200 whose body sends `bytes` bytes and breaks off with
/// a 504 problem, as the proxy's upstream body does when the upstream stalls.
async fn body_breaks_off(
    State(gateway): State<Arc<Gateway>>,
    Path(bytes): Path<usize>,
) -> Response {
    charge(&gateway).await;
    let stalled = idemgate::ProblemDetails::new(
        StatusCode::GATEWAY_TIMEOUT,
        "upstream-timeout",
        "Upstream timeout",
        "the upstream stopped sending",
    );
    let frames: Vec<Result<Bytes, idemgate::BoxError>> =
        vec![Ok(Bytes::from(vec![b'x'; bytes])), Err(Box::new(stalled))];
    (
        StatusCode::OK,
        Body::from_stream(futures_util::stream::iter(frames)),
    )
        .into_response()
}

/// A handler using a fake transactional store: the transaction's "commit" runs the
/// completion on the MemoryStore held in the slot's transaction, and counts.
async fn transactional(
    State(gateway): State<Arc<Gateway>>,
    Path(code): Path<u16>,
    Extension(slot): Extension<TransactionSlot>,
    Extension(store): Extension<Arc<FakeTransactionalStore>>,
) -> Response {
    slot.lend().unwrap();
    let n = charge(&gateway).await;
    slot.give_back(Box::new(FakeTransaction { store }));
    (StatusCode::from_u16(code).unwrap(), format!("run {n}")).into_response()
}

/// Counts what the layer did with handler transactions.
#[derive(Default)]
pub struct FakeTransactionalStore {
    pub memory: MemoryStore,
    pub commits: AtomicUsize,
    pub rollbacks: AtomicUsize,
    /// The next commit fails (the database went away mid-commit), keyed or not.
    pub commit_fails: std::sync::atomic::AtomicBool,
}

struct FakeTransaction {
    store: Arc<FakeTransactionalStore>,
}

#[async_trait]
impl PendingTransaction for FakeTransaction {
    async fn complete_and_commit(
        self: Box<Self>,
        lease: &Lease,
        completion: &Completion,
        journal: &[AuditRecord],
    ) -> Result<FencedWrite, StoreError> {
        if self.store.commit_fails.swap(false, Ordering::SeqCst) {
            self.store.rollbacks.fetch_add(1, Ordering::SeqCst);
            return Err(outage());
        }
        let write = self.store.memory.complete(lease, completion).await?;
        if write == FencedWrite::Applied && !journal.is_empty() {
            self.store.memory.append_audit(journal).await?;
        }
        match write {
            FencedWrite::Applied => self.store.commits.fetch_add(1, Ordering::SeqCst),
            FencedWrite::Refused => self.store.rollbacks.fetch_add(1, Ordering::SeqCst),
        };
        Ok(write)
    }
    async fn commit(self: Box<Self>) -> Result<(), StoreError> {
        if self.store.commit_fails.swap(false, Ordering::SeqCst) {
            self.store.rollbacks.fetch_add(1, Ordering::SeqCst);
            return Err(outage());
        }
        self.store.commits.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn rollback(self: Box<Self>) -> Result<(), StoreError> {
        self.store.rollbacks.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

#[async_trait]
impl Store for FakeTransactionalStore {
    async fn try_claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        self.memory.try_claim(request).await
    }
    async fn complete(
        &self,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<FencedWrite, StoreError> {
        self.memory.complete(lease, completion).await
    }
    async fn append_stream_piece(
        &self,
        lease: &Lease,
        index: u32,
        piece: &bytes::Bytes,
    ) -> Result<FencedWrite, StoreError> {
        self.memory.append_stream_piece(lease, index, piece).await
    }
    async fn read_stream_pieces(
        &self,
        stream: &idemgate_core::stream::StreamId,
        from: u32,
        limit: u32,
    ) -> Result<Vec<bytes::Bytes>, StoreError> {
        self.memory.read_stream_pieces(stream, from, limit).await
    }
    async fn release(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        self.memory.release(lease).await
    }
    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<FencedWrite, StoreError> {
        self.memory.renew(lease, lease_for).await
    }
    async fn delete(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        self.memory.delete(lease).await
    }
    async fn evict(
        &self,
        identity: &IdentityDigest,
        mode: idemgate::EvictMode,
    ) -> Result<idemgate::Eviction, StoreError> {
        self.memory.evict(identity, mode).await
    }
    async fn get(&self, identity: &IdentityDigest) -> Result<Option<Snapshot>, StoreError> {
        self.memory.get(identity).await
    }
    async fn acquire_resource_lease(
        &self,
        resource: &ResourceId,
        ttl: Duration,
    ) -> Result<LeaseAcquisition, StoreError> {
        self.memory.acquire_resource_lease(resource, ttl).await
    }
    async fn release_resource_lease(
        &self,
        lease: &ResourceLease,
    ) -> Result<FencedWrite, StoreError> {
        self.memory.release_resource_lease(lease).await
    }
    async fn append_audit(
        &self,
        records: &[idemgate_core::audit::AuditRecord],
    ) -> Result<(), StoreError> {
        self.memory.append_audit(records).await
    }

    async fn read_audit(
        &self,
        query: &idemgate_core::audit::AuditQuery,
    ) -> Result<Vec<idemgate_core::audit::AuditEntry>, StoreError> {
        self.memory.read_audit(query).await
    }

    async fn audit_partitions(
        &self,
    ) -> Result<Vec<idemgate_core::audit::AuditPartition>, StoreError> {
        self.memory.audit_partitions().await
    }

    async fn trim_audit(
        &self,
        instance: Option<&str>,
        before: idemgate_core::time::Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.memory.trim_audit(instance, before, limit).await
    }

    async fn audit_secret(&self) -> Result<idemgate_core::audit::AuditSecret, StoreError> {
        self.memory.audit_secret().await
    }

    async fn record_duration(
        &self,
        route: &str,
        duration: std::time::Duration,
    ) -> Result<(), idemgate_core::StoreError> {
        self.memory.record_duration(route, duration).await
    }

    async fn route_durations(
        &self,
        route: &str,
    ) -> Result<Vec<std::time::Duration>, idemgate_core::StoreError> {
        self.memory.route_durations(route).await
    }
}

/// Fault injection around a real MemoryStore: each switch makes one operation fail
/// (`Unavailable`) or be refused.
#[derive(Default)]
pub struct FaultyStore {
    pub memory: MemoryStore,
    pub claims_fail: std::sync::atomic::AtomicBool,
    pub completes_fail: std::sync::atomic::AtomicBool,
    pub renewals_refused: std::sync::atomic::AtomicBool,
    /// While set, claims and reads do not answer (a frozen store process).
    pub frozen: std::sync::atomic::AtomicBool,
    pub claims: AtomicUsize,
    /// While set, journal appends do not answer (a slow journal batch).
    pub journal_held: std::sync::atomic::AtomicBool,
    /// Journal appends begun.
    pub journal_appends: AtomicUsize,
}

impl FaultyStore {
    async fn answer_unless_frozen(&self) {
        while self.frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

fn outage() -> StoreError {
    StoreError::unavailable(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "injected outage",
    ))
}

#[async_trait]
impl Store for FaultyStore {
    async fn try_claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.answer_unless_frozen().await;
        if self.claims_fail.load(Ordering::SeqCst) {
            return Err(outage());
        }
        self.memory.try_claim(request).await
    }
    async fn complete(
        &self,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<FencedWrite, StoreError> {
        if self.completes_fail.load(Ordering::SeqCst) {
            return Err(outage());
        }
        self.memory.complete(lease, completion).await
    }
    async fn append_stream_piece(
        &self,
        lease: &Lease,
        index: u32,
        piece: &bytes::Bytes,
    ) -> Result<FencedWrite, StoreError> {
        self.memory.append_stream_piece(lease, index, piece).await
    }
    async fn read_stream_pieces(
        &self,
        stream: &idemgate_core::stream::StreamId,
        from: u32,
        limit: u32,
    ) -> Result<Vec<bytes::Bytes>, StoreError> {
        self.memory.read_stream_pieces(stream, from, limit).await
    }
    async fn release(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        self.memory.release(lease).await
    }
    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<FencedWrite, StoreError> {
        if self.renewals_refused.load(Ordering::SeqCst) {
            return Ok(FencedWrite::Refused);
        }
        self.memory.renew(lease, lease_for).await
    }
    async fn delete(&self, lease: &Lease) -> Result<FencedWrite, StoreError> {
        self.memory.delete(lease).await
    }
    async fn evict(
        &self,
        identity: &IdentityDigest,
        mode: idemgate::EvictMode,
    ) -> Result<idemgate::Eviction, StoreError> {
        self.memory.evict(identity, mode).await
    }
    async fn get(&self, identity: &IdentityDigest) -> Result<Option<Snapshot>, StoreError> {
        self.answer_unless_frozen().await;
        self.memory.get(identity).await
    }
    async fn acquire_resource_lease(
        &self,
        resource: &ResourceId,
        ttl: Duration,
    ) -> Result<LeaseAcquisition, StoreError> {
        self.memory.acquire_resource_lease(resource, ttl).await
    }
    async fn release_resource_lease(
        &self,
        lease: &ResourceLease,
    ) -> Result<FencedWrite, StoreError> {
        self.memory.release_resource_lease(lease).await
    }
    async fn append_audit(
        &self,
        records: &[idemgate_core::audit::AuditRecord],
    ) -> Result<(), StoreError> {
        self.journal_appends.fetch_add(1, Ordering::SeqCst);
        while self.journal_held.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.memory.append_audit(records).await
    }

    async fn read_audit(
        &self,
        query: &idemgate_core::audit::AuditQuery,
    ) -> Result<Vec<idemgate_core::audit::AuditEntry>, StoreError> {
        self.memory.read_audit(query).await
    }

    async fn audit_partitions(
        &self,
    ) -> Result<Vec<idemgate_core::audit::AuditPartition>, StoreError> {
        self.memory.audit_partitions().await
    }

    async fn trim_audit(
        &self,
        instance: Option<&str>,
        before: idemgate_core::time::Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.memory.trim_audit(instance, before, limit).await
    }

    async fn audit_secret(&self) -> Result<idemgate_core::audit::AuditSecret, StoreError> {
        self.memory.audit_secret().await
    }

    async fn record_duration(
        &self,
        route: &str,
        duration: std::time::Duration,
    ) -> Result<(), idemgate_core::StoreError> {
        self.memory.record_duration(route, duration).await
    }

    async fn route_durations(
        &self,
        route: &str,
    ) -> Result<Vec<std::time::Duration>, idemgate_core::StoreError> {
        self.memory.route_durations(route).await
    }
}

/// A request builder with the usual headers.
pub fn post_json(uri: &str, user: Option<&str>, key: Option<&str>, body: &str) -> Request {
    let mut builder =
        axum::http::Request::post(uri).header(header::CONTENT_TYPE, "application/json");
    if let Some(user) = user {
        builder = builder.header("x-user", user);
    }
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(Body::from(body.to_owned())).unwrap()
}

/// Sends `request` from a task of its own (a client that may be cut off).
pub fn send_in_background(app: &Router, request: Request) -> tokio::task::JoinHandle<Answer> {
    let app = app.clone();
    tokio::spawn(async move { send(&app, request).await })
}

/// Sends `request` in the background and returns once its handler is charging.
///
/// The wait is registered before the request starts: `notify_waiters` wakes only
/// the waiters that exist when it fires, and on a multi-thread runtime the spawned
/// request can reach the gateway before this task would otherwise start waiting
/// (the test would then wait forever).
pub async fn send_until_charging(
    app: &Router,
    gateway: &Gateway,
    request: Request,
) -> tokio::task::JoinHandle<Answer> {
    let charging = gateway.charging.notified();
    let answer = send_in_background(app, request);
    // Bounded: a request answered before its handler runs never signals.
    tokio::time::timeout(std::time::Duration::from_secs(10), charging)
        .await
        .expect("the handler starts charging within 10 s");
    answer
}

/// `n` identical keyed orders from `user`, released at once by a barrier, from
/// `n` tasks: a real race, not a loop.
pub async fn send_concurrently(app: &Router, n: usize, user: &str, key: &str) -> Vec<Answer> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (app, barrier) = (app.clone(), Arc::clone(&barrier));
            let request = post_json("/orders", Some(user), Some(key), ORDER);
            tokio::spawn(async move {
                barrier.wait().await;
                send(&app, request).await
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(n);
    for task in tasks {
        answers.push(task.await.expect("request task"));
    }
    answers
}

/// Sends `request` to `app` and reads the answer whole.
///
/// Bounded (30 s), so that a request that should have ended and did not fails
/// its test instead of hanging the suite.
pub async fn send(app: &Router, request: Request) -> Answer {
    let answer = async { Answer::read(app.clone().oneshot(request).await.unwrap()).await };
    tokio::time::timeout(std::time::Duration::from_secs(30), answer)
        .await
        .expect("an answer within 30 s")
}

pub fn new_key() -> String {
    uuid::Uuid::new_v4().to_string()
}

pub const ORDER: &str = r#"{"items":[{"id":42,"quantity":1}],"currency":"RUB","amount":1500}"#;
