//! Running a claimed operation (PROTOCOL §8): detached from the client, with lease
//! renewal, then the record settled by the finality rules under the fence.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::IntoResponse;
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use http::response::Parts;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use idemgate_core::compression::compress;
use idemgate_core::deadline::DeadlineExceeded;
use idemgate_core::record::{StoredBody, StoredResponse};
use idemgate_core::transaction::{PendingTransaction, SlotContents, TransactionSlot};
use idemgate_core::{
    BoxError, Completion, Decision, FencedWrite, Lease, Store, StoreError, decide,
};

use crate::config::Config;
use crate::context::OperationContext;
use crate::finality::{Finality, Settlement, settlement_for};
use crate::handler::Handler;
use crate::problem::ProblemDetails;
use crate::response::replay;
use crate::telemetry::{count, timed};

/// One claimed operation, from spawn to settled record.
pub(crate) struct Execution {
    config: Arc<Config>,
    lease: Lease,
    /// When this process may stop trusting its lease: the start of the last
    /// successful claim or renewal plus the lease length. Store writes are retried
    /// until then.
    lease_deadline: Arc<Mutex<Instant>>,
    /// The route's key in the layer's recent durations
    /// (`crate::durations::route_key`): this run's duration joins them.
    route: String,
    /// The request's `Accept-Encoding`, for the winner's replay when our
    /// completion is fenced off.
    accept_encoding: Option<String>,
}

/// The handler's answer, its body read up to the stored-response limit.
struct Handled {
    parts: Parts,
    body: CollectedBody,
}

enum CollectedBody {
    /// The whole body, within the limit.
    Complete(Bytes),
    /// Over the limit: the frames read, and the rest, still to stream.
    Overflow { head: Vec<Bytes>, rest: Body },
}

/// How a store write after the handler ended.
enum Written {
    Applied,
    Refused,
    /// The store stayed unavailable until the lease ran out.
    GaveUp(StoreError),
    /// The handler's transaction did not commit: its writes are gone, and the
    /// record was released so a retry runs the operation again.
    RolledBack(StoreError),
}

impl Execution {
    pub(crate) fn new(
        config: Arc<Config>,
        lease: Lease,
        claimed_at: Instant,
        route: String,
        accept_encoding: Option<String>,
    ) -> Self {
        let deadline = claimed_at + config.lease;
        Self {
            config,
            lease,
            lease_deadline: Arc::new(Mutex::new(deadline)),
            route,
            accept_encoding,
        }
    }

    /// Spawns the handler detached from the caller and waits for its answer. If
    /// the caller goes away (the client disconnected), the task still finishes and
    /// settles the record, so the retry replays (PITFALLS 5).
    pub(crate) async fn spawn(
        self,
        handler: Handler,
        mut request: Request<Body>,
        permit: OwnedSemaphorePermit,
    ) -> Response<Body> {
        let slot = TransactionSlot::new();
        request.extensions_mut().insert(slot.clone());
        request.extensions_mut().insert(OperationContext {
            operation_id: self.lease.operation_id,
            token: self.lease.token,
            origin: self.lease.origin,
        });
        let tasks = self.config.tasks.clone();
        let task = async move {
            let _permit = permit;
            let _in_flight = self.config.tasks.enter();
            self.run(handler, request, slot).await
        };
        match tasks.spawn(task.in_current_span()).await {
            Ok(response) => response,
            Err(error) => {
                // Only a runtime shutdown can cancel the task: the handler's own
                // panics are caught inside it.
                tracing::error!(%error, "detached handler task did not finish");
                ProblemDetails::handler_failed().into_response()
            }
        }
    }

    async fn run(
        self,
        handler: Handler,
        request: Request<Body>,
        slot: TransactionSlot,
    ) -> Response<Body> {
        // The lease is renewed while the handler runs and its outcome is
        // written, in this task (no task of its own to spawn and abort per
        // request).
        let renewal = self.renewal();
        tokio::pin!(renewal);
        tokio::select! {
            biased;
            response = self.handle_and_record(handler, request, slot) => response,
            never = &mut renewal => match never {},
        }
    }

    /// Runs the handler, reads its answer up to the stored-response limit, and
    /// settles the record by it.
    async fn handle_and_record(
        &self,
        handler: Handler,
        request: Request<Body>,
        slot: TransactionSlot,
    ) -> Response<Body> {
        let limit = self.config.response_limit;
        let style = self.config.problem_style.clone();
        let started = Instant::now();
        let handled = async move {
            // The handler's problems in the layer's style before they are
            // stored, so a replay is what the first answer was.
            let response = style.restyle(handler.call(request).await?);
            collect(response, limit).await
        };
        let handled = match AssertUnwindSafe(handled).catch_unwind().await {
            Ok(Ok(handled)) if handled.parts.status.is_informational() => {
                // A 1xx is no final answer: a stored `101` would replay a
                // protocol switch with no connection behind it, and a covered
                // request is never tunnelled past the layer (PITFALLS 29).
                tracing::error!(status = %handled.parts.status, "the handler answered a covered request with an informational status; answered and settled as a failure");
                Err(ProblemDetails::handler_failed())
            }
            Ok(Ok(handled)) => {
                // What a duplicate's 409 estimates from: handlers that answered.
                self.config.durations.record(&self.route, started.elapsed());
                Ok(handled)
            }
            Ok(Err(error)) => {
                tracing::error!(%error, "handler failed");
                // A body that broke off with a known cause (an upstream that
                // stalled, say) is answered with it rather than a bare 500.
                Err(ProblemDetails::in_chain(error.as_ref())
                    .cloned()
                    .unwrap_or_else(ProblemDetails::handler_failed))
            }
            Err(_) => {
                tracing::error!("handler panicked");
                Err(ProblemDetails::handler_failed())
            }
        };
        self.record_result(handled, slot.take()).await
    }

    /// Renews the lease every third of its length, for as long as it is
    /// polled (it never ends: [`Execution::run`] drops it with the work). A
    /// renewal the store refuses means another holder took over; the handler
    /// keeps running and its completion will be fenced.
    fn renewal(&self) -> impl Future<Output = std::convert::Infallible> + Send + 'static {
        let store = Arc::clone(&self.config.store);
        let lease = self.lease.clone();
        let length = self.config.lease;
        let deadline = Arc::clone(&self.lease_deadline);
        async move {
            let period = length / 3;
            let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let started = Instant::now();
                match timed("renew", store.renew(&lease, length)).await {
                    Ok(FencedWrite::Applied) => {
                        *deadline.lock().unwrap_or_else(PoisonError::into_inner) = started + length;
                    }
                    Ok(FencedWrite::Refused) => {
                        count("idemgate_renewals_lost_total");
                        tracing::warn!("lease lost: another request took the operation over");
                        return std::future::pending().await;
                    }
                    Err(error) => tracing::warn!(%error, "lease renewal failed; retrying"),
                }
            }
        }
        .in_current_span()
    }

    fn lease_deadline(&self) -> Instant {
        *self
            .lease_deadline
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides by PROTOCOL §8 what becomes of the record after the handler's
    /// answer (or failure), writes it, and returns what the client gets.
    async fn record_result(
        &self,
        handled: Result<Handled, ProblemDetails>,
        slot: SlotContents,
    ) -> Response<Body> {
        let (transaction, kept_transaction) = match slot {
            SlotContents::Unused => (None, false),
            SlotContents::Returned(transaction) => (Some(transaction), false),
            SlotContents::StillLent => (None, true),
        };
        let handled = match handled {
            Ok(handled) => handled,
            Err(problem) => {
                return self
                    .record_failure(problem, transaction, kept_transaction)
                    .await;
            }
        };
        if kept_transaction {
            // Its writes roll back when it is finally dropped: the operation did not
            // happen, whatever the handler answered.
            tracing::error!(
                "the handler kept its transaction past its response; releasing the operation"
            );
            self.write_with_retry("release", || self.config.store.release(&self.lease))
                .await;
            return ProblemDetails::handler_failed().into_response();
        }
        let mark = handled.parts.extensions.get::<Finality>().copied();
        let settlement = settlement_for(
            handled.parts.status,
            mark,
            self.config.server_error_policy,
            transaction.is_some(),
        );
        let (response, stored_body) = match handled.body {
            CollectedBody::Complete(bytes) => (
                Response::from_parts(handled.parts, Body::from(bytes.clone())),
                StoredBody::Retained(bytes),
            ),
            CollectedBody::Overflow { head, rest } => {
                count("idemgate_not_retained_total");
                (
                    Response::from_parts(handled.parts, chain(head, rest)),
                    StoredBody::NotRetained,
                )
            }
        };
        self.write_settlement(settlement, transaction, response, stored_body)
            .await
    }

    /// A handler that failed (a panic, an error, a body that broke off, a 1xx):
    /// `problem` answered and settled like an unmarked answer of its status
    /// (a 5xx by the server-error policy, released when the handler's
    /// transaction rolled its effects back).
    async fn record_failure(
        &self,
        problem: ProblemDetails,
        transaction: Option<Box<dyn PendingTransaction>>,
        kept_transaction: bool,
    ) -> Response<Body> {
        let rolled_back = transaction.is_some() || kept_transaction;
        let status =
            StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let settlement = settlement_for(status, None, self.config.server_error_policy, rolled_back);
        let (response, body) = problem.render(&self.config.problem_style);
        self.write_settlement(
            settlement,
            transaction,
            response,
            StoredBody::Retained(body),
        )
        .await
    }

    /// Writes the settlement and returns what the client gets: normally `response`
    /// itself; the winner's outcome when our completion was fenced off.
    async fn write_settlement(
        &self,
        settlement: Settlement,
        transaction: Option<Box<dyn PendingTransaction>>,
        response: Response<Body>,
        stored_body: StoredBody,
    ) -> Response<Body> {
        let store = &self.config.store;
        let status = match settlement {
            Settlement::Complete(status) => status,
            Settlement::Release | Settlement::Delete => {
                if let Some(transaction) = transaction
                    && let Err(error) = transaction.rollback().await
                {
                    tracing::warn!(%error, "rolling back the handler's transaction failed; the database rolls it back on disconnect");
                }
                let written = if settlement == Settlement::Release {
                    self.write_with_retry("release", || store.release(&self.lease))
                        .await
                } else {
                    self.write_with_retry("delete", || store.delete(&self.lease))
                        .await
                };
                if let Written::GaveUp(error) = written {
                    tracing::error!(%error, "could not release the record; a retry takes it over once the lease lapses");
                }
                return response;
            }
        };
        let completion = Completion {
            status,
            // Stored small: a body over the threshold is kept compressed, by
            // the one codec every store shares.
            response: compress(
                StoredResponse {
                    status: response.status(),
                    headers: self.config.replayed_headers.storable(response.headers()),
                    body: stored_body,
                },
                self.config.compression_threshold,
            ),
            ttl: self.config.ttl,
        };
        let written = match transaction {
            Some(transaction) => self.commit_with_completion(transaction, &completion).await,
            None => {
                self.write_with_retry("complete", || store.complete(&self.lease, &completion))
                    .await
            }
        };
        match written {
            Written::Applied => response,
            Written::Refused => self.fenced_outcome().await,
            Written::GaveUp(error) => {
                tracing::error!(%error, "could not store the response; the client gets it, and a retry takes the operation over with the same operation id");
                response
            }
            Written::RolledBack(error) => {
                // Answering the handler's success would describe writes that were
                // rolled back: say the operation did not happen, and can be retried.
                tracing::error!(%error, "the handler's transaction did not commit; its writes were rolled back");
                ProblemDetails::store_unavailable(self.config.unavailable_retry_after)
                    .into_response()
            }
        }
    }

    /// Commits the handler's transaction together with the completion. A commit
    /// error is ambiguous (did it land?), so the record decides: completed under
    /// our lease means it did.
    async fn commit_with_completion(
        &self,
        transaction: Box<dyn PendingTransaction>,
        completion: &Completion,
    ) -> Written {
        // Bounded like every store operation: a database that stops answering
        // mid-commit must not hold the client. Timing out leaves the commit as
        // ambiguous as any commit error, and is resolved the same way below.
        let timeout = self.config.store.timeout();
        let commit = tokio::time::timeout(
            timeout,
            timed(
                "commit",
                transaction.complete_and_commit(&self.lease, completion),
            ),
        );
        let committed = commit.await.unwrap_or_else(|_elapsed| {
            Err(StoreError::unavailable(DeadlineExceeded {
                operation: "commit",
                timeout,
            }))
        });
        match committed {
            Ok(FencedWrite::Applied) => {
                self.config
                    .store
                    .completed_in_transaction(&self.lease, completion);
                Written::Applied
            }
            Ok(FencedWrite::Refused) => Written::Refused,
            Err(error) => {
                let landed =
                    self.config
                        .store
                        .get(&self.lease.identity)
                        .await
                        .is_ok_and(|snapshot| {
                            snapshot.is_some_and(|s| {
                                s.record.status().is_final()
                                    && s.record.operation_id == self.lease.operation_id
                                    && s.record.token == self.lease.token
                            })
                        });
                if landed {
                    Written::Applied
                } else {
                    let _ = self.config.store.release(&self.lease).await;
                    Written::RolledBack(error)
                }
            }
        }
    }

    /// Retries a fenced write on store errors while the lease holds.
    async fn write_with_retry<F, Fut>(&self, op: &'static str, write: F) -> Written
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<FencedWrite, StoreError>>,
    {
        let mut backoff = Duration::from_millis(25);
        loop {
            match timed(op, write()).await {
                Ok(FencedWrite::Applied) => return Written::Applied,
                Ok(FencedWrite::Refused) => return Written::Refused,
                Err(error) if Instant::now() + backoff >= self.lease_deadline() => {
                    return Written::GaveUp(error);
                }
                Err(error) => {
                    tracing::warn!(%error, op, "store write failed; retrying while the lease holds");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// Our completion was refused: another request took the operation over. Give
    /// this client the record's current outcome, so every client of one operation
    /// sees one outcome.
    async fn fenced_outcome(&self) -> Response<Body> {
        count("idemgate_fenced_completions_total");
        tracing::warn!(
            "completion fenced off: another run of this operation holds the record; our result is discarded"
        );
        let snapshot = match self.config.store.get(&self.lease.identity).await {
            Ok(Some(snapshot)) if snapshot.record.operation_id == self.lease.operation_id => {
                snapshot
            }
            _ => return ProblemDetails::in_progress(self.config.busy_retry_after).into_response(),
        };
        match decide(&snapshot, &snapshot.record.fingerprint) {
            Decision::Replay(stored) => replay(stored, self.accept_encoding.as_deref()),
            Decision::InProgress { retry_after } => {
                let hint =
                    self.config
                        .durations
                        .in_progress_hint(&self.route, &snapshot, retry_after);
                ProblemDetails::in_progress(hint).into_response()
            }
            Decision::Mismatch | Decision::Claimable => {
                ProblemDetails::in_progress(self.config.busy_retry_after).into_response()
            }
        }
    }
}

/// Reads a response body up to `limit` bytes.
async fn collect(response: Response<Body>, limit: usize) -> Result<Handled, BoxError> {
    let (parts, mut body) = response.into_parts();
    // Frames are kept as they came: a body sent in one frame (the usual case) is
    // stored and sent on without a copy.
    let mut head = Vec::new();
    let mut len = 0;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue; // trailers are not stored
        };
        len += data.len();
        head.push(data);
        if len > limit {
            return Ok(Handled {
                parts,
                body: CollectedBody::Overflow { head, rest: body },
            });
        }
    }
    let whole = match head.len() {
        0 => Bytes::new(),
        1 => head.swap_remove(0),
        _ => head.concat().into(),
    };
    Ok(Handled {
        parts,
        body: CollectedBody::Complete(whole),
    })
}

/// The frames already read, then the rest of `body`, as one streaming body.
fn chain(head: Vec<Bytes>, rest: Body) -> Body {
    let head = futures_util::stream::iter(head)
        .map(|data| Ok::<_, BoxError>(http_body::Frame::data(data)));
    let rest = BodyStream::new(rest).map(|frame| frame.map_err(BoxError::from));
    Body::new(StreamBody::new(head.chain(rest)))
}
