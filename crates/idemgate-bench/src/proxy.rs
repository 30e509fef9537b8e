//! The proxy suite (`--suite proxy`): what one `idemgate proxy` hop costs against
//! one nginx hop, in the same run, in front of the same minimal upstream.
//!
//! Per round: `nginx, c1, nginx, c2, …, nginx`, where the cases are the direct
//! call, the proxy's keyless pass-through, and new-key and replay per store (order
//! rotated per round); every case is divided by the mean of the two nginx runs
//! around it. nginx and the upstream stay up for the whole suite; each proxy run
//! starts a fresh `idemgate proxy` on a fresh store.
//!
//! Then replay latency open loop (issue 39): per store, requests on a fixed
//! schedule at half of that store's saturating replay rate (its closed-loop
//! median), replays and the direct call at the same rate, alternated per round —
//! the latency a client sees below saturation, not the queueing of 32 closed-loop
//! connections on two cores.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::client::WEBHOOK_SECRET;
use crate::hops::{NginxProcess, UpstreamProcess};
use crate::load::{self, LoadPlan, LoadResult, Scenario};
use crate::machine::Machine;
use crate::report::{Figure, Settings, StoreKind, Target, figure, median};
use crate::server::{self, ServerProcess};
use crate::store::{StoreProcesses, fresh_database};
use crate::{Args, BoxError, Context, command_line, finish, prepare};

/// What stands between the load and the upstream, and what the requests carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Case {
    /// Straight to the upstream: no hop.
    Direct,
    /// nginx as a plain reverse proxy: the reference hop.
    Nginx,
    /// `idemgate proxy`, keyless `POST` (streamed through, no store).
    PassThrough,
    /// `idemgate proxy`, a fresh key per request on this store.
    NewKey(StoreKind),
    /// `idemgate proxy`, completed keys sent again on this store.
    Replay(StoreKind),
    /// `idemgate proxy`'s webhook route (GitHub's scheme): every request a
    /// new, validly signed delivery — verified, claimed, forwarded, completed.
    Webhook(StoreKind),
}

impl Case {
    pub(crate) fn name(self) -> String {
        match self {
            Self::Direct => "direct".to_owned(),
            Self::Nginx => "nginx".to_owned(),
            Self::PassThrough => "proxy pass-through".to_owned(),
            Self::NewKey(store) => format!("proxy new-key, {}", store.name()),
            Self::Replay(store) => format!("proxy replay, {}", store.name()),
            Self::Webhook(store) => format!("proxy webhook, {}", store.name()),
        }
    }

    /// The load this case sends and the answers it expects.
    fn scenario(self) -> Scenario {
        match self {
            Self::Direct | Self::Nginx => Scenario::Bare,
            Self::PassThrough => Scenario::NoKey,
            Self::NewKey(_) => Scenario::NewKey,
            Self::Replay(_) => Scenario::Replay,
            Self::Webhook(_) => Scenario::Webhook,
        }
    }

    /// The proxy's record store for this case (pass-through never reaches it).
    fn store(self) -> Option<StoreKind> {
        match self {
            Self::Direct | Self::Nginx => None,
            Self::PassThrough => Some(StoreKind::Memory),
            Self::NewKey(store) | Self::Replay(store) | Self::Webhook(store) => Some(store),
        }
    }
}

/// One measured run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ProxyRun {
    pub(crate) case: Case,
    pub(crate) round: usize,
    /// Position in the round: a case's neighbours (`seq` ± 1) are nginx runs.
    pub(crate) seq: usize,
    pub(crate) load: LoadResult,
    pub(crate) rps: f64,
    /// CPU per expected answer of the hop's process(es): the upstream for
    /// `direct`, nginx's master and workers, or the `idemgate proxy` process.
    pub(crate) hop_cpu_us: f64,
    /// Redis's or the PostgreSQL backends' CPU per answer, when the store is one.
    pub(crate) store_cpu_us: Option<f64>,
    pub(crate) upstream_cpu_us: f64,
    pub(crate) client_cpu_us: f64,
    pub(crate) warnings: Vec<String>,
    /// An open-loop run's rate (requests a second); `None`: closed loop.
    #[serde(default)]
    pub(crate) open_loop_rate: Option<f64>,
}

/// Everything the suite produced; saved as JSON so the report can be rebuilt.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ProxyReport {
    pub(crate) machine: Machine,
    pub(crate) command: String,
    pub(crate) settings: Settings,
    pub(crate) nginx: String,
    pub(crate) nginx_workers: usize,
    pub(crate) runs: Vec<ProxyRun>,
    pub(crate) failures: Vec<String>,
}

/// One case over all rounds.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) rps: Figure,
    pub(crate) cpu: Figure,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) store_cpu_us: f64,
    pub(crate) upstream_cpu_us: f64,
    pub(crate) errors: u64,
}

/// The suite, from setup to the saved report.
pub(crate) async fn suite(args: &Args, root: &Path) -> Result<ProxyReport, BoxError> {
    let prepared = prepare(args, root, Some("nginx")).await?;
    let report = ProxyReport {
        machine: prepared.machine,
        command: command_line(),
        settings: prepared.settings.clone(),
        nginx: String::new(),
        nginx_workers: 0,
        runs: Vec::new(),
        failures: Vec::new(),
    };
    let outcome = measure(
        &prepared.context,
        &prepared.stores,
        &prepared.settings,
        report,
    )
    .await;
    let saved = match &outcome {
        Ok(report) => {
            finish(
                &prepared.context,
                &prepared.stores,
                root,
                "last-proxy-run.json",
                report,
            )
            .await
        }
        Err(_) => Ok(()),
    };
    let report = outcome?;
    saved?;
    Ok(report)
}

/// Runs the suite for `stores`.
pub(crate) async fn measure(
    context: &Context,
    stores: &[StoreKind],
    settings: &Settings,
    mut report: ProxyReport,
) -> Result<ProxyReport, BoxError> {
    let upstream = UpstreamProcess::start().await?;
    let nginx = NginxProcess::start(&context.scratch.join("nginx"), upstream.addr).await;
    let nginx = match nginx {
        Ok(nginx) => nginx,
        Err(error) => {
            upstream.stop().await;
            return Err(error);
        }
    };
    report.nginx = nginx.version.clone();
    report.nginx_workers = nginx.workers;
    let mut cases = vec![Case::Direct, Case::PassThrough];
    for store in stores {
        cases.extend([
            Case::NewKey(*store),
            Case::Replay(*store),
            Case::Webhook(*store),
        ]);
    }
    let hops = Hops {
        upstream: &upstream,
        nginx: &nginx,
    };
    for round in 0..settings.rounds {
        let mut order = cases.clone();
        let len = order.len();
        order.rotate_left(round % len);
        let mut sequence = vec![Case::Nginx];
        for case in order {
            sequence.extend([case, Case::Nginx]);
        }
        for (seq, case) in sequence.into_iter().enumerate() {
            let at = RunAt {
                round,
                seq,
                rate: None,
            };
            run_into(&mut report, context, &hops, settings, case, at).await;
        }
    }
    open_loop_replays(context, &hops, stores, settings, &mut report).await;
    nginx.stop().await;
    upstream.stop().await;
    Ok(report)
}

/// Replays and the direct call open loop, at half of each store's saturating
/// replay rate; appended to `report.runs` with their rate.
async fn open_loop_replays(
    context: &Context,
    hops: &Hops<'_>,
    stores: &[StoreKind],
    settings: &Settings,
    report: &mut ProxyReport,
) {
    for store in stores {
        let mut saturated: Vec<f64> = report
            .runs
            .iter()
            .filter(|r| r.case == Case::Replay(*store) && r.open_loop_rate.is_none())
            .map(|r| r.rps)
            .collect();
        if saturated.is_empty() {
            continue;
        }
        let rate = median(&mut saturated) / 2.0;
        for round in 0..settings.rounds {
            let mut cases = [Case::Direct, Case::Replay(*store)];
            cases.rotate_left(round % 2);
            for case in cases {
                let at = RunAt {
                    round,
                    seq: 0,
                    rate: Some(rate),
                };
                run_into(report, context, hops, settings, case, at).await;
            }
        }
    }
}

/// Where a run stands: its round, its place in the round, and its rate when
/// open loop.
#[derive(Clone, Copy)]
struct RunAt {
    round: usize,
    seq: usize,
    rate: Option<f64>,
}

/// One run of `case`, logged and kept in `report` (its failure too).
async fn run_into(
    report: &mut ProxyReport,
    context: &Context,
    hops: &Hops<'_>,
    settings: &Settings,
    case: Case,
    at: RunAt,
) {
    let plan = LoadPlan {
        scenario: case.scenario(),
        connections: settings.connections,
        warmup: Duration::from_secs_f64(settings.warmup_s),
        measure: Duration::from_secs_f64(settings.measure_s),
        principal: format!("bench-{}", uuid::Uuid::new_v4().simple()),
        rate: at.rate,
    };
    let round = at.round;
    let what = match at.rate {
        Some(rate) => format!("{} open loop at {rate:.0}/s, round {round}", case.name()),
        None => format!("{} round {round}", case.name()),
    };
    match one_run(context, hops, case, round, &plan).await {
        Ok(mut run) => {
            run.seq = at.seq;
            run.open_loop_rate = at.rate;
            eprintln!(
                "[bench] {what:>40}: {:>7.0} req/s, p50 {:.2} ms, p99 {:.2} ms, hop CPU {:.1} µs/req, upstream {:.1}, errors {}",
                run.rps,
                run.load.p50_us as f64 / 1000.0,
                run.load.p99_us as f64 / 1000.0,
                run.hop_cpu_us,
                run.upstream_cpu_us,
                run.load.error_count()
            );
            report.runs.push(run);
        }
        Err(error) => {
            let failure = format!("{what}: {error}");
            eprintln!("[bench] FAILED {failure}");
            report.failures.push(failure);
        }
    }
}

/// The processes that live for the whole suite.
struct Hops<'a> {
    upstream: &'a UpstreamProcess,
    nginx: &'a NginxProcess,
}

/// The hop a case measures: where to send, whose CPU to count.
enum Hop {
    Upstream,
    Nginx,
    Proxy(Box<ServerProcess>, StoreProcesses),
}

async fn one_run(
    context: &Context,
    hops: &Hops<'_>,
    case: Case,
    round: usize,
    plan: &LoadPlan,
) -> Result<ProxyRun, BoxError> {
    let dir = context.scratch.join(format!(
        "proxy-{}-{round}",
        case.name().replace([' ', ','], "")
    ));
    std::fs::create_dir_all(&dir)?;
    let hop = match case.store() {
        None if case == Case::Direct => Hop::Upstream,
        None => Hop::Nginx,
        Some(store) => {
            let mut args = proxy_args(context, store, &dir).await?;
            if let Case::Webhook(_) = case {
                // The same path as the other cases, as a GitHub webhook route.
                let routes = dir.join("routes.toml");
                std::fs::write(
                    &routes,
                    "[[route]]\nmethod = \"POST\"\npath = \"/api/v1/orders\"\n\
                     webhook = { provider = \"github\", secret = \"env:IDEMGATE_BENCH_WEBHOOK_SECRET\" }\n",
                )?;
                args.extend(["--config".to_owned(), routes.display().to_string()]);
            }
            let env = [("IDEMGATE_BENCH_WEBHOOK_SECRET", WEBHOOK_SECRET)];
            let proxy =
                ServerProcess::start_proxy(&context.binary, hops.upstream.addr, &args, &env)
                    .await?;
            // The pass-through never reaches its store.
            let store_processes = match case {
                Case::PassThrough => StoreProcesses::None,
                _ => StoreProcesses::of(store, context.redis_pid),
            };
            Hop::Proxy(Box::new(proxy), store_processes)
        }
    };
    let (addr, store_processes) = match &hop {
        Hop::Upstream => (hops.upstream.addr, None),
        Hop::Nginx => (hops.nginx.addr, None),
        Hop::Proxy(proxy, store) => (proxy.addr, Some(store)),
    };
    let hop_cpu = || -> Result<Duration, BoxError> {
        match &hop {
            Hop::Upstream => hops.upstream.cpu_time(),
            Hop::Nginx => hops.nginx.cpu_time(),
            Hop::Proxy(proxy, _) => proxy.cpu_time(),
        }
    };
    let measured = drive(addr, plan, hops.upstream, store_processes, hop_cpu).await;
    let warnings = match hop {
        Hop::Proxy(proxy, _) => proxy.stop().await,
        _ => Vec::new(),
    };
    let _ = std::fs::remove_dir_all(&dir);
    let (load, cpu) = measured?;
    let good = load.good.max(1) as f64;
    let per_request = |d: Duration| d.as_secs_f64() * 1e6 / good;
    Ok(ProxyRun {
        case,
        round,
        seq: 0,
        rps: load.good as f64 / load.seconds,
        hop_cpu_us: per_request(cpu.hop),
        store_cpu_us: cpu.store.map(per_request),
        upstream_cpu_us: per_request(cpu.upstream),
        client_cpu_us: per_request(cpu.client),
        load,
        warnings,
        open_loop_rate: None,
    })
}

/// The proxy's flags for a record store on fresh storage under `dir`.
async fn proxy_args(
    context: &Context,
    store: StoreKind,
    dir: &Path,
) -> Result<Vec<String>, BoxError> {
    let url = match store {
        StoreKind::Memory => "memory".to_owned(),
        StoreKind::Sqlite => format!("sqlite://{}", dir.join("proxy.db").display()),
        StoreKind::Redis => context.redis.clone(),
        StoreKind::Postgres => {
            fresh_database(context).await?;
            context.postgres_bench.clone()
        }
    };
    let mut args = vec![
        "--idempotency-store".to_owned(),
        url,
        "--ttl".to_owned(),
        context.ttl.to_string(),
    ];
    if let Some(audit) = &context.audit {
        args.extend(["--audit".to_owned(), audit.clone()]);
    }
    Ok(args)
}

/// CPU time spent in the measured window.
struct WindowCpu {
    hop: Duration,
    store: Option<Duration>,
    upstream: Duration,
    client: Duration,
}

async fn drive(
    addr: SocketAddr,
    plan: &LoadPlan,
    upstream: &UpstreamProcess,
    store: Option<&StoreProcesses>,
    hop_cpu: impl Fn() -> Result<Duration, BoxError>,
) -> Result<(LoadResult, WindowCpu), BoxError> {
    let keys = if plan.scenario == Scenario::Replay {
        let keys = load::replay_keys(&plan.principal);
        load::precomplete(addr, &plan.principal, &keys).await?;
        keys
    } else {
        vec!["unused".to_owned()]
    };
    let own_pid = std::process::id();
    let mut samples = Vec::with_capacity(2);
    let result = load::run(addr, plan, Rc::new(keys), || {
        samples.push((
            hop_cpu(),
            store.map(StoreProcesses::sample),
            upstream.cpu_time(),
            server::process_cpu_time(own_pid),
        ));
    })
    .await?;
    let [start, end] = <[_; 2]>::try_from(samples).map_err(|_| "missing CPU samples")?;
    let store = match (store, &start.1, &end.1) {
        (Some(StoreProcesses::None) | None, _, _) => None,
        (Some(_), Some(a), Some(b)) => Some(StoreProcesses::spent(a, b)),
        _ => None,
    };
    Ok((
        result,
        WindowCpu {
            hop: end.0?.saturating_sub(start.0?),
            store,
            upstream: end.2?.saturating_sub(start.2?),
            client: end.3?.saturating_sub(start.3?),
        },
    ))
}

impl ProxyReport {
    /// Every case but nginx, against the nginx runs around it (closed loop).
    pub(crate) fn rows(&self) -> BTreeMap<Case, Row> {
        let mut grouped: BTreeMap<Case, Vec<&ProxyRun>> = BTreeMap::new();
        for run in self.runs.iter().filter(|r| r.open_loop_rate.is_none()) {
            grouped.entry(run.case).or_default().push(run);
        }
        let neighbours = |run: &ProxyRun| -> Option<(f64, f64)> {
            let around: Vec<&ProxyRun> = self
                .runs
                .iter()
                .filter(|r| {
                    r.case == Case::Nginx
                        && r.open_loop_rate.is_none()
                        && r.round == run.round
                        && (r.seq + 1 == run.seq || r.seq == run.seq + 1)
                })
                .collect();
            if around.is_empty() {
                return None;
            }
            let n = around.len() as f64;
            Some((
                around.iter().map(|r| r.rps).sum::<f64>() / n,
                around.iter().map(|r| r.hop_cpu_us).sum::<f64>() / n,
            ))
        };
        grouped
            .into_iter()
            .map(|(case, runs)| {
                let bases: Vec<Option<(f64, f64)>> = runs
                    .iter()
                    .map(|run| {
                        if case == Case::Nginx {
                            Some((run.rps, run.hop_cpu_us))
                        } else {
                            neighbours(run)
                        }
                    })
                    .collect();
                let rps: Vec<_> = runs
                    .iter()
                    .zip(&bases)
                    .map(|(r, b)| (r.rps, b.map(|b| b.0)))
                    .collect();
                let cpu: Vec<_> = runs
                    .iter()
                    .zip(&bases)
                    .map(|(r, b)| (r.hop_cpu_us, b.map(|b| b.1)))
                    .collect();
                let of = |f: &dyn Fn(&ProxyRun) -> f64| {
                    median(&mut runs.iter().map(|r| f(r)).collect::<Vec<_>>())
                };
                let row = Row {
                    rps: figure(&rps),
                    cpu: figure(&cpu),
                    p50_ms: of(&|r| r.load.p50_us as f64 / 1000.0),
                    p99_ms: of(&|r| r.load.p99_us as f64 / 1000.0),
                    store_cpu_us: of(&|r| r.store_cpu_us.unwrap_or(f64::NAN)),
                    upstream_cpu_us: of(&|r| r.upstream_cpu_us),
                    errors: runs.iter().map(|r| r.load.error_count()).sum(),
                };
                (case, row)
            })
            .collect()
    }

    /// Each store's open-loop replay latency against the direct call's at the
    /// same rate: medians over the rounds.
    pub(crate) fn open_loop_rows(&self) -> Vec<OpenLoopRow> {
        let mut rows = Vec::new();
        for run in &self.runs {
            let (Case::Replay(store), Some(rate)) = (run.case, run.open_loop_rate) else {
                continue;
            };
            if rows.iter().any(|row: &OpenLoopRow| row.store == store) {
                continue;
            }
            let at_rate = |case: Case, of: &dyn Fn(&LoadResult) -> u64| {
                let mut values: Vec<f64> = self
                    .runs
                    .iter()
                    .filter(|r| r.case == case && r.open_loop_rate == Some(rate))
                    .map(|r| of(&r.load) as f64 / 1000.0)
                    .collect();
                median(&mut values)
            };
            rows.push(OpenLoopRow {
                store,
                rate,
                direct_p50_ms: at_rate(Case::Direct, &|l| l.p50_us),
                direct_p99_ms: at_rate(Case::Direct, &|l| l.p99_us),
                replay_p50_ms: at_rate(run.case, &|l| l.p50_us),
                replay_p99_ms: at_rate(run.case, &|l| l.p99_us),
            });
        }
        rows
    }

    /// The targets of the worker-model issue (25), in one run: the
    /// pass-through's CPU against nginx's, the keyed hop's CPU against the
    /// pass-through's, and replay p99 against direct's — closed loop (32
    /// connections on two cores: queueing) and, where measured, open loop at
    /// half load (issue 39's reading).
    pub(crate) fn targets(&self, rows: &BTreeMap<Case, Row>) -> Vec<Target> {
        let mut targets = Vec::new();
        let pass = rows.get(&Case::PassThrough);
        if let Some(pass) = pass {
            targets.push(Target::at_most(
                "keyless pass-through: proxy CPU per request ≤ 1.5 × nginx's",
                pass.cpu.ratio,
                1.5,
                "×",
            ));
        }
        if let (Some(pass), Some(new_key)) = (pass, rows.get(&Case::NewKey(StoreKind::Memory))) {
            targets.push(Target::at_most(
                "memory-store new key: hop CPU over the pass-through's ≤ 25 µs",
                new_key.cpu.median - pass.cpu.median,
                25.0,
                " µs",
            ));
        }
        if let Some(direct) = rows.get(&Case::Direct) {
            for (case, row) in rows {
                if let Case::Replay(store) = case {
                    targets.push(Target::at_most(
                        &format!("replay p99 added over direct ≤ 0.5 ms ({})", store.name()),
                        row.p99_ms - direct.p99_ms,
                        0.5,
                        " ms",
                    ));
                }
            }
        }
        for row in self.open_loop_rows() {
            targets.push(Target::at_most(
                &format!(
                    "replay p99 added over direct ≤ 0.5 ms, open loop at half load ({}, {:.0}/s)",
                    row.store.name(),
                    row.rate
                ),
                row.replay_p99_ms - row.direct_p99_ms,
                0.5,
                " ms",
            ));
        }
        targets
    }
}

/// One store's replays open loop against the direct call at the same rate.
#[derive(Debug, Clone)]
pub(crate) struct OpenLoopRow {
    pub(crate) store: StoreKind,
    /// Requests a second: half of the store's closed-loop replay rate.
    pub(crate) rate: f64,
    pub(crate) direct_p50_ms: f64,
    pub(crate) direct_p99_ms: f64,
    pub(crate) replay_p50_ms: f64,
    pub(crate) replay_p99_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(case: Case, round: usize, seq: usize, rps: f64, cpu: f64, p99_us: u64) -> ProxyRun {
        ProxyRun {
            case,
            round,
            seq,
            load: LoadResult {
                p99_us,
                ..LoadResult::default()
            },
            rps,
            hop_cpu_us: cpu,
            store_cpu_us: None,
            upstream_cpu_us: 10.0,
            client_cpu_us: 5.0,
            warnings: Vec::new(),
            open_loop_rate: None,
        }
    }

    #[test]
    fn cases_are_divided_by_the_nginx_runs_around_them() {
        let report = ProxyReport {
            machine: Machine::default(),
            command: String::new(),
            settings: Settings::default(),
            nginx: "1.22".to_owned(),
            nginx_workers: 2,
            runs: vec![
                run(Case::Nginx, 0, 0, 1000.0, 20.0, 1000),
                run(Case::PassThrough, 0, 1, 900.0, 27.0, 1200),
                run(Case::Nginx, 0, 2, 800.0, 16.0, 1000),
                run(Case::Direct, 0, 3, 2000.0, 10.0, 500),
                run(Case::Nginx, 0, 4, 1000.0, 20.0, 1000),
                run(Case::Replay(StoreKind::Memory), 0, 5, 900.0, 30.0, 2000),
                run(Case::Nginx, 0, 6, 1000.0, 20.0, 1000),
            ],
            failures: Vec::new(),
        };
        let rows = report.rows();
        let pass = &rows[&Case::PassThrough];
        assert!((pass.rps.ratio - 1.0).abs() < 1e-9, "{}", pass.rps.ratio);
        assert!((pass.cpu.ratio - 1.5).abs() < 1e-9, "{}", pass.cpu.ratio);
        let targets = report.targets(&rows);
        assert!(targets[0].met, "1.5× is within the bound");
        assert!(!targets[1].met, "replay p99 is 1.5 ms over direct");
        assert_eq!(targets.len(), 2, "no new-key run, no new-key target");
    }
    #[test]
    fn open_loop_runs_are_their_own_rows_and_targets() {
        let open = |case, p99_us| ProxyRun {
            open_loop_rate: Some(1500.0),
            ..run(case, 0, 0, 1500.0, 20.0, p99_us)
        };
        let report = ProxyReport {
            machine: Machine::default(),
            command: String::new(),
            settings: Settings::default(),
            nginx: "1.22".to_owned(),
            nginx_workers: 2,
            runs: vec![
                run(Case::Direct, 0, 1, 2000.0, 10.0, 5000),
                run(Case::Replay(StoreKind::Memory), 0, 3, 3000.0, 30.0, 6000),
                open(Case::Direct, 400),
                open(Case::Replay(StoreKind::Memory), 700),
            ],
            failures: Vec::new(),
        };
        let rows = report.rows();
        assert_eq!(rows[&Case::Direct].p99_ms, 5.0, "closed loop only");
        let open_rows = report.open_loop_rows();
        assert_eq!(open_rows.len(), 1);
        assert_eq!(open_rows[0].rate, 1500.0);
        assert!((open_rows[0].replay_p99_ms - open_rows[0].direct_p99_ms - 0.3).abs() < 1e-9);
        let targets = report.targets(&rows);
        assert!(!targets[0].met, "closed loop: 1 ms added");
        assert!(targets[1].met, "open loop: 0.3 ms added");
        assert!(report.markdown().contains("#### Replays open loop"));
    }
}
