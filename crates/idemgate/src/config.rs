//! What the layer is configured with: the settings every request reads.
//!
//! [`crate::IdempotencyLayer`] builds a [`Config`]; the request path
//! (`service`, `execution`) only reads it, so they depend on this module and not on
//! the builder.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};

use idemgate_core::deadline::WithDeadline;
use idemgate_core::fingerprint::BodySelection;
use idemgate_core::key::{ContentDedup, KeySource};
use idemgate_core::path::PathFold;

use crate::durations::RouteDurations;
use crate::finality::ServerErrorPolicy;
use crate::principal::PrincipalExtractor;
use crate::problem::ProblemStyle;
use crate::response::ReplayedHeaders;
use crate::tasks::{DetachedTasks, InFlightLimit};
use crate::webhook::Webhook;

/// Which path names the scope and the fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PathSource {
    /// The normalized original request path (the full path, even under a nested
    /// router). The default.
    #[default]
    Request,
    /// axum's matched route template (`/orders/{id}`), so every id shares one scope.
    RouteTemplate,
}

/// Whether a key strategy decides (the default) or only measures (PROTOCOL §16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum StrategyMode {
    /// Claim, replay, 409, 422: the protocol.
    #[default]
    Enforce,
    /// Every request runs as if the strategy were off and gets its own answer;
    /// what the strategy would have done is recorded and counted in
    /// `idemgate_duplicates_total{strategy, action}`, so an operator measures
    /// duplicates before enforcing.
    Observe,
}

/// What observe mode keeps of an observed first run (PROTOCOL §16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[non_exhaustive]
pub enum ObservedResponses {
    /// Its outcome only (status and finality), under a name of its own
    /// ([`idemgate_core::scope::Identity::observed`]) that enforcement never
    /// reads: after a switch to enforce, a retry of an observed operation runs
    /// as a new one. The default: observing costs a claim and a small record
    /// per operation, not a stored response.
    #[default]
    Discard,
    /// The whole response, under the name enforcement reads, as enforcement
    /// would store it: after a switch to enforce, a retry of an observed
    /// operation is replayed whole. Costs what enforcing costs in the store.
    Keep,
}

/// Settings shared by every request the layer sees.
#[derive(Clone)]
pub(crate) struct Config {
    /// The store, every operation bounded by the store timeout
    /// ([`crate::IdempotencyLayer::with_store_timeout`]).
    pub(crate) store: Arc<WithDeadline>,
    pub(crate) methods: Vec<Method>,
    pub(crate) require_key: bool,
    pub(crate) max_key_length: usize,
    /// Where the key is read (PROTOCOL §15); the standard header counts on
    /// every route.
    pub(crate) key_source: KeySource,
    /// The route template the layer serves, when the caller knows it better than
    /// axum's `MatchedPath` (the proxy, which matches routes itself).
    pub(crate) route_template: Option<String>,
    /// Content-based deduplication of keyless requests (PROTOCOL §16).
    pub(crate) dedup: Option<ContentDedup>,
    /// A webhook receiver: the provider's signature verified before the
    /// delivery's own id is claimed ([`crate::webhook`]).
    pub(crate) webhook: Option<Arc<Webhook>>,
    pub(crate) mode: StrategyMode,
    /// What observe mode keeps of a first run.
    pub(crate) observed_responses: ObservedResponses,
    /// The `strategy` label of `idemgate_duplicates_total`: the key source's, or
    /// `content` for a content-keyed request.
    pub(crate) strategy: &'static str,
    pub(crate) body_limit: usize,
    pub(crate) response_limit: usize,
    pub(crate) lease: Duration,
    pub(crate) ttl: Duration,
    pub(crate) wait: Option<WaitMode>,
    /// The one-transaction mode (PROTOCOL §23): the claim is the first
    /// statement of the handler's transaction, not a commit of its own.
    pub(crate) one_transaction: bool,
    pub(crate) server_error_policy: ServerErrorPolicy,
    /// The gRPC statuses whose call is released rather than stored
    /// (PROTOCOL §22).
    pub(crate) grpc_released: Vec<crate::grpc::GrpcCode>,
    pub(crate) principal: Arc<dyn PrincipalExtractor>,
    pub(crate) path_source: PathSource,
    /// Spellings of the request path that share one scope (case, a format
    /// suffix); the fingerprint keeps the path unfolded.
    pub(crate) path_fold: PathFold,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) fingerprint_body: BodySelection,
    /// A JSON-RPC route (PROTOCOL §20): the envelope's `id` is no part of the
    /// fingerprint, replays answer with the retry's `id`, batches are refused.
    pub(crate) jsonrpc: bool,
    /// Which response headers are stored for replays.
    pub(crate) replayed_headers: ReplayedHeaders,
    /// Stored bodies larger than this are kept zstd-compressed
    /// (`idemgate_core::compression`); `usize::MAX`: never.
    pub(crate) compression_threshold: usize,
    /// `Retry-After` of the 503s for store trouble (unavailable, full, a
    /// transaction that did not commit).
    pub(crate) unavailable_retry_after: Duration,
    /// `Retry-After` when the layer itself is busy: the 503 for too many requests
    /// in flight, and a 409 whose record gives no better estimate (the claim kept
    /// losing races, or a fenced completion found no readable record).
    pub(crate) busy_retry_after: Duration,
    pub(crate) in_flight_limit: InFlightLimit,
    /// How the layer's problems, and its handler's, are sent (and stored).
    pub(crate) problem_style: ProblemStyle,
    /// Created once with the layer and never replaced: every handle from
    /// [`IdempotencyLayer::detached_tasks`] tracks the tasks the layer spawns.
    pub(crate) tasks: DetachedTasks,
    /// What this process remembers of the routes' execution histories (kept
    /// in the store), for the 409's `Retry-After`; created once with the layer
    /// and shared by its clones.
    pub(crate) durations: Arc<RouteDurations>,
}

/// How long a duplicate waits for the first request instead of getting 409.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WaitMode {
    pub(crate) max: Duration,
    /// How often a waiter looks even without a notification
    /// ([`crate::waiting::RECHECK`]).
    pub(crate) recheck: Duration,
}

impl Config {
    /// How long a claim in the one-transaction mode waits for a lock its
    /// insert needs — another transaction's uncommitted claim of its key, or a
    /// passing lock on the table (a migration's): the route's wait, or else the
    /// store timeout. Never the two-phase 409 at once: a lock does not tell a
    /// running duplicate from a passing lock, and a short bound would answer
    /// 409 to requests that duplicate nothing.
    pub(crate) fn lock_wait(&self) -> Duration {
        self.wait
            .map(|wait| wait.max)
            .unwrap_or_else(|| self.store.timeout())
    }

    /// The part of a JSON body the fingerprint reads: the configured selection,
    /// and on a JSON-RPC route never the envelope's `id`, which names one
    /// attempt, not the operation (PROTOCOL §20).
    pub(crate) fn fingerprint_selection(&self) -> std::borrow::Cow<'_, BodySelection> {
        use std::borrow::Cow;
        if !self.jsonrpc {
            return Cow::Borrowed(&self.fingerprint_body);
        }
        static ID: std::sync::LazyLock<idemgate_core::fingerprint::JsonPointer> =
            std::sync::LazyLock::new(|| "/id".parse().expect("`/id` is a JSON pointer"));
        match &self.fingerprint_body {
            BodySelection::Whole => Cow::Owned(BodySelection::Except(vec![ID.clone()])),
            BodySelection::Except(pointers) => {
                let mut pointers = pointers.clone();
                pointers.push(ID.clone());
                Cow::Owned(BodySelection::Except(pointers))
            }
            only => Cow::Borrowed(only),
        }
    }
}
