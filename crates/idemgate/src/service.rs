//! `Idempotency<S>`: the request path up to the claim (PROTOCOL §1–§7).
//!
//! Order of checks, each answering before any store call when it fails: method
//! covered → key well-formed → principal → body within the limit → a free slot
//! for a detached handler. Then one atomic claim, and [`decide`] on what it found.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime};

use axum::body::Body;
use axum::extract::{MatchedPath, OriginalUri};
use axum::response::IntoResponse;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::request::Parts;
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower_service::Service;
use tracing::Instrument;

use idemgate_core::fingerprint::{Fingerprint, FingerprintInput};
use idemgate_core::key::{IdempotencyKey, KeyInput, KeyOrigin, KeySource};
use idemgate_core::record::{StoredBody, StoredResponse};
use idemgate_core::scope::{Identity, Scope, normalize_path};
use idemgate_core::stream::StreamId;
use idemgate_core::transaction::{
    ClaimInTransaction, PendingTransaction, SlotContents, TransactionSlot,
};
use idemgate_core::{
    BoxError, Claim, ClaimRequest, Completion, Decision, LeaseOrigin, Snapshot, Store, StoreError,
    decide,
};

use crate::config::{Config, ObservedResponses, PathSource, StrategyMode};
use crate::durations::route_key;
use crate::execution::Execution;
use crate::finality::{Finality, Settlement, settlement_for};
use crate::handler::{BoxFuture, Handler};
use crate::jsonrpc::{Envelope, RequestId};
use crate::principal::PrincipalError;
use crate::problem::ProblemDetails;
use crate::replaying::{join, replay_pieces};
use crate::response::{IDEMPOTENCY_DEDUP, IDEMPOTENT_REPLAYED, ReplayRequest, replay};
use crate::telemetry::{
    Outcome, count, count_duplicate, count_outcome, count_webhook, timed, timed_request,
};
use crate::waiting::Waiter;
use crate::webhook::Webhook;

/// How many times a claim is retried when the record it found became claimable
/// (released, or its lease lapsed) before it could be taken.
const MAX_CLAIM_ATTEMPTS: usize = 8;

/// The service [`crate::IdempotencyLayer`] wraps around an inner service.
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    config: Arc<Config>,
    /// The settings of requests whose key is not the route's own, made once by
    /// the layer.
    variants: Arc<Variants>,
}

/// The settings a request runs under when its key is not the route's own
/// strategy (PROTOCOL §16), derived from the route's once, by the layer.
pub(crate) struct Variants {
    /// A content-keyed request: the dedup window's TTL and body selection, the
    /// `content` strategy. `None` without content dedup.
    pub(crate) content: Option<Arc<Config>>,
    /// A request keyed by the client's own `Idempotency-Key` on a route with
    /// another strategy (its own key source, or content dedup): enforced, under
    /// the `header` strategy — measuring a new strategy never removes the
    /// protection a client asked for, and the counters say which key decided.
    /// `None` on other routes.
    pub(crate) enforced_header: Option<Arc<Config>>,
}

impl<S> std::fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency").finish_non_exhaustive()
    }
}

impl<S> Idempotency<S> {
    pub(crate) fn new(inner: S, config: Arc<Config>, variants: Arc<Variants>) -> Self {
        Self {
            inner,
            config,
            variants,
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Idempotency<S>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
    ReqBody: http_body::Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service that was polled ready is the one that must be called; leave
        // a fresh clone behind for the next request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        // Every problem leaving the layer in its style: its own, and what
        // passed through it.
        let style = config
            .problem_style
            .for_request(crate::grpc::is_grpc(request.headers()));
        // A method the layer does not cover passes through, counted and timed,
        // without the erasure and the state the covered paths need: most of
        // a proxy's traffic takes this path.
        if !config.methods.contains(request.method()) {
            return Box::pin(async move {
                let response = timed_request(async {
                    count_outcome(Outcome::PassedThrough);
                    inner.call(request.map(Body::new)).await
                })
                .await?;
                Ok(style.restyle(response.map(Body::new)))
            });
        }
        // Erased once, here: the rest of the request path is not generic.
        let handler = Handler::new(inner);
        let variants = Arc::clone(&self.variants);
        Box::pin(async move {
            let response =
                timed_request(handle(config, variants, handler, request.map(Body::new))).await?;
            Ok(style.restyle(response))
        })
    }
}

/// A request of a covered method: a webhook delivery, a keyed request, or one
/// that passes through keyless.
async fn handle<E>(
    config: Arc<Config>,
    variants: Arc<Variants>,
    handler: Handler<E>,
    request: Request<Body>,
) -> Result<Response<Body>, E>
where
    E: Into<BoxError> + Send + 'static,
{
    // A webhook receiver: verified before anything else, keyed by the delivery.
    if let Some(webhook) = &config.webhook {
        let webhook = Arc::clone(webhook);
        return Ok(Box::pin(webhook_delivery(
            config,
            webhook,
            handler.boxing_errors(),
            request,
        ))
        .await);
    }
    let (mut parts, body) = request.into_parts();
    // A key in the body: the body is read (within the limit) before the key.
    // So is a JSON-RPC request's, whose envelope decides first.
    let (body, buffered) =
        if config.key_source.reads_body() || config.dedup.is_some() || config.jsonrpc {
            match read_body(&parts, body, config.body_limit).await {
                Ok(bytes) => (Body::from(bytes.clone()), Some(bytes)),
                Err(problem) => return Ok(problem.into_response()),
            }
        } else {
            (body, None)
        };
    // The envelope read once: a batch is refused, a request's `id` goes with it
    // (in its extensions) to the replay that answers it.
    if config.jsonrpc {
        match Envelope::of(buffered.as_deref().unwrap_or_default()) {
            Envelope::Batch => {
                count_outcome(Outcome::Rejected);
                return Ok(ProblemDetails::jsonrpc_batch().into_response());
            }
            Envelope::Single(Some(id)) => {
                parts.extensions.insert(id);
            }
            Envelope::Single(None) => {}
        }
    }
    let found = {
        // Only a path or query key reads the URI: the usual header key costs no
        // path normalization here.
        let reads_uri = matches!(config.key_source, KeySource::Path(_) | KeySource::Query(_));
        let (path, query) = if reads_uri {
            request_path(&parts)
        } else {
            (String::new(), String::new())
        };
        let template = config
            .key_source
            .path_parameter()
            .and_then(|_| route_template(&config, &parts));
        let input = KeyInput {
            headers: &parts.headers,
            path: &path,
            template: template.as_deref(),
            query: &query,
            content_type: parts
                .headers
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            body: buffered.as_deref().unwrap_or_default(),
        };
        config.key_source.locate(&input, config.max_key_length)
    };
    // No key, and the route deduplicates by content: the content is the key
    // (PROTOCOL §16), under the window's own settings.
    let content_key = match (&found, &config.dedup) {
        (Ok(None), Some(dedup)) => {
            let (path, query) = request_path(&parts);
            let headers = fingerprint_headers(&config, &parts);
            let body = buffered.as_deref().unwrap_or_default();
            Some(dedup.key(&fingerprint_input(&parts, &path, &query, &headers, body)))
        }
        _ => None,
    };
    let request = Request::from_parts(parts, body);
    if let (Some(key), Some(content)) = (content_key, variants.content.clone()) {
        if config.mode == StrategyMode::Observe {
            return Box::pin(observe(content, handler, request, key, true)).await;
        }
        let span = tracing::info_span!(
            "idempotency",
            key = %key.digest_prefix(),
            dedup = "content",
            operation_id = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let mut response = Box::pin(keyed(content, handler.boxing_errors(), request, key, true))
            .instrument(span)
            .await;
        if response.headers().contains_key(&IDEMPOTENT_REPLAYED) {
            response
                .headers_mut()
                .insert(&IDEMPOTENCY_DEDUP, HeaderValue::from_static("content"));
        }
        return Ok(response);
    }
    let (key, origin) = match found {
        Ok(Some(found)) => found,
        Ok(None) if config.require_key => {
            count_outcome(Outcome::MissingKey);
            let problem = if config.key_source == KeySource::default() {
                ProblemDetails::missing_key()
            } else {
                ProblemDetails::missing_key_at(&config.key_source)
            };
            return Ok(problem.into_response());
        }
        Ok(None) => {
            count_outcome(Outcome::PassedThrough);
            return keyless(&config, handler, request).await;
        }
        Err(error) => {
            count_outcome(Outcome::InvalidKey);
            return Ok(ProblemDetails::invalid_key(&error).into_response());
        }
    };
    // The client's own key on a route with another strategy: enforced, counted
    // as `header`.
    let config = match (&variants.enforced_header, origin) {
        (Some(enforced), KeyOrigin::StandardHeader) => Arc::clone(enforced),
        _ => config,
    };
    if config.mode == StrategyMode::Observe {
        return Box::pin(observe(config, handler, request, key, false)).await;
    }
    let span = tracing::info_span!(
        "idempotency",
        key = %key.digest_prefix(),
        operation_id = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    // Boxed apart: the keyed path's state is large, and a request that passes
    // through should not allocate (and copy) room for it.
    Ok(
        Box::pin(keyed(config, handler.boxing_errors(), request, key, false))
            .instrument(span)
            .await,
    )
}

/// A covered request without a key: plain processing, no claim and no spawn. A
/// transaction the handler opened is committed unless the answer is a 5xx.
async fn keyless<E: Send + 'static>(
    config: &Config,
    handler: Handler<E>,
    mut request: Request<Body>,
) -> Result<Response<Body>, E> {
    let slot = TransactionSlot::new();
    request.extensions_mut().insert(slot.clone());
    let response = handler.call(request).await?;
    let outcome = match slot.take() {
        SlotContents::Unused => Ok(()),
        SlotContents::Returned(transaction) if response.status().is_server_error() => {
            transaction.rollback().await
        }
        SlotContents::Returned(transaction) => timed("commit", transaction.commit()).await,
        SlotContents::StillLent => {
            tracing::error!(
                "the handler kept its transaction past its response; its writes are rolled back"
            );
            return Ok(ProblemDetails::handler_failed().into_response());
        }
    };
    Ok(match outcome {
        Ok(()) => response,
        Err(error) => {
            tracing::error!(%error, "committing the handler's transaction failed");
            ProblemDetails::store_unavailable(config.unavailable_retry_after).into_response()
        }
    })
}

async fn keyed(
    config: Arc<Config>,
    handler: Handler,
    request: Request<Body>,
    key: IdempotencyKey,
    by_content: bool,
) -> Response<Body> {
    let (mut parts, body) = request.into_parts();
    let (claim, body) = match prepare(&config, &parts, body, key, by_content).await {
        Ok(prepared) => prepared,
        Err(response) => return response,
    };
    let Some(permit) = config.in_flight_limit.try_permit() else {
        count_outcome(Outcome::Overloaded);
        return ProblemDetails::overloaded(config.busy_retry_after).into_response();
    };
    // What the retry asks of a replay: a coding it can read, where its
    // event stream resumes, the JSON-RPC `id` it is answered with.
    let mut wants = ReplayRequest::of(&parts.headers);
    if let Some(id) = parts.extensions.remove::<RequestId>() {
        wants = wants.with_jsonrpc_id(id);
    }
    match claim_or_answer(&config, &claim, &wants).await {
        Claimed::Lease(lease, claimed_at, transaction) => {
            tracing::Span::current()
                .record("operation_id", tracing::field::display(lease.operation_id));
            count_outcome(Outcome::Executed);
            let request = Request::from_parts(parts, Body::from(body));
            let route = route_key(&claim);
            Execution::new(config, lease, claimed_at, route, wants)
                .spawn(handler, request, permit, transaction)
                .await
        }
        Claimed::Answer(response) => response,
    }
}

/// A webhook delivery (`crate::webhook`): its signature verified before
/// anything is claimed, then claimed under its own id, scoped by the route and
/// the provider account, fingerprinted by its raw payload, and run or answered
/// as any keyed request; each delivery counted once in `idemgate_webhooks_total`.
async fn webhook_delivery(
    config: Arc<Config>,
    webhook: Arc<Webhook>,
    handler: Handler,
    request: Request<Body>,
) -> Response<Body> {
    let provider = webhook.provider();
    let (parts, body) = request.into_parts();
    let body = match read_body(&parts, body, config.body_limit).await {
        Ok(body) => body,
        Err(problem) => return problem.into_response(),
    };
    if let Err(refusal) = webhook.verify(&parts.headers, &body, SystemTime::now()) {
        count_outcome(Outcome::Unauthenticated);
        count_webhook(provider, refusal.outcome());
        tracing::info!(%provider, %refusal, "webhook delivery refused");
        return refusal.problem().into_response();
    }
    let delivery = webhook.delivery(&parts.headers, &body);
    let key = match delivery.id.as_deref() {
        None => {
            count_outcome(Outcome::MissingKey);
            return webhook.missing_id().into_response();
        }
        Some(id) => match IdempotencyKey::from_value(id, config.max_key_length) {
            Ok(key) => key,
            Err(error) => {
                count_outcome(Outcome::InvalidKey);
                return ProblemDetails::invalid_key(&error).into_response();
            }
        },
    };
    let (path, _) = request_path(&parts);
    let template = route_template(&config, &parts);
    let scope = Scope {
        principal: delivery.principal,
        method: parts.method.as_str().to_owned(),
        path: template.clone().unwrap_or(path),
    };
    // The raw payload: what the provider signed, byte for byte.
    let fingerprint = Fingerprint::of(FingerprintInput {
        method: &scope.method,
        path: &scope.path,
        query: "",
        content_type: None,
        headers: &[],
        body: &body,
    });
    let claim = ClaimRequest {
        identity: Identity::new(scope, key),
        fingerprint,
        field_digests: None,
        lease: config.lease,
        ttl: config.ttl,
        route_template: template,
    };
    let Some(permit) = config.in_flight_limit.try_permit() else {
        count_outcome(Outcome::Overloaded);
        return ProblemDetails::overloaded(config.busy_retry_after).into_response();
    };
    let wants = ReplayRequest::of(&parts.headers);
    let span = tracing::info_span!(
        "idempotency",
        key = %claim.identity.key().digest_prefix(),
        webhook = %provider,
        operation_id = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    async move {
        match claim_or_answer(&config, &claim, &wants).await {
            Claimed::Lease(lease, claimed_at, transaction) => {
                tracing::Span::current()
                    .record("operation_id", tracing::field::display(lease.operation_id));
                count_outcome(Outcome::Executed);
                count_webhook(provider, "verified");
                let request = Request::from_parts(parts, Body::from(body));
                let route = route_key(&claim);
                Execution::new(config, lease, claimed_at, route, wants)
                    .spawn(handler, request, permit, transaction)
                    .await
            }
            Claimed::Answer(response) => {
                // What the claim found, read from its answer: a replay or a 409
                // is a duplicate, a 422 a mismatch; a store failure is neither.
                if response.headers().contains_key(&IDEMPOTENT_REPLAYED)
                    || response.status() == http::StatusCode::CONFLICT
                {
                    count_webhook(provider, "duplicate");
                } else if response.status() == http::StatusCode::UNPROCESSABLE_ENTITY {
                    count_webhook(provider, "mismatch");
                    tracing::warn!(%provider, "a webhook delivery id came again with another payload: a provider never does that");
                }
                response
            }
        }
    }
    .instrument(span)
    .await
}

/// What a keyed request is claimed as: its identity and fingerprint, with the
/// body buffered; or the answer that refuses it before any claim.
async fn prepare(
    config: &Config,
    parts: &Parts,
    body: Body,
    key: IdempotencyKey,
    by_content: bool,
) -> Result<(ClaimRequest, Bytes), Response<Body>> {
    // The fingerprint reads `Content-Type` to decide whether the body is JSON.
    if parts.headers.get_all(CONTENT_TYPE).iter().nth(1).is_some() {
        count_outcome(Outcome::Rejected);
        return Err(ProblemDetails::ambiguous_header(&CONTENT_TYPE).into_response());
    }
    let principal = match config.principal.extract(parts) {
        Ok(principal) => principal,
        Err(PrincipalError::Ambiguous(name)) => {
            count_outcome(Outcome::Rejected);
            return Err(ProblemDetails::ambiguous_header(&name).into_response());
        }
        Err(error) => {
            count_outcome(Outcome::Unauthenticated);
            return Err(ProblemDetails::unauthenticated(error.to_string()).into_response());
        }
    };
    let body = match read_body(parts, body, config.body_limit).await {
        Ok(body) => body,
        Err(problem) => return Err(problem.into_response()),
    };
    if crate::grpc::is_grpc(&parts.headers) {
        let found = crate::grpc::message_count(&body);
        if found != Some(1) {
            count_outcome(Outcome::Rejected);
            return Err(ProblemDetails::grpc_not_unary(found).into_response());
        }
    }
    let (path, query) = request_path(parts);
    let header_values = fingerprint_headers(config, parts);
    // A key from the path names the operation within the route, not within one
    // concrete path: the template is the scope's path (PROTOCOL §15).
    // Content dedup scopes by route too (PROTOCOL §16).
    let by_template = config.path_source == PathSource::RouteTemplate
        || config.key_source.path_parameter().is_some()
        || by_content;
    let template = route_template(config, parts);
    let scope_path = by_template.then(|| template.clone()).flatten();
    let scope = Scope {
        principal,
        method: parts.method.as_str().to_owned(),
        path: scope_path.unwrap_or_else(|| config.path_fold.apply(&path).into_owned()),
    };
    let identity = Identity::new(scope, key);
    // The per-field digests, keyed by the identity, beside the fingerprint: what
    // lets a 422 name the fields another body under this key changed.
    let (fingerprint, field_digests) = Fingerprint::with_field_digests(
        fingerprint_input(parts, &path, &query, &header_values, &body),
        &config.fingerprint_selection(),
        identity.digest().as_bytes(),
    );
    let claim = ClaimRequest {
        identity,
        fingerprint,
        field_digests,
        lease: config.lease,
        ttl: config.ttl,
        route_template: template,
    };
    Ok((claim, body))
}

/// The values of the headers `config` fingerprints, in its order.
fn fingerprint_headers<'a>(config: &'a Config, parts: &'a Parts) -> Vec<(&'a str, &'a [u8])> {
    config
        .fingerprint_headers
        .iter()
        .flat_map(|name| {
            parts
                .headers
                .get_all(name)
                .iter()
                .map(move |value| (name.as_str(), value.as_bytes()))
        })
        .collect()
}

/// What the fingerprint of a request reads (PROTOCOL §4): the one description
/// both the fingerprint and a content key are computed from.
fn fingerprint_input<'a>(
    parts: &'a Parts,
    path: &'a str,
    query: &'a str,
    headers: &'a [(&'a str, &'a [u8])],
    body: &'a [u8],
) -> FingerprintInput<'a> {
    FingerprintInput {
        method: parts.method.as_str(),
        path,
        query,
        content_type: parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        headers,
        body,
    }
}

/// Observe mode (PROTOCOL §16): the request runs and is answered as if the
/// strategy were off; the claim is still made, so what the strategy would have
/// done is counted, and a first run's record is settled by the usual rules —
/// by default without its response, under the observed name enforcement never
/// reads ([`Identity::observed`]); with [`ObservedResponses::Keep`], whole and
/// under the enforced name, as enforcement would have run it.
async fn observe<E: Into<BoxError> + Send + 'static>(
    config: Arc<Config>,
    handler: Handler<E>,
    request: Request<Body>,
    key: IdempotencyKey,
    by_content: bool,
) -> Result<Response<Body>, E> {
    let (parts, body) = request.into_parts();
    // What would refuse the request before a claim (no principal, two
    // `Content-Type` lines) refuses nothing here: it runs unobserved.
    let single_content_type = parts.headers.get_all(CONTENT_TYPE).iter().nth(1).is_none();
    if !single_content_type || config.principal.extract(&parts).is_err() {
        count_outcome(Outcome::PassedThrough);
        return keyless(&config, handler, Request::from_parts(parts, body)).await;
    }
    let body = match read_body(&parts, body, config.body_limit).await {
        Ok(body) => body,
        Err(problem) => return Ok(problem.into_response()),
    };
    // Answered as if the layer were off.
    count_outcome(Outcome::PassedThrough);
    let prepared = prepare(&config, &parts, Body::from(body.clone()), key, by_content).await;
    let wants = ReplayRequest::of(&parts.headers);
    let request = Request::from_parts(parts, Body::from(body));
    let Ok((mut claim, _)) = prepared else {
        return keyless(&config, handler, request).await;
    };
    let keep = config.observed_responses == ObservedResponses::Keep;
    if !keep {
        let (scope, key) = (claim.identity.scope().clone(), claim.identity.key().clone());
        claim.identity = Identity::observed(scope, key);
    }
    let claimed_at = Instant::now();
    match timed("claim", config.store.try_claim(&claim)).await {
        Ok(Claim::Acquired(lease)) => {
            count_duplicate(config.strategy, "observed");
            // Kept: run as enforcement runs a first request, its response stored
            // whole for the retries that come after a switch to enforce.
            if keep && let Some(permit) = config.in_flight_limit.try_permit() {
                let route = route_key(&claim);
                let execution =
                    Execution::new(Arc::clone(&config), lease, claimed_at, route, wants);
                return Ok(execution
                    .spawn(handler.boxing_errors(), request, permit, None)
                    .await);
            }
            let response = keyless(&config, handler, request).await?;
            if keep {
                // No room to keep this response, and the claim is under the name
                // enforcement reads: a status-only record would replay empty
                // after a switch. Forgotten instead, a retry then runs as new.
                if let Err(error) = timed("release", config.store.release(&lease)).await {
                    tracing::warn!(%error, "observe mode: releasing the unkept claim failed");
                }
            } else {
                let mark = response.extensions().get::<Finality>().copied();
                settle_observed(&config, &lease, response.status(), mark).await;
            }
            Ok(response)
        }
        Ok(Claim::Existing(snapshot)) => {
            let action = match decide(&snapshot, &claim.fingerprint) {
                Decision::Mismatch => "mismatch",
                Decision::Replay(_) => "replayed",
                Decision::InProgress { .. } => "conflict",
                Decision::Claimable => "observed",
            };
            count_duplicate(config.strategy, action);
            keyless(&config, handler, request).await
        }
        Err(error) => {
            tracing::warn!(%error, "observe mode: the store failed; the request runs unobserved");
            keyless(&config, handler, request).await
        }
    }
}

/// Settles an observed first run as enforcement would have (PROTOCOL §8), with
/// no body kept: later duplicates count as replays, 409s or 422s.
async fn settle_observed(
    config: &Config,
    lease: &idemgate_core::Lease,
    status: http::StatusCode,
    mark: Option<Finality>,
) {
    let settlement = settlement_for(status, mark, config.server_error_policy, false);
    let written = match settlement {
        Settlement::Complete(final_status) => {
            let completion = Completion {
                status: final_status,
                response: StoredResponse {
                    trailers: Vec::new(),
                    status,
                    headers: Vec::new(),
                    body: StoredBody::NotRetained,
                },
                ttl: config.ttl,
            };
            timed("complete", config.store.complete(lease, &completion)).await
        }
        Settlement::Release => timed("release", config.store.release(lease)).await,
        Settlement::Delete => timed("delete", config.store.delete(lease)).await,
    };
    if let Err(error) = written {
        tracing::warn!(%error, "observe mode: settling the observed record failed");
    }
}

/// Buffers the body for the fingerprint, refusing more than `limit` bytes.
async fn read_body(parts: &Parts, body: Body, limit: usize) -> Result<Bytes, ProblemDetails> {
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        count_outcome(Outcome::TooLarge);
        return Err(ProblemDetails::too_large(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => {
            count_outcome(Outcome::TooLarge);
            Err(ProblemDetails::too_large(limit))
        }
        Err(error) => {
            tracing::debug!(%error, "request body unreadable");
            count_outcome(Outcome::Rejected);
            Err(ProblemDetails::unreadable_body())
        }
    }
}

/// The normalized path and the query string, from the original URI so a nested
/// router does not shorten them. The fingerprint always uses this path; the scope
/// may use the route template instead.
fn request_path(parts: &Parts) -> (String, String) {
    let uri = parts
        .extensions
        .get::<OriginalUri>()
        .map_or(&parts.uri, |original| &original.0);
    let query = uri.query().unwrap_or_default().to_owned();
    (normalize_path(uri.path()), query)
}

/// The route template the request matched: the layer's own, else axum's.
fn route_template(config: &Config, parts: &Parts) -> Option<String> {
    config.route_template.clone().or_else(|| {
        parts
            .extensions
            .get::<MatchedPath>()
            .map(|m| m.as_str().to_owned())
    })
}

/// What a claim came to.
enum Claimed {
    /// Run the handler; in the one-transaction mode, inside the transaction
    /// that holds the claim.
    Lease(
        idemgate_core::Lease,
        Instant,
        Option<Box<dyn PendingTransaction>>,
    ),
    /// Answer without running it.
    Answer(Response<Body>),
}

/// What one claim found.
enum Attempt {
    /// Acquired; in the one-transaction mode, in this transaction.
    Acquired(idemgate_core::Lease, Option<Box<dyn PendingTransaction>>),
    Existing(Snapshot),
    /// Another request's transaction holds the key's uncommitted claim.
    Locked,
}

/// One claim: on its own (two phases), or as the first statement of the
/// handler's transaction (the one-transaction mode, PROTOCOL §23), where a
/// duplicate of a running request finds its transaction's lock rather than a
/// record.
async fn claim_once(config: &Config, request: &ClaimRequest) -> Result<Attempt, StoreError> {
    if !config.one_transaction {
        return Ok(
            match timed("claim", config.store.try_claim(request)).await? {
                Claim::Acquired(lease) => Attempt::Acquired(lease, None),
                Claim::Existing(snapshot) => Attempt::Existing(snapshot),
            },
        );
    }
    let claim = config
        .store
        .claim_in_transaction(request, config.lock_wait());
    Ok(match timed("claim", claim).await? {
        ClaimInTransaction::Acquired { lease, transaction } => {
            Attempt::Acquired(lease, Some(transaction))
        }
        ClaimInTransaction::Existing(snapshot) => Attempt::Existing(snapshot),
        ClaimInTransaction::Locked => Attempt::Locked,
    })
}

async fn claim_or_answer(
    config: &Config,
    request: &ClaimRequest,
    wants: &ReplayRequest,
) -> Claimed {
    let wait_until = config.wait.map(|wait| Instant::now() + wait.max);
    for _ in 0..MAX_CLAIM_ATTEMPTS {
        let claimed_at = Instant::now();
        let snapshot = match claim_once(config, request).await {
            Ok(Attempt::Acquired(lease, transaction)) => {
                if lease.origin == LeaseOrigin::TakenOver {
                    count("idemgate_lease_takeovers_total");
                    tracing::warn!(operation_id = %lease.operation_id, "took over a lapsed lease: an earlier run may have died mid-way");
                }
                return Claimed::Lease(lease, claimed_at, transaction);
            }
            Ok(Attempt::Existing(snapshot)) => snapshot,
            Ok(Attempt::Locked) => {
                // Its run is uncommitted: no record to estimate from.
                count_outcome(Outcome::Conflict);
                count_duplicate(config.strategy, "conflict");
                return Claimed::Answer(
                    ProblemDetails::in_progress(config.busy_retry_after).into_response(),
                );
            }
            Err(error) => return Claimed::Answer(store_failure(config, &error)),
        };
        match answer_from_existing(config, request, snapshot, wait_until, wants).await {
            Some(response) => return Claimed::Answer(response),
            None => continue,
        }
    }
    count_outcome(Outcome::Conflict);
    count_duplicate(config.strategy, "conflict");
    Claimed::Answer(ProblemDetails::in_progress(config.busy_retry_after).into_response())
}

/// Answers from an existing record, waiting for it first in wait mode. `None` when
/// the record became claimable and the caller should claim again.
async fn answer_from_existing(
    config: &Config,
    request: &ClaimRequest,
    mut snapshot: Snapshot,
    wait_until: Option<Instant>,
    wants: &ReplayRequest,
) -> Option<Response<Body>> {
    let identity = request.identity.digest();
    let store: &dyn Store = config.store.as_ref();
    let waiter = config
        .wait
        .zip(wait_until)
        .map(|(wait, until)| Waiter::new(store, identity, until, wait.recheck));
    loop {
        let retry_after = match decide(&snapshot, &request.fingerprint) {
            Decision::Mismatch => {
                count_outcome(Outcome::Mismatch);
                count_duplicate(config.strategy, "mismatch");
                // Named from the two requests' field digests where both have
                // them; a bare 422 otherwise (a body that is not JSON, a record
                // an older build wrote).
                let problem = match snapshot.record.differing(request.field_digests.as_ref()) {
                    Some(differing) => ProblemDetails::key_reused_differing(&differing),
                    None => ProblemDetails::key_reused(),
                };
                return Some(problem.into_response());
            }
            Decision::Replay(stored) => {
                let StoredBody::InPieces(pieces) = stored.body else {
                    count_outcome(Outcome::Replayed);
                    count_duplicate(config.strategy, "replayed");
                    return Some(replay(stored, wants));
                };
                let stream = StreamId::of_record(*identity, &snapshot.record);
                let replayed =
                    replay_pieces(config.store.clone(), stream, stored, pieces, wants).await;
                return Some(match replayed {
                    Ok(replayed) => {
                        count_outcome(Outcome::Replayed);
                        count_duplicate(config.strategy, "replayed");
                        replayed
                    }
                    Err(error) => store_failure(config, &error),
                });
            }
            Decision::Claimable => return None,
            // A stream in flight, on this instance or another: joined, from
            // its first byte (PROTOCOL §20). Not a JSON-RPC retry's: its
            // answer must carry its own `id`, so it waits for the stored one.
            Decision::InProgress { retry_after } if wants.jsonrpc_id().is_none() => {
                let stream = StreamId::of_record(*identity, &snapshot.record);
                match join(config.store.clone(), stream, wants).await {
                    Some(joined) => {
                        count_outcome(Outcome::Replayed);
                        count_duplicate(config.strategy, "replayed");
                        return Some(joined);
                    }
                    None => retry_after,
                }
            }
            // The lease left; the hint is worked out only if a 409 is sent.
            Decision::InProgress { retry_after } => retry_after,
        };
        let waited = match &waiter {
            Some(waiter) => waiter.next(&snapshot).await,
            None => None,
        };
        let Some(read) = waited else {
            count_outcome(Outcome::Conflict);
            count_duplicate(config.strategy, "conflict");
            let route = route_key(request);
            let retry_after = config
                .durations
                .in_progress_hint(store, &route, &snapshot, retry_after)
                .await;
            return Some(ProblemDetails::in_progress(retry_after).into_response());
        };
        snapshot = match read {
            Ok(Some(snapshot)) => snapshot,
            Ok(None) => return None,
            Err(error) => return Some(store_failure(config, &error)),
        };
    }
}

/// The answer to a store error before anything ran: fail closed (PROTOCOL §9).
fn store_failure(config: &Config, error: &StoreError) -> Response<Body> {
    tracing::error!(error = %error, cause = ?std::error::Error::source(error), "idempotency store failed");
    count_outcome(match error {
        StoreError::Corrupt(_) | StoreError::Misconfigured(_) => Outcome::Rejected,
        _ => Outcome::StoreUnavailable,
    });
    ProblemDetails::for_store_error(error, config.unavailable_retry_after).into_response()
}
