//! A Redis Cluster failover under load, on a cluster of the test's own with one
//! replica per primary (`scripts/redis-cluster.sh start --replicas 1`, stopped by PID
//! when the test ends): many tasks claim, "execute" (a counted run, keyed by the
//! operation id it ran under) and complete keys while a primary is killed with
//! `kill -9`; the killed node is started again (it rejoins as a replica), and then
//! every key is retried until it is final.
//!
//! With a replication wait ([`RedisStoreBuilder::with_replication_wait`]) no key may
//! run under two operation ids: that is asserted. Without it, a claim or completion
//! acknowledged by the dying primary but not yet replicated is lost, and the key runs
//! again as a new operation: that is probabilistic, so it is only reported (run with
//! `--nocapture` to see the figures).
//!
//! Two kinds of kill: of a primary whose replica keeps up (the loss window is the
//! sub-millisecond replication delay on loopback), and of a primary cut off from its
//! replica for 400 ms just before (the replica frozen with SIGSTOP, the primary
//! closing its link with `CLIENT KILL TYPE replica`) — a replica that fell behind, as
//! behind a network fault — which is resumed right after the kill and takes over
//! without the writes of those 400 ms.
//!
//! The default run is small (about 40 s): one kill of each kind per mode, 200 keys
//! and 8 tasks each. `IDEMGATE_FAULTS_FULL=1` runs both kinds on each of the three
//! shards, 1,000 keys and 32 tasks each (about 2 minutes).
//!
//! [`RedisStoreBuilder::with_replication_wait`]: idemgate_redis::RedisStoreBuilder::with_replication_wait

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemgate_core::record::{OperationId, StoredResponse};
use idemgate_core::{Claim, ClaimRequest, Completion, FencedWrite, FinalStatus, Store};
use idemgate_redis::RedisStore;
use idemgate_testkit::fixtures::{awkward_response, fresh_request};

/// The lease of every claim: short, so a record whose completion was lost is taken
/// over quickly by the retries.
const LEASE: Duration = Duration::from_secs(2);
/// What one kill may take, failover and retries included.
const KILL_BOUND: Duration = Duration::from_secs(30);
/// What one "execution" of a handler takes.
const WORK: Duration = Duration::from_millis(20);

/// A cluster with replicas started by `scripts/redis-cluster.sh` in a directory of
/// its own; `Drop` stops it (the script kills every node by the PID it recorded).
struct OwnCluster(Nodes);

/// The nodes of that cluster: its state directory and URLs (primaries first).
#[derive(Clone)]
struct Nodes {
    state: PathBuf,
    urls: Vec<String>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/redis-cluster.sh")
}

impl OwnCluster {
    fn start() -> Self {
        let state = std::env::temp_dir().join(format!(
            "idemgate-failover-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        // The guard exists before the script runs: a start that fails half-way is
        // stopped too.
        let mut cluster = Self(Nodes {
            state,
            urls: Vec::new(),
        });
        let output = cluster
            .0
            .script(&["start", "--replicas", "1"])
            .output()
            .expect("run scripts/redis-cluster.sh");
        assert!(
            output.status.success(),
            "starting the cluster failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        cluster.0.urls = String::from_utf8_lossy(&output.stdout)
            .trim()
            .split(',')
            .map(str::to_owned)
            .collect();
        assert_eq!(cluster.0.urls.len(), 6, "3 primaries + 3 replicas");
        cluster
    }
}

impl Nodes {
    fn script(&self, args: &[&str]) -> Command {
        let mut command = Command::new("bash");
        command
            .arg(script())
            .args(args)
            .env("REDIS_CLUSTER_STATE", &self.state);
        command
    }

    fn admin(&self) -> redis::Connection {
        for url in &self.urls {
            if let Ok(connection) = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(300)))
            {
                return connection;
            }
        }
        panic!("no node of the cluster answers");
    }

    /// The ports of the primary serving `slot` now and of its (online) replica, as
    /// the primary reports it.
    fn shard_of(&self, slot: i64) -> (u16, u16) {
        let primary = self.primary_of(slot);
        let info: String = redis::Client::open(format!("redis://127.0.0.1:{primary}"))
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
            .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c))
            .expect("INFO replication of the primary");
        // slave0:ip=127.0.0.1,port=21136,state=online,offset=…,lag=0
        let replica = info
            .lines()
            .filter(|line| line.starts_with("slave") && line.contains("state=online"))
            .find_map(|line| {
                line.split(',')
                    .find_map(|field| field.strip_prefix("port="))
                    .and_then(|port| port.parse().ok())
            })
            .unwrap_or_else(|| panic!("the primary on {primary} has no online replica: {info}"));
        (primary, replica)
    }

    /// The port of the primary serving `slot` now, as a live node reports it.
    fn primary_of(&self, slot: i64) -> u16 {
        let slots: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut self.admin())
            .expect("CLUSTER SLOTS");
        let redis::Value::Array(ranges) = slots else {
            panic!("CLUSTER SLOTS: {slots:?}")
        };
        for range in ranges {
            let redis::Value::Array(items) = range else {
                continue;
            };
            if let (redis::Value::Int(lo), redis::Value::Int(hi), redis::Value::Array(node)) =
                (&items[0], &items[1], &items[2])
                && (*lo..=*hi).contains(&slot)
                && let redis::Value::Int(port) = node[1]
            {
                return u16::try_from(port).expect("port");
            }
        }
        panic!("no primary serves slot {slot}");
    }

    fn pid(&self, port: u16) -> String {
        std::fs::read_to_string(self.state.join(format!("{port}.pid")))
            .expect("pid file of the node")
            .trim()
            .to_owned()
    }

    fn signal(&self, port: u16, signal: &str) {
        let pid = self.pid(port);
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Makes the primary on `port` close its replicas' connections (`CLIENT KILL TYPE
    /// replica`), as a network fault between them would.
    fn drop_replica_links(&self, port: u16) {
        let _: i64 = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
            .and_then(|mut c| {
                redis::cmd("CLIENT")
                    .arg(&["KILL", "TYPE", "replica"])
                    .query(&mut c)
            })
            .expect("CLIENT KILL TYPE replica");
    }

    /// `kill -9` of the node on `port`, by the PID its pid file holds.
    fn kill(&self, port: u16) {
        self.signal(port, "-9");
    }

    fn restart_node(&self, port: u16) {
        let output = self
            .script(&["restart-node", &port.to_string(), "--replicas", "1"])
            .output()
            .expect("run scripts/redis-cluster.sh");
        assert!(
            output.status.success(),
            "restarting node {port} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Waits until `slot` has moved off `old` and every replica is linked again.
    fn wait_for_failover(&self, slot: i64, old: u16) {
        let start = Instant::now();
        while self.primary_of(slot) == old {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no failover of slot {slot} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("failover of slot {slot} after {:?}", start.elapsed());
    }

    fn wait_until_replicated(&self, port: u16) {
        let start = Instant::now();
        loop {
            let info: Result<String, _> = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(300)))
                .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c));
            if info.is_ok_and(|info| info.contains("master_link_status:up")) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the restarted node {port} did not become an in-sync replica within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A node stopped with SIGSTOP — a replica that has fallen behind — resumed with
/// SIGCONT when this drops, on every exit path.
struct Frozen<'a> {
    nodes: &'a Nodes,
    port: u16,
}

impl<'a> Frozen<'a> {
    fn freeze(nodes: &'a Nodes, port: u16) -> Self {
        nodes.signal(port, "-STOP");
        Self { nodes, port }
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.nodes.pid(self.port)])
            .status();
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ = self.0.script(&["stop", "--replicas", "1"]).status();
        let _ = std::fs::remove_dir_all(&self.0.state);
    }
}

/// What one mode saw.
#[derive(Debug, Default)]
struct Figures {
    keys: usize,
    /// Handler runs in all.
    runs: usize,
    /// Keys that ran under more than one operation id: double executions.
    doubled: usize,
    /// Keys run again under the same operation id (a takeover after a lost
    /// completion; harmless when effects are keyed by the operation id).
    rerun_same_operation: usize,
    /// Store calls that failed (503s to a client).
    unavailable: usize,
}

/// The operation ids each key's handler ran under, in order.
type Runs = Arc<Mutex<Vec<Vec<OperationId>>>>;

/// What the clients of one kill share.
#[derive(Clone)]
struct Round {
    store: RedisStore,
    runs: Runs,
    unavailable: Arc<std::sync::atomic::AtomicUsize>,
    deadline: Instant,
    /// The response every completion stores.
    response: Arc<StoredResponse>,
}

/// One client for key `index`: claim, run, complete; retry on errors and on records
/// still in progress, until the key is final.
async fn drive(round: Round, request: Arc<ClaimRequest>, index: usize) {
    let Round {
        store,
        runs,
        unavailable,
        deadline,
        response,
    } = round;
    let mut last_error = None;
    let mut count_error = |error: idemgate_core::StoreError| {
        unavailable.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        last_error = Some(error);
    };
    loop {
        assert!(
            Instant::now() < deadline,
            "key {index} not final within the bound; last error: {last_error:?}"
        );
        match store.try_claim(&request).await {
            Ok(Claim::Existing(snapshot)) if snapshot.record.status().is_final() => return,
            Ok(Claim::Existing(_)) => tokio::time::sleep(Duration::from_millis(50)).await,
            Ok(Claim::Acquired(lease)) => {
                runs.lock().unwrap()[index].push(lease.operation_id);
                tokio::time::sleep(WORK).await;
                let completion = Completion {
                    status: FinalStatus::Completed,
                    response: StoredResponse::clone(&response),
                    ttl: Duration::from_secs(3_600),
                };
                let lease_end = Instant::now() + LEASE / 2;
                loop {
                    match store.complete(&lease, &completion).await {
                        Ok(FencedWrite::Applied) => return,
                        Ok(FencedWrite::Refused) => break,
                        Err(error) if Instant::now() < lease_end => {
                            count_error(error);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(error) => {
                            count_error(error);
                            break;
                        }
                    }
                }
            }
            Err(error) => {
                count_error(error);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One fault: the primary serving `slot` is killed with `kill -9`.
#[derive(Clone, Copy, Debug)]
struct Kill {
    slot: i64,
    /// Freeze its replica (SIGSTOP) for a moment first, resuming it right after the
    /// kill: a replica that has fallen behind, so the primary acknowledges writes
    /// the replica that takes over never gets.
    lagging_replica: bool,
}

/// How long a lagging replica is frozen before its primary is killed.
const LAG: Duration = Duration::from_millis(400);

/// Runs `keys` keys through `concurrency` tasks during each kill of `kills` in turn,
/// then retries every key until final.
async fn run_mode(
    cluster: &Nodes,
    store: &RedisStore,
    keys: usize,
    concurrency: usize,
    kills: &[Kill],
) -> Figures {
    let deadline = Instant::now() + KILL_BOUND * u32::try_from(kills.len()).expect("kills");
    let mut figures = Figures {
        keys: keys * kills.len(),
        ..Figures::default()
    };
    let unavailable = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for &Kill {
        slot,
        lagging_replica,
    } in kills
    {
        let requests: Vec<Arc<ClaimRequest>> = (0..keys)
            .map(|_| {
                Arc::new(ClaimRequest {
                    lease: LEASE,
                    ..fresh_request()
                })
            })
            .collect();
        let runs: Runs = Arc::new(Mutex::new(vec![Vec::new(); keys]));
        let round = Round {
            store: store.clone(),
            runs: Arc::clone(&runs),
            unavailable: Arc::clone(&unavailable),
            deadline,
            response: Arc::new(awkward_response()),
        };
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                let (round, requests) = (round.clone(), requests.clone());
                let (next, done) = (Arc::clone(&next), Arc::clone(&done));
                tokio::spawn(async move {
                    loop {
                        let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(request) = requests.get(index) else {
                            return;
                        };
                        drive(round.clone(), Arc::clone(request), index).await;
                        done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                })
            })
            .collect();

        // Kill the shard's primary once a quarter of the keys are through, under load
        // (a tenth when its replica is to lag first, so the load outlasts the lag).
        let through = if lagging_replica { keys / 10 } else { keys / 4 };
        while done.load(std::sync::atomic::Ordering::Relaxed) < through {
            assert!(Instant::now() < deadline, "no progress before the kill");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (victim, replica) = cluster.shard_of(slot);
        let frozen = lagging_replica.then(|| {
            let frozen = Frozen::freeze(cluster, replica);
            // What the frozen replica's socket holds still reaches it; from here on
            // the primary acknowledges writes that reach no replica.
            cluster.drop_replica_links(victim);
            frozen
        });
        if frozen.is_some() {
            tokio::time::sleep(LAG).await;
        }
        cluster.kill(victim);
        drop(frozen);
        eprintln!(
            "killed the primary on port {victim} (replica lagging: {lagging_replica}) with {} \
             of {keys} keys final",
            done.load(std::sync::atomic::Ordering::Relaxed)
        );
        let waiting = tokio::task::spawn_blocking({
            let cluster = cluster.clone();
            move || {
                cluster.wait_for_failover(slot, victim);
                cluster.restart_node(victim);
                cluster.wait_until_replicated(victim);
            }
        });
        waiting.await.expect("failover");
        for worker in workers {
            worker.await.expect("worker");
        }

        // Every client retries its key once more after the failover, until final: a
        // record the failover lost shows up here as a key that runs again.
        let retries: Vec<_> = requests
            .iter()
            .enumerate()
            .map(|(index, request)| tokio::spawn(drive(round.clone(), Arc::clone(request), index)))
            .collect();
        for retry in retries {
            retry.await.expect("retry");
        }

        let (runs_before, doubled_before) = (figures.runs, figures.doubled);
        for operations in runs.lock().unwrap().iter() {
            assert!(!operations.is_empty(), "a key never ran");
            figures.runs += operations.len();
            let distinct: HashSet<&OperationId> = operations.iter().collect();
            if distinct.len() > 1 {
                figures.doubled += 1;
            } else if operations.len() > 1 {
                figures.rerun_same_operation += 1;
            }
        }
        eprintln!(
            "  this kill: {keys} keys, {} runs, {} keys ran under two operation ids",
            figures.runs - runs_before,
            figures.doubled - doubled_before
        );
    }
    figures.unavailable = unavailable.load(std::sync::atomic::Ordering::Relaxed);
    figures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_under_load_runs_no_key_twice_with_a_replication_wait() {
    let full = std::env::var("IDEMGATE_FAULTS_FULL").is_ok_and(|v| v == "1");
    let kill = |slot, lagging_replica| Kill {
        slot,
        lagging_replica,
    };
    let (keys, concurrency, kills) = if full {
        let kills = [0, 8_000, 16_000]
            .into_iter()
            .flat_map(|slot| [kill(slot, false), kill(slot, true)])
            .collect();
        (1_000, 32, kills)
    } else {
        (200, 8, vec![kill(0, false), kill(8_000, true)])
    };
    let cluster = OwnCluster::start();
    let builder = || {
        RedisStore::builder()
            .with_response_timeout(Duration::from_millis(800))
            .with_connect_timeout(Duration::from_millis(300))
    };

    let waiting = builder()
        .with_replication_wait(1, Duration::from_millis(300))
        .connect_cluster(&cluster.0.urls)
        .await
        .expect("connect with a replication wait");
    let started = Instant::now();
    let with_wait = run_mode(&cluster.0, &waiting, keys, concurrency, &kills).await;
    eprintln!(
        "WITH replication wait: {with_wait:?} in {:?}",
        started.elapsed()
    );

    let plain = builder()
        .connect_cluster(&cluster.0.urls)
        .await
        .expect("connect without a replication wait");
    let started = Instant::now();
    let without = run_mode(&cluster.0, &plain, keys, concurrency, &kills).await;
    eprintln!(
        "WITHOUT replication wait: {without:?} in {:?}",
        started.elapsed()
    );

    assert_eq!(
        with_wait.doubled, 0,
        "{} of {} keys ran under two operation ids despite the replication wait",
        with_wait.doubled, with_wait.keys
    );
    assert!(with_wait.runs >= with_wait.keys);
    assert!(without.runs >= without.keys);
}
