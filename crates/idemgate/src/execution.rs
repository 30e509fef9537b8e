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
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};
use tracing::Instrument;

use idemgate_core::compression::compress;
use idemgate_core::deadline::DeadlineExceeded;
use idemgate_core::record::{FieldList, StoredBody, StoredResponse};
use idemgate_core::stream::encode_head;
use idemgate_core::transaction::{PendingTransaction, SlotContents, TransactionSlot};
use idemgate_core::{
    BoxError, Completion, Decision, FencedWrite, Lease, Store, StoreError, decide,
};

use crate::config::Config;
use crate::context::OperationContext;
use crate::finality::{Finality, Settlement, settlement_for};
use crate::grpc;
use crate::handler::Handler;
use crate::problem::ProblemDetails;
use crate::recording::{Lost, Recorded, Recording};
use crate::response::{ReplayRequest, body_with_trailers, field_list, replay};
use crate::telemetry::{count, count_stream, timed};

/// One claimed operation, from spawn to settled record.
pub(crate) struct Execution {
    config: Arc<Config>,
    lease: Lease,
    /// When this process may stop trusting its lease: the start of the last
    /// successful claim or renewal plus the lease length. Store writes are retried
    /// until then.
    lease_deadline: Arc<Mutex<Instant>>,
    /// The route's key in the store's execution history
    /// (`crate::durations::route_key`): this run's duration joins it.
    route: String,
    /// What the request asks of a replay, for the winner's when our
    /// completion is fenced off.
    wants: ReplayRequest,
    /// The one-transaction mode (PROTOCOL §23): the claim is uncommitted in
    /// the transaction [`Execution::spawn`] offers the handler, until the
    /// completion commits with it; a rollback takes the claim away too.
    one_transaction: bool,
}

/// The handler's answer, its body read up to the stored-response limit.
struct Handled {
    parts: Parts,
    body: CollectedBody,
}

enum CollectedBody {
    /// The whole body, within the limit, and the trailers that followed it.
    Complete { body: Bytes, trailers: FieldList },
    /// Over the limit: the frames read, and the rest, still to stream.
    Overflow { head: Vec<Bytes>, rest: Body },
}

/// The handler's answer, as the run goes on with it.
enum Answered {
    /// Read up to the limit, then settled and answered.
    Read(Handled),
    /// A stream (PROTOCOL §20, [`is_streamed`]): answered at once, then
    /// forwarded and kept as it flows ([`Execution::stream`]).
    Streamed(Response<Body>),
}

/// Where the running task hands its client the answer's head: a streamed
/// answer is handed over before it ends, and the task goes on forwarding it.
type Answer = oneshot::Sender<Response<Body>>;

/// How many frames of a streamed answer may wait for a slow client; past
/// them, the upstream is read no faster than the client reads (its flow
/// control holds the producer). With the kept part of the body (at most the
/// stored-response limit), this bounds a stream's memory.
const STREAM_FRAMES_IN_FLIGHT: usize = 16;

/// The media types of answers a client reads as they come, event by event or
/// record by record: sent without a length, they are streamed through
/// (PROTOCOL §20). Any other answer without a length — a chunked JSON
/// document, which a client can only use whole — is read whole (up to the
/// limit) before it is answered, so that a body that breaks off is answered
/// with a clean problem rather than a cut.
const STREAMED_MEDIA_TYPES: [&str; 3] = [
    "text/event-stream",
    "application/x-ndjson",
    "application/jsonl",
];

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
        wants: ReplayRequest,
    ) -> Self {
        let deadline = claimed_at + config.lease;
        Self {
            config,
            lease,
            lease_deadline: Arc::new(Mutex::new(deadline)),
            route,
            wants,
            one_transaction: false,
        }
    }

    /// Spawns the handler detached from the caller and waits for its answer. If
    /// the caller goes away (the client disconnected), the task still finishes and
    /// settles the record, so the retry replays (PITFALLS 5).
    ///
    /// `claimed_in`: the transaction the claim was made in (the
    /// one-transaction mode), offered to the handler's `Tx`.
    pub(crate) async fn spawn(
        mut self,
        handler: Handler,
        mut request: Request<Body>,
        permit: OwnedSemaphorePermit,
        claimed_in: Option<Box<dyn PendingTransaction>>,
    ) -> Response<Body> {
        let slot = TransactionSlot::new();
        if let Some(transaction) = claimed_in {
            self.one_transaction = true;
            slot.offer(transaction);
        }
        request.extensions_mut().insert(slot.clone());
        request.extensions_mut().insert(OperationContext {
            operation_id: self.lease.operation_id,
            token: self.lease.token,
            origin: self.lease.origin,
        });
        let tasks = self.config.tasks.clone();
        let (answer, answered) = oneshot::channel();
        let task = async move {
            // Held until the record is settled, which for a stream is when
            // it ends, not when its head is answered.
            let _permit = permit;
            let _in_flight = self.config.tasks.enter();
            self.run(handler, request, slot, answer).await;
        };
        let running = tasks.spawn(task.in_current_span());
        match answered.await {
            Ok(response) => response,
            Err(_task_ended_unanswered) => {
                // Only a runtime shutdown can cancel the task: the handler's own
                // panics are caught inside it.
                if let Err(error) = running.await {
                    tracing::error!(%error, "detached handler task did not finish");
                }
                ProblemDetails::handler_failed().into_response()
            }
        }
    }

    async fn run(
        self,
        handler: Handler,
        request: Request<Body>,
        slot: TransactionSlot,
        answer: Answer,
    ) {
        if self.one_transaction {
            // An uncommitted claim is seen by no one, so no one can take it
            // over: there is no lease to renew (and a renewal from another
            // connection would wait for this very transaction).
            return self.handle_and_record(handler, request, slot, answer).await;
        }
        // The lease is renewed while the handler runs and its outcome is
        // written, in this task (no task of its own to spawn and abort per
        // request).
        let renewal = self.renewal();
        tokio::pin!(renewal);
        tokio::select! {
            biased;
            () = self.handle_and_record(handler, request, slot, answer) => {}
            never = &mut renewal => match never {},
        }
    }

    /// Runs the handler, reads its answer up to the stored-response limit (or
    /// streams it through), and settles the record by it.
    async fn handle_and_record(
        &self,
        handler: Handler,
        request: Request<Body>,
        slot: TransactionSlot,
        answer: Answer,
    ) {
        let limit = self.config.response_limit;
        let style = self.config.problem_style.for_request(self.wants.is_grpc());
        let started = Instant::now();
        let handled = async move {
            // The handler's problems in the layer's style before they are
            // stored, so a replay is what the first answer was.
            let response = style.restyle(handler.call(request).await?);
            if is_streamed(&response) {
                return Ok(Answered::Streamed(response));
            }
            collect(response, limit).await.map(Answered::Read)
        };
        let handled = match AssertUnwindSafe(handled).catch_unwind().await {
            Ok(Ok(Answered::Read(handled))) if handled.parts.status.is_informational() => {
                // A 1xx is no final answer: a stored `101` would replay a
                // protocol switch with no connection behind it, and a covered
                // request is never tunnelled past the layer (PITFALLS 29).
                tracing::error!(status = %handled.parts.status, "the handler answered a covered request with an informational status; answered and settled as a failure");
                Err(ProblemDetails::handler_failed())
            }
            Ok(Ok(Answered::Streamed(response))) => {
                return self.stream(response, slot, started, answer).await;
            }
            Ok(Ok(Answered::Read(handled))) => {
                // What a duplicate's 409 estimates from: handlers that answered.
                self.config
                    .durations
                    .record(&self.config.store, &self.route, started.elapsed());
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
        let response = self.record_result(handled, slot.take()).await;
        // A client that went away takes no answer; the record is settled.
        let _ = answer.send(response);
    }

    /// Forwards a streamed answer (PROTOCOL §20) frame by frame as the handler
    /// produces it, recording it in the store in pieces ([`Recording`]) up to
    /// the stored-response limit, and settles the record when it ends. The stream's end reaches
    /// the client only once the record is written, so a client that saw a
    /// clean end holds what a retry will replay; a stream that breaks off is
    /// never a success: it is settled like a failed handler, and the client's
    /// stream is cut (never cleanly ended). A client that leaves does not stop
    /// the operation: the stream is read to its end and recorded.
    async fn stream(
        &self,
        response: Response<Body>,
        slot: TransactionSlot,
        started: Instant,
        answer: Answer,
    ) {
        let (parts, mut body) = response.into_parts();
        let status = parts.status;
        let headers = parts.headers.clone();
        let mark = parts.extensions.get::<Finality>().copied();
        // Recorded in the store as it flows, where retries on any instance
        // join it (PROTOCOL §20, `crate::replaying`); its head before the
        // client gets it, so whoever follows the client finds the stream. In
        // memory when the handler holds a transaction (`crate::recording`).
        let mut recording = if slot.is_in_use() {
            Recording::in_memory(self.config.response_limit)
        } else {
            Recording::start(
                self.config.store.clone(),
                self.lease.clone(),
                encode_head(status, self.config.replayed_headers.storable(&headers)),
                self.config.response_limit,
            )
            .await
        };
        let (frames, mut forwarded) = mpsc::channel(STREAM_FRAMES_IN_FLIGHT);
        let forwarded = futures_util::stream::poll_fn(move |cx| forwarded.poll_recv(cx));
        let head = Response::from_parts(parts, Body::new(StreamBody::new(forwarded)));
        let mut client = answer.send(head).is_ok().then_some(frames);
        let broke_off = loop {
            match body.frame().await {
                None => break None,
                Some(Err(error)) => break Some(BoxError::from(error)),
                Some(Ok(frame)) => {
                    let data = frame.data_ref().cloned();
                    if let Some(sender) = &client
                        && sender.send(Ok::<_, BoxError>(frame)).await.is_err()
                    {
                        // The client left; the operation goes on to its end.
                        client = None;
                    }
                    if let Some(data) = data {
                        recording.push(data).await;
                    }
                }
            }
        };
        let recorded = recording.finish().await;
        let (transaction, kept_transaction) = lent_transaction(slot.take());
        let written = match broke_off {
            None => {
                count_stream("completed");
                self.config
                    .durations
                    .record(&self.config.store, &self.route, started.elapsed());
                if kept_transaction {
                    tracing::error!(
                        "the handler kept its transaction past its streamed response; releasing the operation"
                    );
                    self.release_rolled_back().await;
                    Written::Refused
                } else {
                    let settlement = settlement_for(
                        status,
                        mark,
                        self.config.server_error_policy,
                        transaction.is_some(),
                    );
                    let stored_body = match recorded {
                        Recorded::Pieces(pieces) => StoredBody::InPieces(pieces),
                        Recorded::Whole(body) => StoredBody::Retained(body),
                        Recorded::NotRetained(lost) => {
                            if lost == Lost::OverLimit {
                                count("idemgate_not_retained_total");
                            }
                            StoredBody::NotRetained
                        }
                    };
                    // The trailers of an event stream or NDJSON answer are not
                    // kept: those formats end with their last record.
                    self.settle(
                        settlement,
                        transaction,
                        status,
                        &headers,
                        stored_body,
                        Vec::new(),
                    )
                    .await
                }
            }
            Some(error) => {
                count_stream("cut");
                tracing::error!(%error, "the streamed answer broke off; settled as a failed handler");
                let problem = ProblemDetails::in_chain(error.as_ref())
                    .cloned()
                    .unwrap_or_else(ProblemDetails::handler_failed);
                // The failure is answered to whoever retries; this client,
                // which already has the head, gets the cut below.
                let _ = self
                    .record_failure(problem, transaction, kept_transaction)
                    .await;
                Written::Refused
            }
        };
        match (written, client) {
            // A clean end: the sender drops here, after the record is written.
            (Written::Applied | Written::GaveUp(_), _) | (_, None) => {}
            (Written::Refused | Written::RolledBack(_), Some(sender)) => {
                // What this client already received is not the operation's
                // outcome: cut its stream so it retries and learns it.
                let _ = sender
                    .send(Err(
                        "the streamed answer is not the operation's outcome".into()
                    ))
                    .await;
            }
        }
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
        let (transaction, kept_transaction) = lent_transaction(slot);
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
            self.release_rolled_back().await;
            return ProblemDetails::handler_failed().into_response();
        }
        let mark = handled.parts.extensions.get::<Finality>().copied();
        // A gRPC answer is 200 whatever happened: its outcome is `grpc-status`
        // — unless it is a problem, settled by its HTTP status as for anyone.
        let problem_status = handled.parts.extensions.get::<grpc::ProblemStatus>();
        let (status, mark) = match (&handled.body, problem_status) {
            (_, Some(grpc::ProblemStatus(status))) => (*status, mark),
            (CollectedBody::Complete { trailers, .. }, None)
                if mark.is_none() && grpc::is_grpc(&handled.parts.headers) =>
            {
                let code = grpc::status_of(&handled.parts.headers, trailers);
                grpc::settlement_status(code, &self.config.grpc_released)
            }
            _ => (handled.parts.status, mark),
        };
        let settlement = settlement_for(
            status,
            mark,
            self.config.server_error_policy,
            transaction.is_some(),
        );
        let (response, stored_body, trailers) = match handled.body {
            CollectedBody::Complete { body, trailers } => (
                Response::from_parts(handled.parts, body_with_trailers(body.clone(), &trailers)),
                StoredBody::Retained(body),
                trailers,
            ),
            CollectedBody::Overflow { head, rest } => {
                count("idemgate_not_retained_total");
                (
                    Response::from_parts(handled.parts, chain(head, rest)),
                    StoredBody::NotRetained,
                    Vec::new(),
                )
            }
        };
        self.write_settlement(settlement, transaction, response, stored_body, trailers)
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
        let style = self.config.problem_style.for_request(self.wants.is_grpc());
        let (response, body) = problem.render(&style);
        self.write_settlement(
            settlement,
            transaction,
            response,
            StoredBody::Retained(body),
            Vec::new(),
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
        trailers: FieldList,
    ) -> Response<Body> {
        let written = self
            .settle(
                settlement,
                transaction,
                response.status(),
                response.headers(),
                stored_body,
                trailers,
            )
            .await;
        if !matches!(settlement, Settlement::Complete(_)) {
            // Released or deleted: the answer is the handler's, whatever the
            // store said (a retry runs the operation again either way).
            return response;
        }
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

    /// Writes `settlement` to the record: the answer (`status`, the storable
    /// part of `headers`, `stored_body`, the `trailers` whole — a gRPC call's
    /// outcome is in them) as its outcome, or its release or deletion; in the
    /// handler's transaction when it lent one.
    async fn settle(
        &self,
        settlement: Settlement,
        transaction: Option<Box<dyn PendingTransaction>>,
        status: StatusCode,
        headers: &HeaderMap,
        stored_body: StoredBody,
        trailers: FieldList,
    ) -> Written {
        let store = &self.config.store;
        let final_status = match settlement {
            Settlement::Complete(final_status) => final_status,
            Settlement::Release | Settlement::Delete => {
                if let Some(transaction) = transaction
                    && let Err(error) = transaction.rollback().await
                {
                    tracing::warn!(%error, "rolling back the handler's transaction failed; the database rolls it back on disconnect");
                }
                let written = if settlement == Settlement::Release || self.one_transaction {
                    self.release_rolled_back().await
                } else {
                    self.write_with_retry("delete", || store.delete(&self.lease))
                        .await
                };
                if let Written::GaveUp(error) = &written {
                    tracing::error!(%error, "could not release the record; a retry takes it over once the lease lapses");
                }
                return written;
            }
        };
        let completion = Completion {
            status: final_status,
            // Stored small: a body over the threshold is kept compressed, by
            // the one codec every store shares; and detached from the buffers
            // it was read into (or zstd's slack), which a record kept in
            // memory would pin.
            response: compress(
                StoredResponse {
                    trailers,
                    status,
                    headers: match grpc::is_trailers_only(headers) {
                        // Its headers are the call's status and metadata.
                        true => crate::response::trailers_only_fields(headers),
                        false => self.config.replayed_headers.storable(headers),
                    },
                    body: stored_body,
                },
                self.config.compression_threshold,
            )
            .detached(),
            ttl: self.config.ttl,
        };
        match transaction {
            Some(transaction) => self.commit_with_completion(transaction, &completion).await,
            None => {
                self.write_with_retry("complete", || store.complete(&self.lease, &completion))
                    .await
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
        // The journal's `executed` entry commits in the same transaction.
        let journal = self
            .config
            .store
            .transaction_journal_entries(&self.lease, completion)
            .await;
        let commit = tokio::time::timeout(
            timeout,
            timed(
                "commit",
                transaction.complete_and_commit(&self.lease, completion, &journal),
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
                    if self.one_transaction {
                        self.config.store.rolled_back_in_transaction(&self.lease);
                    } else {
                        let _ = self.config.store.release(&self.lease).await;
                    }
                    Written::RolledBack(error)
                }
            }
        }
    }

    /// Releases the record after the handler's transaction rolled back (or
    /// will, when the handler drops what it kept). In the one-transaction mode
    /// the claim was in that transaction: it is gone with it, and there is
    /// nothing to write.
    async fn release_rolled_back(&self) -> Written {
        if self.one_transaction {
            self.config.store.rolled_back_in_transaction(&self.lease);
            return Written::Applied;
        }
        self.write_with_retry("release", || self.config.store.release(&self.lease))
            .await
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
            Decision::Replay(stored) => replay(stored, &self.wants),
            Decision::InProgress { retry_after } => {
                let hint = self
                    .config
                    .durations
                    .in_progress_hint(
                        self.config.store.as_ref(),
                        &self.route,
                        &snapshot,
                        retry_after,
                    )
                    .await;
                ProblemDetails::in_progress(hint).into_response()
            }
            Decision::Mismatch | Decision::Claimable => {
                ProblemDetails::in_progress(self.config.busy_retry_after).into_response()
            }
        }
    }
}

/// What the handler lent the run, and whether it still holds it.
fn lent_transaction(slot: SlotContents) -> (Option<Box<dyn PendingTransaction>>, bool) {
    match slot {
        SlotContents::Unused => (None, false),
        SlotContents::Returned(transaction) => (Some(transaction), false),
        SlotContents::StillLent => (None, true),
    }
}

/// Whether an answer is streamed through (PROTOCOL §20): sent without a
/// length, in one of [`STREAMED_MEDIA_TYPES`].
fn is_streamed(response: &Response<Body>) -> bool {
    use http_body::Body as _;
    if response.status().is_informational()
        || response.body().size_hint().exact().is_some()
        || response
            .headers()
            .contains_key(http::header::CONTENT_LENGTH)
    {
        return false;
    }
    response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(is_streamed_media_type)
}

/// Whether `content_type` is one a client reads as it comes, event by event or
/// record by record (`text/event-stream`, `application/x-ndjson`,
/// `application/jsonl`; PROTOCOL §20). Such an answer
/// without a length is streamed through; a compressor in front of it would
/// hold its events back until its buffer fills, so none should encode it.
///
/// ```
/// assert!(idemgate::is_streamed_media_type("text/event-stream; charset=utf-8"));
/// assert!(idemgate::is_streamed_media_type("application/x-ndjson"));
/// assert!(!idemgate::is_streamed_media_type("application/json"));
/// ```
pub fn is_streamed_media_type(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    STREAMED_MEDIA_TYPES
        .iter()
        .any(|streamed| essence.eq_ignore_ascii_case(streamed))
}

/// Reads a response body up to `limit` bytes.
async fn collect(response: Response<Body>, limit: usize) -> Result<Handled, BoxError> {
    let (parts, mut body) = response.into_parts();
    // Frames are kept as they came: a body sent in one frame (the usual case) is
    // stored and sent on without a copy.
    let mut head = Vec::new();
    let mut len = 0;
    let mut trailers = Vec::new();
    while let Some(frame) = body.frame().await {
        let data = match frame?.into_data() {
            Ok(data) => data,
            Err(frame) => {
                // Kept whole, repeats included: a gRPC call's
                // outcome is its trailers (PROTOCOL §22).
                if let Ok(fields) = frame.into_trailers() {
                    trailers.extend(field_list(fields));
                }
                continue;
            }
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
        body: CollectedBody::Complete {
            body: whole,
            trailers,
        },
    })
}

/// The frames already read, then the rest of `body`, as one streaming body.
fn chain(head: Vec<Bytes>, rest: Body) -> Body {
    let head = futures_util::stream::iter(head)
        .map(|data| Ok::<_, BoxError>(http_body::Frame::data(data)));
    let rest = BodyStream::new(rest).map(|frame| frame.map_err(BoxError::from));
    Body::new(StreamBody::new(head.chain(rest)))
}
