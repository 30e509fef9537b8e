//! The load: a fixed number of keep-alive connections, for a warm-up and then a
//! measured window. Closed loop by default: each connection sends its next
//! request as soon as the previous answer arrived, so the rate is what the
//! server sustains and latency is measured at saturation. Open loop with a rate
//! ([`LoadPlan::rate`]): the requests are sent on a fixed schedule whatever the
//! answers do, and a request sent late because its connection was still
//! waiting for the previous answer counts the wait (no coordinated omission).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::BoxError;
use crate::client::{Connection, Reply, RequestTemplate, TransferTemplate};

/// What the requests carry, and what the server is expected to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Scenario {
    /// The server without the idempotency layer (`--no-idempotency`), no key.
    Bare,
    /// The layer is there; the request has no `Idempotency-Key`.
    NoKey,
    /// A fresh UUID key on every request: claim, run, complete.
    NewKey,
    /// Keys completed before the measurement, sent again: replays.
    Replay,
    /// 64 connections on 8 keys at a time (a new set every 100 ms): executions,
    /// 409s and replays, all expected.
    Contended,
    /// A signed GitHub webhook delivery with a fresh `X-GitHub-Delivery` on
    /// every request (the proxy suite's webhook route: verify, claim, forward,
    /// complete). Not in [`Scenario::ALL`]: `serve` has no such route.
    Webhook,
    /// A ledger transfer between two random accounts of [`TRANSFER_ACCOUNTS`],
    /// a fresh `reference_id` (its key) on every request: on the SQL stores in
    /// the one-transaction mode (PROTOCOL §23). Compared with
    /// [`Scenario::BareTransfer`], not with `bare`.
    Transfer,
    /// The same transfers on the server without the layer
    /// (`--no-idempotency`): `transfer`'s baseline.
    BareTransfer,
    /// The same transfers claimed in two phases (the hidden
    /// `--two-phase-transfers`): what the one-transaction mode is compared with.
    TransferTwoPhase,
}

impl Scenario {
    pub(crate) const ALL: [Self; 5] = [
        Self::Bare,
        Self::NoKey,
        Self::NewKey,
        Self::Replay,
        Self::Contended,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Bare => "bare",
            Self::NoKey => "no-key",
            Self::NewKey => "new-key",
            Self::Replay => "replay",
            Self::Contended => "contended",
            Self::Webhook => "webhook",
            Self::Transfer => "transfer",
            Self::BareTransfer => "bare-transfer",
            Self::TransferTwoPhase => "transfer-two-phase",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain([Self::Transfer, Self::TransferTwoPhase])
            .find(|s| s.name() == name)
    }

    /// The run this scenario is divided by: `bare`, or for transfers the same
    /// transfers without the layer.
    pub(crate) fn baseline(self) -> Self {
        match self {
            Self::Transfer | Self::TransferTwoPhase | Self::BareTransfer => Self::BareTransfer,
            _ => Self::Bare,
        }
    }

    /// Whether this is a baseline run (the server without the layer).
    pub(crate) fn is_baseline(self) -> bool {
        self.baseline() == self
    }

    /// Whether the requests are ledger transfers.
    pub(crate) fn is_transfer(self) -> bool {
        self.baseline() == Self::BareTransfer
    }

    /// Whether a reply is what this scenario expects.
    fn expects(self, reply: Reply) -> bool {
        match self {
            Self::Bare
            | Self::NoKey
            | Self::NewKey
            | Self::Webhook
            | Self::Transfer
            | Self::TransferTwoPhase
            | Self::BareTransfer => reply.status == 201 && !reply.replayed,
            Self::Replay => reply.status == 201 && reply.replayed,
            Self::Contended => reply.status == 201 || reply.status == 409,
        }
    }
}

/// How many keys `replay` cycles through, each completed once before the warm-up.
pub(crate) const REPLAY_KEYS: usize = 256;
/// How many accounts `transfer` moves money between, opened before each run.
pub(crate) const TRANSFER_ACCOUNTS: usize = 64;
/// How many keys `contended` hammers at a time.
pub(crate) const CONTENDED_KEYS: u64 = 8;
/// How long one set of contended keys lasts.
pub(crate) const CONTENDED_PERIOD: Duration = Duration::from_millis(100);

/// One load run's settings.
#[derive(Debug, Clone)]
pub(crate) struct LoadPlan {
    pub(crate) scenario: Scenario,
    pub(crate) connections: usize,
    pub(crate) warmup: Duration,
    pub(crate) measure: Duration,
    /// The bearer token, fresh per run so keys never meet an earlier run's records.
    pub(crate) principal: String,
    /// Open loop: this many requests a second over all connections, each
    /// connection's on its own evenly spaced schedule; `None`: closed loop.
    pub(crate) rate: Option<f64>,
}

/// What one run measured, inside the measured window only.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct LoadResult {
    /// The measured window, in seconds.
    pub(crate) seconds: f64,
    /// Expected answers completed in the window.
    pub(crate) good: u64,
    /// 2xx answers that were not replays.
    pub(crate) executed: u64,
    /// 2xx answers marked `Idempotent-Replayed: true`.
    pub(crate) replayed: u64,
    /// 409 answers.
    pub(crate) conflicts: u64,
    /// Unexpected answers and I/O failures, by kind.
    pub(crate) errors: BTreeMap<String, u64>,
    /// Latency percentiles of every completed request in the window, microseconds.
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
    pub(crate) p999_us: u64,
    pub(crate) max_us: u64,
}

impl LoadResult {
    pub(crate) fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// Per-connection tallies, merged at the end.
struct Tally {
    histogram: Histogram<u64>,
    result: LoadResult,
}

impl Tally {
    fn new() -> Self {
        Self {
            // 1 µs to 100 s at 3 significant digits: constant, valid bounds.
            histogram: Histogram::new_with_bounds(1, 100_000_000, 3)
                .expect("constant histogram bounds are valid"),
            result: LoadResult::default(),
        }
    }
}

/// The instants that bound a run, shared by its connections.
struct Clock {
    started: Instant,
    measure_from: Instant,
    until: Instant,
}

/// Completes `keys` once each (sequentially over a few connections), so `replay`
/// has records to replay. Every answer must be a fresh 201.
pub(crate) async fn precomplete(
    addr: SocketAddr,
    principal: &str,
    keys: &[String],
) -> Result<(), BoxError> {
    let template = RequestTemplate::orders(addr, principal);
    let mut request = Vec::new();
    let mut connection = Connection::connect(addr).await?;
    for key in keys {
        template.write(&mut request, Some(key));
        let reply = connection.send(&request).await?;
        if reply.status != 201 || reply.replayed {
            return Err(format!(
                "completing a replay key answered {} (replayed: {})",
                reply.status, reply.replayed
            )
            .into());
        }
        if connection.closed {
            connection = Connection::connect(addr).await?;
        }
    }
    Ok(())
}

/// Opens [`TRANSFER_ACCOUNTS`] accounts as `principal`, each with more money
/// than any run can move, and returns their ids (as text, for the request
/// lines): what `transfer` moves money between.
pub(crate) async fn open_accounts(
    addr: SocketAddr,
    principal: &str,
) -> Result<Vec<String>, BoxError> {
    let mut connection = Connection::connect(addr).await?;
    let template = TransferTemplate::new(addr, principal);
    let mut request = Vec::new();
    let mut ids = Vec::with_capacity(TRANSFER_ACCOUNTS);
    for _ in 0..TRANSFER_ACCOUNTS {
        template.open_account(&mut request);
        let (reply, body) = connection.send_reading(&request).await?;
        if reply.status != 201 {
            return Err(format!("opening an account answered {}", reply.status).into());
        }
        let account: serde_json::Value = serde_json::from_slice(&body)?;
        let id = account["account_id"]
            .as_i64()
            .ok_or("an opened account without its account_id")?;
        ids.push(id.to_string());
        if connection.closed {
            connection = Connection::connect(addr).await?;
        }
    }
    Ok(ids)
}

/// The replay scenario's keys for a run.
pub(crate) fn replay_keys(run: &str) -> Vec<String> {
    (0..REPLAY_KEYS)
        .map(|i| format!("{run}-replay-{i}"))
        .collect()
}

/// Drives the server at `addr` with `plan` and returns what the measured window
/// saw. `prepared` is what the scenario cycles through: the replay keys
/// ([`precomplete`]d), or the transfer accounts ([`open_accounts`]). `on_window` is called at the start and at the end of the measured window
/// (to sample the server's CPU time), in this task, without delaying requests.
pub(crate) async fn run(
    addr: SocketAddr,
    plan: &LoadPlan,
    prepared: Rc<Vec<String>>,
    mut on_window: impl FnMut(),
) -> Result<LoadResult, BoxError> {
    let started = Instant::now();
    let clock = Rc::new(Clock {
        started,
        measure_from: started + plan.warmup,
        until: started + plan.warmup + plan.measure,
    });
    let template = Rc::new(match plan.scenario {
        Scenario::Webhook => RequestTemplate::webhook(addr),
        _ => RequestTemplate::orders(addr, &plan.principal),
    });
    let transfers = Rc::new(TransferTemplate::new(addr, &plan.principal));
    let local = tokio::task::LocalSet::new();
    let mut handles = Vec::with_capacity(plan.connections);
    for index in 0..plan.connections {
        let clock = Rc::clone(&clock);
        let template = Rc::clone(&template);
        let transfers = Rc::clone(&transfers);
        let keys = Rc::clone(&prepared);
        let scenario = plan.scenario;
        let principal = plan.principal.clone();
        // Connection `index` sends at `started + (index + k · connections) / rate`.
        let schedule = plan.rate.map(|rate| Schedule {
            first: started + Duration::from_secs_f64(index as f64 / rate),
            every: Duration::from_secs_f64(plan.connections as f64 / rate),
        });
        handles.push(local.spawn_local(async move {
            let plan = Drive {
                scenario,
                principal: &principal,
                clock: &clock,
                template: &template,
                transfers: &transfers,
                prepared: &keys,
                schedule,
            };
            drive(addr, index, plan).await
        }));
    }
    let sampler = {
        let clock = Rc::clone(&clock);
        async move {
            tokio::time::sleep_until(clock.measure_from).await;
            on_window();
            tokio::time::sleep_until(clock.until).await;
            on_window();
        }
    };
    let mut tallies = Vec::with_capacity(handles.len());
    local
        .run_until(async {
            sampler.await;
            for handle in handles {
                tallies.push(handle.await);
            }
        })
        .await;
    let mut histogram = Tally::new().histogram;
    let mut total = LoadResult {
        seconds: plan.measure.as_secs_f64(),
        ..LoadResult::default()
    };
    for tally in tallies {
        let tally = tally.map_err(|e| format!("connection task failed: {e}"))??;
        histogram.add(&tally.histogram)?;
        let r = tally.result;
        total.good += r.good;
        total.executed += r.executed;
        total.replayed += r.replayed;
        total.conflicts += r.conflicts;
        for (kind, count) in r.errors {
            *total.errors.entry(kind).or_default() += count;
        }
    }
    total.p50_us = histogram.value_at_quantile(0.50);
    total.p99_us = histogram.value_at_quantile(0.99);
    total.p999_us = histogram.value_at_quantile(0.999);
    total.max_us = histogram.max();
    Ok(total)
}

/// An open-loop connection's send times: `first`, then every `every`.
#[derive(Clone, Copy)]
struct Schedule {
    first: Instant,
    every: Duration,
}

/// What one connection sends, and when.
struct Drive<'a> {
    scenario: Scenario,
    principal: &'a str,
    clock: &'a Clock,
    template: &'a RequestTemplate,
    /// The transfers' requests, for the transfer scenarios.
    transfers: &'a TransferTemplate,
    prepared: &'a [String],
    schedule: Option<Schedule>,
}

/// One connection's loop.
async fn drive(addr: SocketAddr, index: usize, plan: Drive<'_>) -> Result<Tally, BoxError> {
    let Drive {
        scenario,
        principal,
        clock,
        template,
        transfers,
        prepared,
        schedule,
    } = plan;
    let mut tally = Tally::new();
    let mut connection = Connection::connect(addr).await?;
    let mut request = Vec::with_capacity(512);
    let mut key = String::with_capacity(64);
    let mut rng = XorShift::new(index as u64 + 1);
    let mut replay_next = index;
    let mut next_due = schedule.map(|s| s.first);
    // When this connection's previous answer arrived.
    let mut answered_at = Instant::now();
    loop {
        // Open loop: wait for the request's time. Its latency counts from that
        // time when the previous answer held the connection past it (the
        // server's delay, which a closed loop would hide); from the moment it
        // is sent when only the timer woke late (tokio's is millisecond-grained:
        // the generator's delay, not the server's).
        let sent_at = match (next_due, schedule) {
            (Some(due), Some(schedule)) => {
                tokio::time::sleep_until(due).await;
                next_due = Some(due + schedule.every);
                if answered_at > due {
                    due
                } else {
                    Instant::now()
                }
            }
            _ => Instant::now(),
        };
        if sent_at >= clock.until {
            break;
        }
        let key = match scenario {
            Scenario::Bare | Scenario::NoKey => None,
            // A fresh key (for transfers, the reference between two accounts).
            Scenario::NewKey
            | Scenario::Webhook
            | Scenario::Transfer
            | Scenario::TransferTwoPhase
            | Scenario::BareTransfer => {
                key.clear();
                key.push_str(
                    uuid::Uuid::new_v4()
                        .hyphenated()
                        .encode_lower(&mut uuid::Uuid::encode_buffer()),
                );
                Some(key.as_str())
            }
            Scenario::Replay => {
                let k = &prepared[replay_next % prepared.len()];
                replay_next += 1;
                Some(k.as_str())
            }
            Scenario::Contended => {
                let generation = sent_at.duration_since(clock.started).as_millis()
                    / CONTENDED_PERIOD.as_millis();
                key.clear();
                use std::fmt::Write as _;
                let _ = write!(
                    key,
                    "{principal}-{generation}-{}",
                    rng.next() % CONTENDED_KEYS
                );
                Some(key.as_str())
            }
        };
        match key {
            Some(reference) if scenario.is_transfer() => {
                let count = prepared.len() as u64;
                let from = rng.next() % count;
                let to = (from + 1 + rng.next() % (count - 1)) % count;
                transfers.write(
                    &mut request,
                    &prepared[from as usize],
                    &prepared[to as usize],
                    reference,
                );
            }
            _ => template.write(&mut request, key),
        }
        let reply = connection.send(&request).await;
        let done_at = Instant::now();
        answered_at = done_at;
        let counted = done_at >= clock.measure_from && done_at < clock.until;
        match reply {
            Ok(reply) => {
                if counted {
                    let micros = done_at.duration_since(sent_at).as_micros() as u64;
                    let _ = tally.histogram.record(micros.max(1));
                    let r = &mut tally.result;
                    if (200..300).contains(&reply.status) {
                        if reply.replayed {
                            r.replayed += 1;
                        } else {
                            r.executed += 1;
                        }
                    } else if reply.status == 409 {
                        r.conflicts += 1;
                    }
                    if scenario.expects(reply) {
                        r.good += 1;
                    } else {
                        let kind = format!(
                            "HTTP {}{}",
                            reply.status,
                            if reply.replayed { " (replayed)" } else { "" }
                        );
                        *r.errors.entry(kind).or_default() += 1;
                    }
                }
                if connection.closed {
                    connection = Connection::connect(addr).await?;
                }
            }
            Err(error) => {
                if counted {
                    *tally
                        .result
                        .errors
                        .entry(format!("I/O: {}", error.kind()))
                        .or_default() += 1;
                }
                if Instant::now() >= clock.until {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                connection = Connection::connect(addr).await?;
            }
        }
    }
    Ok(tally)
}

/// A tiny PRNG for picking contended keys (no allocation, no syscalls).
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}
