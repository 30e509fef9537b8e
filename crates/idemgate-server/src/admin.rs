//! The admin listener, one router for `proxy` (always on) and `serve` (with
//! `--admin-listen`): `/healthz`, `/readyz`, `/metrics`, on `proxy` `GET
//! /v1/config` (the route file it follows: [`RouteFileView`] JSON, open like
//! `/metrics`: a digest and a time, nothing secret), and — only when
//! `IDEMGATE_ADMIN_TOKEN` is set — the key API:
//!
//! - `GET /v1/keys?principal=P&method=M&path=/x&key=K[&body=true]`: the record as
//!   [`KeyView`] JSON, 404 `key-not-found` when there is none;
//! - `DELETE /v1/keys?…[&force=true]`: evicts it ([`EvictionView`] JSON), 404 when
//!   there is none, 409 `key-in-progress` for a live `PROCESSING` record unless
//!   forced.
//!
//! - `GET /v1/audit?since=&until=&limit=&after=`: journal entries as JSON Lines
//!   ([`EntryView`], `application/jsonl`), oldest first, at most `limit` (default
//!   and bound 1000); the next page is `after=` the last line's `seq`.
//!
//! All need `Authorization: Bearer <IDEMGATE_ADMIN_TOKEN>` (401
//! `admin-unauthorized` otherwise, compared in constant time). Without a token the
//! routes do not exist (404): the key API is never open by default.

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use idemgate::deadline::WithDeadline;
use idemgate::key::IdempotencyKey;
use idemgate::scope::{Identity, IdentityDigest, Scope};
use idemgate::{DetachedTasks, EvictMode, Eviction, Principal, ProblemDetails, Store};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;

use crate::audit::{EntryView, PAGE, instance_name, parse_time};
use crate::config::AdminToken;
use crate::idempotency::UNAVAILABLE_RETRY_AFTER;
use crate::inspect::{EvictionView, KeyQuery, KeyView, lease_left};
use crate::monitoring::metrics_response;
use crate::route_file::{RouteFile, RouteFileView};

/// What the admin routes read.
#[derive(Clone)]
pub struct AdminState {
    /// The store, each call bounded by the store timeout.
    store: Arc<WithDeadline>,
    /// The record `/readyz` reads (never written, so always absent).
    probe: IdentityDigest,
    metrics: Option<PrometheusHandle>,
    tasks: DetachedTasks,
    /// The key API's token; `None`: the key API is off.
    token: Option<AdminToken>,
    /// The proxy's route file; `None` (serve): no `/v1/config`.
    route_file: Option<RouteFile>,
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState")
            .field("key_api", &self.token.is_some())
            .finish_non_exhaustive()
    }
}

impl AdminState {
    /// The admin state over `store`, each call bounded by `store_timeout`; the
    /// key API is on only with a `token`.
    pub fn new(
        store: Arc<dyn Store>,
        store_timeout: std::time::Duration,
        metrics: Option<PrometheusHandle>,
        tasks: DetachedTasks,
        token: Option<AdminToken>,
    ) -> Self {
        Self {
            store: Arc::new(WithDeadline::new(store, store_timeout)),
            probe: readiness_probe(),
            metrics,
            tasks,
            token,
            route_file: None,
        }
    }

    /// Serves `GET /v1/config` from `file` (the proxy's route file).
    #[must_use]
    pub fn with_route_file(mut self, file: RouteFile) -> Self {
        self.route_file = Some(file);
        self
    }
}

/// The admin router: health, readiness, metrics, and the key API when a token
/// is configured.
pub fn router(admin: AdminState) -> Router {
    let mut router = Router::new()
        .route(
            "/healthz",
            get(|| async { axum::Json(serde_json::json!({ "status": "ok" })) }),
        )
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics));
    if admin.route_file.is_some() {
        router = router.route("/v1/config", get(show_config));
    }
    match &admin.token {
        Some(token) => {
            router = router
                .route(
                    "/v1/keys",
                    get(show_key)
                        .delete(evict_key)
                        .route_layer(middleware::from_fn_with_state(token.clone(), require_token)),
                )
                .route(
                    "/v1/audit",
                    get(read_journal)
                        .route_layer(middleware::from_fn_with_state(token.clone(), require_token)),
                );
        }
        None => tracing::info!("admin key API off: set IDEMGATE_ADMIN_TOKEN to enable /v1/keys"),
    }
    router.with_state(admin)
}

/// Ready when the store answers a read within the store timeout: an instance
/// whose store is down answers every keyed request 503, so a load balancer should
/// skip it.
async fn readyz(State(admin): State<AdminState>) -> Response {
    match admin.store.get(&admin.probe).await {
        Ok(_) => axum::Json(serde_json::json!({ "status": "ready" })).into_response(),
        Err(error) => {
            tracing::warn!(%error, "readiness: the idempotency store did not answer");
            ProblemDetails::store_unavailable(UNAVAILABLE_RETRY_AFTER).into_response()
        }
    }
}

/// The identity `/readyz` reads: one no request can name (its principal is not
/// one an extractor makes), so the read finds nothing and changes nothing.
fn readiness_probe() -> IdentityDigest {
    let scope = Scope {
        principal: Principal::new("idemgate:readyz"),
        method: "GET".to_owned(),
        path: "/readyz".to_owned(),
    };
    // A constant key of visible ASCII: parsing it cannot fail.
    let key = IdempotencyKey::parse(b"idemgate-readyz", 255).expect("a valid constant key");
    *Identity::new(scope, key).digest()
}

/// `GET /v1/config`: which route file the proxy follows (its SHA-256 and load
/// time) and the last reload it refused.
async fn show_config(State(admin): State<AdminState>) -> axum::Json<RouteFileView> {
    axum::Json(
        admin
            .route_file
            .as_ref()
            .map(RouteFile::view)
            .unwrap_or_default(),
    )
}

async fn render_metrics(State(admin): State<AdminState>) -> Response {
    admin.tasks.record_gauges();
    metrics_response(admin.metrics.as_ref())
}

/// `Authorization: Bearer <token>`, sent once, matching the configured token.
async fn require_token(State(token): State<AdminToken>, request: Request, next: Next) -> Response {
    let mut lines = request.headers().get_all(header::AUTHORIZATION).iter();
    let presented = match (lines.next(), lines.next()) {
        (Some(value), None) => value.as_bytes().strip_prefix(b"Bearer "),
        _ => None,
    };
    if presented.is_some_and(|presented| token.admits(presented)) {
        return next.run(request).await;
    }
    let problem = ProblemDetails::new(
        StatusCode::UNAUTHORIZED,
        "admin-unauthorized",
        "Admin token required",
        "send Authorization: Bearer <IDEMGATE_ADMIN_TOKEN>",
    );
    let mut response = problem.into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// The query of both key routes.
#[derive(Debug, Deserialize)]
struct KeyParams {
    principal: String,
    method: String,
    path: String,
    key: String,
    /// `GET`: include the stored headers and body.
    #[serde(default)]
    body: bool,
    /// `DELETE`: evict even a live `PROCESSING` record.
    #[serde(default)]
    force: bool,
}

/// The identity the query names, or the 400 that says why it names none.
fn identity_of(
    params: Result<Query<KeyParams>, QueryRejection>,
) -> Result<(Identity, KeyParams), ProblemDetails> {
    let invalid = |detail: String| {
        ProblemDetails::new(
            StatusCode::BAD_REQUEST,
            "invalid-key-query",
            "Invalid key query",
            detail,
        )
    };
    let Query(params) = params.map_err(|rejection| {
        invalid(format!(
            "{}; expected principal, method, path and key",
            rejection.body_text()
        ))
    })?;
    let query = KeyQuery {
        principal: Principal::new(params.principal.clone()),
        method: params.method.clone(),
        path: params.path.clone(),
        key: params.key.clone(),
    };
    let identity = query
        .identity()
        .map_err(|error| invalid(error.to_string()))?;
    Ok((identity, params))
}

fn key_not_found() -> ProblemDetails {
    ProblemDetails::new(
        StatusCode::NOT_FOUND,
        "key-not-found",
        "No record under this key",
        "no live record for this principal, method, path and key (never used, expired or evicted)",
    )
}

fn store_failed(error: idemgate::StoreError) -> ProblemDetails {
    tracing::error!(%error, cause = ?std::error::Error::source(&error), "admin key API: the idempotency store failed");
    ProblemDetails::for_store_error(&error, UNAVAILABLE_RETRY_AFTER)
}

async fn show_key(
    State(admin): State<AdminState>,
    params: Result<Query<KeyParams>, QueryRejection>,
) -> Result<axum::Json<KeyView>, ProblemDetails> {
    let (identity, params) = identity_of(params)?;
    let snapshot = admin
        .store
        .get(identity.digest())
        .await
        .map_err(store_failed)?
        .ok_or_else(key_not_found)?;
    Ok(axum::Json(KeyView::of(&identity, &snapshot, params.body)))
}

async fn evict_key(
    State(admin): State<AdminState>,
    params: Result<Query<KeyParams>, QueryRejection>,
) -> Result<axum::Json<EvictionView>, ProblemDetails> {
    let (identity, params) = identity_of(params)?;
    let mode = if params.force {
        EvictMode::Force
    } else {
        EvictMode::UnlessRunning
    };
    let eviction = admin
        .store
        .evict(identity.digest(), mode)
        .await
        .map_err(store_failed)?;
    let view = EvictionView::of(&identity, eviction);
    if matches!(eviction, Eviction::Evicted { .. })
        && let Err(error) =
            crate::audit::journal_eviction(admin.store.as_ref(), &identity, instance_name()).await
    {
        tracing::error!(%error, "admin eviction: the journal did not take its entry");
    }
    match eviction {
        Eviction::Evicted { status } => {
            tracing::warn!(
                identity = %view.identity,
                previous_status = status.as_str(),
                forced = params.force,
                "admin evicted a key: its next request runs as a new operation"
            );
            Ok(axum::Json(view))
        }
        Eviction::Absent => Err(key_not_found()),
        Eviction::RefusedLiveLease { .. } => Err(ProblemDetails::new(
            StatusCode::CONFLICT,
            "key-in-progress",
            "A request holding this key may still run",
            format!(
                "the record is PROCESSING with {} ms left on its lease; retry after it, or add force=true (a retry may then run the operation beside the running one)",
                view.lease_remaining_ms.unwrap_or_default()
            ),
        )
        .with_retry_after(lease_left(eviction).unwrap_or_default())),
    }
}

/// The query of `GET /v1/audit`.
#[derive(Debug, Deserialize)]
struct AuditParams {
    since: Option<String>,
    until: Option<String>,
    limit: Option<usize>,
    after: Option<u64>,
}

/// `GET /v1/audit`: one page of the journal as JSON Lines.
async fn read_journal(
    State(admin): State<AdminState>,
    params: Result<Query<AuditParams>, QueryRejection>,
) -> Result<Response, ProblemDetails> {
    let invalid = |detail: String| {
        ProblemDetails::new(
            StatusCode::BAD_REQUEST,
            "invalid-audit-query",
            "Invalid journal query",
            detail,
        )
    };
    let Query(params) = params.map_err(|rejection| {
        invalid(format!(
            "{}; expected since, until (RFC 3339), limit, after (a seq)",
            rejection.body_text()
        ))
    })?;
    let time = |text: Option<String>| text.map(|t| parse_time(&t).map_err(invalid)).transpose();
    let query = idemgate::audit::AuditQuery {
        since: time(params.since)?,
        until: time(params.until)?,
        after: params.after,
        limit: params.limit.unwrap_or(PAGE).clamp(1, PAGE),
    };
    let entries = admin.store.read_audit(&query).await.map_err(store_failed)?;
    let body: String = entries.iter().map(EntryView::line).collect();
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/jsonl"),
        )],
        body,
    )
        .into_response())
}
