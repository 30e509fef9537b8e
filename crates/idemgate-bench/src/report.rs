//! From runs to medians, ratios to `bare`, targets, and the Markdown report.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::ceiling::Ceiling;
use crate::load::{LoadResult, Scenario};
use crate::machine::Machine;

/// Where the idempotency records (and the orders) live in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum StoreKind {
    /// `--idempotency-store memory`, orders in a fresh SQLite file.
    Memory,
    /// The default: records and orders in one fresh SQLite file, transactional.
    Sqlite,
    /// Records and orders in a fresh PostgreSQL database, transactional.
    Postgres,
    /// `--idempotency-store redis://…`, orders in a fresh SQLite file.
    Redis,
}

impl StoreKind {
    pub(crate) const ALL: [Self; 4] = [Self::Memory, Self::Sqlite, Self::Postgres, Self::Redis];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::Redis => "redis",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Where the orders live, for the report.
    pub(crate) fn orders(self) -> &'static str {
        match self {
            Self::Memory | Self::Redis => "SQLite file (records elsewhere)",
            Self::Sqlite => "the same SQLite file (transactional)",
            Self::Postgres => "the same PostgreSQL database (transactional)",
        }
    }
}

/// One server run under one scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunRecord {
    pub(crate) store: StoreKind,
    pub(crate) scenario: Scenario,
    pub(crate) round: usize,
    /// Position in the store's sequence of runs: a scenario's neighbours
    /// (`seq` ± 1) are the `bare` runs it is compared with.
    #[serde(default)]
    pub(crate) seq: usize,
    pub(crate) connections: usize,
    pub(crate) load: LoadResult,
    /// Expected answers per second in the measured window.
    pub(crate) rps: f64,
    /// Server CPU time (user + system) in the window, per expected answer.
    pub(crate) cpu_us_per_req: f64,
    /// The store's own processes' CPU time (Redis, PostgreSQL backends) per
    /// expected answer; `None` for in-process stores and `bare`.
    #[serde(default)]
    pub(crate) store_cpu_us_per_req: Option<f64>,
    /// The load generator's CPU time per expected answer.
    #[serde(default)]
    pub(crate) client_cpu_us_per_req: f64,
    /// The server process's peak RSS (`VmHWM`) at the end of the window.
    pub(crate) peak_rss_kib: u64,
    /// WARN/ERROR lines the server logged.
    pub(crate) server_warnings: Vec<String>,
}

/// The run's settings, as the report states them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Settings {
    pub(crate) mode: String,
    pub(crate) rounds: usize,
    pub(crate) warmup_s: f64,
    pub(crate) measure_s: f64,
    pub(crate) connections: usize,
    pub(crate) contended_connections: usize,
    pub(crate) ttl_s: u64,
    pub(crate) ceiling_s: u64,
}

/// Everything a run produced; saved as JSON so the report can be rebuilt.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Report {
    pub(crate) machine: Machine,
    pub(crate) command: String,
    pub(crate) settings: Settings,
    pub(crate) runs: Vec<RunRecord>,
    pub(crate) ceilings: Vec<Ceiling>,
    pub(crate) failures: Vec<String>,
}

/// A metric's median across rounds, and its ratio to `bare` of the same round.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Figure {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) ratio: f64,
    pub(crate) ratio_min: f64,
    pub(crate) ratio_max: f64,
}

/// One (store, scenario) over all rounds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cell {
    pub(crate) rps: Figure,
    pub(crate) p50_ms: Figure,
    pub(crate) p99_ms: Figure,
    pub(crate) p999_ms: Figure,
    pub(crate) cpu_us: Figure,
    /// Median over rounds of (CPU µs/request − bare's, same round).
    pub(crate) cpu_added_us: f64,
    pub(crate) rss_mib: Figure,
    /// Median store-process CPU µs/request (NaN when not measured).
    pub(crate) store_cpu_us: f64,
    /// Median load-generator CPU µs/request.
    pub(crate) client_cpu_us: f64,
    pub(crate) executed: u64,
    pub(crate) replayed: u64,
    pub(crate) conflicts: u64,
    pub(crate) errors: u64,
    pub(crate) error_kinds: BTreeMap<String, u64>,
    pub(crate) connections: usize,
}

pub(crate) fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

pub(crate) fn figure(pairs: &[(f64, Option<f64>)]) -> Figure {
    let mut values: Vec<f64> = pairs.iter().map(|(v, _)| *v).collect();
    let mut ratios: Vec<f64> = pairs
        .iter()
        .filter_map(|(v, bare)| bare.filter(|b| *b > 0.0).map(|b| v / b))
        .collect();
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let ratio_min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let ratio_max = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Figure {
        median: median(&mut values),
        min,
        max,
        ratio: median(&mut ratios),
        ratio_min,
        ratio_max,
    }
}

impl Report {
    /// Medians and ratios per (store, scenario).
    pub(crate) fn cells(&self) -> BTreeMap<(StoreKind, Scenario), Cell> {
        let mut grouped: BTreeMap<(StoreKind, Scenario), Vec<&RunRecord>> = BTreeMap::new();
        for run in &self.runs {
            grouped
                .entry((run.store, run.scenario))
                .or_default()
                .push(run);
        }
        // The bare figure a run is divided by: the mean of the bare runs just
        // before and after it (one of them when the other failed).
        let baseline = |run: &RunRecord, metric: &dyn Fn(&RunRecord) -> f64| -> Option<f64> {
            if run.scenario == Scenario::Bare {
                return Some(metric(run));
            }
            let neighbours: Vec<f64> = self
                .runs
                .iter()
                .filter(|r| {
                    r.store == run.store
                        && r.scenario == Scenario::Bare
                        && (r.seq + 1 == run.seq || r.seq == run.seq + 1)
                })
                .map(metric)
                .collect();
            (!neighbours.is_empty())
                .then(|| neighbours.iter().sum::<f64>() / neighbours.len() as f64)
        };
        let mut cells = BTreeMap::new();
        for ((store, scenario), runs) in grouped {
            let pairs = |metric: &dyn Fn(&RunRecord) -> f64| -> Vec<(f64, Option<f64>)> {
                runs.iter()
                    .map(|run| (metric(run), baseline(run, metric)))
                    .collect()
            };
            let mut added: Vec<f64> = runs
                .iter()
                .filter_map(|run| {
                    baseline(run, &|r| r.cpu_us_per_req).map(|b| run.cpu_us_per_req - b)
                })
                .collect();
            let mut cell = Cell {
                rps: figure(&pairs(&|r| r.rps)),
                p50_ms: figure(&pairs(&|r| r.load.p50_us as f64 / 1000.0)),
                p99_ms: figure(&pairs(&|r| r.load.p99_us as f64 / 1000.0)),
                p999_ms: figure(&pairs(&|r| r.load.p999_us as f64 / 1000.0)),
                cpu_us: figure(&pairs(&|r| r.cpu_us_per_req)),
                cpu_added_us: median(&mut added),
                rss_mib: figure(&pairs(&|r| r.peak_rss_kib as f64 / 1024.0)),
                store_cpu_us: median(
                    &mut runs
                        .iter()
                        .filter_map(|r| r.store_cpu_us_per_req)
                        .collect::<Vec<_>>(),
                ),
                client_cpu_us: median(
                    &mut runs
                        .iter()
                        .map(|r| r.client_cpu_us_per_req)
                        .collect::<Vec<_>>(),
                ),
                connections: runs.first().map_or(0, |r| r.connections),
                ..Cell::default()
            };
            for run in runs {
                cell.executed += run.load.executed;
                cell.replayed += run.load.replayed;
                cell.conflicts += run.load.conflicts;
                cell.errors += run.load.error_count();
                for (kind, count) in &run.load.errors {
                    *cell.error_kinds.entry(kind.clone()).or_default() += count;
                }
            }
            cells.insert((store, scenario), cell);
        }
        cells
    }

    fn ceiling(&self, store: StoreKind) -> Option<&Ceiling> {
        self.ceilings.iter().find(|c| c.store == store.name())
    }

    /// The issue's targets, judged on this run.
    pub(crate) fn targets(&self) -> Vec<Target> {
        let cells = self.cells();
        let cell = |store, scenario| cells.get(&(store, scenario));
        let mut targets = Vec::new();
        if let Some(c) = cell(StoreKind::Memory, Scenario::NewKey) {
            targets.push(Target::at_least(
                "memory new-key ≥ 0.85 × bare (req/s)",
                c.rps.ratio,
                0.85,
                "×",
            ));
        }
        for store in StoreKind::ALL {
            if let Some(c) = cell(store, Scenario::Replay) {
                targets.push(Target::at_least(
                    &format!("{} replay ≥ 1.0 × bare (req/s)", store.name()),
                    c.rps.ratio,
                    1.0,
                    "×",
                ));
            }
        }
        for store in StoreKind::ALL {
            if let Some(c) = cell(store, Scenario::NoKey) {
                targets.push(Target::at_least(
                    &format!("{} no-key ≥ 0.95 × bare (req/s)", store.name()),
                    c.rps.ratio,
                    0.95,
                    "×",
                ));
            }
        }
        for store in [StoreKind::Redis, StoreKind::Postgres] {
            if let (Some(c), Some(ceiling)) = (cell(store, Scenario::NewKey), self.ceiling(store)) {
                targets.push(Target::at_least(
                    &format!(
                        "{} new-key ≥ 0.7 × the store's ceiling ({:.0} {}/s)",
                        store.name(),
                        ceiling.ops_per_sec,
                        if store == StoreKind::Redis {
                            "claims"
                        } else {
                            "claim+complete"
                        }
                    ),
                    c.rps.median / ceiling.ops_per_sec,
                    0.7,
                    "×",
                ));
            }
        }
        // Issue 11 ("Faster stores"): new keys per store against bare, and every
        // store's replay (the replay cache on) against the memory store's.
        for (store, floor) in [
            (StoreKind::Sqlite, 0.7),
            (StoreKind::Redis, 0.9),
            (StoreKind::Postgres, 0.55),
        ] {
            if let Some(c) = cell(store, Scenario::NewKey) {
                targets.push(Target::at_least(
                    &format!("{} new-key ≥ {floor} × bare (req/s)", store.name()),
                    c.rps.ratio,
                    floor,
                    "×",
                ));
            }
        }
        if let Some(c) = cell(StoreKind::Redis, Scenario::NewKey) {
            targets.push(Target::at_most(
                "redis new-key adds ≤ 60 µs of server CPU over bare",
                c.cpu_added_us,
                60.0,
                " µs",
            ));
        }
        let memory_replay = cell(StoreKind::Memory, Scenario::Replay).map(|c| c.rps.median);
        for store in StoreKind::ALL {
            let Some(c) = cell(store, Scenario::Replay) else {
                continue;
            };
            if let (Some(memory), true) = (memory_replay, store != StoreKind::Memory) {
                targets.push(Target::at_least(
                    &format!("{} replay ≥ 0.8 × memory's replay (req/s)", store.name()),
                    c.rps.median / memory,
                    0.8,
                    "×",
                ));
            }
            targets.push(Target {
                name: format!(
                    "{} replay p99 ≤ 1 ms at {} connections",
                    store.name(),
                    c.connections
                ),
                measured: format!("{:.2} ms", c.p99_ms.median),
                met: c.p99_ms.median <= 1.0,
            });
        }
        targets
    }

    /// The generated part of docs/benchmarks.md (and the terminal report).
    pub(crate) fn markdown(&self, chart: Option<&str>) -> String {
        let mut out = String::new();
        let m = &self.machine;
        let s = &self.settings;
        let _ = writeln!(out, "Generated by `idemgate-bench` on {}.\n", m.date);
        let _ = writeln!(out, "```sh\n{}\n```\n", self.command);
        let _ = writeln!(out, "### Machine\n");
        let _ = writeln!(out, "| | |\n|---|---|");
        let _ = writeln!(out, "| CPUs (nproc) | {} |", m.nproc);
        let _ = writeln!(out, "| CPU model | {} |", m.cpu_model);
        let _ = writeln!(out, "| kernel | {} |", m.kernel);
        let _ = writeln!(out, "| memory | {:.1} GiB |", m.memory_gib);
        let _ = writeln!(
            out,
            "| 4 KiB write + fdatasync (temp dir) | p50 {} µs, p99 {} µs |",
            m.fsync_p50_us, m.fsync_p99_us
        );
        let _ = writeln!(out, "| PostgreSQL | {} |", m.postgres);
        let _ = writeln!(out, "| Redis | {} |", m.redis);
        let _ = writeln!(out, "| rustc | {} |", m.rustc);
        let _ = writeln!(
            out,
            "| load average at start | {} (the machine is shared) |\n",
            m.load_average_at_start
        );
        let _ = writeln!(out, "### Settings\n");
        let _ = writeln!(
            out,
            "- mode `{}`: {} round(s) per store, each `bare, s1, bare, s2, …, bare` (scenario \
             order rotated per round), every run on a freshly started server and a fresh \
             orders database; {:.1} s warm-up, then {:.1} s measured.",
            s.mode, s.rounds, s.warmup_s, s.measure_s
        );
        let _ = writeln!(
            out,
            "- {} keep-alive HTTP/1.1 connections ({} for `contended`), closed loop, from one \
             client thread on the same machine. Every request is `POST /api/v1/orders` with \
             `Authorization: Bearer <fresh per run>` and the README's body \
             `{{\"items\":[{{\"id\":42,\"quantity\":1}}],\"currency\":\"RUB\",\"amount\":1500}}`; \
             the built-in simulated gateway approves every charge.",
            s.connections, s.contended_connections
        );
        let _ = writeln!(
            out,
            "- Ratios are per run (a scenario against the mean of the two `bare` runs just \
             before and after it, same store), then the median over rounds; brackets give \
             the min–max over rounds. `+CPU` is the server CPU time per request the layer \
             adds over `bare`; store CPU is Redis's process or the PostgreSQL backends of \
             the bench database; client CPU is this load generator."
        );
        let _ = writeln!(
            out,
            "- Server flags: `--ttl {}` (the benchmark's records expire by themselves; the \
             work per request does not depend on it), everything else as shipped: SQLite WAL \
             with `synchronous = FULL`, PostgreSQL and Redis as configured above.",
            s.ttl_s
        );
        let _ = writeln!(out, "- Orders database per store:");
        for store in StoreKind::ALL {
            let _ = writeln!(out, "  - `{}`: {}", store.name(), store.orders());
        }
        let _ = writeln!(out);

        let cells = self.cells();
        let _ = writeln!(out, "### Targets\n");
        let _ = writeln!(out, "| target | measured | met |\n|---|---|---|");
        for target in self.targets() {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                target.name,
                target.measured,
                if target.met { "yes" } else { "**no**" }
            );
        }
        let _ = writeln!(out);

        if let Some(chart) = chart {
            let _ = writeln!(out, "![throughput and CPU per request]({chart})\n");
        }

        let _ = writeln!(out, "### Throughput and server CPU\n");
        let _ = writeln!(
            out,
            "| store | scenario | req/s | × bare | server CPU µs/req | × bare | +CPU µs/req | store CPU µs/req | client CPU µs/req | errors |"
        );
        let _ = writeln!(out, "|---|---|---:|---|---:|---|---:|---:|---:|---:|");
        for ((store, scenario), c) in &cells {
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {} | {:.0} | {} | {} | {} | {:.0} | {} |",
                store.name(),
                scenario.name(),
                c.rps.median,
                ratio(&c.rps, *scenario),
                c.cpu_us.median,
                ratio(&c.cpu_us, *scenario),
                if *scenario == Scenario::Bare {
                    "—".to_owned()
                } else {
                    format!("{:+.0}", c.cpu_added_us)
                },
                if c.store_cpu_us.is_nan() {
                    "—".to_owned()
                } else {
                    format!("{:.0}", c.store_cpu_us)
                },
                c.client_cpu_us,
                c.errors
            );
        }
        let _ = writeln!(out);

        let _ = writeln!(out, "### Latency (ms)\n");
        let _ = writeln!(
            out,
            "| store | scenario | p50 | × bare | p99 | × bare | p99.9 | × bare |"
        );
        let _ = writeln!(out, "|---|---|---:|---|---:|---|---:|---|");
        for ((store, scenario), c) in &cells {
            let _ = writeln!(
                out,
                "| {} | {} | {:.2} | {} | {:.2} | {} | {:.2} | {} |",
                store.name(),
                scenario.name(),
                c.p50_ms.median,
                ratio(&c.p50_ms, *scenario),
                c.p99_ms.median,
                ratio(&c.p99_ms, *scenario),
                c.p999_ms.median,
                ratio(&c.p999_ms, *scenario),
            );
        }
        let _ = writeln!(out);

        let _ = writeln!(out, "### Peak RSS and outcomes\n");
        let _ = writeln!(
            out,
            "| store | scenario | peak RSS MiB | × bare | executed | replayed | 409 | unexpected |"
        );
        let _ = writeln!(out, "|---|---|---:|---|---:|---:|---:|---|");
        for ((store, scenario), c) in &cells {
            let total = (c.executed + c.replayed + c.conflicts + c.errors).max(1) as f64;
            let pct = |n: u64| format!("{:.1}%", 100.0 * n as f64 / total);
            let unexpected = if c.error_kinds.is_empty() {
                "0".to_owned()
            } else {
                c.error_kinds
                    .iter()
                    .map(|(k, n)| format!("{k}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} | {} | {} | {} | {} | {} |",
                store.name(),
                scenario.name(),
                c.rss_mib.median,
                ratio(&c.rss_mib, *scenario),
                pct(c.executed),
                pct(c.replayed),
                pct(c.conflicts),
                unexpected
            );
        }
        let _ = writeln!(out);

        let _ = writeln!(out, "### Store ceilings\n");
        if self.ceilings.is_empty() {
            let _ = writeln!(out, "Not measured in this run.\n");
        } else {
            let _ = writeln!(
                out,
                "| store | one operation | ceiling ops/s | store CPU µs/op at the ceiling | new-key req/s | store CPU µs/new-key | new-key / ceiling | bare req/s / ceiling |"
            );
            let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|");
            for ceiling in &self.ceilings {
                let store = StoreKind::parse(&ceiling.store);
                let rps = |scenario| {
                    store
                        .and_then(|s| cells.get(&(s, scenario)))
                        .map_or(f64::NAN, |c| c.rps.median)
                };
                let new_key_cpu = store
                    .and_then(|s| cells.get(&(s, Scenario::NewKey)))
                    .map_or(f64::NAN, |c| c.store_cpu_us);
                let _ = writeln!(
                    out,
                    "| {} | {} | {:.0} | {} | {:.0} | {:.0} | {:.3} | {:.3} |",
                    ceiling.store,
                    ceiling.operation,
                    ceiling.ops_per_sec,
                    ceiling
                        .store_cpu_us_per_op
                        .map_or("—".to_owned(), |c| format!("{c:.0}")),
                    rps(Scenario::NewKey),
                    new_key_cpu,
                    rps(Scenario::NewKey) / ceiling.ops_per_sec,
                    rps(Scenario::Bare) / ceiling.ops_per_sec,
                );
            }
            let _ = writeln!(out);
            for ceiling in &self.ceilings {
                let _ = writeln!(out, "- `{}`: `{}`", ceiling.store, ceiling.command);
                for note in &ceiling.notes {
                    let _ = writeln!(out, "  - {note}");
                }
            }
            let _ = writeln!(out);
        }
        if !self.failures.is_empty() {
            let _ = writeln!(out, "### Failures\n");
            for failure in &self.failures {
                let _ = writeln!(out, "- {failure}");
            }
            let _ = writeln!(out);
        }
        let warnings: Vec<String> = self
            .runs
            .iter()
            .flat_map(|r| {
                r.server_warnings.iter().map(move |w| {
                    format!(
                        "{} {} round {}: {w}",
                        r.store.name(),
                        r.scenario.name(),
                        r.round
                    )
                })
            })
            .filter(|w| !w.contains("--no-idempotency"))
            .collect();
        if !warnings.is_empty() {
            let _ = writeln!(out, "### Server warnings\n");
            for warning in warnings.iter().take(20) {
                let short: String = warning.chars().take(240).collect();
                let _ = writeln!(out, "- `{short}…`");
            }
            let _ = writeln!(out);
        }
        out
    }
}

fn ratio(figure: &Figure, scenario: Scenario) -> String {
    if scenario == Scenario::Bare {
        return "1".to_owned();
    }
    if figure.ratio.is_nan() {
        return "—".to_owned();
    }
    if (figure.ratio_max - figure.ratio_min).abs() < 0.005 {
        format!("{:.2}×", figure.ratio)
    } else {
        format!(
            "{:.2}× [{:.2}–{:.2}]",
            figure.ratio, figure.ratio_min, figure.ratio_max
        )
    }
}

/// A target of the issue and whether this run met it.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) measured: String,
    pub(crate) met: bool,
}

impl Target {
    pub(crate) fn at_most(name: &str, value: f64, ceiling: f64, unit: &str) -> Self {
        Self {
            name: name.to_owned(),
            measured: format!("{value:.3}{unit}"),
            met: value <= ceiling,
        }
    }

    pub(crate) fn at_least(name: &str, value: f64, floor: f64, unit: &str) -> Self {
        Self {
            name: name.to_owned(),
            measured: format!("{value:.3}{unit}"),
            met: value >= floor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }

    #[test]
    fn ratios_divide_by_the_mean_of_the_neighbouring_bare_runs() {
        let run = |scenario, seq, rps: f64| RunRecord {
            store: StoreKind::Memory,
            scenario,
            round: 0,
            seq,
            connections: 32,
            load: LoadResult::default(),
            rps,
            cpu_us_per_req: 100.0,
            store_cpu_us_per_req: None,
            client_cpu_us_per_req: 10.0,
            peak_rss_kib: 1024,
            server_warnings: Vec::new(),
        };
        let report = Report {
            machine: Machine::default(),
            command: String::new(),
            settings: Settings {
                mode: "quick".into(),
                rounds: 2,
                warmup_s: 1.0,
                measure_s: 1.0,
                connections: 32,
                contended_connections: 64,
                ttl_s: 900,
                ceiling_s: 1,
            },
            runs: vec![
                run(Scenario::Bare, 1, 1000.0),
                run(Scenario::NewKey, 2, 900.0),
                run(Scenario::Bare, 3, 1000.0),
                run(Scenario::NewKey, 4, 400.0),
                run(Scenario::Bare, 5, 500.0),
            ],
            ceilings: Vec::new(),
            failures: Vec::new(),
        };
        let cells = report.cells();
        let new_key = &cells[&(StoreKind::Memory, Scenario::NewKey)];
        // 900 / mean(1000, 1000) and 400 / mean(1000, 500).
        assert!(
            (new_key.rps.ratio_max - 0.9).abs() < 1e-9,
            "{:?}",
            new_key.rps
        );
        assert!((new_key.rps.ratio_min - 400.0 / 750.0).abs() < 1e-9);
        assert_eq!(new_key.cpu_added_us, 0.0);
        let targets = report.targets();
        assert!(!targets[0].met, "{targets:?}");
    }
}
