//! Metrics (through the `metrics` facade) and outcome names (PROTOCOL §12).
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `idemgate_requests_total` | counter | `outcome` ([`Outcome::as_str`]) |
//! | `idemgate_request_duration_seconds` | histogram | `outcome` (from the request's arrival at the layer to its response, or to the client leaving) |
//! | `idemgate_store_seconds` | histogram | `op`: claim, complete, release, renew, delete, get, commit |
//! | `idemgate_store_errors_total` | counter | `op` |
//! | `idemgate_replay_cache_total` | counter | `result`: hit, miss (claims and reads that asked the [replay cache](crate::cache); a hit made no store round trip and still counts in `idemgate_store_seconds{op="claim"}`) |
//! | `idemgate_duplicates_total` | counter | `strategy` ([`STRATEGIES`]: where the key came from), `action` ([`DUPLICATE_ACTIONS`]: what the strategy did, or in observe mode would have done) |
//! | `idemgate_webhooks_total` | counter | `provider` ([`crate::webhook::Provider::as_str`]), `outcome` ([`crate::webhook::WEBHOOK_OUTCOMES`]): each webhook delivery once |
//! | `idemgate_streams_total` | counter | `result` ([`STREAM_RESULTS`]): each streamed answer (PROTOCOL §20) once, when it ends; each retry that joined one or replayed one from its pieces |
//! | `idemgate_lease_takeovers_total` | counter | — |
//! | `idemgate_fenced_completions_total` | counter | — |
//! | `idemgate_not_retained_total` | counter | — |
//! | `idemgate_renewals_lost_total` | counter | — |
//! | `idemgate_in_flight` | gauge | — (this process's keyed operations running) |
//! | `idemgate_oldest_in_flight_seconds` | gauge | — (age of this process's oldest `PROCESSING` operation) |
//!
//! No metric carries a key, a principal or a path: their cardinality is unbounded.
//!
//! `executed` and `replayed` durations side by side compare a first run (claim,
//! handler, completion) with its repeats (one store read). An exporter that can
//! render histograms with buckets should use [`LATENCY_BUCKETS`]; the `idemgate`
//! binary does.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::Instant;

use metrics::{Counter, Histogram};

/// Histogram bucket bounds in seconds for this workload: a replay from memory
/// takes tens of microseconds, a store round trip about a millisecond, a first
/// run as long as its handler (a payment gateway: up to seconds).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0,
];

/// How a request left the layer. New outcomes may be added: match with a `_` arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran under a claim.
    Executed,
    /// A stored response was replayed.
    Replayed,
    /// 409: the first request still runs.
    Conflict,
    /// 422: the key was used with another request.
    Mismatch,
    /// 400: malformed key.
    InvalidKey,
    /// 400: no key where one is required.
    MissingKey,
    /// 413.
    TooLarge,
    /// 401.
    Unauthenticated,
    /// 503: the store failed or is full; nothing ran.
    StoreUnavailable,
    /// 503: too many keyed requests in flight.
    Overloaded,
    /// No key (or a method the layer does not cover): passed through.
    PassedThrough,
    /// Anything else refused before a claim (an unreadable body, a corrupt record).
    Rejected,
}

impl Outcome {
    /// Every outcome, in declaration order.
    pub const ALL: [Self; 12] = [
        Self::Executed,
        Self::Replayed,
        Self::Conflict,
        Self::Mismatch,
        Self::InvalidKey,
        Self::MissingKey,
        Self::TooLarge,
        Self::Unauthenticated,
        Self::StoreUnavailable,
        Self::Overloaded,
        Self::PassedThrough,
        Self::Rejected,
    ];

    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::Conflict => "conflict",
            Self::Mismatch => "mismatch",
            Self::InvalidKey => "invalid_key",
            Self::MissingKey => "missing_key",
            Self::TooLarge => "too_large",
            Self::Unauthenticated => "unauthenticated",
            Self::StoreUnavailable => "store_unavailable",
            Self::Overloaded => "overloaded",
            Self::PassedThrough => "passed_through",
            Self::Rejected => "rejected",
        }
    }
}

/// The `op` label values of `idemgate_store_seconds` and `idemgate_store_errors_total`.
pub const STORE_OPS: [&str; 7] = [
    "claim", "complete", "release", "renew", "delete", "get", "commit",
];

/// The `strategy` label values of `idemgate_duplicates_total`.
pub const STRATEGIES: [&str; 5] = ["header", "path", "json", "query", "content"];

/// The `action` label values of `idemgate_duplicates_total`: a duplicate
/// replayed, a duplicate of a running request (409), a key reused with another
/// request (422), and — in observe mode only — a new operation recorded.
pub const DUPLICATE_ACTIONS: [&str; 4] = ["replayed", "conflict", "mismatch", "observed"];

/// Counts one `idemgate_duplicates_total`.
pub(crate) fn count_duplicate(strategy: &'static str, action: &'static str) {
    metrics::counter!("idemgate_duplicates_total", "strategy" => strategy, "action" => action)
        .increment(1);
}

/// What happened to streamed answers: `completed` (one ran to its end and its
/// record was written), `cut` (one broke off, and was settled as a failure),
/// `joined` (a retry joined one in flight, on this instance or another
/// sharing the store), `replayed` (a retry got a completed one, read from its
/// pieces in the store).
pub const STREAM_RESULTS: [&str; 4] = ["completed", "cut", "joined", "replayed"];

/// Counts one streamed answer in `idemgate_streams_total`.
pub(crate) fn count_stream(result: &'static str) {
    metrics::counter!("idemgate_streams_total", "result" => result).increment(1);
}

/// Counts one webhook delivery in `idemgate_webhooks_total`.
pub(crate) fn count_webhook(provider: crate::webhook::Provider, outcome: &'static str) {
    metrics::counter!("idemgate_webhooks_total", "provider" => provider.as_str(), "outcome" => outcome)
        .increment(1);
}

/// Describes every metric of the table above and registers each counter (every
/// `outcome`, every `op`) at zero.
///
/// Call it once after installing a recorder. A counter that first appears at 1
/// has no increase Prometheus can see (`rate` needs two samples), so the first
/// store error or fenced completion would go unnoticed by an alert, and a
/// dashboard panel would show "no data" rather than 0.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "idemgate_requests_total",
        "Requests that reached the idempotency layer, by outcome."
    );
    describe_histogram!(
        "idemgate_request_duration_seconds",
        metrics::Unit::Seconds,
        "Time in the idempotency layer until the response, by outcome: executed (first run) vs replayed."
    );
    describe_histogram!(
        "idemgate_store_seconds",
        metrics::Unit::Seconds,
        "Idempotency store calls, by op."
    );
    describe_counter!(
        "idemgate_store_errors_total",
        "Idempotency store calls that failed, by op."
    );
    describe_counter!(
        idemgate_core::cache::REPLAY_CACHE_METRIC,
        "Claims and reads that asked the replay cache, by result: a hit was answered from memory."
    );
    describe_counter!(
        "idemgate_lease_takeovers_total",
        "Claims that took over a lapsed lease: an earlier run may have died mid-way."
    );
    describe_counter!(
        "idemgate_fenced_completions_total",
        "Completions refused because another holder had taken the lease over."
    );
    describe_counter!(
        "idemgate_not_retained_total",
        "Responses too large to store: completed as not retained."
    );
    describe_counter!(
        "idemgate_renewals_lost_total",
        "Lease renewals refused: the lease was lost while the handler ran."
    );
    describe_gauge!(
        "idemgate_in_flight",
        "Keyed operations this process is running."
    );
    describe_gauge!(
        "idemgate_oldest_in_flight_seconds",
        metrics::Unit::Seconds,
        "Age of this process's oldest running keyed operation (0 when none)."
    );
    for requests in &outcome_metrics().requests {
        requests.absolute(0);
    }
    for op in STORE_OPS {
        metrics::counter!("idemgate_store_errors_total", "op" => op).absolute(0);
    }
    describe_counter!(
        "idemgate_duplicates_total",
        "Duplicates by key strategy and action: replayed, conflict (409), mismatch (422); observed: a new operation seen in observe mode."
    );
    for strategy in STRATEGIES {
        for action in DUPLICATE_ACTIONS {
            metrics::counter!("idemgate_duplicates_total", "strategy" => strategy, "action" => action)
                .absolute(0);
        }
    }
    describe_counter!(
        "idemgate_webhooks_total",
        "Webhook deliveries by provider and outcome: verified (forwarded), bad_signature, stale, duplicate (answered from its record), mismatch (its id with another payload)."
    );
    for provider in crate::webhook::Provider::ALL {
        for outcome in crate::webhook::WEBHOOK_OUTCOMES {
            metrics::counter!("idemgate_webhooks_total", "provider" => provider.as_str(), "outcome" => outcome)
                .absolute(0);
        }
    }
    describe_counter!(
        "idemgate_streams_total",
        "Streamed answers (SSE, NDJSON) by how they ended: completed (recorded), cut (broke off; settled as a failure); joined: retries that joined one in flight."
    );
    for result in STREAM_RESULTS {
        metrics::counter!("idemgate_streams_total", "result" => result).absolute(0);
    }
    for name in [
        "idemgate_lease_takeovers_total",
        "idemgate_fenced_completions_total",
        "idemgate_not_retained_total",
        "idemgate_renewals_lost_total",
    ] {
        metrics::counter!(name).absolute(0);
    }
    metrics::gauge!("idemgate_in_flight").set(0.0);
    metrics::gauge!("idemgate_oldest_in_flight_seconds").set(0.0);
}

tokio::task_local! {
    /// The outcome of the request the current task serves, once known.
    static OUTCOME: Cell<Option<Outcome>>;
}

/// Each outcome's request counter and duration histogram, registered once: with
/// a label, the macros build a key and look it up in the recorder on every
/// call, several allocations per request. They are registered with the
/// recorder installed when [`describe`] runs or, without it, when the first
/// request arrives (an application installs its recorder before it serves).
struct OutcomeMetrics {
    requests: [Counter; Outcome::ALL.len()],
    durations: [Histogram; Outcome::ALL.len()],
}

static OUTCOME_METRICS: OnceLock<OutcomeMetrics> = OnceLock::new();

fn outcome_metrics() -> &'static OutcomeMetrics {
    OUTCOME_METRICS.get_or_init(|| OutcomeMetrics {
        requests: Outcome::ALL
            .map(|o| metrics::counter!("idemgate_requests_total", "outcome" => o.as_str())),
        durations: Outcome::ALL.map(
            |o| metrics::histogram!("idemgate_request_duration_seconds", "outcome" => o.as_str()),
        ),
    })
}

impl Outcome {
    /// Its place in [`Outcome::ALL`].
    const fn index(self) -> usize {
        self as usize
    }
}

pub(crate) fn count_outcome(outcome: Outcome) {
    outcome_metrics().requests[outcome.index()].increment(1);
    tracing::Span::current().record("outcome", outcome.as_str());
    // Outside `timed_request` (nothing to time) there is no slot.
    let _ = OUTCOME.try_with(|slot| slot.set(Some(outcome)));
}

/// Runs one request through the layer and records its duration into
/// `idemgate_request_duration_seconds{outcome}` with the outcome
/// [`count_outcome`] gave it. A request whose client left is recorded too (the
/// guard drops with the future, inside the task-local's scope).
pub(crate) async fn timed_request<T>(request: impl Future<Output = T>) -> T {
    OUTCOME
        .scope(Cell::new(None), async move {
            let _timer = RequestTimer(Instant::now());
            request.await
        })
        .await
}

/// Records the duration when dropped: on completion and on cancellation alike.
struct RequestTimer(Instant);

impl Drop for RequestTimer {
    fn drop(&mut self) {
        if let Ok(Some(outcome)) = OUTCOME.try_with(Cell::get) {
            outcome_metrics().durations[outcome.index()].record(self.0.elapsed().as_secs_f64());
        }
    }
}

pub(crate) fn count(name: &'static str) {
    metrics::counter!(name).increment(1);
}

/// Times one store call into `idemgate_store_seconds{op}` and counts its errors.
pub(crate) async fn timed<T, E>(
    op: &'static str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let start = Instant::now();
    let result = call.await;
    metrics::histogram!("idemgate_store_seconds", "op" => op).record(start.elapsed().as_secs_f64());
    if result.is_err() {
        metrics::counter!("idemgate_store_errors_total", "op" => op).increment(1);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_has_its_own_place_among_the_registered_metrics() {
        for (place, outcome) in Outcome::ALL.into_iter().enumerate() {
            assert_eq!(outcome.index(), place, "{outcome:?}");
        }
    }
}
