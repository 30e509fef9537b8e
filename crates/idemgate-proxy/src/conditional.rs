//! `If-Match` enforced by the proxy for an upstream that ignores it (a route's
//! `conditional = "enforce"`, PROTOCOL §17).
//!
//! A write that carries preconditions (or must: `require_if_match`) runs under a
//! [resource lease](idemgate::resource_lease) on the resource's identity, taken
//! from the store's lease capability (`Store::acquire_resource_lease`: one atomic
//! step in every backend, so proxies sharing one PostgreSQL or Redis serialise
//! each other). Under the lease the proxy asks the upstream for the resource's
//! current `ETag` (a `GET` of the same path with the client's credentials),
//! evaluates the preconditions with `idemgate::conditional`, and either answers
//! 412 itself — nothing forwarded — or forwards the write and gives the lease up
//! once the upstream's response head has arrived.
//!
//! Sound only while every writer of the resource goes through these proxies (or
//! the upstream honours `If-Match` itself): a write that bypasses them is not
//! serialised. Upstream `ETag`s pass through unaltered.
//!
//! # Waiting for the resource
//!
//! A writer that finds the resource held looks again after a short backoff
//! ([`FIRST_BACKOFF`], doubling up to [`MAX_BACKOFF`], never past the holder's
//! lease end or the writer's own deadline), for at most the upstream timeout;
//! then it answers 503 `resource-busy` without forwarding anything. Polling,
//! because a lease's release has no change notification in the stores (records
//! have one, `Store::wait_for_change`; adding one for leases is a store feature
//! of its own): the backoff keeps a waiter to at most one store round trip every
//! 50 ms, and a holder keeps the resource for one `GET` and one write.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::IntoResponse;
use http::header::{
    CONTENT_LENGTH, CONTENT_TYPE, ETAG, EXPECT, IF_MATCH, IF_MODIFIED_SINCE, IF_NONE_MATCH,
    IF_RANGE, IF_UNMODIFIED_SINCE, LAST_MODIFIED, TRANSFER_ENCODING,
};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use idemgate::conditional::{EntityTag, Preconditions, Validators};
use idemgate::resource_lease::{LeaseAcquisition, ResourceId, ResourceLease};
use idemgate::{Finality, ProblemDetails, Store};
use tokio::time::Instant;
use tower_service::Service;

use crate::forward::Forward;
use crate::headers::IDEMPOTENCY_KEY;
use crate::problem;

/// A waiting writer's first wait before it looks at the resource again.
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
/// The longest a waiting writer sleeps between two looks.
const MAX_BACKOFF: Duration = Duration::from_millis(50);

/// The store of the resource leases, as `ProxyConfig` holds it.
#[derive(Clone)]
pub(crate) struct LockStore(pub(crate) Arc<dyn Store>);

impl std::fmt::Debug for LockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LockStore")
    }
}

/// A route's enforcement.
#[derive(Clone)]
pub(crate) struct Enforce {
    /// Where the leases live: the proxies' shared store. `None` when the proxy
    /// was built without one: such a route answers 500 rather than write
    /// unserialised.
    pub(crate) store: Option<Arc<dyn Store>>,
    /// 428 for a write without `If-Match`.
    pub(crate) require_if_match: bool,
}

impl std::fmt::Debug for Enforce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enforce")
            .field("store", &self.store.is_some())
            .field("require_if_match", &self.require_if_match)
            .finish()
    }
}

/// What a route's layer wraps: the forwarder, and the route's enforcement when
/// it has `conditional = "enforce"` (its writes then go through [`enforce`]).
/// Kept outside [`Forward`], so forwarding never depends on this policy.
#[derive(Clone, Debug)]
pub(crate) struct Enforcing {
    forward: Forward,
    enforce: Option<Arc<Enforce>>,
}

impl Enforcing {
    pub(crate) fn new(forward: Forward, enforce: Option<Enforce>) -> Self {
        Self {
            forward,
            enforce: enforce.map(Arc::new),
        }
    }
}

impl Service<Request<Body>> for Enforcing {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.forward.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            Ok(match &this.enforce {
                // Boxed apart: the enforcing path's state is large, and every
                // other request would otherwise allocate and copy room for it.
                Some(policy) if writes(request.method()) => {
                    Box::pin(enforce(this.forward, policy, request)).await
                }
                _ => this.forward.send(request).await,
            })
        })
    }
}

/// Whether `method` writes (so its preconditions are the proxy's to enforce).
fn writes(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// Gives the lease up when dropped: after the upstream's answer, or when the
/// client went away mid-way (the future dropped), so a resource is never held
/// longer than the exchange.
struct Held {
    store: Arc<dyn Store>,
    lease: Option<ResourceLease>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            let store = Arc::clone(&self.store);
            tokio::spawn(async move {
                if let Err(error) = store.release_resource_lease(&lease).await {
                    // The lease runs out on its own.
                    tracing::warn!(%error, "could not give up a resource lease");
                }
            });
        }
    }
}

/// The write under enforcement: 400/428/412 locally, or forwarded under the
/// resource's lease.
async fn enforce(forward: Forward, enforce: &Enforce, request: Request<Body>) -> Response<Body> {
    let preconditions = match Preconditions::from_headers(request.headers()) {
        Ok(preconditions) => preconditions,
        Err(error) => {
            let problem = ProblemDetails::new(
                StatusCode::BAD_REQUEST,
                "invalid-precondition",
                "Invalid precondition",
                error.to_string(),
            );
            return (Finality::Rejected, problem).into_response();
        }
    };
    if enforce.require_if_match
        && let Err(refusal) = preconditions.require_if_match()
    {
        return refusal.into_response();
    }
    if preconditions == Preconditions::default() {
        // Nothing to enforce: an unconditional write, as without the policy.
        return forward.send(request).await;
    }
    let Some(store) = enforce.store.clone() else {
        tracing::error!("a route enforces If-Match but the proxy has no store for its leases");
        return ProblemDetails::store_misconfigured().into_response();
    };
    let wait = forward.timeout();
    // The resource: this upstream's path (the canonical one routes matched).
    let resource = ResourceId::new(&format!(
        "{}{}",
        forward.upstream_authority(),
        request.uri().path()
    ));
    let held = match acquire(&store, &resource, wait).await {
        Ok(lease) => Held {
            store,
            lease: Some(lease),
        },
        Err(response) => return response,
    };
    let read = read_request(&request);
    let current = match current_validators(&forward, read).await {
        Ok(current) => current,
        Err(response) => return response,
    };
    if let Err(refusal) = preconditions.check(request.method(), current.as_ref()) {
        drop(held);
        return refusal.into_response();
    }
    let response = forward.send(request).await;
    // The upstream has answered (its head is here): the write is decided, the
    // next writer may read the new ETag.
    drop(held);
    response
}

/// Takes the resource's lease, waiting up to `wait` for another writer's (see
/// the module docs, "Waiting for the resource").
async fn acquire(
    store: &Arc<dyn Store>,
    resource: &ResourceId,
    wait: Duration,
) -> Result<ResourceLease, Response<Body>> {
    // The GET and the write are each bounded by the upstream timeout; a proxy
    // that dies holding the lease frees it when it runs out.
    let ttl = wait * 2 + Duration::from_secs(5);
    let deadline = Instant::now() + wait;
    let mut backoff = FIRST_BACKOFF;
    loop {
        match store.acquire_resource_lease(resource, ttl).await {
            Ok(LeaseAcquisition::Acquired(lease)) => return Ok(lease),
            Ok(LeaseAcquisition::Held { until, now }) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    let problem = ProblemDetails::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "resource-busy",
                        "Resource busy",
                        "another conditional write to this resource is still running; nothing was forwarded",
                    )
                    .with_retry_after(Duration::from_secs(1));
                    return Err((Finality::Retryable, problem).into_response());
                }
                // Never sleep past the holder's lease end (it is free then) nor
                // past this writer's deadline (one last look at it).
                let holder_left = until.duration_since(now).max(Duration::from_millis(1));
                tokio::time::sleep(backoff.min(holder_left).min(left)).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Err(error) => {
                tracing::warn!(%error, "the store refused a resource lease");
                let problem = ProblemDetails::for_store_error(&error, Duration::from_secs(1));
                return Err((Finality::Retryable, problem).into_response());
            }
        }
    }
}

/// The resource's validators as the upstream says now: its `ETag` and
/// `Last-Modified` on a 2xx, `None` on 404/410 (no current representation).
async fn current_validators(
    forward: &Forward,
    read: Request<Body>,
) -> Result<Option<Validators>, Response<Body>> {
    let response = forward.send(read).await;
    let status = response.status();
    if status == StatusCode::NOT_FOUND || status == StatusCode::GONE {
        return Ok(None);
    }
    if !status.is_success() {
        tracing::warn!(%status, "the upstream did not answer the read of the current ETag");
        // Nothing was written: the client may retry.
        let problem = problem::upstream_failed(forward.upstream_authority());
        return Err((Finality::Retryable, problem).into_response());
    }
    let headers = response.headers();
    Ok(Some(Validators {
        etag: headers
            .get(ETAG)
            .and_then(|value| EntityTag::parse(value.as_bytes()).ok()),
        last_modified: headers
            .get(LAST_MODIFIED)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| httpdate::parse_http_date(text).ok()),
    }))
}

/// The `GET` of the written resource: its URI, the client's address, and
/// [`read_headers`].
fn read_request(request: &Request<Body>) -> Request<Body> {
    let mut read = Request::new(Body::empty());
    *read.method_mut() = Method::GET;
    *read.uri_mut() = request.uri().clone();
    *read.headers_mut() = read_headers(request.headers());
    if let Some(info) = request
        .extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
    {
        read.extensions_mut().insert(*info);
    }
    read
}

/// The client's headers for the read: its credentials and negotiation, without
/// its body's headers, its preconditions or its key.
fn read_headers(headers: &HeaderMap) -> HeaderMap {
    let mut read = headers.clone();
    for name in [
        CONTENT_LENGTH,
        CONTENT_TYPE,
        TRANSFER_ENCODING,
        EXPECT,
        IF_MATCH,
        IF_NONE_MATCH,
        IF_UNMODIFIED_SINCE,
        IF_MODIFIED_SINCE,
        IF_RANGE,
        IDEMPOTENCY_KEY,
    ] {
        read.remove(name);
    }
    read
}
