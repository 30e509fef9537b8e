//! A PostgreSQL and a Redis of the test's own, on free loopback ports, to kill and
//! freeze (the shared servers on 5432 and 6379 are never touched). A signal goes to
//! the server and to every process it forked, each by PID (PostgreSQL backends put
//! themselves in their own process groups, so a group signal would miss them), and
//! the whole tree is killed when its guard drops — on every exit path, panics
//! included.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use super::budget::{Rng, span};
use crate::support::server::{TempDir, send_signal};
use idemgate_testkit::free_port;
use idemgate_testkit::wait::wait_until;

/// One child process and what it forks, killed when dropped.
pub struct Tree {
    child: Child,
}

impl Tree {
    fn spawn(command: &mut Command) -> Self {
        let child = command
            .process_group(0)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
        Self { child }
    }

    /// Signals the root first (a stopped root forks no more), then its descendants
    /// as they are at that moment.
    fn signal(&self, signal: &str) {
        let root = self.child.id();
        send_signal(&root.to_string(), signal);
        for pid in descendants(root) {
            // A backend may exit between the listing and the signal.
            let _ = Command::new("kill")
                .args([&format!("-{signal}"), "--", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }

    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// `kill -9` of the tree, and the root reaped.
    fn kill9(mut self) {
        self.signal("KILL");
        let _ = self.child.wait();
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        // SIGKILL also ends a stopped process; then reap the root.
        if !self.exited() {
            self.signal("KILL");
        }
        let _ = self.child.wait();
    }
}

/// Every process below `root`, from `/proc`.
fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
            let after_comm = &stat[stat.rfind(')')? + 1..];
            let ppid = after_comm.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid) in &parents {
            if ppid == parent && !found.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found
}

/// What is done to an own store: `kill -9`, then a restart on its data; or
/// SIGSTOP, then SIGCONT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Kill,
    Freeze,
}

/// `cycles` outages of `store` by `fault`, each after 1–2 s of the load and
/// 5.5–7 s long (5.5–10 s in the full run) — well past the store timeout the
/// scenarios give the server (1 s), so requests meet the outage itself, not
/// only a delay. Returns their lengths.
pub async fn outages<S: OwnStore>(
    store: &mut S,
    fault: Fault,
    cycles: usize,
    rng: &mut Rng,
) -> Vec<Duration> {
    let mut outages = Vec::with_capacity(cycles);
    for _ in 0..cycles {
        tokio::time::sleep(rng.millis(1_000, 2_000)).await;
        let outage = span(rng.millis(5_500, 7_000), rng.millis(5_500, 10_000));
        match fault {
            Fault::Kill => {
                store.kill9();
                tokio::time::sleep(outage).await;
                store.restart().await;
            }
            Fault::Freeze => {
                store.freeze();
                tokio::time::sleep(outage).await;
                store.thaw();
            }
        }
        outages.push(outage);
    }
    outages
}

/// A process that can be killed, restarted on its data, frozen and thawed.
pub trait OwnStore {
    /// The URL the server connects to.
    fn url(&self) -> String;
    /// Start again on the same data and port; returns once it accepts clients.
    fn restart(&mut self) -> impl Future<Output = ()>;
    /// The running process tree, if any.
    fn process(&mut self) -> &mut Option<Tree>;

    /// `kill -9` of the server and every process it forked.
    fn kill9(&mut self) {
        if let Some(process) = self.process().take() {
            process.kill9();
        }
    }

    /// SIGSTOP of the server and every process it forked.
    fn freeze(&mut self) {
        self.process().as_ref().expect("running").signal("STOP");
    }

    /// SIGCONT.
    fn thaw(&mut self) {
        self.process().as_ref().expect("running").signal("CONT");
    }
}

/// A PostgreSQL cluster in a temp directory; as root, run as the `postgres` user
/// (PostgreSQL refuses root), else as the test's own user.
pub struct OwnPostgres {
    process: Option<Tree>,
    bin: PathBuf,
    port: u16,
    user: Option<(u32, u32)>,
    dir: TempDir,
}

impl OwnPostgres {
    /// `initdb` and start.
    pub async fn start() -> Self {
        let bin = postgres_bin();
        let user = running_as_root().then(postgres_user);
        let dir = TempDir::new("idemgate-faults-pg");
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown");
        }
        let mut initdb = Command::new(bin.join("initdb"));
        let status = as_user(&mut initdb, user)
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

    fn spawn(&self) -> Tree {
        let dir = self.dir.path();
        Tree::spawn(
            as_user(&mut Command::new(self.bin.join("postgres")), self.user)
                .arg("-D")
                .arg(dir.join("data"))
                .args(["-p", &self.port.to_string(), "-h", "127.0.0.1", "-k"])
                .arg(dir)
                // A killed process leaves its writes in the page cache: what is
                // tested is a process crash, not a power cut.
                .args(["-c", "fsync=off", "-c", "shared_buffers=16MB"])
                .args(["-c", "max_connections=100"])
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

    fn process(&mut self) -> &mut Option<Tree> {
        &mut self.process
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
}

/// A Redis with an append-only file synced at every write, so a restart after
/// `kill -9` keeps every acknowledged record (without persistence a restart forgets
/// completed keys and they run again: issue 9's durability check).
pub struct OwnRedis {
    process: Option<Tree>,
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

    fn process(&mut self) -> &mut Option<Tree> {
        &mut self.process
    }

    async fn restart(&mut self) {
        let dir = self.dir.path();
        let process = Tree::spawn(
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

/// Whether this process runs as root (uid 0), from `/proc/self/status`.
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("Uid:"))?;
            line.split_whitespace()
                .nth(2)
                .map(|effective| effective == "0")
        })
        .unwrap_or(false)
}

/// `command`, to run as `user` when one is given.
fn as_user(command: &mut Command, user: Option<(u32, u32)>) -> &mut Command {
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    command
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
