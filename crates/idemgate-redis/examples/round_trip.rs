//! What one Redis round trip costs this process in CPU, by client path: the floor
//! under the store's own per-call cost.
//!
//! ```text
//! cargo run --release -p idemgate-redis --example round_trip -- [URL] [SECONDS] [TASKS] [PACE_MS]
//! ```
//!
//! With `PACE_MS`, each task sleeps that long before every call, so calls arrive at
//! an idle process (as in the server, whose requests wait on SQLite most of the
//! time) instead of a busy one; a `sleep` line measures the pacing alone, to be
//! subtracted.
//!
//! Measured on the two-core test machine, quiet (load < 1), 32 tasks, `PACE_MS` 10
//! (about 2,800 calls/s, the bench's new-key rate), three runs, pacing subtracted:
//! `raw` 12.7–14.4 µs per round trip, `multiplexed` 10.8–13.5, `manager` 15.2–17.0,
//! `store-get` 16.3–18.0, `store` 21.7–28.3. Unpaced (always busy) every path costs
//! 2.4–8 µs: what a round trip costs is mostly waking an idle process for its reply.
//!
//! For each path, `TASKS` (default 32) tasks on a two-worker tokio runtime (the
//! server's shape on the two-core test machine) send one `EVALSHA` after another for
//! `SECONDS` (default 3), and the process's user + system CPU time from
//! `/proc/self/stat` is divided by the calls made:
//!
//! - `raw`: one TCP connection per task, the `EVALSHA` hand-encoded, one `write`
//!   and `read`s per call — the cost of the socket round trip itself;
//! - `multiplexed`: redis-rs' `MultiplexedConnection` (one connection shared by every
//!   task, a driver task in between), a pre-built command;
//! - `manager`: the same through `ConnectionManager`, with `Script::key(…).arg(…)`;
//! - `store-get`: `RedisStore::get` of an absent record — the store's path around
//!   a light script;
//! - `store`: `RedisStore::try_claim` on fresh keys — everything the store does
//!   (and this program's building of each `ClaimRequest`, a SHA-256 of the key).
//!
//! The script is a one-liner returning an integer, given the claim's arguments (so
//! requests are as large as claims), except on `store-get` and `store`. Keys expire after 60 s.

#![allow(missing_docs, clippy::print_stdout)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::IdempotencyKey;
use idemgate_core::scope::{Identity, IdentityDigest, Principal, Scope};
use idemgate_core::{ClaimRequest, Store};
use idemgate_redis::{PersistenceCheck, RedisStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SCRIPT: &str = "return 1";

/// User + system CPU time of this process so far.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after `)`.
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // CLK_TCK is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// Runs `tasks` copies of `call` for `seconds` and prints calls/s and CPU µs/call.
async fn measure<F, Fut>(name: &str, tasks: usize, seconds: u64, pace: Duration, call: F)
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    // Warm up for half a second, then measure.
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (stop, calls, call) = (stop.clone(), calls.clone(), call.clone());
        handles.push(tokio::spawn(async move {
            let mut i = (task as u64) << 40;
            while !stop.load(Ordering::Relaxed) {
                if !pace.is_zero() {
                    tokio::time::sleep(pace).await;
                }
                call(i).await;
                i += 1;
                calls.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (calls0, cpu0, start) = (calls.load(Ordering::Relaxed), process_cpu(), Instant::now());
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (calls1, cpu1, elapsed) = (
        calls.load(Ordering::Relaxed),
        process_cpu(),
        start.elapsed(),
    );
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.await.expect("task");
    }
    let n = (calls1 - calls0).max(1) as f64;
    println!(
        "{name:12} {:>8.0} calls/s  {:>6.1} µs CPU/call",
        n / elapsed.as_secs_f64(),
        (cpu1 - cpu0).as_secs_f64() * 1e6 / n
    );
}

/// The claim's arguments for call `i`: key, fingerprint, operation id, lease, ttl, version.
fn claim_args(i: u64) -> [Vec<u8>; 6] {
    [
        format!("idemgate-rt:{{{i:064x}}}").into_bytes(),
        vec![7; 32],
        vec![9; 16],
        b"30000".to_vec(),
        b"60000".to_vec(),
        b"1".to_vec(),
    ]
}

fn resp_command(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", parts.len()).into_bytes();
    for part in parts {
        out.extend_from_slice(format!("${}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let seconds: u64 = args.next().map_or(3, |s| s.parse().expect("seconds"));
    let tasks: usize = args.next().map_or(32, |s| s.parse().expect("tasks"));
    let pace = Duration::from_millis(args.next().map_or(0, |s| s.parse().expect("pace ms")));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let client = redis::Client::open(url.as_str()).expect("url");
        let script = Arc::new(redis::Script::new(SCRIPT));
        let mut manager = client.get_connection_manager().await.expect("connect");
        script
            .prepare_invoke()
            .load_async(&mut manager)
            .await
            .expect("load");
        let sha = script.get_hash().to_owned();
        let addr = url
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_owned();

        if !pace.is_zero() {
            measure("sleep", tasks, seconds, pace, |_| async {}).await;
        }
        measure("raw", tasks, seconds, pace, {
            let (sha, addr) = (sha.clone(), addr.clone());
            let pool = Arc::new(tokio::sync::Mutex::new(Vec::new()));
            move |i| {
                let (sha, addr, pool) = (sha.clone(), addr.clone(), pool.clone());
                async move {
                    let mut stream = match pool.lock().await.pop() {
                        Some(stream) => stream,
                        None => {
                            let stream = tokio::net::TcpStream::connect(&addr).await.expect("tcp");
                            stream.set_nodelay(true).expect("nodelay");
                            stream
                        }
                    };
                    let [key, fp, op, lease, ttl, version] = claim_args(i);
                    let command = resp_command(&[
                        b"EVALSHA",
                        sha.as_bytes(),
                        b"1",
                        &key,
                        &fp,
                        &op,
                        &lease,
                        &ttl,
                        &version,
                    ]);
                    stream.write_all(&command).await.expect("write");
                    let mut reply = [0u8; 16];
                    let mut got = 0;
                    while !reply[..got].ends_with(b"\r\n") {
                        got += stream.read(&mut reply[got..]).await.expect("read");
                    }
                    assert_eq!(&reply[..got], b":1\r\n");
                    pool.lock().await.push(stream);
                }
            }
        })
        .await;

        let multiplexed = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        measure("multiplexed", tasks, seconds, pace, {
            let sha = sha.clone();
            move |i| {
                let (mut connection, sha) = (multiplexed.clone(), sha.clone());
                async move {
                    let [key, fp, op, lease, ttl, version] = claim_args(i);
                    let mut cmd = redis::cmd("EVALSHA");
                    cmd.arg(&sha)
                        .arg(1)
                        .arg(key)
                        .arg(fp)
                        .arg(op)
                        .arg(lease)
                        .arg(ttl)
                        .arg(version);
                    let reply: i64 = cmd.query_async(&mut connection).await.expect("evalsha");
                    assert_eq!(reply, 1);
                }
            }
        })
        .await;

        measure("manager", tasks, seconds, pace, {
            move |i| {
                let (mut connection, script) = (manager.clone(), script.clone());
                async move {
                    let [key, fp, op, lease, ttl, version] = claim_args(i);
                    let mut invocation = script.key(key);
                    invocation.arg(fp).arg(op).arg(lease).arg(ttl).arg(version);
                    let reply: i64 = invocation
                        .invoke_async(&mut connection)
                        .await
                        .expect("evalsha");
                    assert_eq!(reply, 1);
                }
            }
        })
        .await;

        let store = RedisStore::builder()
            .with_key_prefix("idemgate-rt:")
            .with_persistence_check(PersistenceCheck::Warn)
            .connect(&url)
            .await
            .expect("store");
        measure("store-get", tasks, seconds, pace, {
            let store = store.clone();
            move |i| {
                let store = store.clone();
                async move {
                    let mut digest = [0u8; 32];
                    digest[..8].copy_from_slice(&i.to_le_bytes());
                    let found = store
                        .get(&IdentityDigest::from_bytes(digest))
                        .await
                        .expect("get");
                    assert!(found.is_none());
                }
            }
        })
        .await;
        measure("store", tasks, seconds, pace, {
            move |i| {
                let store = store.clone();
                async move {
                    let scope = Scope {
                        principal: Principal::new("round-trip"),
                        method: "POST".into(),
                        path: "/orders".into(),
                    };
                    let key = format!("{i:x}");
                    let request = ClaimRequest {
                        identity: Identity::new(
                            scope,
                            IdempotencyKey::parse(key.as_bytes(), 255).expect("key"),
                        ),
                        fingerprint: Fingerprint::from_bytes([0; 32]),
                        field_digests: None,
                        lease: Duration::from_secs(30),
                        ttl: Duration::from_secs(60),
                        route_template: None,
                    };
                    store.try_claim(&request).await.expect("claim");
                }
            }
        })
        .await;
    });
}
