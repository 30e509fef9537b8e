//! Shared test support: the shared servers' URLs, and dedicated `redis-server`
//! processes a test starts, owns and kills.

#![allow(dead_code, unreachable_pub)]

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The standalone server every conformance test shares (`IDEMGATE_TEST_REDIS_URL`,
/// default `redis://127.0.0.1:6379`), read at run time.
pub fn standalone_url() -> String {
    std::env::var("IDEMGATE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// The cluster's node URLs (`IDEMGATE_TEST_REDIS_CLUSTER_URLS`, comma-separated).
/// Panics when unset: a cluster test never passes without a cluster.
pub fn cluster_urls() -> Vec<String> {
    let urls = std::env::var("IDEMGATE_TEST_REDIS_CLUSTER_URLS").unwrap_or_default();
    let urls: Vec<String> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(
        !urls.is_empty(),
        "IDEMGATE_TEST_REDIS_CLUSTER_URLS is not set: run scripts/test.sh, which starts a 3-primary \
         Redis Cluster (scripts/redis-cluster.sh start) and exports it"
    );
    urls
}

/// A `redis-server` child process; `Drop` kills it (SIGKILL) by PID and removes its
/// directory.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
}

impl RedisServer {
    /// Starts `redis-server --port <free port> --bind 127.0.0.1 --save "" --dir
    /// <fresh directory> <args>` (so no persistence unless `args` turn on AOF), and
    /// waits until it answers `PING`.
    pub fn start(args: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "idemgate-redis-test-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        let mut server = Self {
            child: None,
            port: idemgate_testkit::free_port(),
            dir,
            args: args.iter().map(|s| (*s).to_owned()).collect(),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let port = self.port.to_string();
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &port, "--bind", "127.0.0.1", "--save", ""])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command
            .spawn()
            .expect("start redis-server (is it installed? scripts/services.sh redis installs it)");
        self.child = Some(child);
        self.wait_until_up();
    }

    fn wait_until_up(&mut self) {
        let start = Instant::now();
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        while start.elapsed() < Duration::from_secs(10) {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "redis-server on port {} exited at start: {status}",
                    self.port
                );
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok()
                && redis::Client::open(self.url())
                    .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
                    .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                    .is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "redis-server on port {} did not answer PING within 10 s",
            self.port
        );
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Kills the process with SIGKILL (`kill -9`) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A stopped process dies of SIGKILL too, but resume it in case.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGSTOP (`pause == true`) or SIGCONT: a server that accepts nothing and
    /// answers nothing, as behind a network partition.
    pub fn pause(&self, pause: bool) {
        let pid = self
            .child
            .as_ref()
            .expect("server running")
            .id()
            .to_string();
        let signal = if pause { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// Starts the server again on the same port and directory, with the same options.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// A synchronous connection for setting up and inspecting the server.
    pub fn admin(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .expect("admin connection to the dedicated server")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// 64 tasks claim one fresh identity at once, half through `a`, half through `b`
/// (two separate clients): exactly one wins, and every loser sees the winner's record.
pub async fn two_clients_race(a: &idemgate_redis::RedisStore, b: &idemgate_redis::RedisStore) {
    use idemgate_core::{Claim, Store};
    use std::sync::Arc;

    const RACERS: usize = 64;
    let request = Arc::new(idemgate_testkit::fixtures::fresh_request());
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let (request, barrier) = (Arc::clone(&request), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                store.try_claim(&request).await.expect("claim")
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for task in tasks {
        match task.await.expect("task") {
            Claim::Acquired(lease) => winners.push(lease),
            Claim::Existing(snapshot) => losers.push(snapshot),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "{} of {RACERS} concurrent claims through two clients won; exactly one may",
        winners.len()
    );
    for loser in &losers {
        assert_eq!(loser.record.operation_id, winners[0].operation_id);
        assert_eq!(loser.record.token, winners[0].token);
    }
}

/// A waiter on store `b` wakes when store `a` (another client, as on another
/// instance) completes the record: through pub/sub, well before its timeout.
pub async fn other_instance_wakes_waiter(
    a: &idemgate_redis::RedisStore,
    b: &idemgate_redis::RedisStore,
) {
    use idemgate_core::{Claim, Completion, FencedWrite, FinalStatus, Store};

    let request = idemgate_testkit::fixtures::fresh_request();
    let Claim::Acquired(lease) = a.try_claim(&request).await.expect("claim") else {
        panic!("fresh identity not acquired");
    };
    let digest = *request.identity.digest();
    // The first wait subscribes; give the subscription a moment before measuring.
    b.wait_for_change(&digest, Duration::from_millis(300)).await;
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            b.wait_for_change(&digest, Duration::from_secs(10)).await;
            start.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let completion = Completion {
        status: FinalStatus::Completed,
        response: idemgate_testkit::fixtures::awkward_response(),
        ttl: Duration::from_secs(60),
    };
    assert_eq!(
        a.complete(&lease, &completion).await.expect("complete"),
        FencedWrite::Applied
    );
    let waited = waiter.await.expect("waiter");
    assert!(
        waited < Duration::from_secs(3),
        "the other instance's waiter woke only after {waited:?}"
    );
    let seen = b.get(&digest).await.expect("get").expect("record");
    assert!(seen.record.status().is_final());
}

/// Announcements cost only where someone waits: a completion nobody waits for
/// publishes nothing on the change channel, one that a waiter on `b` marked does
/// (and wakes it), and a wait on a record that ended before the wait began returns
/// at once instead of sleeping out its timeout. `subscriber_url` is a server (or
/// any cluster node) to listen on the channel through.
pub async fn announcements_only_when_waited(
    a: &idemgate_redis::RedisStore,
    b: &idemgate_redis::RedisStore,
    subscriber_url: &str,
) {
    use futures_util::StreamExt;
    use idemgate_core::{Claim, Completion, FencedWrite, FinalStatus, Store};

    let completion = Completion {
        status: FinalStatus::Completed,
        response: idemgate_testkit::fixtures::awkward_response(),
        ttl: Duration::from_secs(60),
    };
    let acquire = |request| async move {
        match a.try_claim(&request).await.expect("claim") {
            Claim::Acquired(lease) => lease,
            Claim::Existing(_) => panic!("fresh identity not acquired"),
        }
    };
    let mut pubsub = redis::Client::open(subscriber_url)
        .expect("url")
        .get_async_pubsub()
        .await
        .expect("pub/sub connection");
    pubsub
        .subscribe(a.change_channel())
        .await
        .expect("subscribe");
    let mut messages = pubsub.into_on_message();

    // Nobody waits: completed, not announced.
    let unwaited = idemgate_testkit::fixtures::fresh_request();
    let lease = acquire(unwaited.clone()).await;
    assert_eq!(
        a.complete(&lease, &completion).await.expect("complete"),
        FencedWrite::Applied
    );

    // A waiter on the other instance: announced, and the waiter wakes.
    let waited = idemgate_testkit::fixtures::fresh_request();
    let lease = acquire(waited.clone()).await;
    let digest = *waited.identity.digest();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            b.wait_for_change(&digest, Duration::from_secs(10)).await;
            start.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        a.complete(&lease, &completion).await.expect("complete"),
        FencedWrite::Applied
    );
    let woke_after = waiter.await.expect("waiter");
    assert!(
        woke_after < Duration::from_secs(3),
        "the waiter woke only after {woke_after:?}"
    );

    // Other tests share the channel: read until the waited record's announcement.
    let mut seen = Vec::new();
    let found = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(message) = messages.next().await {
            let payload = message.get_payload_bytes().to_vec();
            if payload == digest.as_bytes() {
                return true;
            }
            seen.push(payload);
        }
        false
    })
    .await;
    assert_eq!(
        found,
        Ok(true),
        "the waited-for completion was not announced"
    );
    assert!(
        !seen
            .iter()
            .any(|p| p == unwaited.identity.digest().as_bytes()),
        "a completion nobody waited for was announced"
    );

    // Ended before the wait began: no announcement to hear, the mark says so.
    let ended = idemgate_testkit::fixtures::fresh_request();
    let lease = acquire(ended.clone()).await;
    assert_eq!(
        a.complete(&lease, &completion).await.expect("complete"),
        FencedWrite::Applied
    );
    let start = Instant::now();
    b.wait_for_change(ended.identity.digest(), Duration::from_secs(10))
        .await;
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "a wait on a record that had ended slept {:?}",
        start.elapsed()
    );
}

/// A stream recorded through store `a` is read through store `b` (another
/// client, as on another instance), piece for piece, while it flows and once
/// completed; and a reader waiting on `b` is woken by each piece `a` appends
/// (through pub/sub), well before its timeout.
pub async fn other_instance_reads_and_wakes_on_pieces(
    a: &idemgate_redis::RedisStore,
    b: &idemgate_redis::RedisStore,
) {
    use bytes::Bytes;
    use idemgate_core::record::{StoredBody, StoredResponse};
    use idemgate_core::stream::StreamId;
    use idemgate_core::{Claim, Completion, FencedWrite, FinalStatus, Store};

    let request = idemgate_testkit::fixtures::fresh_request();
    let Claim::Acquired(lease) = a.try_claim(&request).await.expect("claim") else {
        panic!("fresh identity not acquired");
    };
    let stream = lease.stream();
    let digest = stream.identity;
    let sent: Vec<Bytes> = (0..4)
        .map(|i| Bytes::from(format!("id: {i}\ndata: piece {i}\n\n")))
        .collect();
    assert_eq!(
        a.append_stream_piece(&lease, 0, &sent[0])
            .await
            .expect("append"),
        FencedWrite::Applied
    );
    assert_eq!(
        b.read_stream_pieces(&stream, 0, 10).await.expect("read"),
        sent[..1],
        "the other instance reads the piece"
    );
    // The first wait subscribes; give the subscription a moment before measuring.
    b.wait_for_change(&digest, Duration::from_millis(300)).await;
    for index in 1..sent.len() {
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                b.wait_for_change(&digest, Duration::from_secs(10)).await;
                start.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            a.append_stream_piece(&lease, index as u32, &sent[index])
                .await
                .expect("append"),
            FencedWrite::Applied
        );
        let waited = waiter.await.expect("waiter");
        assert!(
            waited < Duration::from_secs(3),
            "the other instance's reader woke only after {waited:?} for piece {index}"
        );
        assert_eq!(
            b.read_stream_pieces(&stream, 0, 10).await.expect("read"),
            sent[..=index]
        );
    }
    let response = StoredResponse {
        trailers: Vec::new(),
        body: StoredBody::InPieces(3),
        ..idemgate_testkit::fixtures::awkward_response()
    };
    let completion = Completion {
        status: FinalStatus::Completed,
        response: response.clone(),
        ttl: Duration::from_secs(60),
    };
    assert_eq!(
        a.complete(&lease, &completion).await.expect("complete"),
        FencedWrite::Applied
    );
    let done = b.get(&digest).await.expect("get").expect("record");
    assert_eq!(done.record.response(), Some(&response));
    let named = StreamId::of_record(digest, &done.record);
    assert_eq!(
        b.read_stream_pieces(&named, 1, 10).await.expect("read"),
        sent[1..],
        "the completed record's pieces, read on the other instance"
    );
}
