//! `IdempotencyLayer`: the builder of the layer's `Config`, and the tower `Layer`.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
use tower_layer::Layer;

use idemgate_core::Store;
use idemgate_core::deadline::{DEFAULT_STORE_TIMEOUT, WithDeadline};
use idemgate_core::fingerprint::BodySelection;
use idemgate_core::key::{ContentDedup, DEFAULT_MAX_KEY_LENGTH, KeySource};
use idemgate_core::path::PathFold;
use idemgate_core::transaction::OneTransactionUnsupported;

use crate::config::{Config, ObservedResponses, PathSource, StrategyMode, WaitMode};
use crate::durations::RouteDurations;
use crate::finality::ServerErrorPolicy;
use crate::grpc::GrpcCode;
use crate::principal::{DefaultPrincipal, PrincipalExtractor};
use crate::problem::{ProblemShape, ProblemStyle};
use crate::response::ReplayedHeaders;
use crate::service::{Idempotency, Variants};
use crate::tasks::{DetachedTasks, InFlightLimit};
use crate::webhook::Webhook;

/// The largest request body a covered request may have by default (1 MiB): past
/// it, `413` before anything is claimed.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// The largest response the layer stores by default (1 MiB).
pub const DEFAULT_RESPONSE_LIMIT: usize = 1024 * 1024;

/// How long a running request's claim lasts without renewal by default.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// How long a record is kept by default: a day, longer than any client's retries.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a duplicate of a running request waits for its outcome by default in
/// the `idemgate` binary (`--wait-ms`, a proxy route's `wait_ms`), before `409`.
///
/// Ten seconds: longer than the p99 of the operations an `Idempotency-Key`
/// usually guards (payments, orders: well under a few seconds), so the duplicate
/// of a slow-but-normal run gets its replay instead of a `409` its SDK may
/// surface as an error (Stripe's, Modern Treasury's and Orb's retry a 409 a
/// couple of times at most, then raise); shorter than the gateways' own request
/// timeouts in front of such services (AWS API Gateway 29 s, Heroku 30 s, an
/// ALB's 60 s idle), so a waiter is answered — with an honest `Retry-After` —
/// before a gateway cuts it. A client with a shorter timeout of its own leaves
/// earlier; its next attempt waits again. A waiter holds no store connection
/// (see `docs/benchmarks.md` for what 1,000 cost).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// Makes retries of `POST`, `PUT`, `PATCH` and `DELETE` requests with an
/// `Idempotency-Key` run once.
///
/// Add it to the routes that change things, after authentication (which puts a
/// [`crate::Principal`] in the request extensions) and inside compression:
///
/// ```
/// use axum::{Router, routing::post};
/// use idemgate::{IdempotencyLayer, MemoryStore};
///
/// async fn create_order() -> &'static str { "created" }
///
/// let idempotency = IdempotencyLayer::new(MemoryStore::new());
/// let app: Router = Router::new()
///     .route("/orders", post(create_order))
///     // A route layer: unknown routes (404) and wrong methods (405) are not stored.
///     .route_layer(idempotency);
///     // .layer(auth)         // outside: puts the Principal in the extensions
///     // .layer(compression)  // outside: replays are encoded per request
/// ```
#[derive(Clone)]
#[must_use = "a layer does nothing until it wraps a service (Router::route_layer, ServiceBuilder::layer)"]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("methods", &self.config.methods)
            .field("ttl", &self.config.ttl)
            .field("lease", &self.config.lease)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer over `store` with the defaults of PROTOCOL.md: every method that
    /// is not safe (`POST`, `PUT`, `PATCH`, `DELETE`) when it carries a key,
    /// key optional, keys up to 255 characters, 1 MiB request and stored-response
    /// limits, 30 s lease, 24 h TTL, 409 without waiting, 5xx stored as `FAILED`,
    /// principal from the request extensions, 2 s store timeout.
    pub fn new(store: impl Store) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// A layer over a shared store (when the backend is chosen at run time).
    pub fn from_arc(store: Arc<dyn Store>) -> Self {
        Self {
            config: Arc::new(Config {
                store: Arc::new(WithDeadline::new(store, DEFAULT_STORE_TIMEOUT)),
                methods: vec![Method::POST, Method::PUT, Method::PATCH, Method::DELETE],
                require_key: false,
                max_key_length: DEFAULT_MAX_KEY_LENGTH,
                key_source: KeySource::default(),
                route_template: None,
                dedup: None,
                webhook: None,
                mode: StrategyMode::Enforce,
                observed_responses: ObservedResponses::Discard,
                strategy: "header",
                body_limit: DEFAULT_BODY_LIMIT,
                response_limit: DEFAULT_RESPONSE_LIMIT,
                lease: DEFAULT_LEASE,
                ttl: DEFAULT_TTL,
                wait: None,
                one_transaction: false,
                server_error_policy: ServerErrorPolicy::Store,
                grpc_released: GrpcCode::RELEASED_BY_DEFAULT.to_vec(),
                principal: Arc::new(DefaultPrincipal::new()),
                path_source: PathSource::Request,
                path_fold: PathFold::NONE,
                fingerprint_headers: Vec::new(),
                fingerprint_body: BodySelection::Whole,
                jsonrpc: false,
                replayed_headers: ReplayedHeaders::default(),
                compression_threshold: idemgate_core::compression::DEFAULT_THRESHOLD,
                unavailable_retry_after: Duration::from_secs(1),
                busy_retry_after: Duration::from_secs(1),
                in_flight_limit: InFlightLimit::new(1024),
                problem_style: ProblemStyle::default(),
                tasks: DetachedTasks::new(),
                durations: Arc::new(RouteDurations::default()),
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Config)) -> Self {
        // Clones of a layer share their config until one of them is configured.
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// The methods the layer covers (by default `POST`, `PUT`, `PATCH` and
    /// `DELETE`: a client that sends a key on any of them asks for it to be
    /// honoured); others pass through even with a key.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_methods([http::Method::POST, http::Method::PUT, http::Method::DELETE]);
    /// ```
    pub fn with_methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.with(|c| c.methods = methods)
    }

    /// Answer 400 to covered requests without a key, instead of passing them
    /// through.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_require_key(true);
    /// ```
    pub fn with_require_key(self, require: bool) -> Self {
        self.with(|c| c.require_key = require)
    }

    /// The longest key accepted, in characters (default 255).
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_max_key_length(64);
    /// ```
    pub fn with_max_key_length(self, characters: usize) -> Self {
        self.with(|c| c.max_key_length = characters)
    }

    /// Where the key comes from (PROTOCOL §15): another header, a path parameter
    /// of the route template, a JSON pointer into the body, or a query
    /// parameter; by default the `Idempotency-Key` header. The value is validated
    /// as the header is, and everything after it (scope, fingerprint, claim,
    /// replay) is unchanged. The standard header still counts: when it and the
    /// source both carry a key and they differ, the answer is 400
    /// `ambiguous-key`, before any claim. A key from the path scopes by the route
    /// template, so the id alone names the operation.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_key_source("json:/reference_id".parse().unwrap());
    /// ```
    pub fn with_key_source(self, source: KeySource) -> Self {
        self.with(|c| {
            c.strategy = source.strategy();
            c.key_source = source;
        })
    }

    /// Enforce the key strategy (the default), or only observe it: in
    /// [`StrategyMode::Observe`] every request runs and is answered as if the
    /// layer were off, while what the strategy would have done — a replay, a
    /// 409, a 422, or a new operation — is recorded in the store and counted in
    /// `idemgate_duplicates_total{strategy, action}` (`action` = `replayed`,
    /// `conflict`, `mismatch`, `observed`). Turn content dedup on in observe mode,
    /// read the counters, then enforce.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_mode(idemgate::StrategyMode::Observe);
    /// ```
    pub fn with_mode(self, mode: StrategyMode) -> Self {
        self.with(|c| c.mode = mode)
    }

    /// What observe mode keeps of an observed first run: its outcome only, under
    /// a name enforcement never reads (the default: after a switch to enforce, a
    /// retry of an observed operation runs as new), or the whole response under
    /// the enforced name (a retry after the switch is replayed whole; the store
    /// holds what enforcing would). A client's own `Idempotency-Key` on a route
    /// that observes another strategy is enforced either way.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer
    ///     .with_mode(idemgate::StrategyMode::Observe)
    ///     .with_observed_responses(idemgate::ObservedResponses::Keep);
    /// ```
    pub fn with_observed_responses(self, kept: ObservedResponses) -> Self {
        self.with(|c| c.observed_responses = kept)
    }

    /// A JSON-RPC 2.0 endpoint (PROTOCOL §20; an MCP server's Streamable HTTP
    /// endpoint): the envelope's `id` — new on every attempt — is left out of
    /// the fingerprint, a replay answers with the retry's own `id` (in a JSON
    /// body, or in each event of an event stream that carries the response),
    /// and a batch (a JSON array) is refused with `400 jsonrpc-batch` before
    /// any claim. The key is read as on any route: the header, or a body field
    /// such as `json:/params/_meta/idempotency_key`.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer
    ///     .with_key_source("json:/params/_meta/idempotency_key".parse().unwrap())
    ///     .with_jsonrpc(true);
    /// ```
    pub fn with_jsonrpc(self, on: bool) -> Self {
        self.with(|c| c.jsonrpc = on)
    }

    /// Content-based deduplication (PROTOCOL §16): a covered request without a
    /// key is keyed by the SHA-256 of its canonical content (see
    /// [`ContentDedup`]), scoped by principal, method and route (the template
    /// when known), its record kept for the window instead of the TTL. A
    /// duplicate inside the window is replayed with `Idempotent-Replayed: true`
    /// and `Idempotency-Dedup: content`. An explicit key always wins.
    ///
    /// ```
    /// use idemgate::key::ContentDedup;
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_content_dedup(ContentDedup::new(std::time::Duration::from_secs(300)));
    /// ```
    pub fn with_content_dedup(self, dedup: ContentDedup) -> Self {
        self.with(|c| c.dedup = Some(dedup))
    }

    /// A webhook receiver (see [`crate::webhook`]): every covered request is a
    /// delivery of `webhook`'s provider, its signature verified before anything
    /// is claimed — a missing, bad or stale one is answered `401`
    /// (`bad-webhook-signature`, `stale-webhook`), nothing claimed, nothing run.
    /// A verified delivery is keyed by its own id (Stripe's event `id`,
    /// `X-GitHub-Delivery`, `X-Shopify-Event-Id` or `X-Shopify-Webhook-Id`,
    /// `webhook-id`), scoped by the route and the provider account (no
    /// principal is extracted: webhooks carry no user credentials), and
    /// fingerprinted by its raw payload; the key source and content dedup do
    /// not apply, and it is always enforced. A redelivery of a completed
    /// delivery gets the stored answer without running; one of a running
    /// delivery waits ([`IdempotencyLayer::with_wait`]) or gets `409`; the same
    /// id with another payload gets `422`. Counted in
    /// `idemgate_webhooks_total{provider, outcome}`.
    ///
    /// It also sets [`ServerErrorPolicy::Release`], so a provider's redelivery
    /// after a 5xx runs again; call [`IdempotencyLayer::with_server_error_policy`]
    /// after it to change that.
    ///
    /// ```
    /// use idemgate::webhook::{Provider, Webhook};
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_webhook(Webhook::new(Provider::Github, ["It's a Secret to Everybody"]).unwrap());
    /// ```
    pub fn with_webhook(self, webhook: Webhook) -> Self {
        let webhook = Arc::new(webhook);
        self.with(|c| {
            c.webhook = Some(webhook);
            c.server_error_policy = ServerErrorPolicy::Release;
        })
    }

    /// The route template this layer serves (`/orders/{order_id}`), when axum's
    /// `MatchedPath` is not there to say it (a service that routes by itself,
    /// such as the proxy): the scope of a path key and of
    /// [`PathSource::RouteTemplate`], and the name of the route's execution
    /// history and of its journal entries for every key.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer
    ///     .with_route_template("/orders/{order_id}")
    ///     .with_key_source("path:order_id".parse().unwrap());
    /// ```
    pub fn with_route_template(self, template: impl Into<String>) -> Self {
        let template = template.into();
        self.with(|c| c.route_template = Some(template))
    }

    /// The largest request body buffered for fingerprinting (default 1 MiB);
    /// larger requests get 413 before any claim.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_body_limit(64 * 1024);
    /// ```
    pub fn with_body_limit(self, bytes: usize) -> Self {
        self.with(|c| c.body_limit = bytes)
    }

    /// The largest response body stored for replay (default 1 MiB). A larger one
    /// is streamed to the client and recorded as "not retained"; its replay carries
    /// status and headers only, with `Idempotency-Response: not-retained`. It never
    /// makes the handler run again.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_response_limit(256 * 1024);
    /// ```
    pub fn with_response_limit(self, bytes: usize) -> Self {
        self.with(|c| c.response_limit = bytes)
    }

    /// How long a claim holds the operation before another request may take it
    /// over (default 30 s). Renewed every third of it while the handler runs, so
    /// only a dead or stuck holder loses it.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_lease(std::time::Duration::from_secs(10));
    /// ```
    pub fn with_lease(self, lease: Duration) -> Self {
        self.with(|c| c.lease = lease.max(Duration::from_millis(10)))
    }

    /// How long a completed record is kept (default 24 h). After it, the key is new.
    /// Keep it much longer than the lease.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_ttl(std::time::Duration::from_secs(48 * 3600));
    /// ```
    pub fn with_ttl(self, ttl: Duration) -> Self {
        self.with(|c| c.ttl = ttl)
    }

    /// Wait mode: a duplicate of a running request waits up to `max` for it, then
    /// gets its replay (or runs, if it was released). A wait that times out answers
    /// the usual 409; a zero `max` answers it at once. Waiters wake the moment the
    /// outcome is recorded, on this instance or another: each store announces it
    /// (see [`Store::wait_for_change`](idemgate_core::Store::wait_for_change)),
    /// and a waiter looks again at least every second in case an announcement
    /// was lost. The binary's default is [`DEFAULT_WAIT`]; the library's stays
    /// 409 at once unless this is called.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_wait(std::time::Duration::from_secs(5));
    /// ```
    pub fn with_wait(self, max: Duration) -> Self {
        self.with(|c| {
            c.wait = Some(WaitMode {
                max,
                recheck: crate::waiting::RECHECK,
            })
        })
    }

    /// The one-transaction mode (PROTOCOL §23), for a route whose every effect
    /// is in the store's own database: the claim is the first statement of the
    /// handler's transaction and the completion its last — one commit instead
    /// of two, and no claim left behind by a crash or a rollback. The handler
    /// takes that transaction with its store's `Tx` extractor
    /// (`idemgate_postgres::Tx`, `idemgate_sqlite::Tx`), which continues it
    /// instead of beginning one.
    ///
    /// A duplicate that comes while the first runs waits for its transaction
    /// (on the record's unique index in PostgreSQL, for the one writer in
    /// SQLite), then replays its outcome; in PostgreSQL the wait is bounded by
    /// the route's [`wait`](IdempotencyLayer::with_wait), or else by the store
    /// timeout, past which it gets the usual 409. A handler whose
    /// transaction rolls back (a 5xx, a panic, a released outcome) leaves no
    /// record: nothing it did committed, so a retry runs it again. The lease is
    /// not renewed: no one else can see, let alone take over, an uncommitted
    /// claim.
    ///
    /// Keep the two-phase claim (the default) for a handler with an effect
    /// outside the database, a payment gateway call: its claim must be
    /// committed before the call, or a crash after it would let a retry call
    /// again.
    ///
    /// Refused, with [`OneTransactionUnsupported`], on a store that cannot claim
    /// inside the handler's transaction (memory, Redis): there the handler
    /// could never share one with the claim.
    ///
    /// ```
    /// # fn layer(store: idemgate::MemoryStore) {
    /// let refused = idemgate::IdempotencyLayer::new(store).with_one_transaction();
    /// assert!(refused.is_err());
    /// # }
    /// ```
    pub fn with_one_transaction(self) -> Result<Self, OneTransactionUnsupported> {
        if !self.config.store.supports_one_transaction() {
            return Err(OneTransactionUnsupported);
        }
        Ok(self.with(|c| c.one_transaction = true))
    }

    /// What happens to an unmarked 5xx or a panic: stored as `FAILED` (default)
    /// or released.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_server_error_policy(idemgate::ServerErrorPolicy::Release);
    /// ```
    pub fn with_server_error_policy(self, policy: ServerErrorPolicy) -> Self {
        self.with(|c| c.server_error_policy = policy)
    }

    /// The gRPC statuses that release a call's claim, so that the retry runs
    /// it (default [`GrpcCode::RELEASED_BY_DEFAULT`]: `UNAVAILABLE`,
    /// `RESOURCE_EXHAUSTED`). `OK` and the other deterministic statuses are
    /// stored and replayed; `UNKNOWN`, `INTERNAL`, `DATA_LOSS`, `CANCELLED`
    /// and `DEADLINE_EXCEEDED` (which may come after the work was done) follow
    /// the server-error policy (PROTOCOL §22).
    ///
    /// ```
    /// use idemgate::GrpcCode;
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_grpc_released([GrpcCode::Unavailable, GrpcCode::Aborted]);
    /// ```
    pub fn with_grpc_released(self, codes: impl IntoIterator<Item = GrpcCode>) -> Self {
        let codes: Vec<GrpcCode> = codes.into_iter().collect();
        self.with(|c| c.grpc_released = codes)
    }

    /// How to find the principal; see [`PrincipalExtractor`] and
    /// [`DefaultPrincipal`].
    ///
    /// ```
    /// use idemgate::principal::DefaultPrincipal;
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_principal(DefaultPrincipal::with_authorization_secret(b"a stable secret"));
    /// ```
    pub fn with_principal(self, extractor: impl PrincipalExtractor) -> Self {
        let extractor: Arc<dyn PrincipalExtractor> = Arc::new(extractor);
        self.with(|c| c.principal = extractor)
    }

    /// Scope by axum's matched route template instead of the request path.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_path_source(idemgate::PathSource::RouteTemplate);
    /// ```
    pub fn with_path_source(self, source: PathSource) -> Self {
        self.with(|c| c.path_source = source)
    }

    /// Let spellings of a path that your router takes as one route share one scope:
    /// ASCII case, a format suffix (see [`PathFold`]). A key sent to `/Orders`
    /// then names the same operation as on `/orders`; the fingerprint still sees
    /// the path as sent, so the second spelling is a `422`, never a second run.
    /// Only with [`PathSource::Request`] (a route template is one spelling).
    ///
    /// ```
    /// use idemgate::path::PathFold;
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_path_fold(PathFold::NONE.with_case_insensitive(true));
    /// ```
    pub fn with_path_fold(self, fold: PathFold) -> Self {
        self.with(|c| c.path_fold = fold)
    }

    /// Request headers that join the fingerprint (a tenant header, say), so the
    /// same body with another value is a 422.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_fingerprint_headers([http::HeaderName::from_static("x-account")]);
    /// ```
    pub fn with_fingerprint_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names = names.into_iter().collect();
        self.with(|c| c.fingerprint_headers = names)
    }

    /// Which part of a JSON body the fingerprint covers (default: all of it): only
    /// the values at some JSON pointers, or all but some, so a volatile field a
    /// client changes on every retry (a timestamp, a trace id) is not a 422. A
    /// body that is not JSON is fingerprinted whole. See [`BodySelection`].
    ///
    /// ```
    /// use idemgate::fingerprint::BodySelection;
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_fingerprint_body(BodySelection::Except(vec!["/sent_at".parse().unwrap()]));
    /// ```
    pub fn with_fingerprint_body(self, selection: BodySelection) -> Self {
        self.with(|c| c.fingerprint_body = selection)
    }

    /// Store and replay `Set-Cookie` headers (off by default: replaying a session
    /// cookie to whoever holds the key is rarely what you want).
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_replayed_set_cookie(true);
    /// ```
    pub fn with_replayed_set_cookie(self, replay: bool) -> Self {
        self.with(|c| {
            c.replayed_headers = std::mem::take(&mut c.replayed_headers).with_set_cookie(replay)
        })
    }

    /// Also store and replay these response headers (an application's
    /// `X-Order-Ref`, say), beyond [`ReplayedHeaders::defaults`] — what a replay
    /// needs; `Date`, `Server`, request ids and rate-limit counters are per
    /// response and not stored. Replaces what was configured, `Set-Cookie`
    /// included.
    ///
    /// ```
    /// use idemgate::ReplayedHeaders;
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_replayed_headers(
    ///     ReplayedHeaders::default().with_names([http::HeaderName::from_static("x-order-ref")]),
    /// );
    /// ```
    pub fn with_replayed_headers(self, replayed: ReplayedHeaders) -> Self {
        self.with(|c| c.replayed_headers = replayed)
    }

    /// Also store and replay these response headers on top of what is
    /// configured (a proxy route's own, say); see
    /// [`IdempotencyLayer::with_replayed_headers`].
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_replayed_header_names([http::HeaderName::from_static("x-order-ref")]);
    /// ```
    pub fn with_replayed_header_names(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.with(|c| {
            c.replayed_headers = std::mem::take(&mut c.replayed_headers).with_names(names)
        })
    }

    /// Stored response bodies larger than `bytes` (default 1 KiB) are kept
    /// zstd-compressed on whatever store, and decompressed for their replays;
    /// `usize::MAX` stores every body as it is. Records stored either way replay.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_compression_threshold(4096);
    /// ```
    pub fn with_compression_threshold(self, bytes: usize) -> Self {
        self.with(|c| c.compression_threshold = bytes)
    }

    /// The most keyed requests running at once (default 1024); beyond it, 503
    /// before any claim.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_max_in_flight(256);
    /// ```
    pub fn with_max_in_flight(self, max: usize) -> Self {
        // Only the limit is replaced: the task tracker stays, so a handle taken
        // from `detached_tasks` before this call still sees every handler.
        let limit = InFlightLimit::new(max);
        self.with(|c| c.in_flight_limit = limit)
    }

    /// The longest one store operation may take (default 2 s). A store that does
    /// not answer in time — frozen, partitioned, out of connections — counts as
    /// unavailable: the request gets 503 with `Retry-After` and its handler does not
    /// run; writes after the handler are retried while the lease holds. Keep it well
    /// under your clients' timeout and above the store's worst healthy latency.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_store_timeout(std::time::Duration::from_millis(500));
    /// ```
    pub fn with_store_timeout(self, timeout: Duration) -> Self {
        self.with(|c| c.store = Arc::new(c.store.with_timeout(timeout)))
    }

    /// The `Retry-After` sent with 503s for store failures (default 1 s): the store
    /// unreachable or full, or a handler's transaction that did not commit, keyed
    /// or not.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_unavailable_retry_after(std::time::Duration::from_secs(5));
    /// ```
    pub fn with_unavailable_retry_after(self, after: Duration) -> Self {
        self.with(|c| c.unavailable_retry_after = after)
    }

    /// The `Retry-After` sent when the layer is busy (default 1 s): the 503 for too
    /// many keyed requests in flight, and a 409 whose record does not say how long
    /// its lease has left. A 409 for a running request otherwise says the time the
    /// route's execution history (kept in the store, shared by every instance)
    /// suggests it still needs, or the seconds left on its lease when no
    /// instance has recorded the route yet, always within [1, 60] s
    /// ([`idemgate_core::estimate::retry_after`]).
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_busy_retry_after(std::time::Duration::from_secs(2));
    /// ```
    pub fn with_busy_retry_after(self, after: Duration) -> Self {
        self.with(|c| c.busy_retry_after = after)
    }

    /// The base of every idemgate problem `type` URI (default
    /// [`crate::problem::PROBLEM_BASE`], `/problems/`, which claims no domain),
    /// so types point at the operator's own documentation of the slugs in
    /// `docs/problems.md`. Applies to the layer's problems and to the
    /// [`crate::ProblemDetails`] its handler answers, before they are stored.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_problem_type_base("https://docs.example.com/errors/");
    /// ```
    pub fn with_problem_type_base(self, base: impl Into<String>) -> Self {
        let base = base.into();
        self.with(|c| c.problem_style = c.problem_style.clone().with_base(base))
    }

    /// Send `Link: <type URI>; rel="describedby"` with every problem (off by
    /// default), for clients that follow links to documentation.
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_problem_link(true);
    /// ```
    pub fn with_problem_link(self, link: bool) -> Self {
        self.with(|c| c.problem_style = c.problem_style.clone().with_link(link))
    }

    /// The problems' body shape: RFC 9457 (default) or Stripe's error object,
    /// so Stripe-shaped SDKs raise their idempotency error; see [`ProblemShape`].
    ///
    /// ```
    /// # let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new());
    /// let layer = layer.with_problem_shape(idemgate::problem::ProblemShape::Stripe);
    /// ```
    pub fn with_problem_shape(self, shape: ProblemShape) -> Self {
        self.with(|c| c.problem_style = c.problem_style.clone().with_shape(shape))
    }

    /// How this layer sends problems, for problems answered outside it
    /// ([`crate::problem::ProblemStyleLayer`]) to look the same.
    pub fn problem_style(&self) -> &ProblemStyle {
        &self.config.problem_style
    }

    /// The handle on detached handler tasks, for graceful shutdown and gauges. It
    /// may be taken at any point of the builder chain: the layer built from it, and
    /// its clones, spawn their handlers on the same tracker.
    pub fn detached_tasks(&self) -> DetachedTasks {
        self.config.tasks.clone()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        // The settings of requests keyed otherwise than by the route's own
        // strategy, derived once here rather than copied from the config at
        // every such request.
        let content = self.config.dedup.as_ref().map(|dedup| {
            Arc::new(Config {
                ttl: dedup.window(),
                fingerprint_body: dedup.selection(),
                strategy: "content",
                ..(*self.config).clone()
            })
        });
        // A route whose own key is not the header: a header-keyed request is
        // enforced and counted as `header`, in either mode. A header route
        // observing content dedup: its header-keyed requests are enforced.
        let has_another_strategy = !self.config.key_source.is_standard_header()
            || (self.config.mode == StrategyMode::Observe && self.config.dedup.is_some());
        let enforced_header = has_another_strategy.then(|| {
            Arc::new(Config {
                mode: StrategyMode::Enforce,
                strategy: "header",
                ..(*self.config).clone()
            })
        });
        let variants = Variants {
            content,
            enforced_header,
        };
        Idempotency::new(inner, Arc::clone(&self.config), Arc::new(variants))
    }
}
