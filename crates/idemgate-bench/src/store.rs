//! The stores the runs use, outside the server: their processes (whose CPU a
//! run samples) and the PostgreSQL bench database (created fresh for every run,
//! dropped at the end).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::server::process_cpu_time;
use crate::{BoxError, Context};

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

/// The processes whose CPU a store spends on the benchmark.
#[derive(Debug, Clone)]
pub(crate) enum StoreProcesses {
    /// No separate process (memory, SQLite: in the server).
    None,
    /// One server process (Redis).
    Pid(u32),
    /// The PostgreSQL backends connected to this database (found by their
    /// process title, `postgres: USER DATABASE …`).
    PostgresBackends(String),
}

impl StoreProcesses {
    /// The processes `store` runs as outside the server: Redis's (when its pid
    /// is known) or the bench database's PostgreSQL backends; none for the
    /// stores inside the server.
    pub(crate) fn of(store: StoreKind, redis_pid: Option<u32>) -> Self {
        match store {
            StoreKind::Memory | StoreKind::Sqlite => Self::None,
            StoreKind::Redis => redis_pid.map_or(Self::None, Self::Pid),
            StoreKind::Postgres => Self::PostgresBackends(BENCH_DATABASE.to_owned()),
        }
    }

    /// CPU time so far, per process.
    pub(crate) fn sample(&self) -> Vec<(u32, Duration)> {
        match self {
            Self::None => Vec::new(),
            Self::Pid(pid) => process_cpu_time(*pid)
                .map(|cpu| vec![(*pid, cpu)])
                .unwrap_or_default(),
            Self::PostgresBackends(database) => {
                let needle = format!(" {database} ");
                let Ok(entries) = std::fs::read_dir("/proc") else {
                    return Vec::new();
                };
                entries
                    .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
                    .filter(|pid| {
                        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                            let title = String::from_utf8_lossy(&cmdline);
                            title.starts_with("postgres: ") && title.contains(&needle)
                        })
                    })
                    .filter_map(|pid| process_cpu_time(pid).ok().map(|cpu| (pid, cpu)))
                    .collect()
            }
        }
    }

    /// CPU spent between two samples; a process absent from `start` began
    /// after it, so all of its time counts.
    pub(crate) fn spent(start: &[(u32, Duration)], end: &[(u32, Duration)]) -> Duration {
        end.iter()
            .map(|(pid, cpu)| {
                let before = start
                    .iter()
                    .find(|(p, _)| p == pid)
                    .map_or(Duration::ZERO, |(_, c)| *c);
                cpu.saturating_sub(before)
            })
            .sum()
    }
}

/// The database the PostgreSQL runs use, created fresh for each.
pub(crate) const BENCH_DATABASE: &str = "idemgate_bench";

/// The Redis server's pid, when it runs on this machine and says so.
pub(crate) async fn redis_pid(url: &str) -> Option<u32> {
    let out = tokio::process::Command::new("redis-cli")
        .args(["-u", url, "INFO", "server"])
        .output()
        .await
        .ok()?;
    let pid = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))?
        .trim()
        .parse()
        .ok()?;
    std::path::Path::new(&format!("/proc/{pid}"))
        .exists()
        .then_some(pid)
}

/// `url` with its database replaced by `database`.
pub(crate) fn database_url(url: &str, database: &str) -> Result<String, BoxError> {
    let (scheme, rest) = url.split_once("://").ok_or("a postgres:// URL")?;
    let (authority, tail) = rest.split_once('/').unwrap_or((rest, ""));
    let query = tail
        .split_once('?')
        .map(|(_, q)| format!("?{q}"))
        .unwrap_or_default();
    Ok(format!("{scheme}://{authority}/{database}{query}"))
}

async fn psql(url: &str, sql: &str) -> Result<(), BoxError> {
    let out = tokio::process::Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qAtc", sql])
        .output()
        .await?;
    if !out.status.success() {
        return Err(format!("psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(())
}

/// Drops the bench database, closing its connections.
pub(crate) async fn drop_database(context: &Context) -> Result<(), BoxError> {
    psql(
        &context.postgres_admin,
        &format!("DROP DATABASE IF EXISTS {BENCH_DATABASE} WITH (FORCE)"),
    )
    .await
}

/// The keys the servers' journal (docs/audit.md) left in Redis under the
/// default key prefix. Records expire after `--ttl`, route histories are
/// bounded, but the journal outlives both by design: without this, every run
/// would leave its millions of entries in the shared Redis, for the next run
/// and the test suite to read through.
const REDIS_JOURNAL_KEYS: &str = "idemgate:{idemgate:audit}*";

/// Deletes what the servers' journal wrote to the Redis at `url`; answers how
/// many keys went.
pub(crate) async fn drop_redis_journal(url: &str) -> Result<usize, BoxError> {
    let client = redis::Client::open(url)?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let mut cursor: u64 = 0;
    let mut removed = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(REDIS_JOURNAL_KEYS)
            .arg("COUNT")
            .arg(1_000)
            .query_async(&mut connection)
            .await?;
        if !keys.is_empty() {
            removed += keys.len();
            redis::cmd("UNLINK")
                .arg(&keys)
                .query_async::<()>(&mut connection)
                .await?;
        }
        if next == 0 {
            return Ok(removed);
        }
        cursor = next;
    }
}

/// A fresh, empty bench database.
pub(crate) async fn fresh_database(context: &Context) -> Result<(), BoxError> {
    drop_database(context).await?;
    // FILE_COPY checkpoints at once: every run starts from the same WAL state
    // instead of meeting a checkpoint at a random moment.
    psql(
        &context.postgres_admin,
        &format!("CREATE DATABASE {BENCH_DATABASE} STRATEGY = FILE_COPY"),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls_keep_authority_and_parameters() {
        assert_eq!(
            database_url("postgres://postgres@127.0.0.1:5432/test", "b").unwrap(),
            "postgres://postgres@127.0.0.1:5432/b"
        );
        assert_eq!(
            database_url("postgres://u:p@h/test?sslmode=disable", "b").unwrap(),
            "postgres://u:p@h/b?sslmode=disable"
        );
        assert_eq!(
            database_url("postgresql://h:1", "b").unwrap(),
            "postgresql://h:1/b"
        );
    }
}
