//! The service suite (`--suite service`, the default): `idemgate serve` per
//! store and scenario against its own `--no-idempotency` baseline.
//!
//! Per store and round: `bare, s1, bare, s2, …, bare` (scenario order rotated
//! per round; `transfer` sits between two `bare-transfer` runs instead), every
//! run on a freshly started server and a fresh orders database; then the
//! store's ceiling (`redis-benchmark`, `pgbench`).

use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use crate::load::{self, LoadPlan, Scenario};
use crate::report::{Report, RunRecord, StoreKind};
use crate::server::{self, ServerProcess};
use crate::store::{StoreProcesses, drop_database, fresh_database};
use crate::{Args, BoxError, Context, Prepared, ceiling, command_line, finish, prepare};

/// The suite, from setup to the saved report: every store's rounds, then the
/// ceilings.
pub(crate) async fn suite(args: &Args, root: &Path) -> Result<Report, BoxError> {
    let Prepared {
        context,
        machine,
        settings,
        stores,
    } = prepare(args, root, None).await?;
    let scenarios: Vec<Scenario> = args
        .scenarios
        .iter()
        .map(|s| Scenario::parse(s).ok_or_else(|| format!("unknown scenario {s:?}")))
        .filter(|s| !matches!(s, Ok(Scenario::Bare)))
        .collect::<Result<_, _>>()?;
    let rounds = settings.rounds;
    let warmup = Duration::from_secs_f64(settings.warmup_s);
    let measure = Duration::from_secs_f64(settings.measure_s);
    let ceiling_s = settings.ceiling_s;
    let mut report = Report {
        machine,
        command: command_line(),
        settings,
        runs: Vec::new(),
        ceilings: Vec::new(),
        failures: Vec::new(),
    };
    let outcome = async {
        for store in &stores {
            let mut seq = 0;
            for round in 0..rounds {
                // Transfers claim in two phases anyway where the records are
                // not in the orders database: nothing to compare there.
                let mut order: Vec<Scenario> = scenarios
                    .iter()
                    .copied()
                    .filter(|s| {
                        *s != Scenario::TransferTwoPhase
                            || matches!(store, StoreKind::Sqlite | StoreKind::Postgres)
                    })
                    .collect();
                let len = order.len();
                if len > 0 {
                    order.rotate_left(round % len);
                }
                // bare, s1, bare, s2, …, bare: every scenario run sits between two
                // runs of its baseline, and is divided by their mean.
                let mut sequence: Vec<Scenario> = Vec::new();
                for scenario in order {
                    if sequence.last() != Some(&scenario.baseline()) {
                        sequence.push(scenario.baseline());
                    }
                    sequence.extend([scenario, scenario.baseline()]);
                }
                if sequence.is_empty() {
                    sequence.push(Scenario::Bare);
                }
                for scenario in sequence {
                    seq += 1;
                    let connections = if scenario == Scenario::Contended {
                        args.contended_connections
                    } else {
                        args.connections
                    };
                    let plan = LoadPlan {
                        scenario,
                        connections,
                        warmup,
                        measure,
                        principal: format!("bench-{}", uuid::Uuid::new_v4().simple()),
                        rate: None,
                    };
                    match one_run(&context, *store, round, &plan).await {
                        Ok(mut record) => {
                            record.seq = seq;
                            eprintln!(
                                "[bench] {:>8} {:>9} round {round}: {:>7.0} req/s, p50 {:.2} ms, p99 {:.2} ms, CPU {:.0} µs/req (store {}, client {:.0}), RSS {:.1} MiB, errors {}",
                                store.name(),
                                scenario.name(),
                                record.rps,
                                record.load.p50_us as f64 / 1000.0,
                                record.load.p99_us as f64 / 1000.0,
                                record.cpu_us_per_req,
                                record
                                    .store_cpu_us_per_req
                                    .map_or("-".to_owned(), |c| format!("{c:.0}")),
                                record.client_cpu_us_per_req,
                                record.peak_rss_kib as f64 / 1024.0,
                                record.load.error_count()
                            );
                            report.runs.push(record);
                        }
                        Err(error) => {
                            let failure = format!(
                                "{} {} round {round}: {error}",
                                store.name(),
                                scenario.name()
                            );
                            eprintln!("[bench] FAILED {failure}");
                            report.failures.push(failure);
                        }
                    }
                }
            }
            if ceiling_s > 0 {
                let duration = Duration::from_secs(ceiling_s);
                let measured = match store {
                    StoreKind::Redis => {
                        let redis = StoreProcesses::of(StoreKind::Redis, context.redis_pid);
                        Some(ceiling::redis(&context.redis, args.connections, duration, &redis).await)
                    }
                    StoreKind::Postgres => Some(postgres_ceiling(&context, args.connections, duration).await),
                    StoreKind::Memory | StoreKind::Sqlite => None,
                };
                match measured {
                    Some(Ok(c)) => {
                        eprintln!(
                            "[bench] {} ceiling: {:.0} {}/s",
                            c.store, c.ops_per_sec, c.operation
                        );
                        report.ceilings.push(c);
                    }
                    Some(Err(error)) => {
                        let failure = format!("{} ceiling: {error}", store.name());
                        eprintln!("[bench] FAILED {failure}");
                        report.failures.push(failure);
                    }
                    None => {}
                }
            }
        }
        Ok::<_, BoxError>(())
    }
    .await;
    if outcome.is_err() {
        if stores.contains(&StoreKind::Postgres) {
            let _ = drop_database(&context).await;
        }
        let _ = std::fs::remove_dir_all(&context.scratch);
    }
    outcome?;
    finish(&context, &stores, root, "last-run.json", &report).await?;
    Ok(report)
}

/// The server's flags for `store`, on fresh orders storage under `dir`.
async fn server_args(
    context: &Context,
    store: StoreKind,
    scenario: Scenario,
    dir: &Path,
) -> Result<Vec<String>, BoxError> {
    let sqlite = format!("sqlite://{}", dir.join("orders.db").display());
    let (database, records) = match store {
        StoreKind::Memory => (sqlite, "memory".to_owned()),
        StoreKind::Sqlite => (sqlite, "database".to_owned()),
        StoreKind::Redis => (sqlite, context.redis.clone()),
        StoreKind::Postgres => {
            fresh_database(context).await?;
            (context.postgres_bench.clone(), "database".to_owned())
        }
    };
    let mut args = vec![
        "--database".to_owned(),
        database,
        "--idempotency-store".to_owned(),
        records,
        "--ttl".to_owned(),
        context.ttl.to_string(),
    ];
    if scenario.is_baseline() {
        args.push("--no-idempotency".to_owned());
    }
    if scenario == Scenario::TransferTwoPhase {
        args.push("--two-phase-transfers".to_owned());
    }
    if let Some(entries) = context.replay_cache_entries {
        args.extend(["--replay-cache-entries".to_owned(), entries.to_string()]);
    }
    if let Some(audit) = &context.audit
        && !scenario.is_baseline()
    {
        args.extend(["--audit".to_owned(), audit.clone()]);
    }
    Ok(args)
}

async fn one_run(
    context: &Context,
    store: StoreKind,
    round: usize,
    plan: &LoadPlan,
) -> Result<RunRecord, BoxError> {
    let dir = context
        .scratch
        .join(format!("{}-{}-{round}", store.name(), plan.scenario.name()));
    std::fs::create_dir_all(&dir)?;
    let args = server_args(context, store, plan.scenario, &dir).await?;
    // A bare run uses no Redis; PostgreSQL still holds its orders.
    let store_processes = match store {
        StoreKind::Redis if plan.scenario.is_baseline() => StoreProcesses::None,
        _ => StoreProcesses::of(store, context.redis_pid),
    };
    let server = ServerProcess::start(&context.binary, &args).await?;
    let result = drive(&server, plan, &store_processes).await;
    let peak_rss_kib = server.peak_rss_kib();
    let warnings = server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    let (load, cpu) = result?;
    let good = load.good.max(1) as f64;
    let per_request = |d: Duration| d.as_secs_f64() * 1e6 / good;
    Ok(RunRecord {
        store,
        scenario: plan.scenario,
        round,
        seq: 0,
        connections: plan.connections,
        rps: load.good as f64 / load.seconds,
        cpu_us_per_req: per_request(cpu.server),
        store_cpu_us_per_req: cpu.store.map(per_request),
        client_cpu_us_per_req: per_request(cpu.client),
        peak_rss_kib: peak_rss_kib?,
        load,
        server_warnings: warnings,
    })
}

/// CPU time spent in the measured window.
struct WindowCpu {
    server: Duration,
    /// The store's own processes (Redis, PostgreSQL backends); `None` when the
    /// store runs inside the server or the run uses no store.
    store: Option<Duration>,
    /// This load generator.
    client: Duration,
}

/// Prepares the scenario's keys, runs the load, and samples the CPU time of the
/// server, the store and this process at both ends of the measured window.
async fn drive(
    server: &ServerProcess,
    plan: &LoadPlan,
    store: &StoreProcesses,
) -> Result<(load::LoadResult, WindowCpu), BoxError> {
    let keys = if plan.scenario == Scenario::Replay {
        let keys = load::replay_keys(&plan.principal);
        load::precomplete(server.addr, &plan.principal, &keys).await?;
        keys
    } else if plan.scenario.is_transfer() {
        load::open_accounts(server.addr, &plan.principal).await?
    } else {
        vec!["unused".to_owned()]
    };
    let own_pid = std::process::id();
    let mut samples = Vec::with_capacity(2);
    let result = load::run(server.addr, plan, Rc::new(keys), || {
        samples.push((
            server.cpu_time(),
            store.sample(),
            server::process_cpu_time(own_pid),
        ));
    })
    .await?;
    let [start, end] = <[_; 2]>::try_from(samples).map_err(|_| "missing CPU samples")?;
    let cpu = WindowCpu {
        server: end.0?.saturating_sub(start.0?),
        store: (!matches!(store, StoreProcesses::None))
            .then(|| StoreProcesses::spent(&start.1, &end.1)),
        client: end.2?.saturating_sub(start.2?),
    };
    Ok((result, cpu))
}

/// Migrates a fresh bench database with the store's own migration (by starting the
/// server once), then runs pgbench on it.
async fn postgres_ceiling(
    context: &Context,
    connections: usize,
    duration: Duration,
) -> Result<ceiling::Ceiling, BoxError> {
    let dir = context.scratch.join("postgres-ceiling");
    std::fs::create_dir_all(&dir)?;
    let args = server_args(context, StoreKind::Postgres, Scenario::NewKey, &dir).await?;
    let server = ServerProcess::start(&context.binary, &args).await?;
    server.stop().await;
    let backends = StoreProcesses::of(StoreKind::Postgres, None);
    ceiling::postgres(
        &context.postgres_bench,
        connections,
        duration,
        &dir,
        &backends,
    )
    .await
}
