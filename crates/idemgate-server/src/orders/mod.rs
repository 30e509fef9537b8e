//! The orders service of the design articles, as a real service: `POST
//! /api/v1/orders` charges a payment gateway and stores an order exactly once per
//! `Idempotency-Key`, whatever the network, the client or the process does. By
//! default everything lives in one SQLite file, and each order commits in the same
//! transaction as its idempotency record.
//!
//! - [`api`]: the routes' handlers;
//! - [`accounts`]: accounts and compare-and-set transfers (PROTOCOL §18), with
//!   their SQL in [`ledger`];
//! - [`auth`]: bearer authentication, outside the idempotency layer;
//! - [`db`]: the orders database (the only database this tree opens);
//! - [`fault`]: the test suites' fault between an edit's write and its answer;
//! - [`order`]: what a client may order, checked before anything is charged;
//! - [`outcome`]: what each write answered, by operation id, so a retry that
//!   runs an operation again after a crash answers what its first run did;
//! - [`payment`]: the payment gateway client;
//! - [`webhook`]: the gateway's webhook, `POST /webhooks/payments`, marking an
//!   order's payment confirmed exactly once (the inbox pattern).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::Method;
use axum::middleware;
use axum::routing::{get, patch, post};
use idemgate::key::KeySource;
use idemgate::problem::ProblemStyleLayer;
use idemgate::{DetachedTasks, IdempotencyLayer};
use metrics_exporter_prometheus::PrometheusHandle;

pub mod accounts;
pub mod api;
pub mod auth;
pub mod db;
mod failure;
pub mod fault;
pub mod ledger;
pub mod order;
pub mod outcome;
pub mod payment;
pub mod webhook;

use db::OrdersDb;
use payment::PaymentGateway;

/// How the orders handler writes its order.
#[derive(Clone, Debug)]
pub enum OrderWrites {
    /// In the idempotency layer's transaction (SQLite): the order and the
    /// `COMPLETED` record commit together.
    SqliteTransaction(idemgate_sqlite::SqliteStore),
    /// The same on PostgreSQL.
    PostgresTransaction(idemgate_postgres::PostgresStore),
    /// Straight to the orders database, keyed by operation id (the idempotency
    /// records live elsewhere: memory or Redis).
    Direct,
}

/// What handlers share.
#[derive(Clone, Debug)]
pub struct OrdersState {
    /// Orders storage.
    pub orders: OrdersDb,
    /// How orders are written.
    pub writes: OrderWrites,
    /// The payment gateway.
    pub gateway: PaymentGateway,
    /// Renders `/metrics`; `None` when no recorder is installed.
    pub metrics: Option<PrometheusHandle>,
    /// The idempotency layer's detached handlers (for the in-flight gauges).
    pub tasks: DetachedTasks,
    /// The `Retry-After` of a 503 for an order that could not be stored: the one
    /// the idempotency layer sends for its store (`with_unavailable_retry_after`).
    pub unavailable_retry_after: Duration,
    /// How long an operation's recorded outcome is kept ([`outcome`]): the
    /// idempotency layer's TTL, past which no run of the operation can come.
    pub outcome_retention: Duration,
    /// Tests only: the fault after an edit's write ([`fault`]); `None` in
    /// production.
    pub edit_fault: Option<fault::EditFault>,
    /// The payment webhook (`POST /webhooks/payments`, [`webhook`]); `None`:
    /// no such route.
    pub payment_webhook: Option<webhook::PaymentWebhook>,
    /// Benchmarks only (`--two-phase-transfers`): transfers keep the two-phase
    /// claim where they would run in one transaction.
    pub two_phase_transfers: bool,
}

/// The whole service: `/api/v1/orders` behind bearer authentication and the
/// idempotency layer, plus `/healthz` and `/metrics`.
pub fn router(state: OrdersState, idempotency: IdempotencyLayer) -> Router {
    routes(state, Some(idempotency))
}

/// The same routes and handlers with no idempotency layer: the `bare` baseline
/// `idemgate-bench` measures the layer against (the hidden `--no-idempotency`).
/// Handlers then get no operation and no transaction slot, so orders are written
/// directly. Never for production: a retried POST charges and stores twice.
pub fn router_without_idempotency(state: OrdersState) -> Router {
    routes(state, None)
}

fn routes(state: OrdersState, idempotency: Option<IdempotencyLayer>) -> Router {
    // Problems answered outside the layer (authentication's 401) in its style.
    let style = idempotency
        .as_ref()
        .map(|layer| layer.problem_style().clone())
        .unwrap_or_default();
    let mut orders = Router::new()
        .route(
            "/api/v1/orders",
            get(api::list_orders).post(api::create_order),
        )
        .route(
            "/api/v1/orders/{order_id}",
            patch(api::patch_order).delete(api::cancel_order),
        )
        .route("/api/v1/accounts", post(accounts::open_account))
        .route("/api/v1/accounts/{id}", get(accounts::get_account))
        // Reads, so uncovered by the layer; the POST on the same path is the
        // transfers' router below (axum merges the two method routers).
        .route(
            "/api/v1/accounts/{id}/transfers",
            get(accounts::list_transfers),
        )
        .route("/api/v1/transfers/{id}", get(accounts::get_transfer));
    // A transfer is keyed by its `reference_id` (PROTOCOL §15, §18): the client's
    // own reference is the idempotency key, no header needed.
    let mut transfers = Router::new().route(
        "/api/v1/accounts/{id}/transfers",
        post(accounts::create_transfer),
    );
    // The same path as the edits above, another layer: the natural-key create
    // (and the read) on `PUT`/`GET`; axum merges the two method routers.
    let mut natural = Router::new().route(
        "/api/v1/orders/{order_id}",
        get(api::get_order).put(api::put_order),
    );
    let mut hooks = Router::new();
    if let Some(idempotency) = idempotency {
        // PATCH and DELETE are conditional writes: with a key, the journal comes
        // first, so a retry of one that succeeded replays it (PROTOCOL §17).
        let idempotency = idempotency.with_methods([Method::POST, Method::PATCH, Method::DELETE]);
        // Route layers: only matched routes reach them, so 404/405 are not stored.
        // `PUT /api/v1/orders/{order_id}` is keyed by its id (PROTOCOL §15): the
        // same layer, store and detached tasks, another key source.
        natural = natural.route_layer(
            idempotency
                .clone()
                .with_methods([Method::PUT])
                .with_key_source(KeySource::Path("order_id".to_owned())),
        );
        let keyed_by_reference = idempotency
            .clone()
            .with_methods([Method::POST])
            .with_key_source(
                "json:/reference_id"
                    .parse::<KeySource>()
                    .expect("a constant key source"),
            );
        // Every effect of a transfer is in the ledger, in the records'
        // database: claim, ledger rows and completion commit once (PROTOCOL
        // §23). Orders call the payment gateway, so they keep two phases.
        transfers = transfers.route_layer(match state.writes {
            _ if state.two_phase_transfers => keyed_by_reference,
            OrderWrites::SqliteTransaction(_) | OrderWrites::PostgresTransaction(_) => {
                keyed_by_reference
                    .with_one_transaction()
                    .expect("the SQL stores claim inside the handler's transaction")
            }
            OrderWrites::Direct => keyed_by_reference,
        });
        // The gateway's webhook: verified, keyed by its `webhook-id`, no
        // bearer token (webhooks carry no user credentials).
        if let Some(payment) = &state.payment_webhook {
            hooks = hooks
                .route(webhook::PATH, post(webhook::receive))
                .route_layer(
                    idempotency
                        .clone()
                        .with_methods([Method::POST])
                        .with_webhook(payment.secret.webhook()),
                );
        }
        orders = orders.route_layer(idempotency);
    }
    let api = orders
        .merge(natural)
        .merge(transfers)
        .route_layer(middleware::from_fn(auth::authenticate));
    Router::new()
        .route("/healthz", get(api::healthz))
        .route("/metrics", get(api::render_metrics))
        .merge(crate::demo::routes())
        .merge(hooks)
        .merge(api)
        .layer(ProblemStyleLayer::new(style))
        // Outermost, outside the idempotency layer (PROTOCOL §1): each answer,
        // first run or replay, is encoded for the request in hand by its
        // Accept-Encoding (gzip, br, zstd, or identity), and the record keeps
        // the one representation every retry can read.
        .layer(tower_http::compression::CompressionLayer::new())
        .with_state(Arc::new(state))
}
