//! The real `idemgate` binary as a child process, driven over real HTTP.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The PostgreSQL the tests use (read at run time).
pub fn postgres_url() -> String {
    std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The Redis the tests use (read at run time).
pub fn redis_url() -> String {
    std::env::var("IDEMGATE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A fresh SQLite database URL in its own temp directory.
pub fn sqlite_url() -> (String, TempDir) {
    let dir = TempDir::new("idemgate-e2e");
    (
        format!("sqlite://{}", dir.path().join("orders.db").display()),
        dir,
    )
}

/// Removes its directory when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh, empty directory `<tmp>/<prefix>-<uuid>`.
    pub fn new(prefix: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How to start the server.
#[derive(Clone, Debug)]
pub struct Options {
    pub database: String,
    pub idempotency_store: String,
    pub gateway_url: Option<String>,
    pub ttl_seconds: u64,
    pub lease_seconds: u64,
    pub wait_ms: u64,
    pub gateway_timeout_ms: u64,
    pub simulated_delay_ms: u64,
    /// More `serve` flags, as (flag, value).
    pub extra: Vec<(String, String)>,
    /// More `serve` flags that take no value.
    pub switches: Vec<String>,
    /// Environment variables set for the process.
    pub env: Vec<(String, String)>,
    /// Run under `prlimit --nofile=SOFT:HARD` (util-linux).
    pub nofile: Option<(u64, u64)>,
    /// Serve the admin listener (`--admin-listen 127.0.0.1:0`).
    pub admin: bool,
    /// `IDEMGATE_ADMIN_TOKEN`, when set.
    pub admin_token: Option<String>,
}

impl Options {
    pub fn new(database: &str) -> Self {
        Self {
            database: database.to_owned(),
            idempotency_store: "database".to_owned(),
            gateway_url: None,
            ttl_seconds: 86_400,
            lease_seconds: 30,
            wait_ms: 0,
            gateway_timeout_ms: 10_000,
            simulated_delay_ms: 0,
            extra: Vec::new(),
            switches: Vec::new(),
            env: Vec::new(),
            nofile: None,
            admin: false,
            admin_token: None,
        }
    }

    /// With an admin listener, and the key API on it when `token` is given.
    pub fn admin(mut self, token: Option<&str>) -> Self {
        self.admin = true;
        self.admin_token = token.map(str::to_owned);
        self
    }

    /// One more `serve` flag.
    pub fn arg(mut self, flag: &str, value: impl ToString) -> Self {
        self.extra.push((flag.to_owned(), value.to_string()));
        self
    }

    /// One more `serve` flag without a value (`--require-key`).
    pub fn switch(mut self, flag: &str) -> Self {
        self.switches.push(flag.to_owned());
        self
    }

    /// One more environment variable.
    pub fn env(mut self, name: &str, value: impl ToString) -> Self {
        self.env.push((name.to_owned(), value.to_string()));
        self
    }

    /// Starts the server with soft and hard `RLIMIT_NOFILE` at `limit`.
    pub fn open_file_limit(self, limit: u64) -> Self {
        self.open_file_limits(limit, limit)
    }

    /// Starts the server with these soft and hard `RLIMIT_NOFILE`.
    pub fn open_file_limits(mut self, soft: u64, hard: u64) -> Self {
        self.nofile = Some((soft, hard));
        self
    }

    pub fn gateway(mut self, url: String) -> Self {
        self.gateway_url = Some(url);
        self
    }

    pub fn store(mut self, store: &str) -> Self {
        self.idempotency_store = store.to_owned();
        self
    }
}

/// A running `idemgate serve`.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    /// The admin listener, when started with one.
    pub admin: Option<SocketAddr>,
    pub options: Options,
}

impl Server {
    pub async fn start(options: Options) -> Self {
        let binary = env!("CARGO_BIN_EXE_idemgate");
        let mut command = match options.nofile {
            // prlimit sets the limit and execs the binary: the same process.
            Some((soft, hard)) => {
                let mut command = Command::new("prlimit");
                command
                    .arg(format!("--nofile={soft}:{hard}"))
                    .args(["--", binary]);
                command
            }
            None => Command::new(binary),
        };
        command
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(["--database", &options.database])
            .args(["--idempotency-store", &options.idempotency_store])
            .args(["--ttl", &options.ttl_seconds.to_string()])
            .args(["--lease", &options.lease_seconds.to_string()])
            .args(["--wait-ms", &options.wait_ms.to_string()])
            .args([
                "--gateway-timeout-ms",
                &options.gateway_timeout_ms.to_string(),
            ])
            .args(["--shutdown-timeout", "10"])
            .args([
                "--simulated-gateway-delay-ms",
                &options.simulated_delay_ms.to_string(),
            ])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for variable in [
            "IDEMGATE_LISTEN",
            "PORT",
            "DATABASE_URL",
            "IDEMGATE_IDEMPOTENCY_STORE",
            "PAYMENT_GATEWAY_URL",
            "IDEMPOTENCY_TTL_SECONDS",
            "IDEMPOTENCY_LEASE_SECONDS",
            "IDEMPOTENCY_WAIT_MS",
            "IDEMGATE_LOG_FORMAT",
            "IDEMGATE_SIMULATED_GATEWAY_DELAY_MS",
            "IDEMGATE_HEADER_READ_TIMEOUT_MS",
            "IDEMGATE_BODY_READ_TIMEOUT_MS",
            "IDEMGATE_IDLE_TIMEOUT_MS",
            "IDEMGATE_MAX_CONNECTIONS",
            "IDEMGATE_OTLP",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "IDEMGATE_ADMIN_LISTEN",
            "IDEMGATE_ADMIN_TOKEN",
            "IDEMGATE_REQUIRE_KEY",
            "IDEMGATE_PROBLEM_TYPE_BASE",
            "IDEMGATE_PROBLEM_LINK",
            "IDEMGATE_PROBLEM_SHAPE",
            "IDEMGATE_REPLAY_HEADERS",
            "IDEMGATE_REPLAY_SET_COOKIE",
            "IDEMGATE_PAYMENT_WEBHOOK_SECRET",
            "IDEMGATE_TEST_FAULT_IN_PAYMENT_WEBHOOK",
        ] {
            command.env_remove(variable);
        }
        if options.admin {
            command.args(["--admin-listen", "127.0.0.1:0"]);
        }
        if let Some(token) = &options.admin_token {
            command.env("IDEMGATE_ADMIN_TOKEN", token);
        }
        command.envs(options.env.iter().map(|(k, v)| (k, v)));
        for (flag, value) in &options.extra {
            command.args([flag, value]);
        }
        command.args(&options.switches);
        if let Some(url) = &options.gateway_url {
            command.args(["--gateway-url", url]);
        }
        let markers: &[&str] = if options.admin {
            &[
                "idemgate listening on http://",
                "admin listening on http://",
            ]
        } else {
            &["listening on http://"]
        };
        let (child, addrs) = spawn_listening(&mut command, markers).await;
        Self {
            child,
            addr: addrs[0],
            admin: addrs.get(1).copied(),
            options,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// A URL on the admin listener.
    pub fn admin_url(&self, path: &str) -> String {
        format!(
            "http://{}{path}",
            self.admin.expect("started with an admin listener")
        )
    }

    /// The process id (while it runs).
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// SIGSTOP: the process is frozen mid-whatever, its sockets stay open.
    pub fn freeze(&self) {
        send_signal(&self.pid().to_string(), "STOP");
    }

    /// SIGCONT: a frozen process resumes where it stopped.
    pub fn thaw(&self) {
        send_signal(&self.pid().to_string(), "CONT");
    }

    /// `kill -9`: no shutdown, no cleanup.
    pub async fn kill9(mut self) {
        self.child.kill().await.expect("kill -9");
    }

    /// SIGTERM, then wait for a clean exit.
    pub async fn stop(mut self) {
        send_signal(&self.pid().to_string(), "TERM");
        let exit = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("the server did not stop within 20 s of SIGTERM")
            .expect("wait");
        assert!(exit.success(), "the server exited with {exit}");
    }

    /// Sends SIGTERM and returns without waiting.
    pub fn terminate(&self) {
        send_signal(&self.pid().to_string(), "TERM");
    }

    pub async fn wait_exit(mut self) -> std::process::ExitStatus {
        wait_exit(&mut self.child).await
    }
}

/// Waits (20 s at most) for a started binary to exit, after a signal.
pub async fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exit in time")
        .expect("wait")
}

/// Spawns `command` (stderr piped) and waits until its log has named, for each
/// of `markers` in any order, the address that follows it (`… listening on
/// http://ADDR`). Keeps draining the log afterwards, echoing warnings and errors.
pub async fn spawn_listening(command: &mut Command, markers: &[&str]) -> (Child, Vec<SocketAddr>) {
    let mut child = command.spawn().expect("spawn the idemgate binary");
    let stderr = child.stderr.take().expect("piped stderr");
    let mut lines = BufReader::new(stderr).lines();
    let addrs = tokio::time::timeout(Duration::from_secs(30), async {
        let mut found: Vec<Option<SocketAddr>> = vec![None; markers.len()];
        while let Some(line) = lines.next_line().await.expect("read server log") {
            // The most specific marker first: "admin listening on" also contains
            // "listening on".
            let hit = markers
                .iter()
                .enumerate()
                .filter(|(_, marker)| line.contains(*marker))
                .max_by_key(|(_, marker)| marker.len());
            if let Some((i, marker)) = hit {
                let rest = line.split(marker).nth(1).expect("text after the marker");
                let addr = rest
                    .split_whitespace()
                    .next()
                    .expect("address after the marker");
                found[i] = Some(addr.parse::<SocketAddr>().expect("a socket address"));
                if found.iter().all(Option::is_some) {
                    return found.into_iter().flatten().collect::<Vec<_>>();
                }
                continue;
            }
            eprintln!("[server] {line}");
        }
        panic!("the server exited before listening");
    })
    .await
    .expect("the server did not start within 30 s");
    let label = addrs[0];
    // Keep draining the log so the server never blocks on a full pipe.
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("ERROR") || line.contains("WARN") {
                eprintln!("[server {label}] {line}");
            }
        }
    });
    (child, addrs)
}

/// `kill -<signal> <target>`; a target of `-<pgid>` signals a whole process group.
/// Panics when `kill` fails: a signal that was not delivered would make the test
/// prove something other than what it says.
pub fn send_signal(target: &str, signal: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(target)
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} -- {target} failed");
}

/// Runs `command` to its end and returns what it printed, failing the test
/// after 30 s: a binary that should refuse to start and does not would
/// otherwise serve forever, and hang the suite instead of failing it.
pub async fn run_to_exit(command: &mut Command) -> std::process::Output {
    let output = command.kill_on_drop(true).output();
    tokio::time::timeout(Duration::from_secs(30), output)
        .await
        .expect("the command ends within 30 s")
        .expect("run the binary")
}
