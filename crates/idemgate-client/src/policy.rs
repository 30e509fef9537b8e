//! When to send an attempt again, and how long to wait (PROTOCOL §14).
//!
//! Every surface of this crate ([`Client`](crate::Client) and
//! [`RetryMiddleware`](crate::RetryMiddleware)) drives its attempts through one
//! [`Attempts`] value, so the rules below live here and nowhere else.

use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, StatusCode};
use idemgate_core::key::IDEMPOTENCY_KEY;
use retry_policies::policies::ExponentialBackoff;
use retry_policies::{Jitter, RetryDecision, RetryPolicy as _};

use crate::answer::{is_replayed, retry_after};

/// How many times, for what, and for how long an operation is retried.
///
/// | setting | default | |
/// |---|---|---|
/// | [`max_retries`](Self::max_retries) | 4 | attempts after the first; `0` means exactly one attempt |
/// | [`backoff`](Self::backoff) | 100 ms … 5 s | exponential (×2), full jitter: each wait is uniform in `[0, bound]` |
/// | [`max_retry_after`](Self::max_retry_after) | 10 s | a server's `Retry-After` is honoured up to this |
/// | [`deadline`](Self::deadline) | 30 s | for all attempts and waits together; no attempt starts that cannot finish before it |
/// | [`attempt_timeout`](Self::attempt_timeout) | 10 s | one attempt, from connecting to the last body byte |
///
/// What is retried — a *keyed* request (one sent for an [`Operation`](crate::Operation))
/// or one whose method is idempotent (`GET`, `HEAD`, `PUT`, `DELETE`, `OPTIONS`, `TRACE`):
/// - a transport failure: connection refused or reset, a timeout, a response cut
///   off;
/// - `409` with `Retry-After`: the first attempt is still running on the server;
///   the retry waits `Retry-After` (capped) and then gets its replay;
/// - any `5xx` that is not a replay (no `Idempotent-Replayed: true`), waiting its
///   `Retry-After` when it has one (`503` from a store outage or a shed connection).
///
/// Never retried: `422` (the key was used for another request), every other `4xx`,
/// a replayed `5xx` (the stored outcome of the operation: asking again gives the
/// same answer), and anything `2xx`/`3xx`.
///
/// **A non-idempotent request without a key (`POST`, `PATCH`) is sent exactly once**,
/// whatever the policy: the server cannot tell its retry from a second order, so
/// retrying it is how duplicate charges are made (reqwest-retry's
/// kittycad.rs #1042). It passes through rather than failing, so a client can mix
/// plain calls with operations; give it an [`Operation`](crate::Operation) to make
/// it retryable.
///
/// ```
/// use std::time::Duration;
/// use idemgate_client::RetryPolicy;
///
/// let patient = RetryPolicy::default().max_retries(8).deadline(Duration::from_secs(120));
/// let once = RetryPolicy::default().max_retries(0); // exactly one attempt
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    max_retries: u32,
    min_backoff: Duration,
    max_backoff: Duration,
    max_retry_after: Duration,
    deadline: Duration,
    attempt_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 4,
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            max_retry_after: Duration::from_secs(10),
            deadline: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// Attempts after the first; `0` sends exactly one attempt.
    ///
    /// ```
    /// let once = idemgate_client::RetryPolicy::default().max_retries(0);
    /// ```
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// The backoff bounds: the first retry waits up to `min`, each next one up to
    /// twice as long, never more than `max` (each wait is drawn uniformly from zero
    /// to its bound). A `max` below `min` is taken as `min`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let policy = idemgate_client::RetryPolicy::default()
    ///     .backoff(Duration::from_millis(50), Duration::from_secs(2));
    /// ```
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.min_backoff = min;
        self.max_backoff = max.max(min);
        self
    }

    /// The longest `Retry-After` honoured; a longer one is waited for this long.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let policy = idemgate_client::RetryPolicy::default().max_retry_after(Duration::from_secs(3));
    /// ```
    pub fn max_retry_after(mut self, cap: Duration) -> Self {
        self.max_retry_after = cap;
        self
    }

    /// The time all attempts and the waits between them may take together. When
    /// the next wait would end past it, the last outcome is returned instead.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let policy = idemgate_client::RetryPolicy::default().deadline(Duration::from_secs(5));
    /// ```
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The time one attempt may take (cut to what is left of the deadline).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let policy = idemgate_client::RetryPolicy::default().attempt_timeout(Duration::from_secs(2));
    /// ```
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// The backoff's bounds, `(min, max)`, as [`backoff`](Self::backoff) took them.
    #[cfg(any(test, feature = "case-files"))]
    pub(crate) fn backoff_bounds(&self) -> (Duration, Duration) {
        (self.min_backoff, self.max_backoff)
    }

    fn backoff_policy(&self) -> ExponentialBackoff {
        ExponentialBackoff::builder()
            .retry_bounds(self.min_backoff, self.max_backoff)
            .jitter(Jitter::Full)
            .base(2)
            .build_with_max_retries(self.max_retries)
    }
}

/// What an attempt's outcome asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The outcome of the operation (or of this request): return it.
    Final,
    /// Worth another attempt, after the server's `Retry-After` when it gave one.
    Retry { after: Option<Duration> },
}

/// The response rules of [`RetryPolicy`]'s table, on the status and headers only.
pub(crate) fn judge_response(status: StatusCode, headers: &HeaderMap) -> Verdict {
    if is_replayed(headers) {
        return Verdict::Final;
    }
    let after = retry_after(headers);
    match status {
        StatusCode::CONFLICT if after.is_some() => Verdict::Retry { after },
        status if status.is_server_error() => Verdict::Retry { after },
        _ => Verdict::Final,
    }
}

/// The transport rules: what failed, and whether the request may have reached the
/// server (and so may have run).
pub(crate) fn judge_error(error: &reqwest_middleware::Error) -> (Verdict, bool) {
    let retry = Verdict::Retry { after: None };
    match error {
        // Not even sent: a request that could not be built, or a redirect the
        // client refused to follow (that one was delivered).
        reqwest_middleware::Error::Reqwest(e) if e.is_builder() => (Verdict::Final, false),
        reqwest_middleware::Error::Reqwest(e) if e.is_redirect() => (Verdict::Final, true),
        // No connection, so no byte reached the server.
        reqwest_middleware::Error::Reqwest(e) if e.is_connect() => (retry, false),
        // Sent, and no complete answer: the lost-response case. Safe to repeat
        // because the key makes the server run it at most once.
        reqwest_middleware::Error::Reqwest(_) => (retry, true),
        // Another middleware's own failure (an auth token fetch, say): not ours to
        // repeat, and we cannot know what it sent.
        reqwest_middleware::Error::Middleware(_) => (Verdict::Final, true),
    }
}

/// Whether an answer with this status may come from a run of the operation: a
/// `4xx` is a refusal made before running, except `409`, which says the first
/// attempt runs.
pub(crate) fn may_have_run(status: StatusCode) -> bool {
    !status.is_client_error() || status == StatusCode::CONFLICT
}

/// When the attempts of one operation may be made: the policy's backoff and
/// deadline from the first attempt on — the one schedule of HTTP requests
/// ([`Attempts`]) and gRPC calls (`crate::grpc`).
#[derive(Debug)]
pub(crate) struct Schedule {
    policy: RetryPolicy,
    backoff: ExponentialBackoff,
    started: Instant,
    started_wall: SystemTime,
}

impl Schedule {
    /// From now, under `policy`.
    pub(crate) fn start(policy: &RetryPolicy) -> Self {
        Self {
            policy: policy.clone(),
            backoff: policy.backoff_policy(),
            started: Instant::now(),
            started_wall: SystemTime::now(),
        }
    }

    /// How long the next attempt may take: the attempt timeout, cut to what
    /// is left of the deadline.
    pub(crate) fn attempt_timeout(&self) -> Duration {
        let left = self.policy.deadline.saturating_sub(self.started.elapsed());
        self.policy.attempt_timeout.min(left)
    }

    /// How long to wait, after `made` attempts, before the next one that
    /// `verdict` asks for (`after`, the server's hint, capped; else the
    /// backoff) — or `None` for no next attempt: the verdict is final, the
    /// retries are spent, or it would start at or past the deadline.
    pub(crate) fn wait_for(&self, made: u32, verdict: Verdict) -> Option<Duration> {
        let Verdict::Retry { after } = verdict else {
            return None;
        };
        let RetryDecision::Retry { execute_after } =
            self.backoff.should_retry(self.started_wall, made - 1)
        else {
            return None; // max_retries reached
        };
        let backoff = execute_after
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        let wait = after.map_or(backoff, |after| after.min(self.policy.max_retry_after));
        (self.started.elapsed() + wait < self.policy.deadline).then_some(wait)
    }
}

/// The attempts of one request: counts them, keeps the deadline, waits between
/// them, and remembers whether any may have run on the server.
#[derive(Debug)]
pub(crate) struct Attempts {
    schedule: Schedule,
    retryable: bool,
    made: u32,
    may_have_run: bool,
}

impl Attempts {
    /// Before the first attempt: whether this request may be retried at all, and
    /// the refusal of a keyed or idempotent request whose body cannot be sent twice.
    pub(crate) fn start(
        policy: &RetryPolicy,
        request: &reqwest::Request,
    ) -> Result<Self, crate::Error> {
        // RFC 9110 §9.2.2: repeating an idempotent method has the effect of one.
        let retryable =
            request.headers().contains_key(&IDEMPOTENCY_KEY) || request.method().is_idempotent();
        let replayable = request.body().is_none_or(|body| body.as_bytes().is_some());
        if retryable && !replayable {
            return Err(crate::Error::BodyNotReplayable);
        }
        Ok(Self {
            schedule: Schedule::start(policy),
            retryable,
            made: 0,
            may_have_run: false,
        })
    }

    /// The next attempt: a copy of `pending` (or `pending` itself when it is sent
    /// only once), with its timeout cut to the deadline.
    pub(crate) fn next(&mut self, pending: &mut Option<reqwest::Request>) -> reqwest::Request {
        let mut request = match pending.as_ref().and_then(reqwest::Request::try_clone) {
            Some(copy) if self.retryable => copy,
            _ => pending
                .take()
                .expect("no attempt after a request that is sent once"),
        };
        let timeout = self.schedule.attempt_timeout();
        let timeout = request.timeout().map_or(timeout, |own| timeout.min(*own));
        *request.timeout_mut() = Some(timeout);
        self.made += 1;
        request
    }

    /// After an attempt answered: waits and returns `true` when another attempt
    /// is due, `false` when this answer is the outcome.
    pub(crate) async fn again_after_response(
        &mut self,
        status: StatusCode,
        headers: &HeaderMap,
    ) -> bool {
        self.may_have_run |= may_have_run(status);
        self.again(judge_response(status, headers)).await
    }

    /// After an attempt failed in transport: waits and returns `true` when another
    /// attempt is due.
    pub(crate) async fn again_after_error(&mut self, error: &reqwest_middleware::Error) -> bool {
        let (verdict, delivered) = judge_error(error);
        self.may_have_run |= delivered;
        self.again(verdict).await
    }

    async fn again(&mut self, verdict: Verdict) -> bool {
        match self.wait_for(verdict) {
            Some(wait) => {
                tokio::time::sleep(wait).await;
                true
            }
            None => false,
        }
    }

    /// How long to wait before the next attempt, or `None` for no next attempt.
    pub(crate) fn wait_for(&self, verdict: Verdict) -> Option<Duration> {
        if !self.retryable {
            return None;
        }
        self.schedule.wait_for(self.made, verdict)
    }

    /// Attempts made so far.
    pub(crate) fn made(&self) -> u32 {
        self.made
    }

    /// Whether any attempt may have run the operation on the server.
    pub(crate) fn may_have_run(&self) -> bool {
        self.may_have_run
    }
}

#[cfg(test)]
mod tests {
    //! The rules shared with the other clients are the cases of
    //! `clients/retry-rules.json`, run by `crate::retry_rules`; here only what is
    //! this crate's own.

    use super::*;

    #[test]
    fn a_stream_body_is_refused_before_any_attempt_when_it_could_be_retried() {
        use std::convert::Infallible;
        struct OneChunk(Option<bytes::Bytes>);
        impl http_body::Body for OneChunk {
            type Data = bytes::Bytes;
            type Error = Infallible;
            fn poll_frame(
                mut self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Infallible>>>
            {
                std::task::Poll::Ready(self.0.take().map(|b| Ok(http_body::Frame::data(b))))
            }
        }
        let streaming = |keyed| {
            let mut request = crate::retry_rules::request("POST", keyed);
            *request.body_mut() = Some(reqwest::Body::wrap(OneChunk(Some("{}".into()))));
            request
        };
        let policy = RetryPolicy::default();
        assert!(matches!(
            Attempts::start(&policy, &streaming(true)),
            Err(crate::Error::BodyNotReplayable)
        ));
        // Sent once anyway, so nothing needs replaying.
        assert!(Attempts::start(&policy, &streaming(false)).is_ok());
    }
}
