//! The real `idemgate` binary as a child process, and what /proc says about it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::BoxError;

/// Environment variables the server reads; removed so the bench's flags are the
/// whole configuration (`IDEMGATE_PRINCIPAL_SECRET`, which `start_proxy` sets,
/// excepted).
const SERVER_VARIABLES: &[&str] = &[
    "IDEMGATE_LISTEN",
    "PORT",
    "DATABASE_URL",
    "IDEMGATE_IDEMPOTENCY_STORE",
    "PAYMENT_GATEWAY_URL",
    "PAYMENT_GATEWAY_TIMEOUT_MS",
    "IDEMPOTENCY_TTL_SECONDS",
    "IDEMPOTENCY_LEASE_SECONDS",
    "IDEMPOTENCY_WAIT_MS",
    "IDEMGATE_SHUTDOWN_TIMEOUT_SECONDS",
    "IDEMGATE_LOG_FORMAT",
    "RUST_LOG",
    "IDEMGATE_UPSTREAM",
    "IDEMGATE_ADMIN_LISTEN",
    "IDEMGATE_PRINCIPAL",
    "IDEMGATE_PRINCIPAL_SECRET_FILE",
    "IDEMGATE_UPSTREAM_TIMEOUT_MS",
    "IDEMGATE_CONFIG",
    "IDEMGATE_REPLAY_CACHE_ENTRIES",
    "IDEMGATE_REPLAY_CACHE_BYTES",
    "IDEMGATE_REPLAY_CACHE_MAX_AGE_MS",
];

/// A running `idemgate serve`.
pub(crate) struct ServerProcess {
    child: Child,
    pid: u32,
    /// Where it listens.
    pub(crate) addr: SocketAddr,
    log_lines: tokio::task::JoinHandle<Vec<String>>,
}

/// Builds the release server binary.
pub(crate) async fn build_server(workspace: &Path) -> Result<PathBuf, BoxError> {
    build_release(
        workspace,
        &["-p", "idemgate-server", "--bin", "idemgate"],
        "idemgate",
    )
    .await
}

/// `cargo build --release <target>` in `workspace`, and the path of what it
/// built: `artifact` under the release directory (of `CARGO_TARGET_DIR`, or
/// the workspace's `target`).
pub(crate) async fn build_release(
    workspace: &Path,
    target: &[&str],
    artifact: &str,
) -> Result<PathBuf, BoxError> {
    eprintln!("[bench] cargo build --release {}", target.join(" "));
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args(["build", "--release"])
        .args(target)
        .current_dir(workspace)
        .status()
        .await?;
    if !status.success() {
        return Err(format!("building {artifact} failed: {status}").into());
    }
    let directory = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let built = directory.join("release").join(artifact);
    if !built.exists() {
        return Err(format!("nothing built at {}", built.display()).into());
    }
    Ok(built)
}

impl ServerProcess {
    /// Starts `binary serve --listen 127.0.0.1:0 <args>` and waits for its
    /// "listening on" line (at most 60 s: a migration on a busy machine is slow).
    pub(crate) async fn start(binary: &Path, args: &[String]) -> Result<Self, BoxError> {
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--shutdown-timeout", "10"])
            .args(args);
        Self::spawn(command, "idemgate listening on http://").await
    }

    /// Starts `binary proxy --upstream http://UPSTREAM --listen 127.0.0.1:0
    /// --admin-listen 127.0.0.1:0 <args>` with a fixed principal secret, and waits
    /// for its public listener's line.
    pub(crate) async fn start_proxy(
        binary: &Path,
        upstream: SocketAddr,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<Self, BoxError> {
        let mut command = Command::new(binary);
        command.envs(env.iter().copied());
        command
            .arg("proxy")
            .args(["--upstream", &format!("http://{upstream}")])
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(["--shutdown-timeout", "10"])
            .args(args)
            .env(
                "IDEMGATE_PRINCIPAL_SECRET",
                "idemgate-bench-principal-secret",
            );
        Self::spawn(command, "proxy listening on http://").await
    }

    /// Spawns `command` with a clean environment and waits (at most 60 s) for the
    /// log line containing `marker` followed by the listen address.
    async fn spawn(mut command: Command, marker: &str) -> Result<Self, BoxError> {
        command
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for variable in SERVER_VARIABLES {
            command.env_remove(variable);
        }
        let mut child = command.spawn()?;
        let pid = child.id().ok_or("the server exited at once")?;
        let stderr = child.stderr.take().ok_or("no stderr pipe")?;
        let mut lines = BufReader::new(stderr).lines();
        let mut early = Vec::new();
        let found = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.split(marker).nth(1) {
                    let addr = rest.split_whitespace().next().unwrap_or_default();
                    return Ok::<_, BoxError>(Some(addr.parse::<SocketAddr>()?));
                }
                early.push(line);
            }
            Ok(None)
        })
        .await;
        let addr = match found {
            Ok(Ok(Some(addr))) => addr,
            Ok(Ok(None)) => {
                return Err(
                    format!("the server exited before listening:\n{}", early.join("\n")).into(),
                );
            }
            Ok(Err(error)) => return Err(error),
            Err(_) => return Err("the server did not listen within 60 s".into()),
        };
        // Keep draining the log (a full pipe would block the server); keep the
        // warnings and errors for the report.
        let log_lines = tokio::spawn(async move {
            let mut kept = Vec::new();
            while let Ok(Some(line)) = lines.next_line().await {
                if (line.contains("ERROR") || line.contains("WARN")) && kept.len() < 20 {
                    kept.push(line);
                }
            }
            kept
        });
        Ok(Self {
            child,
            pid,
            addr,
            log_lines,
        })
    }

    /// The process's user + system CPU time so far, all threads.
    pub(crate) fn cpu_time(&self) -> Result<Duration, BoxError> {
        process_cpu_time(self.pid)
    }

    /// The process's peak resident set size (`VmHWM`), in KiB.
    pub(crate) fn peak_rss_kib(&self) -> Result<u64, BoxError> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let line = status
            .lines()
            .find(|line| line.starts_with("VmHWM:"))
            .ok_or("no VmHWM in /proc/PID/status")?;
        Ok(line
            .split_whitespace()
            .nth(1)
            .ok_or("bad VmHWM line")?
            .parse()?)
    }

    /// SIGTERM, then a bounded wait; SIGKILL if it does not exit. Returns the
    /// warnings and errors it logged.
    pub(crate) async fn stop(mut self) -> Vec<String> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .await;
        if tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .is_err()
        {
            eprintln!("[bench] server {} ignored SIGTERM; killing it", self.pid);
            let _ = self.child.kill().await;
        }
        tokio::time::timeout(Duration::from_secs(5), self.log_lines)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default()
    }
}

/// A process's user + system CPU time so far, all threads (/proc/PID/stat).
pub(crate) fn process_cpu_time(pid: u32) -> Result<Duration, BoxError> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesized command name: state is field 3, utime 14,
    // stime 15 (proc(5)).
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or("unreadable /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |index: usize| -> Result<u64, BoxError> {
        Ok(fields
            .get(index)
            .ok_or("short /proc/PID/stat")?
            .parse::<u64>()?)
    };
    let total = ticks(11)? + ticks(12)?;
    Ok(Duration::from_secs_f64(total as f64 / clock_ticks() as f64))
}

/// `CLK_TCK`, the unit of /proc CPU times (asked of `getconf` once; 100 on Linux
/// unless configured otherwise).
fn clock_ticks() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(100)
    })
}
