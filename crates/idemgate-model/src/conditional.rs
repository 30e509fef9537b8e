//! Conditional writes and transfers (PROTOCOL §17–§18) as a [`stateright::Model`].
//!
//! Two clients, each with its own idempotency key, write one resource through
//! the layer, on one instance that may crash, with answers that may be lost and
//! clients that retry with their key:
//!
//! - [`Workload::Editors`]: two editors hold one `ETag` and send `PATCH` with
//!   `If-Match`; the handler evaluates it with the real
//!   [`Preconditions::evaluate`] and writes with the orders service's
//!   compare-and-set (`UPDATE … WHERE version = ?`, one atomic step: the
//!   database's contract); a false precondition is a rejection (412, the claim
//!   deleted).
//! - [`Workload::Transfers`]: two transfers from one account, both with
//!   `expected_balance` = the balance they read, each with its own
//!   `reference_id`; the handler answers a reference it already recorded with
//!   that transfer, else debits with `UPDATE … WHERE balance = ? AND balance >=
//!   amount` and records the transfer in the same database transaction (the
//!   orders ledger's contract); a false precondition is a rejection (409).
//!
//! The idempotency journal around the handler is core's: the claim is
//! [`Record::claim_origin`], a retry's answer is [`decide()`], the completion and
//! the rejection's delete are fenced by [`Record::admits_fenced_write`].
//! [`Settle::Transactional`] commits the handler's write together with the
//! completion (the layer's transactional mode: one database for the records and
//! the orders); [`Settle::Separate`] writes, then completes, as with a store
//! that is not the orders database.
//!
//! # One outcome per operation (the orders service's `operation_outcomes`)
//!
//! With [`Settle::Separate`] an edit can commit and its instance crash before
//! the record completes; the retry takes the lapsed lease over and runs the same
//! operation again, and its `If-Match` now names the version the edit itself
//! replaced. This model found that such a client is answered 412 for an edit
//! that applied. The orders service now records each edit's answer by operation
//! id in the edit's own transaction (`crates/idemgate-server/src/orders/outcome.rs`,
//! commit 67e779f), and so does the model's handler: the edit's write and its
//! outcome are one atomic step. A run that follows an earlier run of its
//! operation (the claim's [`LeaseOrigin`] is not `New`: a takeover) looks the
//! outcome up first ([`Phase::Lookup`]) and answers the recorded 200 before it
//! evaluates `If-Match`; a refused run of that kind looks again before it
//! refuses ([`Phase::Recheck`]), for a first run that committed in between. A
//! client may give up on an attempt still running ([`ConditionalModel::give_ups`],
//! the bounds of [`ConditionalModel::impatient`]), so the checker also explores
//! a takeover racing the first run's write.
//! [`Guards`] takes either step away: with `outcome_by_operation` off the model
//! is the old design, and the 412 is found again.
//!
//! In the transactional mode the real handler records and looks too, and never
//! finds anything: an edit commits only with its record's completion, so a run
//! that follows another follows one that wrote nothing. The model leaves the
//! outcome out there. (The model has no release, so a run that follows another
//! is a takeover.)
//!
//! [`Preconditions::evaluate`]: idemgate::conditional::Preconditions::evaluate

use http::{HeaderMap, Method, StatusCode};
use idemgate::conditional::{EntityTag, Evaluation, Preconditions, Validators};
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::record::{
    FencingToken, LeaseOrigin, OperationId, RECORD_FORMAT_VERSION, Record, RecordState, StoredBody,
    StoredResponse,
};
use idemgate_core::time::Timestamp;
use idemgate_core::{Decision, Snapshot, decide};
use stateright::{Model, Property};

/// What the two clients do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Two editors, one `ETag` (`If-Match`, PROTOCOL §17).
    Editors,
    /// Two transfers from one account of 100, both expecting that balance:
    /// 30 and 80 (PROTOCOL §18).
    Transfers,
}

/// How the handler's write and the record's completion are committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// In one transaction (the layer's transactional mode).
    Transactional,
    /// The write, then the completion: two steps a crash can fall between.
    Separate,
}

/// The guards of the edit's handler the model keeps (the orders service's
/// `operation_outcomes`, `crates/idemgate-server/src/orders/outcome.rs`). Each
/// `false` takes one away, so the checker can show what it is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guards {
    /// An applied edit records its answer by operation id in the step that
    /// changes the version, and a run that follows an earlier run of its
    /// operation (a takeover) answers that recorded 200 before it evaluates
    /// `If-Match`. Off: the design before commit 67e779f, where such a run
    /// evaluates its now stale `If-Match` and answers 412.
    pub outcome_by_operation: bool,
    /// Such a run, refused, looks the outcome up again before it answers the
    /// refusal: the first run may have committed after the first look-up.
    /// Off: the refusal is answered (only with `outcome_by_operation` on).
    pub look_again_before_refusing: bool,
}

impl Guards {
    /// Both, as the orders service keeps them.
    pub const ALL: Self = Self {
        outcome_by_operation: true,
        look_again_before_refusing: true,
    };
}

/// The conditional-write model.
#[derive(Clone, Debug)]
pub struct ConditionalModel {
    /// What the clients do.
    pub workload: Workload,
    /// How writes and completions commit.
    pub settle: Settle,
    /// The edit handler's guards.
    pub guards: Guards,
    /// Attempts per client.
    pub attempts: u8,
    /// The clock stops here.
    pub horizon: u8,
    /// Instance crashes allowed.
    pub crashes: u8,
    /// Answers that may be lost.
    pub lost_answers: u8,
    /// Attempts a client may stop waiting for while they still run (a client
    /// timeout shorter than the handler); the attempt runs on.
    pub give_ups: u8,
}

impl ConditionalModel {
    /// The bounds `cargo test` checks: 3 attempts each, a crash, two lost
    /// answers; every guard.
    pub fn new(workload: Workload, settle: Settle) -> Self {
        Self {
            workload,
            settle,
            guards: Guards::ALL,
            attempts: 3,
            horizon: 3,
            crashes: 1,
            lost_answers: 2,
            give_ups: 0,
        }
    }

    /// The bounds of a client that gives up on a running attempt once (a
    /// takeover racing the first run's write), with one lost answer and no
    /// crash: 3 attempts each.
    pub fn impatient(workload: Workload, settle: Settle) -> Self {
        Self {
            crashes: 0,
            lost_answers: 1,
            give_ups: 1,
            ..Self::new(workload, settle)
        }
    }

    /// Every fault of [`new`](Self::new) and of [`impatient`](Self::impatient)
    /// at once: a crash, two lost answers, a give-up (the ignored test).
    pub fn every_fault(workload: Workload, settle: Settle) -> Self {
        Self {
            give_ups: 1,
            ..Self::new(workload, settle)
        }
    }

    /// The same model with other guards.
    pub fn with_guards(mut self, guards: Guards) -> Self {
        self.guards = guards;
        self
    }

    /// Whether an edit's runs record and look up their outcome (edits with the
    /// records in a store of their own, the guard kept).
    fn outcomes_looked_up(&self) -> bool {
        self.workload == Workload::Editors
            && self.settle == Settle::Separate
            && self.guards.outcome_by_operation
    }
}

const LEASE: u8 = 1;
const OPENING_BALANCE: u8 = 100;
const AMOUNTS: [u8; 2] = [30, 80];

/// What the handler answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reply {
    /// 200/201: the write applied (or, for a transfer, was found recorded).
    Done,
    /// 412/409: the precondition was false; nothing written.
    Refused,
}

/// What a client got back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    /// The handler's own answer.
    Fresh(Reply),
    /// A replay of the stored answer.
    Replay(Reply),
    /// 409 in progress, or 503: retried.
    Retry,
}

/// A client's key's record (one identity per client).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rec {
    /// Operation id.
    pub op: u8,
    /// Fencing token.
    pub token: u8,
    /// `None` while processing (lease until `until`), else the stored reply.
    pub reply: Option<Reply>,
    /// Lease end while processing.
    pub until: u8,
}

/// Where a request inside the instance stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// About to claim.
    Claim,
    /// Holds (op, token) after a takeover; about to look up the operation's
    /// recorded outcome (edits, `Separate`, [`Guards::outcome_by_operation`]).
    Lookup(u8, u8),
    /// Holds (op, token); about to run the handler. `true`: the run follows an
    /// earlier run of its operation (a takeover).
    Run(u8, u8, bool),
    /// Such a run was refused; about to look the outcome up again before it
    /// answers the refusal ([`Guards::look_again_before_refusing`]).
    Recheck(u8, u8),
    /// The handler answered; about to settle the record (`Separate` only).
    Complete(u8, u8, Reply),
    /// About to answer.
    Respond(Answer),
}

/// A request being served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Task {
    /// Its client.
    pub client: u8,
    /// Which attempt.
    pub attempt: u8,
    /// Where it stands.
    pub phase: Phase,
}

/// A client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// Attempts sent.
    pub sent: u8,
    /// Waiting for this attempt.
    pub waiting: Option<u8>,
    /// Its final answer.
    pub done: Option<Reply>,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The clock.
    pub now: u8,
    /// Each client's key's record.
    pub records: [Option<Rec>; 2],
    /// Tokens and operations made.
    pub made: u8,
    /// The resource's version (editors).
    pub version: u8,
    /// The account's balance (transfers).
    pub balance: u8,
    /// What the transfers credited.
    pub credited: u8,
    /// Whose writes applied (a client id per applied write).
    pub applied: Vec<u8>,
    /// The operations whose edit recorded its 200 (`operation_outcomes`),
    /// written in the step of the edit's write.
    pub outcomes: Vec<u8>,
    /// A run answered its operation's recorded outcome.
    pub answered_recorded: bool,
    /// The clients.
    pub clients: [Client; 2],
    /// The requests in the instance.
    pub tasks: Vec<Task>,
    /// Crashes left.
    pub crashes: u8,
    /// Lost answers left.
    pub lost_answers: u8,
    /// Attempts left that a client may give up on while they run.
    pub give_ups: u8,
}

/// A step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A client sends its next attempt.
    Send(u8),
    /// A client stops waiting for an attempt that can no longer answer.
    Timeout(u8),
    /// A client stops waiting for an attempt that still runs.
    GiveUp(u8),
    /// A request steps.
    Step(u8),
    /// A request's answer is lost.
    AnswerLost(u8),
    /// The instance crashes.
    Crash,
    /// The clock ticks.
    Tick,
}

fn record(rec: &Rec) -> Record {
    let state = match rec.reply {
        None => RecordState::Processing {
            locked_until: Timestamp::from_millis(i64::from(rec.until)),
        },
        Some(reply) => RecordState::Completed(StoredResponse {
            trailers: Vec::new(),
            status: match reply {
                Reply::Done => StatusCode::OK,
                Reply::Refused => StatusCode::PRECONDITION_FAILED,
            },
            headers: Vec::new(),
            body: StoredBody::Retained(bytes::Bytes::new()),
        }),
    };
    Record {
        fingerprint: Fingerprint::from_bytes([1; 32]),
        field_digests: None,
        format_version: RECORD_FORMAT_VERSION,
        operation_id: OperationId::from_bytes([rec.op; 16]),
        token: FencingToken(u64::from(rec.token)),
        state,
        created_at: Timestamp::from_millis(0),
        expires_at: Timestamp::from_millis(i64::from(u8::MAX)),
    }
}

fn admits(rec: Option<Rec>, op: u8, token: u8, now: u8) -> bool {
    rec.is_some_and(|rec| {
        record(&rec).admits_fenced_write(
            OperationId::from_bytes([op; 16]),
            FencingToken(u64::from(token)),
            Timestamp::from_millis(i64::from(now)),
        )
    })
}

fn etag(version: u8) -> EntityTag {
    // A strong tag per version: valid opaque characters, so it cannot fail.
    EntityTag::strong(format!("v{version}")).unwrap_or_else(|_| unreachable!())
}

impl ConditionalModel {
    /// The handler's write: `Done` if it applied (or was found recorded). An
    /// applied edit records its outcome under `op` in the same step (the same
    /// transaction), when the model keeps that guard.
    fn handle(&self, state: &mut State, client: u8, op: u8) -> Reply {
        match self.workload {
            Workload::Editors => {
                // Both editors read version 0 and send its ETag.
                let mut headers = HeaderMap::new();
                headers.insert(http::header::IF_MATCH, etag(0).to_header_value());
                let preconditions = Preconditions::from_headers(&headers).unwrap_or_default();
                let current = Validators::etag(etag(state.version));
                // The check and the write: one `UPDATE … WHERE version = ?`.
                match preconditions.evaluate(&Method::PATCH, Some(&current)) {
                    Evaluation::Proceed => {
                        state.version += 1;
                        state.applied.push(client);
                        if self.outcomes_looked_up() {
                            state.outcomes.push(op);
                            state.outcomes.sort_unstable();
                        }
                        Reply::Done
                    }
                    Evaluation::NotModified | Evaluation::PreconditionFailed => Reply::Refused,
                }
            }
            Workload::Transfers => {
                // A recorded reference answers its transfer.
                if state.applied.contains(&client) {
                    return Reply::Done;
                }
                let amount = AMOUNTS[usize::from(client)];
                // `UPDATE … WHERE balance = expected AND balance >= amount`,
                // with the credit and the transfer's row, in one transaction.
                if state.balance == OPENING_BALANCE && state.balance >= amount {
                    state.balance -= amount;
                    state.credited += amount;
                    state.applied.push(client);
                    Reply::Done
                } else {
                    Reply::Refused
                }
            }
        }
    }

    /// Settles `client`'s record with `reply`, fenced: a `Done` completes, a
    /// `Refused` (a rejection) deletes. Whether it applied.
    fn settle(state: &mut State, client: u8, op: u8, token: u8, reply: Reply) -> bool {
        let slot = &mut state.records[usize::from(client)];
        if !admits(*slot, op, token, state.now) {
            return false;
        }
        *slot = match reply {
            Reply::Done => slot.map(|rec| Rec {
                reply: Some(Reply::Done),
                ..rec
            }),
            Reply::Refused => None,
        };
        true
    }

    fn step(&self, state: &mut State, task: Task) -> Option<Phase> {
        let client = task.client;
        let now = state.now;
        match task.phase {
            Phase::Claim => {
                let slot = state.records[usize::from(client)];
                let rec = match slot {
                    None => {
                        state.made += 1;
                        let rec = Rec {
                            op: state.made,
                            token: state.made,
                            reply: None,
                            until: now + LEASE,
                        };
                        state.records[usize::from(client)] = Some(rec);
                        return Some(Phase::Run(rec.op, rec.token, false));
                    }
                    Some(rec) => rec,
                };
                let core = record(&rec);
                let at = Timestamp::from_millis(i64::from(now));
                if let Some(origin) = core.claim_origin(&core.fingerprint, at) {
                    state.made += 1;
                    let taken = Rec {
                        token: state.made,
                        until: now + LEASE,
                        ..rec
                    };
                    state.records[usize::from(client)] = Some(taken);
                    // The orders service's `outcome::may_follow_a_run`.
                    let follows = origin != LeaseOrigin::New;
                    return Some(if follows && self.outcomes_looked_up() {
                        Phase::Lookup(taken.op, taken.token)
                    } else {
                        Phase::Run(taken.op, taken.token, follows)
                    });
                }
                let snapshot = Snapshot {
                    record: core,
                    now: at,
                };
                Some(Phase::Respond(
                    match decide(&snapshot, &snapshot.record.fingerprint) {
                        Decision::Replay(response) if response.status == StatusCode::OK => {
                            Answer::Replay(Reply::Done)
                        }
                        Decision::Replay(_) => Answer::Replay(Reply::Refused),
                        Decision::InProgress { .. } | Decision::Claimable | Decision::Mismatch => {
                            Answer::Retry
                        }
                    },
                ))
            }
            // The journal comes first (PROTOCOL §17): the recorded 200, not
            // the stale `If-Match` (`orders::api::earlier_edit`).
            Phase::Lookup(op, token) => Some(if state.outcomes.contains(&op) {
                state.answered_recorded = true;
                Phase::Complete(op, token, Reply::Done)
            } else {
                Phase::Run(op, token, true)
            }),
            Phase::Run(op, token, follows) => match self.settle {
                Settle::Transactional => {
                    // The write commits only with the completion (or the
                    // rejection's delete): a fenced-off run writes nothing.
                    if !admits(state.records[usize::from(client)], op, token, now) {
                        return Some(Phase::Respond(Answer::Retry));
                    }
                    let reply = self.handle(state, client, op);
                    Self::settle(state, client, op, token, reply);
                    Some(Phase::Respond(Answer::Fresh(reply)))
                }
                Settle::Separate => {
                    let reply = self.handle(state, client, op);
                    let recheck = reply == Reply::Refused
                        && follows
                        && self.outcomes_looked_up()
                        && self.guards.look_again_before_refusing;
                    Some(if recheck {
                        Phase::Recheck(op, token)
                    } else {
                        Phase::Complete(op, token, reply)
                    })
                }
            },
            // A first run that committed while this one read: its answer.
            Phase::Recheck(op, token) => Some(if state.outcomes.contains(&op) {
                state.answered_recorded = true;
                Phase::Complete(op, token, Reply::Done)
            } else {
                Phase::Complete(op, token, Reply::Refused)
            }),
            Phase::Complete(op, token, reply) => {
                if Self::settle(state, client, op, token, reply) {
                    Some(Phase::Respond(Answer::Fresh(reply)))
                } else {
                    Some(Phase::Respond(Answer::Retry))
                }
            }
            Phase::Respond(answer) => {
                let c = &mut state.clients[usize::from(client)];
                if c.waiting == Some(task.attempt) {
                    c.waiting = None;
                    match answer {
                        Answer::Fresh(reply) | Answer::Replay(reply) => c.done = Some(reply),
                        Answer::Retry => {}
                    }
                }
                None
            }
        }
    }
}

impl Model for ConditionalModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let client = Client {
            sent: 0,
            waiting: None,
            done: None,
        };
        vec![State {
            now: 0,
            records: [None; 2],
            made: 0,
            version: 0,
            balance: OPENING_BALANCE,
            credited: 0,
            applied: Vec::new(),
            outcomes: Vec::new(),
            answered_recorded: false,
            clients: [client; 2],
            tasks: Vec::new(),
            crashes: self.crashes,
            lost_answers: self.lost_answers,
            give_ups: self.give_ups,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (i, c) in state.clients.iter().enumerate() {
            if c.done.is_some() {
                continue;
            }
            if let Some(attempt) = c.waiting {
                // A client times out once its attempt cannot be answered (its
                // answer lost, the instance crashed).
                let answerable = state
                    .tasks
                    .iter()
                    .any(|t| usize::from(t.client) == i && t.attempt == attempt);
                if !answerable {
                    actions.push(Action::Timeout(i as u8));
                } else if state.give_ups > 0 {
                    actions.push(Action::GiveUp(i as u8));
                }
            } else if c.sent < self.attempts {
                actions.push(Action::Send(i as u8));
            }
        }
        for (i, task) in state.tasks.iter().enumerate() {
            actions.push(Action::Step(i as u8));
            if matches!(task.phase, Phase::Respond(_)) && state.lost_answers > 0 {
                actions.push(Action::AnswerLost(i as u8));
            }
        }
        if state.crashes > 0 && !state.tasks.is_empty() {
            actions.push(Action::Crash);
        }
        if state.now < self.horizon {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Send(client) => {
                let c = &mut state.clients[usize::from(client)];
                c.sent += 1;
                c.waiting = Some(c.sent);
                let attempt = c.sent;
                state.tasks.push(Task {
                    client,
                    attempt,
                    phase: Phase::Claim,
                });
            }
            Action::Timeout(client) => state.clients[usize::from(client)].waiting = None,
            Action::GiveUp(client) => {
                state.give_ups -= 1;
                state.clients[usize::from(client)].waiting = None;
            }
            Action::Step(index) => {
                let task = *state.tasks.get(usize::from(index))?;
                match self.step(&mut state, task) {
                    Some(phase) => state.tasks[usize::from(index)].phase = phase,
                    None => {
                        state.tasks.remove(usize::from(index));
                    }
                }
            }
            Action::AnswerLost(index) => {
                state.lost_answers -= 1;
                state.tasks.remove(usize::from(index));
            }
            Action::Crash => {
                state.crashes -= 1;
                state.tasks.clear();
            }
            Action::Tick => state.now += 1,
        }
        state.tasks.sort_unstable();
        Some(state)
    }

    fn format_step(&self, last: &State, action: Action) -> Option<String> {
        let next = self.next_state(last, action)?;
        let task = |i: u8| last.tasks.get(usize::from(i)).copied();
        Some(match action {
            Action::Send(c) => format!(
                "t={}: client {c} sends attempt {}",
                last.now,
                next.clients[usize::from(c)].sent
            ),
            Action::Timeout(c) => format!("t={}: client {c} times out", last.now),
            Action::GiveUp(c) => format!(
                "t={}: client {c} gives up on attempt {} while it runs",
                last.now,
                last.clients[usize::from(c)].sent
            ),
            Action::Step(i) => format!(
                "t={}: {:?} steps → records {:?}, applied {:?}, outcomes {:?}, version {}, balance {}, clients {:?}",
                last.now,
                task(i)?,
                next.records,
                next.applied,
                next.outcomes,
                next.version,
                next.balance,
                next.clients.map(|c| c.done)
            ),
            Action::AnswerLost(i) => {
                format!("t={}: the answer of {:?} is lost", last.now, task(i)?)
            }
            Action::Crash => format!("t={}: the instance crashes", last.now),
            Action::Tick => format!("t={}: the clock ticks", last.now),
        })
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ONE_WINNER, |m: &Self, s: &State| match m.workload {
                // Of two editors holding one ETag, at most one write applies;
                // of two transfers expecting one balance, at most one debits.
                Workload::Editors | Workload::Transfers => {
                    let mut seen = s.applied.clone();
                    seen.sort_unstable();
                    seen.dedup();
                    seen.len() == s.applied.len() && s.applied.len() <= 1
                }
            }),
            Property::always(MONEY_CONSERVED, |_: &Self, s: &State| {
                u16::from(s.balance) + u16::from(s.credited) == u16::from(OPENING_BALANCE)
            }),
            Property::always(ANSWER_MATCHES_WRITE, |_: &Self, s: &State| {
                s.clients.iter().enumerate().all(|(i, c)| match c.done {
                    Some(Reply::Done) => s.applied.contains(&(i as u8)),
                    Some(Reply::Refused) => !s.applied.contains(&(i as u8)),
                    None => true,
                })
            }),
            Property::sometimes("both clients have their answer", |_: &Self, s: &State| {
                s.clients.iter().all(|c| c.done.is_some())
            }),
            Property::sometimes("one client wins", |_: &Self, s: &State| {
                s.applied.len() == 1
            }),
            Property::sometimes(ANSWERED_RECORDED, |_: &Self, s: &State| s.answered_recorded),
        ]
    }
}

/// §17/§18: of two writers holding one `ETag` (one expected balance), at most one
/// write applies, and no write applies twice.
pub const ONE_WINNER: &str = "of two writers holding one ETag or balance, at most one applies";
/// §18: the money debited is the money credited; a balance never goes negative.
pub const MONEY_CONSERVED: &str = "money is conserved";
/// A client's final answer says what happened to its write: 2xx exactly when it
/// applied, a 412/409 exactly when it did not.
pub const ANSWER_MATCHES_WRITE: &str = "a client's final answer matches whether its write applied";
/// A run that followed an earlier run of its edit answered that run's recorded
/// outcome (reached only by edits with a store of their own, the guard kept).
pub const ANSWERED_RECORDED: &str = "a re-run answers its operation's recorded outcome";
