//! Keys and retries for tonic clients (feature `tonic`; PROTOCOL §22): the
//! `idempotency-key` metadata on every unary call, one key per logical call,
//! kept across its retries.
//!
//! - [`IdempotencyKeys`], an interceptor for a generated client
//!   (`OrdersClient::with_interceptor(channel, IdempotencyKeys)`), gives a
//!   call without a key a fresh one. A retry below it — a tower retry layer on
//!   the channel — re-sends the request it built, key included.
//! - [`call`] is the retry loop for an [`Operation`]: every attempt carries
//!   the operation's key (the interceptor leaves a key in place), `ABORTED`
//!   is retried after the server's `grpc-retry-pushback-ms`, `UNAVAILABLE`,
//!   `DEADLINE_EXCEEDED`, `INTERNAL` and `UNKNOWN` with backoff (the attempt
//!   may have run; the key makes the server run it at most once), everything
//!   else — and any replayed outcome — is final.
//!
//! ```no_run
//! use idemgate_client::{Operation, RetryPolicy, grpc};
//!
//! # async fn pay() -> Result<(), tonic::Status> {
//! # let message = ();
//! # let send = |request: tonic::Request<()>| async move { Ok::<_, tonic::Status>(tonic::Response::new(())) };
//! let pay = Operation::new(); // when the user clicks "Pay"
//! // `send` is the generated method: |request| client.clone().create_order(request)
//! let order = grpc::call(&RetryPolicy::default(), &pay, message, send).await?;
//! # Ok(()) }
//! ```

use std::future::Future;

use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::{Code, Request, Response, Status};

use crate::Operation;
use crate::policy::{RetryPolicy, Schedule, Verdict};

/// The metadata the key travels in.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// A tonic interceptor that gives every call without an `idempotency-key` a
/// fresh one (a UUID v4); a call that carries one keeps it.
#[derive(Debug, Clone, Copy, Default)]
pub struct IdempotencyKeys;

impl tonic::service::Interceptor for IdempotencyKeys {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if !request.metadata().contains_key(IDEMPOTENCY_KEY) {
            let key = Operation::new();
            request
                .metadata_mut()
                .insert(IDEMPOTENCY_KEY, ascii(key.key()));
        }
        Ok(request)
    }
}

/// `message` as a request carrying `operation`'s key.
pub fn keyed<T>(operation: &Operation, message: T) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert(IDEMPOTENCY_KEY, ascii(operation.key()));
    request
}

/// Calls `send` with `message` under `operation`'s key until the outcome is
/// final, as `policy` allows (its retries, backoff, pushback cap, attempt
/// timeout and deadline): the module's rules say which statuses are retried.
pub async fn call<T, R, F, Fut>(
    policy: &RetryPolicy,
    operation: &Operation,
    message: T,
    mut send: F,
) -> Result<Response<R>, Status>
where
    T: Clone,
    F: FnMut(Request<T>) -> Fut,
    Fut: Future<Output = Result<Response<R>, Status>>,
{
    let schedule = Schedule::start(policy);
    let mut made = 0;
    loop {
        let mut request = keyed(operation, message.clone());
        request.set_timeout(schedule.attempt_timeout());
        made += 1;
        let outcome = send(request).await;
        let verdict = match &outcome {
            Ok(_) => Verdict::Final,
            Err(status) => judge(status),
        };
        match schedule.wait_for(made, verdict) {
            Some(wait) => tokio::time::sleep(wait).await,
            None => return outcome,
        }
    }
}

/// What a failed call's status asks for.
fn judge(status: &Status) -> Verdict {
    if replayed(status.metadata()) {
        return Verdict::Final;
    }
    match status.code() {
        // Another attempt of this operation is running: come back when told.
        Code::Aborted => match pushback(status.metadata()) {
            Some(after) => Verdict::Retry { after: Some(after) },
            None => Verdict::Final,
        },
        // Not reached, or no complete answer: it may have run, and the key
        // makes running it again safe.
        Code::Unavailable | Code::DeadlineExceeded | Code::Internal | Code::Unknown => {
            Verdict::Retry {
                after: pushback(status.metadata()),
            }
        }
        _ => Verdict::Final,
    }
}

/// Whether the answer is a stored outcome replayed: final, whatever it says.
fn replayed(metadata: &MetadataMap) -> bool {
    metadata
        .get("idempotent-replayed")
        .is_some_and(|value| value == "true")
}

/// `grpc-retry-pushback-ms` (gRFC A6).
fn pushback(metadata: &MetadataMap) -> Option<std::time::Duration> {
    let millis = metadata.get("grpc-retry-pushback-ms")?.to_str().ok()?;
    millis.parse().ok().map(std::time::Duration::from_millis)
}

fn ascii(key: &str) -> AsciiMetadataValue {
    // An `Operation`'s key is a UUID or a key `Operation::resume` validated:
    // visible ASCII, which metadata accepts.
    AsciiMetadataValue::try_from(key).expect("an operation's key is visible ASCII")
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tonic::service::Interceptor;

    use super::*;

    #[test]
    fn the_interceptor_keys_a_call_once_and_keeps_a_given_key() {
        let fresh = IdempotencyKeys.call(Request::new(())).unwrap();
        let key = fresh.metadata().get(IDEMPOTENCY_KEY).unwrap().clone();
        let again = IdempotencyKeys.call(fresh).unwrap();
        assert_eq!(again.metadata().get(IDEMPOTENCY_KEY), Some(&key));
        let other = IdempotencyKeys.call(Request::new(())).unwrap();
        assert_ne!(other.metadata().get(IDEMPOTENCY_KEY), Some(&key));
    }

    /// The keys a scripted server saw, attempt by attempt.
    type Seen = Arc<Mutex<Vec<String>>>;

    /// One attempt's answer, at once.
    type Answered = std::future::Ready<Result<Response<u32>, Status>>;

    /// A server that answers the scripted statuses in turn, then `OK`,
    /// recording the key of every attempt.
    fn server(script: Vec<Status>) -> (Seen, impl FnMut(Request<u32>) -> Answered) {
        let keys = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&keys);
        let mut script = script.into_iter();
        let send = move |request: Request<u32>| {
            let key = request.metadata().get(IDEMPOTENCY_KEY).unwrap();
            seen.lock().unwrap().push(key.to_str().unwrap().to_owned());
            std::future::ready(match script.next() {
                Some(status) => Err(status),
                None => Ok(Response::new(request.into_inner() * 2)),
            })
        };
        (keys, send)
    }

    fn aborted(pushback_ms: &str) -> Status {
        let mut metadata = MetadataMap::new();
        metadata.insert("grpc-retry-pushback-ms", pushback_ms.parse().unwrap());
        Status::with_metadata(Code::Aborted, "in progress", metadata)
    }

    #[tokio::test(start_paused = true)]
    async fn every_attempt_carries_the_operation_s_key() {
        let (keys, send) = server(vec![
            Status::unavailable("connection refused"),
            aborted("1500"),
            Status::deadline_exceeded("lost"),
        ]);
        let pay = Operation::new();
        let policy =
            RetryPolicy::default().backoff(Duration::from_millis(10), Duration::from_millis(20));
        let started = tokio::time::Instant::now();
        let answer = call(&policy, &pay, 21, send).await.unwrap();
        assert_eq!(answer.into_inner(), 42);
        let keys = keys.lock().unwrap();
        assert_eq!(keys.len(), 4);
        assert!(keys.iter().all(|key| key == pay.key()));
        // The pushback was honoured: at least 1.5 s of the wait.
        assert!(started.elapsed() >= Duration::from_millis(1500));
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_and_replays_are_final() {
        let (keys, send) = server(vec![Status::failed_precondition("key reused")]);
        let refused = call(&RetryPolicy::default(), &Operation::new(), 1, send)
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition);
        assert_eq!(keys.lock().unwrap().len(), 1);

        let mut metadata = MetadataMap::new();
        metadata.insert("idempotent-replayed", "true".parse().unwrap());
        let stored = Status::with_metadata(Code::Internal, "stored failure", metadata);
        let (keys, send) = server(vec![stored]);
        let replayed = call(&RetryPolicy::default(), &Operation::new(), 1, send)
            .await
            .unwrap_err();
        assert_eq!(replayed.code(), Code::Internal);
        assert_eq!(keys.lock().unwrap().len(), 1, "a replayed outcome is final");
    }
}
