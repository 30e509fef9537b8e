//! A PostgreSQL and a Redis of the test's own, on free loopback ports, to kill and
//! freeze (the shared servers on 5432 and 6379 are never touched). Each runs in its
//! own process group, so a signal reaches the server and every child it forked (the
//! PostgreSQL backends), and each is killed by that group id when its guard drops —
//! on every exit path, panics included.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use crate::server::{TempDir, send_signal};

/// A port nothing listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// One child process and its group, killed when dropped.
struct Group {
    child: Child,
}

impl Group {
    fn spawn(command: &mut Command) -> Self {
        let child = command
            .process_group(0)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
        Self { child }
    }

    fn signal(&self, signal: &str) {
        send_signal(&format!("-{}", self.child.id()), signal);
    }

    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SIGKILL also ends a stopped process; then reap it.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.wait();
    }
}

/// Polls `ready` until it holds, or panics after `limit`.
async fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "{what} not ready within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A process that can be killed, restarted on its data, frozen and thawed.
pub trait OwnStore {
    /// The URL the server connects to.
    fn url(&self) -> String;
    /// `kill -9` of the whole process group.
    fn kill9(&mut self);
    /// Start again on the same data and port; returns once it accepts clients.
    fn restart(&mut self) -> impl Future<Output = ()>;
    /// SIGSTOP of the whole process group.
    fn freeze(&self);
    /// SIGCONT.
    fn thaw(&self);
}

/// A PostgreSQL cluster in a temp directory, run as the `postgres` user (it refuses
/// root).
pub struct OwnPostgres {
    process: Option<Group>,
    bin: PathBuf,
    port: u16,
    user: (u32, u32),
    dir: TempDir,
}

impl OwnPostgres {
    /// `initdb` and start.
    pub async fn start() -> Self {
        let bin = postgres_bin();
        let user = postgres_user();
        let dir = TempDir::new("idemgate-faults-pg");
        std::os::unix::fs::chown(dir.path(), Some(user.0), Some(user.1)).expect("chown");
        let status = Command::new(bin.join("initdb"))
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(dir.path().join("data"))
            .uid(user.0)
            .gid(user.1)
            .stdout(Stdio::null())
            .stderr(log_file(dir.path(), "initdb.log"))
            .status()
            .expect("run initdb");
        assert!(status.success(), "initdb failed; see {:?}", dir.path());
        let mut postgres = Self {
            process: None,
            bin,
            port: free_port(),
            user,
            dir,
        };
        postgres.restart().await;
        postgres
    }

    fn spawn(&self) -> Group {
        let dir = self.dir.path();
        Group::spawn(
            Command::new(self.bin.join("postgres"))
                .arg("-D")
                .arg(dir.join("data"))
                .args(["-p", &self.port.to_string(), "-h", "127.0.0.1", "-k"])
                .arg(dir)
                // A killed process leaves its writes in the page cache: what is
                // tested is a process crash, not a power cut.
                .args(["-c", "fsync=off", "-c", "shared_buffers=16MB"])
                .args(["-c", "max_connections=100"])
                .uid(self.user.0)
                .gid(self.user.1)
                .stdout(Stdio::null())
                .stderr(log_file(dir, "postgres.log")),
        )
    }

    fn accepts(&self) -> bool {
        Command::new(self.bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl OwnStore for OwnPostgres {
    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn kill9(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.signal("KILL");
            let _ = process.child.wait();
        }
    }

    async fn restart(&mut self) {
        // Right after a kill -9 a start can fail while the old shared memory goes
        // away: try a few times.
        for _ in 0..5 {
            let mut process = self.spawn();
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && !process.exited() && !self.accepts() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if !process.exited() && self.accepts() {
                self.process = Some(process);
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!(
            "own PostgreSQL did not start; see {:?}",
            self.dir.path().join("postgres.log")
        );
    }

    fn freeze(&self) {
        self.process.as_ref().expect("running").signal("STOP");
    }

    fn thaw(&self) {
        self.process.as_ref().expect("running").signal("CONT");
    }
}

/// A Redis with an append-only file synced at every write, so a restart after
/// `kill -9` keeps every acknowledged record (without persistence a restart forgets
/// completed keys and they run again: issue 9's durability check).
pub struct OwnRedis {
    process: Option<Group>,
    port: u16,
    dir: TempDir,
}

impl OwnRedis {
    pub async fn start() -> Self {
        let mut redis = Self {
            process: None,
            port: free_port(),
            dir: TempDir::new("idemgate-faults-redis"),
        };
        redis.restart().await;
        redis
    }

    fn accepts(&self) -> bool {
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "ping"])
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"PONG"))
    }
}

impl OwnStore for OwnRedis {
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn kill9(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.signal("KILL");
            let _ = process.child.wait();
        }
    }

    async fn restart(&mut self) {
        let dir = self.dir.path();
        let process = Group::spawn(
            Command::new("redis-server")
                .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                .arg("--dir")
                .arg(dir)
                .args([
                    "--save",
                    "",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                ])
                .args(["--daemonize", "no", "--protected-mode", "no"])
                .stdout(log_file(dir, "redis.log"))
                .stderr(Stdio::null()),
        );
        self.process = Some(process);
        wait_until("own Redis", Duration::from_secs(30), || self.accepts()).await;
    }

    fn freeze(&self) {
        self.process.as_ref().expect("running").signal("STOP");
    }

    fn thaw(&self) {
        self.process.as_ref().expect("running").signal("CONT");
    }
}

fn log_file(dir: &Path, name: &str) -> File {
    File::options()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .expect("open a log file")
}

/// The newest installed PostgreSQL's binaries.
fn postgres_bin() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL installed under /usr/lib/postgresql (scripts/services.sh)")
        .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    versions.sort_by_key(|bin| {
        bin.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
    });
    versions
        .pop()
        .expect("an initdb under /usr/lib/postgresql/*/bin")
}

/// The `postgres` user's uid and gid.
fn postgres_user() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.first() == Some(&"postgres"))
                .then(|| Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?)))
                .flatten()
        })
        .expect("a postgres user (the PostgreSQL package creates it)")
}
