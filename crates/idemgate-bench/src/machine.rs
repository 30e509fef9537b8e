//! What the numbers were measured on.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The machine and the servers the run used.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Machine {
    pub(crate) nproc: usize,
    pub(crate) cpu_model: String,
    pub(crate) kernel: String,
    pub(crate) memory_gib: f64,
    pub(crate) rustc: String,
    pub(crate) postgres: String,
    pub(crate) redis: String,
    /// Median and 99th percentile of a 4 KiB write + fdatasync in the temp dir:
    /// what one SQLite commit with `synchronous = FULL` waits for.
    pub(crate) fsync_p50_us: u64,
    pub(crate) fsync_p99_us: u64,
    pub(crate) load_average_at_start: String,
    pub(crate) date: String,
}

fn command_line(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Reads /proc and asks the tools; never fails (unknowns say so).
pub(crate) fn describe(postgres_url: &str, redis_url: &str, scratch: &Path) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .map(|rest| rest.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let redis_info = command_line("redis-cli", &["-u", redis_url, "INFO", "server"]);
    let redis_version = redis_info
        .lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .unwrap_or("unknown")
        .trim()
        .to_owned();
    let config = |name: &str| {
        command_line("redis-cli", &["-u", redis_url, "CONFIG", "GET", name])
            .lines()
            .nth(1)
            .unwrap_or("?")
            .to_owned()
    };
    let redis = format!(
        "Redis {redis_version} (appendonly {}, appendfsync {}, save \"{}\", maxmemory-policy {})",
        config("appendonly"),
        config("appendfsync"),
        config("save"),
        config("maxmemory-policy"),
    );
    let postgres = format!(
        "{} (synchronous_commit {}, fsync {})",
        command_line("psql", &[postgres_url, "-Atc", "SHOW server_version"]),
        command_line("psql", &[postgres_url, "-Atc", "SHOW synchronous_commit"]),
        command_line("psql", &[postgres_url, "-Atc", "SHOW fsync"]),
    );
    let (fsync_p50_us, fsync_p99_us) = fsync_latency(scratch).unwrap_or((0, 0));
    Machine {
        nproc: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".to_owned()),
        memory_gib,
        rustc: command_line("rustc", &["--version"]),
        postgres,
        redis,
        fsync_p50_us,
        fsync_p99_us,
        load_average_at_start: std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
        date: command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
    }
}

/// 200 × (4 KiB write + `sync_data`) in `dir`.
fn fsync_latency(dir: &Path) -> std::io::Result<(u64, u64)> {
    let path = dir.join("fsync-probe");
    let mut file = std::fs::File::create(&path)?;
    let block = [0u8; 4096];
    let mut samples = Vec::with_capacity(200);
    for _ in 0..200 {
        let start = Instant::now();
        file.write_all(&block)?;
        file.sync_data()?;
        samples.push(start.elapsed());
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    samples.sort();
    let at = |q: f64| -> u64 {
        let index = ((samples.len() - 1) as f64 * q).round() as usize;
        samples
            .get(index)
            .copied()
            .unwrap_or(Duration::ZERO)
            .as_micros() as u64
    };
    Ok((at(0.5), at(0.99)))
}
