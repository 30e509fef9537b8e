//! The idempotency protocol (PROTOCOL §5–§9, §11, §14) as a [`stateright::Model`].
//!
//! One key. Each client sends one logical request under it (its body is its
//! fingerprint) and retries it; each attempt reaches one of the layer instances,
//! which serves it as `idemgate::Idempotency` does: claim, [`decide()`] on what the
//! claim found, run the handler (a call to a downstream that dedupes by the
//! operation id, PROTOCOL §11), settle the record under the fence, answer. The
//! store applies each call atomically; its claim and fence are core's own
//! [`Record::claim_origin`] and [`Record::admits_fenced_write`].
//!
//! What is nondeterministic, each as an action the checker tries in every order:
//! which instance an attempt reaches, every step of every request, the clock's
//! tick (a request that does not step while the clock ticks is an instance paused
//! past its lease), lease renewals, and, within [`Faults`]' budget, the faults.

use std::fmt::Write as _;

use bytes::Bytes;
use http::StatusCode;
use idemgate::finality::{self, settlement_for};
use idemgate::{Finality, ServerErrorPolicy};
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::record::{
    FencingToken, LeaseOrigin, OperationId, RECORD_FORMAT_VERSION, Record, RecordState, StoredBody,
    StoredResponse,
};
use idemgate_core::time::Timestamp;
use idemgate_core::{Decision, FinalStatus, Snapshot, decide};
use stateright::{Model, Property};

/// The guards of the protocol the model keeps. Each `false` replaces one use of a
/// real rule by a weakened variant (the real function, asked with what the
/// missing guard would not look at), so the checker can show what the guard is
/// for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guards {
    /// Fenced writes (`complete`, `release`, `renew`) apply only while the
    /// record still holds the writer's operation and token. Off: they are
    /// unconditional updates of whatever record is there (PITFALLS 3).
    pub fencing: bool,
    /// A takeover needs the record's fingerprint. Off: any request with the key
    /// may take over a released or lapsed record.
    pub fingerprint_on_takeover: bool,
    /// A takeover needs the holder's lease to have lapsed. Off: a running
    /// record is taken over at once.
    pub lease_check: bool,
}

impl Guards {
    /// Every guard, as the real stores keep them.
    pub const ALL: Self = Self {
        fencing: true,
        fingerprint_on_takeover: true,
        lease_check: true,
    };
}

/// How much of each fault the checker may inject along one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Faults {
    /// Instance crashes (every request it serves is gone; records stay).
    pub crashes: u8,
    /// Messages lost between a client and an instance (a request that never
    /// arrives, an answer that never returns).
    pub lost_messages: u8,
    /// Store calls whose answer is lost: applied and the answer lost, or lost
    /// before the store saw them. The instance sees a store error.
    pub lost_store_calls: u8,
    /// Duplicated messages: a client's request arriving twice, or a store call
    /// applied once now and once more, later.
    pub duplicates: u8,
    /// Downstream answers that go wrong: the downstream applied the effect but its
    /// answer was lost (the handler answers 504, stored `FAILED`), or it refused
    /// with nothing done (the handler marks it retryable: released).
    pub downstream: u8,
}

impl Faults {
    /// No fault at all.
    pub const NONE: Self = Self {
        crashes: 0,
        lost_messages: 0,
        lost_store_calls: 0,
        duplicates: 0,
        downstream: 0,
    };
}

/// The size of the model.
#[derive(Clone, Debug)]
pub struct Bounds {
    /// One client per entry, with its request body (its fingerprint). Clients
    /// with the same body send the same request: one logical operation.
    pub bodies: Vec<u8>,
    /// Layer instances.
    pub instances: u8,
    /// Attempts each client may make (its first and its retries).
    pub attempts: u8,
    /// The clock stops here.
    pub horizon: u8,
    /// Lease length, in ticks.
    pub lease: u8,
    /// Record TTL, in ticks.
    pub ttl: u8,
    /// The fault budget.
    pub faults: Faults,
}

impl Bounds {
    /// 2 clients sending one request, 2 instances, 1 key, 2 attempts each, a
    /// lease of 2 ticks on a clock of 3 (so a holder can be paused past its
    /// lease, and taken over), with `faults`.
    pub fn small(faults: Faults) -> Self {
        Self {
            bodies: vec![0, 0],
            instances: 2,
            attempts: 2,
            horizon: 3,
            lease: 2,
            ttl: 16,
            faults,
        }
    }

    /// The fault mixes `cargo test` checks exhaustively, one model each: every
    /// pair of faults meets in at least one of them. (All five at once:
    /// [`Bounds::full`].)
    pub fn mixes() -> [(&'static str, Faults); 3] {
        let one = |crashes, lost_messages, lost_store_calls, duplicates, downstream| Faults {
            crashes,
            lost_messages,
            lost_store_calls,
            duplicates,
            downstream,
        };
        [
            (
                "crash, lost message, lost store answer, downstream fault",
                one(1, 1, 1, 0, 1),
            ),
            (
                "crash, lost message, lost store answer, duplicate",
                one(1, 1, 1, 1, 0),
            ),
            (
                "crash, lost message, duplicate, downstream fault",
                one(1, 1, 0, 1, 1),
            ),
        ]
    }

    /// Every fault at once, with 2 attempts (`attempts: 3` for more).
    pub fn full() -> Self {
        Self::small(Faults {
            crashes: 1,
            lost_messages: 1,
            lost_store_calls: 1,
            duplicates: 1,
            downstream: 1,
        })
    }
}

/// The model: its bounds and the guards it keeps.
#[derive(Clone, Debug)]
pub struct ProtocolModel {
    /// The size of the model.
    pub bounds: Bounds,
    /// The guards kept.
    pub guards: Guards,
    /// Whether the answer a client got from a holder whose completion could not
    /// be stored (PROTOCOL §8: the store stayed unavailable until the lease ran
    /// out, so "the client gets the real response" and a later run settles the
    /// record) counts in "one final answer per operation". `false` by default:
    /// the protocol chooses that exception (docs/reliability.md, "What is
    /// model-checked").
    pub strict_outcomes: bool,
}

impl ProtocolModel {
    /// The model with every guard.
    pub fn new(bounds: Bounds) -> Self {
        Self {
            bounds,
            guards: Guards::ALL,
            strict_outcomes: false,
        }
    }

    /// The same model with other guards.
    pub fn with_guards(mut self, guards: Guards) -> Self {
        self.guards = guards;
        self
    }

    /// The same model, counting unstored answers in "one final answer".
    pub fn with_strict_outcomes(mut self) -> Self {
        self.strict_outcomes = true;
        self
    }
}

/// What a handler's run reported: the response a replay gives back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reply {
    /// 201: the downstream charged operation `op` for `body`.
    Created {
        /// The operation charged.
        op: u8,
        /// The request body the charge was made for.
        body: u8,
    },
    /// 504: the downstream's answer was lost; the outcome is unknown.
    GatewayTimeout {
        /// The operation.
        op: u8,
    },
}

/// The record's state, as [`RecordState`] with the model's replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// Claimed until `until`.
    Processing {
        /// End of the lease.
        until: u8,
    },
    /// Released: claimable again by its fingerprint.
    Released,
    /// A final 2xx–4xx stored.
    Completed(Reply),
    /// A 5xx stored under the `store` policy.
    Failed(Reply),
}

/// The one record of the key, small; [`Rec::to_core`] is the real [`Record`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rec {
    /// The body it was claimed for.
    pub body: u8,
    /// Operation id.
    pub op: u8,
    /// Fencing token.
    pub token: u8,
    /// Where it stands.
    pub stage: Stage,
    /// After this tick the record is absent.
    pub expires_at: u8,
}

/// What a client got back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    /// The handler's own response, its completion stored.
    Fresh(Reply),
    /// The handler's own response, its completion not stored: the store stayed
    /// unavailable until the lease ran out (PROTOCOL §8).
    Unstored(Reply),
    /// A replay of the stored response.
    Replay(Reply),
    /// 409: in progress.
    Conflict,
    /// 503: the store failed before anything ran.
    Unavailable,
    /// 503 from the handler: the downstream refused with nothing done; released.
    Declined,
    /// 422: the key was used for another request.
    Mismatch,
}

impl Answer {
    /// Whether a client stops here (PROTOCOL §14): a replay, a non-5xx answer, a
    /// 422. A 409, a 503 and a 5xx that is not a replay are retried.
    pub fn is_final(self) -> bool {
        match self {
            Self::Fresh(reply) | Self::Unstored(reply) => matches!(reply, Reply::Created { .. }),
            Self::Replay(_) | Self::Mismatch => true,
            Self::Conflict | Self::Unavailable | Self::Declined => false,
        }
    }

    /// The reply carried, if any.
    pub fn reply(self) -> Option<Reply> {
        match self {
            Self::Fresh(reply) | Self::Unstored(reply) | Self::Replay(reply) => Some(reply),
            _ => None,
        }
    }
}

/// A client and its logical request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Client {
    /// Its request's body (its fingerprint).
    pub body: u8,
    /// Attempts sent.
    pub sent: u8,
    /// Waiting for the answer to this attempt.
    pub waiting: Option<u8>,
    /// Its final answer, once it has one.
    pub done: Option<Answer>,
}

/// A lease an instance holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Held {
    /// Operation id.
    pub op: u8,
    /// Fencing token.
    pub token: u8,
    /// Until when the instance trusts it (its claim or last renewal + lease).
    pub until: u8,
    /// Still renewing (stops once a renewal is refused).
    pub renewing: bool,
}

/// What the handler's answer does to the record (PROTOCOL §8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Settlement {
    /// `complete` with this reply (a 201 `COMPLETED`, a 504 `FAILED`).
    Complete(Reply),
    /// `release`: the downstream refused with nothing done.
    Release,
}

/// Where a request inside an instance stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// About to call `try_claim`.
    Claim,
    /// Holds the lease; about to call the downstream.
    Run(Held),
    /// About to write the settlement (retried on store errors while the lease holds).
    Settle(Held, Settlement),
    /// About to answer the client.
    Respond(Answer),
}

/// One request being served by an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Task {
    /// The instance serving it.
    pub instance: u8,
    /// The client that sent it.
    pub client: u8,
    /// Which of the client's attempts it is.
    pub attempt: u8,
    /// Where it stands.
    pub phase: Phase,
}

/// A store call duplicated on the way, applied again later; its answer goes
/// nowhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StoreCall {
    /// `try_claim` for a body.
    Claim {
        /// The body.
        body: u8,
    },
    /// A fenced settlement.
    Settle(Held, Settlement),
}

/// A downstream effect: the charge of operation `op` (the downstream key) for `body`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Effect {
    /// The downstream key's operation.
    pub op: u8,
    /// The token of the run that made it.
    pub token: u8,
    /// The body charged.
    pub body: u8,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    /// The clock (the store's; instances share it, PROTOCOL §6.4).
    pub now: u8,
    /// The key's record.
    pub record: Option<Rec>,
    /// Operation ids made so far.
    pub ops: u8,
    /// Fencing tokens made so far.
    pub tokens: u8,
    /// The clients.
    pub clients: Vec<Client>,
    /// The requests inside instances, sorted.
    pub tasks: Vec<Task>,
    /// Duplicated store calls not yet applied.
    pub delayed: Vec<StoreCall>,
    /// The downstream's effects (deduped by operation id).
    pub effects: Vec<Effect>,
    /// Operation ids of every completion the store applied: the commit of an
    /// operation's outcome (in the transactional mode, of its writes too).
    pub completions: Vec<u8>,
    /// A completion was applied for a writer whose token the record no longer held.
    pub fenced_completed: bool,
    /// A claim took over a lease that was still live.
    pub live_lease_taken: bool,
    /// A lease was taken over (a `sometimes` check that the model gets there).
    pub took_over: bool,
    /// A completion was refused by the fence.
    pub fenced_off: bool,
    /// What is left of the fault budget.
    pub faults: Faults,
}

impl State {
    /// The state with clients and instances renamed by `clients[old] = new` and
    /// `instances[old] = new`.
    fn relabel(&self, clients: &[u8], instances: &[u8]) -> Self {
        let mut next = self.clone();
        for (old, client) in self.clients.iter().enumerate() {
            next.clients[usize::from(clients[old])] = *client;
        }
        for task in &mut next.tasks {
            task.client = clients[usize::from(task.client)];
            task.instance = instances[usize::from(task.instance)];
        }
        next.tasks.sort_unstable();
        next
    }

    /// The least of the states equal to this one up to the names of clients and
    /// of instances: instances are interchangeable, and so are clients (each
    /// carries its own body), so the checker needs to see only one of them.
    pub fn representative(&self) -> Self {
        let instances = self.tasks.iter().map(|t| t.instance + 1).max().unwrap_or(0);
        let mut best = self.clone();
        for clients in permutations(self.clients.len()) {
            for instances in permutations(usize::from(instances)) {
                let candidate = self.relabel(&clients, &instances);
                if candidate < best {
                    best = candidate;
                }
            }
        }
        best
    }
}

/// Every ordering of `0..n`.
fn permutations(n: usize) -> Vec<Vec<u8>> {
    let mut all = vec![Vec::new()];
    for k in 0..n as u8 {
        all = all
            .into_iter()
            .flat_map(|p: Vec<u8>| {
                (0..=p.len()).map(move |at| {
                    let mut q = p.clone();
                    q.insert(at, k);
                    q
                })
            })
            .collect();
    }
    all
}

/// A step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// A client sends its next attempt to an instance.
    Send {
        /// The client.
        client: u8,
        /// The instance.
        instance: u8,
    },
    /// Like `Send`, but the request arrives twice.
    SendTwice {
        /// The client.
        client: u8,
        /// The instance.
        instance: u8,
    },
    /// Like `Send`, but the request is lost on the way.
    SendLost {
        /// The client.
        client: u8,
    },
    /// A client stops waiting for its attempt's answer.
    Timeout {
        /// The client.
        client: u8,
    },
    /// A request takes its next step, nothing going wrong.
    Step {
        /// Index into [`State::tasks`].
        task: u8,
    },
    /// A request's store call (claim or settlement) is lost: applied and its
    /// answer lost when `applied`, else lost before the store saw it.
    StoreLost {
        /// Index into [`State::tasks`].
        task: u8,
        /// Whether the store applied it.
        applied: bool,
    },
    /// A request's store call is applied, and its duplicate is applied later.
    StoreTwice {
        /// Index into [`State::tasks`].
        task: u8,
    },
    /// The handler calls the downstream, which charges (or finds the charge of
    /// this operation) and answers.
    Charge {
        /// Index into [`State::tasks`].
        task: u8,
    },
    /// The downstream charges, and its answer is lost: the handler answers 504.
    ChargeAnswerLost {
        /// Index into [`State::tasks`].
        task: u8,
    },
    /// The downstream refuses with nothing charged; the handler marks it retryable.
    Decline {
        /// Index into [`State::tasks`].
        task: u8,
    },
    /// The holder renews its lease.
    Renew {
        /// Index into [`State::tasks`].
        task: u8,
    },
    /// A request's answer to its client is lost.
    AnswerLost {
        /// Index into [`State::tasks`].
        task: u8,
    },
    /// An instance crashes: every request it serves is gone.
    Crash {
        /// The instance.
        instance: u8,
    },
    /// The clock ticks.
    Tick,
    /// A duplicated store call arrives.
    ApplyDelayed {
        /// Index into [`State::delayed`].
        index: u8,
    },
}

/// The record's fingerprint, operation id, token, instants as core types.
fn fingerprint(body: u8) -> Fingerprint {
    Fingerprint::from_bytes([body.wrapping_add(1); 32])
}

fn operation_id(op: u8) -> OperationId {
    OperationId::from_bytes([op.wrapping_add(1); 16])
}

fn at(tick: u8) -> Timestamp {
    Timestamp::from_millis(i64::from(tick))
}

fn stored(reply: Reply) -> StoredResponse {
    let (status, body) = match reply {
        Reply::Created { op, body } => (StatusCode::CREATED, vec![op, body]),
        Reply::GatewayTimeout { op } => (StatusCode::GATEWAY_TIMEOUT, vec![op]),
    };
    StoredResponse {
        trailers: Vec::new(),
        status,
        headers: Vec::new(),
        body: StoredBody::Retained(Bytes::from(body)),
    }
}

/// What the layer does with the handler's answer (PROTOCOL §8), by the layer's
/// own rule (`idemgate::finality::settlement_for`), not a copy: the handler
/// answers `reply` unmarked, or — the downstream refused with nothing done — a
/// 503 marked retryable; the 5xx policy is the default, `store`. A change to the
/// rule that settles these answers otherwise stops the model here.
fn settlement(reply: Option<Reply>) -> Settlement {
    let (status, mark) = match reply {
        Some(reply) => (stored(reply).status, None),
        None => (StatusCode::SERVICE_UNAVAILABLE, Some(Finality::Retryable)),
    };
    match (
        settlement_for(status, mark, ServerErrorPolicy::Store, false),
        reply,
    ) {
        (
            finality::Settlement::Complete(FinalStatus::Completed),
            Some(reply @ Reply::Created { .. }),
        )
        | (
            finality::Settlement::Complete(FinalStatus::Failed),
            Some(reply @ Reply::GatewayTimeout { .. }),
        ) => Settlement::Complete(reply),
        (finality::Settlement::Release, None) => Settlement::Release,
        (other, reply) => {
            unreachable!(
                "PROTOCOL §8 settles {reply:?} as {other:?}, which the model does not follow"
            )
        }
    }
}

/// Reads back a reply the model stored; `None` for a response it never writes.
fn replied(response: &StoredResponse) -> Option<Reply> {
    let StoredBody::Retained(body) = &response.body else {
        return None;
    };
    match (response.status, body.as_ref()) {
        (StatusCode::CREATED, [op, body]) => Some(Reply::Created {
            op: *op,
            body: *body,
        }),
        (StatusCode::GATEWAY_TIMEOUT, [op]) => Some(Reply::GatewayTimeout { op: *op }),
        _ => None,
    }
}

impl Rec {
    /// The record as core holds it.
    pub fn to_core(&self) -> Record {
        let state = match self.stage {
            Stage::Processing { until } => RecordState::Processing {
                locked_until: at(until),
            },
            Stage::Released => RecordState::Released,
            Stage::Completed(reply) => RecordState::Completed(stored(reply)),
            Stage::Failed(reply) => RecordState::Failed(stored(reply)),
        };
        Record {
            fingerprint: fingerprint(self.body),
            field_digests: None,
            format_version: RECORD_FORMAT_VERSION,
            operation_id: operation_id(self.op),
            token: FencingToken(u64::from(self.token)),
            state,
            created_at: at(0),
            expires_at: at(self.expires_at),
        }
    }
}

/// A step's narrative, written only when a trace is printed.
struct Log<'a>(Option<&'a mut String>);

impl Log<'_> {
    fn say(&mut self, args: std::fmt::Arguments<'_>) {
        if let Some(out) = self.0.as_mut() {
            if !out.is_empty() {
                out.push_str("; ");
            }
            let _ = out.write_fmt(args);
        }
    }
}

macro_rules! say {
    ($log:expr, $($arg:tt)*) => { $log.say(format_args!($($arg)*)) };
}

fn ordinal(n: u8) -> &'static str {
    match n {
        1 => "1st",
        2 => "2nd",
        3 => "3rd",
        _ => "nth",
    }
}

impl ProtocolModel {
    fn live_record(state: &State) -> Option<Rec> {
        // A record past its expires_at is absent to every store call (Store docs).
        state.record.filter(|rec| rec.expires_at > state.now)
    }

    /// The claim rule: core's [`Record::claim_origin`], or its weakened variant.
    fn claim_origin(&self, rec: &Rec, body: u8, now: u8) -> Option<LeaseOrigin> {
        let record = rec.to_core();
        let asked = if self.guards.fingerprint_on_takeover {
            fingerprint(body)
        } else {
            record.fingerprint
        };
        let clock = if self.guards.lease_check {
            at(now)
        } else {
            // Every lease looks lapsed.
            Timestamp::from_millis(i64::MAX)
        };
        record.claim_origin(&asked, clock)
    }

    /// The fence: core's [`Record::admits_fenced_write`], or its weakened variant.
    fn admits(&self, rec: &Rec, held: &Held, now: u8) -> bool {
        // Without the guard a write is unconditional: it lands on whatever
        // record is there.
        !self.guards.fencing
            || rec.to_core().admits_fenced_write(
                operation_id(held.op),
                FencingToken(u64::from(held.token)),
                at(now),
            )
    }

    /// `try_claim`: the store's atomic claim. `Ok` with the lease, or `Err` with
    /// what the request answers from the existing record (by [`decide()`]); `None`
    /// inside `Err` when `decide` says claim again.
    fn try_claim(
        &self,
        state: &mut State,
        body: u8,
        log: &mut Log<'_>,
    ) -> Result<Held, Option<Answer>> {
        let now = state.now;
        let until = now.saturating_add(self.bounds.lease);
        let Some(rec) = Self::live_record(state) else {
            let op = state.ops;
            state.ops += 1;
            state.tokens += 1;
            let token = state.tokens;
            state.record = Some(Rec {
                body,
                op,
                token,
                stage: Stage::Processing { until },
                expires_at: now.saturating_add(self.bounds.ttl),
            });
            say!(
                log,
                "claimed a new operation op{op} (token {token}, lease until t={until})"
            );
            return Ok(Held {
                op,
                token,
                until,
                renewing: true,
            });
        };
        if let Some(origin) = self.claim_origin(&rec, body, now) {
            if let Stage::Processing { until: held_until } = rec.stage {
                if held_until > now {
                    state.live_lease_taken = true;
                }
                state.took_over = true;
            }
            state.tokens += 1;
            let token = state.tokens;
            state.record = Some(Rec {
                token,
                stage: Stage::Processing { until },
                expires_at: rec.expires_at.max(now.saturating_add(self.bounds.ttl)),
                ..rec
            });
            say!(
                log,
                "claimed op{} again ({}, token {token}, lease until t={until})",
                rec.op,
                match origin {
                    LeaseOrigin::New => "new",
                    LeaseOrigin::Released => "it was released",
                    LeaseOrigin::TakenOver => "took over a lapsed lease",
                }
            );
            return Ok(Held {
                op: rec.op,
                token,
                until,
                renewing: true,
            });
        }
        let snapshot = Snapshot {
            record: rec.to_core(),
            now: at(now),
        };
        let answer = match decide(&snapshot, &fingerprint(body)) {
            Decision::Mismatch => Some(Answer::Mismatch),
            Decision::InProgress { .. } => Some(Answer::Conflict),
            Decision::Replay(response) => replied(response).map(Answer::Replay),
            Decision::Claimable => None,
        };
        say!(log, "found op{} ({:?}): {answer:?}", rec.op, rec.stage);
        Err(answer)
    }

    /// A fenced settlement: `Some(true)` applied, `Some(false)` refused.
    fn settle(
        &self,
        state: &mut State,
        held: &Held,
        settlement: Settlement,
        log: &mut Log<'_>,
    ) -> bool {
        let now = state.now;
        let Some(rec) = Self::live_record(state).filter(|rec| self.admits(rec, held, now)) else {
            say!(
                log,
                "{settlement:?} of op{} token {} REFUSED by the fence",
                held.op,
                held.token
            );
            return false;
        };
        match settlement {
            Settlement::Complete(reply) => {
                if rec.token != held.token {
                    state.fenced_completed = true;
                }
                state.completions.push(rec.op);
                let stage = match reply {
                    Reply::Created { .. } => Stage::Completed(reply),
                    Reply::GatewayTimeout { .. } => Stage::Failed(reply),
                };
                state.record = Some(Rec {
                    stage,
                    expires_at: now.saturating_add(self.bounds.ttl),
                    ..rec
                });
                say!(
                    log,
                    "store completed op{} with {reply:?} (token {})",
                    rec.op,
                    held.token
                );
            }
            Settlement::Release => {
                state.record = Some(Rec {
                    stage: Stage::Released,
                    ..rec
                });
                say!(log, "store released op{} (token {})", rec.op, held.token);
            }
        }
        true
    }

    /// Our completion was refused: answer the record's current outcome
    /// (`fenced_outcome` in the layer: `decide` over the record of our operation).
    fn fenced_outcome(state: &State, held: &Held) -> Answer {
        let Some(rec) = Self::live_record(state).filter(|rec| rec.op == held.op) else {
            return Answer::Conflict;
        };
        let record = rec.to_core();
        let snapshot = Snapshot {
            now: at(state.now),
            record,
        };
        match decide(&snapshot, &snapshot.record.fingerprint) {
            Decision::Replay(response) => {
                replied(response).map_or(Answer::Conflict, Answer::Replay)
            }
            Decision::InProgress { .. } | Decision::Mismatch | Decision::Claimable => {
                Answer::Conflict
            }
        }
    }

    fn new_task(state: &mut State, client: u8, instance: u8) {
        let c = &mut state.clients[usize::from(client)];
        c.sent += 1;
        c.waiting = Some(c.sent);
        let attempt = c.sent;
        state.tasks.push(Task {
            instance,
            client,
            attempt,
            phase: Phase::Claim,
        });
    }

    /// A request's store call, nothing lost. Returns the request's next phase.
    fn store_step(&self, state: &mut State, task: Task, log: &mut Log<'_>) -> Option<Phase> {
        match task.phase {
            Phase::Claim => Some(
                match self.try_claim(state, state.clients[usize::from(task.client)].body, log) {
                    Ok(held) => Phase::Run(held),
                    Err(Some(answer)) => Phase::Respond(answer),
                    // Released or lapsed since: the layer claims again.
                    Err(None) => Phase::Claim,
                },
            ),
            Phase::Settle(held, settlement) => {
                let applied = self.settle(state, &held, settlement, log);
                Some(Phase::Respond(match (settlement, applied) {
                    (Settlement::Complete(reply), true) => Answer::Fresh(reply),
                    (Settlement::Complete(_), false) => {
                        state.fenced_off = true;
                        let answer = Self::fenced_outcome(state, &held);
                        say!(log, "answers the record's outcome: {answer:?}");
                        answer
                    }
                    // The handler's answer either way.
                    (Settlement::Release, _) => Answer::Declined,
                }))
            }
            Phase::Run(_) | Phase::Respond(_) => None,
        }
    }

    /// Applies `action`, narrating it into `out` when given.
    pub fn apply(&self, last: &State, action: Action, out: Option<&mut String>) -> Option<State> {
        let mut log = Log(out);
        let mut state = last.clone();
        match action {
            Action::Send { client, instance } | Action::SendTwice { client, instance } => {
                Self::new_task(&mut state, client, instance);
                let attempt = state.clients[usize::from(client)].sent;
                say!(
                    log,
                    "client {client} sends its {} attempt to instance {instance}",
                    ordinal(attempt)
                );
                if matches!(action, Action::SendTwice { .. }) {
                    state.faults.duplicates -= 1;
                    let mut twin = *state.tasks.last()?;
                    twin.phase = Phase::Claim;
                    state.tasks.push(twin);
                    say!(log, "it arrives twice");
                }
            }
            Action::SendLost { client } => {
                state.faults.lost_messages -= 1;
                let c = &mut state.clients[usize::from(client)];
                c.sent += 1;
                c.waiting = Some(c.sent);
                say!(
                    log,
                    "client {client}'s {} attempt is lost on the way",
                    ordinal(c.sent)
                );
            }
            Action::Timeout { client } => {
                state.clients[usize::from(client)].waiting = None;
                say!(log, "client {client} times out");
            }
            Action::Tick => {
                state.now += 1;
                say!(log, "the clock ticks to t={}", state.now);
            }
            Action::Crash { instance } => {
                state.faults.crashes -= 1;
                state.tasks.retain(|task| task.instance != instance);
                say!(log, "instance {instance} crashes");
            }
            Action::ApplyDelayed { index } => {
                let call = state.delayed.remove(usize::from(index));
                say!(log, "a duplicated store call arrives late: {call:?}");
                match call {
                    StoreCall::Claim { body } => {
                        let _ = self.try_claim(&mut state, body, &mut log);
                    }
                    StoreCall::Settle(held, settlement) => {
                        let _ = self.settle(&mut state, &held, settlement, &mut log);
                    }
                }
            }
            Action::Step { task: index }
            | Action::StoreLost { task: index, .. }
            | Action::StoreTwice { task: index }
            | Action::Charge { task: index }
            | Action::ChargeAnswerLost { task: index }
            | Action::Decline { task: index }
            | Action::Renew { task: index }
            | Action::AnswerLost { task: index } => {
                let i = usize::from(index);
                let task = *state.tasks.get(i)?;
                say!(
                    log,
                    "instance {} (client {}'s {} attempt)",
                    task.instance,
                    task.client,
                    ordinal(task.attempt)
                );
                let next = self.task_step(&mut state, task, action, &mut log)?;
                match next {
                    Some(phase) => state.tasks[i].phase = phase,
                    None => {
                        state.tasks.remove(i);
                    }
                }
            }
        }
        state.tasks.sort_unstable();
        Some(state)
    }

    /// A request's step; `Some(None)` when the request is over.
    fn task_step(
        &self,
        state: &mut State,
        task: Task,
        action: Action,
        log: &mut Log<'_>,
    ) -> Option<Option<Phase>> {
        let next = match (action, task.phase) {
            (Action::Step { .. }, Phase::Respond(answer)) => {
                let client = &mut state.clients[usize::from(task.client)];
                if client.waiting == Some(task.attempt) {
                    client.waiting = None;
                    if answer.is_final() {
                        client.done = Some(answer);
                    }
                    say!(log, "answers {answer:?} to client {}", task.client);
                } else {
                    say!(
                        log,
                        "answers {answer:?}, but client {} no longer waits for it",
                        task.client
                    );
                }
                None
            }
            (Action::AnswerLost { .. }, Phase::Respond(answer)) => {
                state.faults.lost_messages -= 1;
                say!(log, "its answer {answer:?} is lost");
                None
            }
            (Action::Step { .. }, _) => self.store_step(state, task, log),
            (Action::StoreTwice { .. }, _) => {
                state.faults.duplicates -= 1;
                let call = match task.phase {
                    Phase::Claim => StoreCall::Claim {
                        body: state.clients[usize::from(task.client)].body,
                    },
                    Phase::Settle(held, settlement) => StoreCall::Settle(held, settlement),
                    Phase::Run(_) | Phase::Respond(_) => return None,
                };
                state.delayed.push(call);
                say!(log, "its store call is duplicated");
                self.store_step(state, task, log)
            }
            (Action::StoreLost { applied, .. }, _) => {
                state.faults.lost_store_calls -= 1;
                if applied {
                    // The store applies it; its answer never returns.
                    let _ = self.store_step(state, task, log);
                    say!(log, "the store's answer is lost");
                } else {
                    say!(log, "its store call is lost before the store");
                }
                match task.phase {
                    Phase::Claim => Some(Phase::Respond(Answer::Unavailable)),
                    // Retried while the lease holds, else given up: the client
                    // gets the handler's own answer (PROTOCOL §8).
                    Phase::Settle(held, settlement) if state.now >= held.until => {
                        say!(log, "the lease ran out: gives up on the store");
                        Some(Phase::Respond(match settlement {
                            Settlement::Complete(reply) => Answer::Unstored(reply),
                            Settlement::Release => Answer::Declined,
                        }))
                    }
                    phase @ Phase::Settle(..) => Some(phase),
                    Phase::Run(_) | Phase::Respond(_) => return None,
                }
            }
            (Action::Charge { .. } | Action::ChargeAnswerLost { .. }, Phase::Run(held)) => {
                let body = state.clients[usize::from(task.client)].body;
                // The downstream dedupes by its key, the operation id (PROTOCOL §11).
                let effect = match state.effects.iter().find(|e| e.op == held.op) {
                    Some(effect) => *effect,
                    None => {
                        let effect = Effect {
                            op: held.op,
                            token: held.token,
                            body,
                        };
                        state.effects.push(effect);
                        effect
                    }
                };
                say!(
                    log,
                    "the downstream charges op{} for body {}",
                    effect.op,
                    effect.body
                );
                let reply = if matches!(action, Action::ChargeAnswerLost { .. }) {
                    state.faults.downstream -= 1;
                    say!(log, "its answer is lost: the handler answers 504");
                    Reply::GatewayTimeout { op: held.op }
                } else {
                    Reply::Created {
                        op: effect.op,
                        body: effect.body,
                    }
                };
                Some(Phase::Settle(held, settlement(Some(reply))))
            }
            (Action::Decline { .. }, Phase::Run(held)) => {
                state.faults.downstream -= 1;
                say!(
                    log,
                    "the downstream refuses op{} with nothing charged",
                    held.op
                );
                Some(Phase::Settle(held, settlement(None)))
            }
            (Action::Renew { .. }, Phase::Run(held) | Phase::Settle(held, _)) => {
                let now = state.now;
                let until = now.saturating_add(self.bounds.lease);
                let renewed = match Self::live_record(state) {
                    Some(rec) if self.admits(&rec, &held, now) => {
                        // (Unfenced, a renewal of a settled record changes nothing.)
                        if let Stage::Processing { .. } = rec.stage {
                            state.record = Some(Rec {
                                stage: Stage::Processing { until },
                                ..rec
                            });
                        }
                        true
                    }
                    _ => false,
                };
                let held = if renewed {
                    say!(log, "renews its lease until t={until}");
                    Held { until, ..held }
                } else {
                    say!(log, "its renewal is refused: it stops renewing");
                    Held {
                        renewing: false,
                        ..held
                    }
                };
                Some(match task.phase {
                    Phase::Settle(_, settlement) => Phase::Settle(held, settlement),
                    _ => Phase::Run(held),
                })
            }
            _ => return None,
        };
        Some(next)
    }

    /// Runs a fault-free, fair schedule from `state`: every request steps to its
    /// end, every client without a final answer retries, the clock ticks, and
    /// so on, for at most `rounds` rounds. Whether every client got a final answer.
    pub fn recovers(&self, state: &State) -> bool {
        let mut state = state.clone();
        state.faults = Faults::NONE;
        let rounds = 4 * usize::from(self.bounds.lease) + 8;
        for _ in 0..rounds {
            while !state.delayed.is_empty() {
                state = self.must(&state, Action::ApplyDelayed { index: 0 });
            }
            self.drain(&mut state);
            for client in 0..state.clients.len() {
                let c = state.clients[client];
                let served = state.tasks.iter().any(|t| usize::from(t.client) == client);
                if c.done.is_none() && !served {
                    let client = client as u8;
                    if c.waiting.is_some() {
                        state = self.must(&state, Action::Timeout { client });
                    }
                    state = self.must(
                        &state,
                        Action::Send {
                            client,
                            instance: 0,
                        },
                    );
                }
            }
            self.drain(&mut state);
            if state.clients.iter().all(|c| c.done.is_some()) {
                return true;
            }
            state.now = state.now.saturating_add(1);
        }
        false
    }

    fn must(&self, state: &State, action: Action) -> State {
        // The fair schedule only takes actions enabled in its state.
        self.apply(state, action, None)
            .unwrap_or_else(|| state.clone())
    }

    /// Steps every request to its end (a claim that must be claimed again
    /// counts as an end for this round).
    fn drain(&self, state: &mut State) {
        let mut guard = 64;
        while let Some(task) = state.tasks.first().copied() {
            guard -= 1;
            if guard == 0 {
                return;
            }
            let action = match task.phase {
                Phase::Run(_) => Action::Charge { task: 0 },
                _ => Action::Step { task: 0 },
            };
            let next = self.must(state, action);
            let stuck = next == *state;
            *state = next;
            if stuck {
                return;
            }
        }
    }

    /// The enabled actions of `state`.
    fn enabled(&self, state: &State, actions: &mut Vec<Action>) {
        let faults = state.faults;
        for (client, c) in state.clients.iter().enumerate() {
            let client = client as u8;
            if c.done.is_some() {
                continue;
            }
            if let Some(attempt) = c.waiting {
                // A client waits as long as its attempt can still be answered:
                // it times out once the request or its answer was lost, or its
                // instance crashed. (A client retrying while its first attempt
                // still runs is what the other client of the request does.)
                let answerable = state
                    .tasks
                    .iter()
                    .any(|t| t.client == client && t.attempt == attempt);
                if !answerable {
                    actions.push(Action::Timeout { client });
                }
                continue;
            }
            if c.sent >= self.bounds.attempts {
                continue;
            }
            for instance in 0..self.bounds.instances {
                actions.push(Action::Send { client, instance });
                if faults.duplicates > 0 {
                    actions.push(Action::SendTwice { client, instance });
                }
            }
            if faults.lost_messages > 0 {
                actions.push(Action::SendLost { client });
            }
        }
        for (index, task) in state.tasks.iter().enumerate() {
            let task_index = index as u8;
            match task.phase {
                Phase::Claim | Phase::Settle(..) => {
                    actions.push(Action::Step { task: task_index });
                    if faults.lost_store_calls > 0 {
                        actions.push(Action::StoreLost {
                            task: task_index,
                            applied: true,
                        });
                        actions.push(Action::StoreLost {
                            task: task_index,
                            applied: false,
                        });
                    }
                    if faults.duplicates > 0 {
                        actions.push(Action::StoreTwice { task: task_index });
                    }
                }
                Phase::Run(held) => {
                    actions.push(Action::Charge { task: task_index });
                    if faults.downstream > 0 {
                        actions.push(Action::ChargeAnswerLost { task: task_index });
                        if !state.effects.iter().any(|e| e.op == held.op) {
                            actions.push(Action::Decline { task: task_index });
                        }
                    }
                }
                Phase::Respond(_) => {
                    actions.push(Action::Step { task: task_index });
                    if faults.lost_messages > 0 {
                        actions.push(Action::AnswerLost { task: task_index });
                    }
                }
            }
            if let Phase::Run(held) | Phase::Settle(held, _) = task.phase {
                // The holder renews in the last tick of its lease (the layer
                // renews every third of it; earlier renewals change nothing a
                // later one does not).
                if held.renewing && held.until == state.now.saturating_add(1) {
                    actions.push(Action::Renew { task: task_index });
                }
            }
        }
        if faults.crashes > 0 {
            for instance in 0..self.bounds.instances {
                if state.tasks.iter().any(|t| t.instance == instance) {
                    actions.push(Action::Crash { instance });
                }
            }
        }
        for index in 0..state.delayed.len() {
            actions.push(Action::ApplyDelayed { index: index as u8 });
        }
        if state.now < self.bounds.horizon {
            actions.push(Action::Tick);
        }
    }
}

/// The final answers clients of one request (one body) got, with their clients.
fn finals(state: &State) -> Vec<(u8, Answer)> {
    state
        .clients
        .iter()
        .filter_map(|c| c.done.map(|answer| (c.body, answer)))
        .collect()
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            record: None,
            ops: 0,
            tokens: 0,
            clients: self
                .bounds
                .bodies
                .iter()
                .map(|&body| Client {
                    body,
                    sent: 0,
                    waiting: None,
                    done: None,
                })
                .collect(),
            tasks: Vec::new(),
            delayed: Vec::new(),
            effects: Vec::new(),
            completions: Vec::new(),
            fenced_completed: false,
            live_lease_taken: false,
            took_over: false,
            fenced_off: false,
            faults: self.bounds.faults,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        self.enabled(state, actions);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        self.apply(last, action, None)
    }

    fn format_step(&self, last: &State, action: Action) -> Option<String> {
        let mut out = String::new();
        self.apply(last, action, Some(&mut out))?;
        Some(format!("t={}: {out}", last.now))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AT_MOST_ONE_EFFECT, |_: &Self, s: &State| {
                let mut ops: Vec<u8> = s.completions.clone();
                ops.sort_unstable();
                let once = ops.windows(2).all(|w| w[0] != w[1]);
                // The downstream dedupes by operation id; one key is one
                // operation while its clients retry within the TTL.
                once && s.effects.len() <= 1
            }),
            Property::always(ONE_OUTCOME, |m: &Self, s: &State| {
                let finals = finals(s);
                finals.iter().all(|(body, a)| {
                    finals.iter().all(|(other, b)| {
                        let counted =
                            |x: &Answer| m.strict_outcomes || !matches!(x, Answer::Unstored(_));
                        body != other || !counted(a) || !counted(b) || a.reply() == b.reply()
                    })
                })
            }),
            Property::always(OWN_REQUEST, |_: &Self, s: &State| {
                finals(s).iter().all(|(body, answer)| match answer.reply() {
                    Some(Reply::Created { body: charged, .. }) => charged == *body,
                    _ => true,
                })
            }),
            Property::always(REPLAY_AFTER_EFFECT, |_: &Self, s: &State| {
                let charged =
                    |op: u8, body: u8| s.effects.iter().any(|e| e.op == op && e.body == body);
                let stored = match s.record.map(|r| r.stage) {
                    Some(Stage::Completed(Reply::Created { op, body })) => charged(op, body),
                    _ => true,
                };
                stored
                    && finals(s).iter().all(|(_, answer)| match answer.reply() {
                        Some(Reply::Created { op, body }) => charged(op, body),
                        _ => true,
                    })
            }),
            Property::always(FENCED_NEVER_COMPLETES, |_: &Self, s: &State| {
                !s.fenced_completed
            }),
            Property::always(RELEASED_LEAVES_NO_EFFECT, |_: &Self, s: &State| {
                match s.record {
                    // The record keeps the releasing holder's token.
                    Some(rec) if rec.stage == Stage::Released => !s
                        .effects
                        .iter()
                        .any(|e| e.op == rec.op && e.token == rec.token),
                    _ => true,
                }
            }),
            Property::always(LIVE_LEASE_EXCLUDES, |_: &Self, s: &State| {
                !s.live_lease_taken
            }),
            Property::always(EVENTUALLY_FINAL, |m: &Self, s: &State| m.recovers(s)),
            Property::sometimes("a lapsed lease is taken over", |_: &Self, s: &State| {
                s.took_over
            }),
            Property::sometimes(
                "a holder's completion is fenced off",
                |_: &Self, s: &State| s.fenced_off,
            ),
            Property::sometimes("every client has a final answer", |_: &Self, s: &State| {
                s.clients.iter().all(|c| c.done.is_some())
            }),
        ]
    }
}

/// "At most one committed effect per operation": the store applies one
/// completion per operation id, and the downstream holds one charge per key.
pub const AT_MOST_ONE_EFFECT: &str = "at most one committed effect per operation";
/// "All clients of one operation see one outcome" (PROTOCOL §8).
pub const ONE_OUTCOME: &str =
    "every client of one operation that gets a final answer gets the same one";
/// A final answer is for the request the client sent: another body under the
/// key is a 422, never the first request's outcome (PROTOCOL §6.3).
pub const OWN_REQUEST: &str = "a request never gets another request's outcome";
/// A stored or answered 201 names a charge the downstream holds.
pub const REPLAY_AFTER_EFFECT: &str = "a replay never precedes the effect it reports";
/// The fence (PROTOCOL §8): a holder whose token moved on cannot complete.
pub const FENCED_NEVER_COMPLETES: &str = "a fenced holder never completes";
/// A holder releases only a run that made no effect (PROTOCOL §8: released only
/// when the effects are known undone): a `RELEASED` record's operation holds no
/// effect made under the releasing holder's token.
pub const RELEASED_LEAVES_NO_EFFECT: &str = "a released claim leaves no effect behind";
/// PROTOCOL §6.2, §8: a claim never takes over a lease that is still live
/// (store clock).
pub const LIVE_LEASE_EXCLUDES: &str = "a live lease is never taken over";
/// Liveness, as checked: from every reachable state, once faults stop, a fair
/// schedule brings every retrying client to a final answer.
pub const EVENTUALLY_FINAL: &str =
    "every retrying client gets a final answer once faults stop (fair schedule)";
/// Reachable, and safe: a holder paused past its lease charges after the next
/// holder found nothing charged and released. The release kept the operation id,
/// so the next run's downstream call (keyed by it, PROTOCOL §11) answers that
/// charge instead of making a second.
pub const STALE_EFFECT_OUTLIVES_RELEASE: &str =
    "a stale holder's effect outlives a release (answered by the next run)";
