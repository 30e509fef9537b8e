//! Connection hygiene against the real binary over raw TCP: slow heads, slow
//! bodies, idle keep-alive connections, the connection bound and file-descriptor
//! exhaustion. Short timeouts through the flags keep each test to a few seconds;
//! every attacker count and wait is bounded, and every assertion is about effects
//! (who got served, what was charged), with generous bounds for "closed in time".

use std::time::Duration;

use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::support::client::{Client, ORDER, new_key};
use crate::support::gateway::MockGateway;
use crate::support::server::{Options, Server, sqlite_url};

/// Slack on top of a timeout before "closed in time" fails: the machine is shared.
const MARGIN: Duration = Duration::from_secs(4);

/// How a raw connection ended, as its client saw it.
#[derive(Debug)]
struct Ending {
    /// Everything the server sent before it closed.
    received: Vec<u8>,
    /// How long after connecting.
    after: Duration,
}

impl Ending {
    fn status_line(&self) -> String {
        String::from_utf8_lossy(&self.received)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    }
}

/// Reads until the server closes (EOF or reset), at most `bound`.
async fn read_until_closed(
    mut reader: tokio::net::tcp::OwnedReadHalf,
    started: Instant,
    bound: Duration,
) -> Option<Ending> {
    let mut received = Vec::new();
    let mut buf = [0_u8; 4096];
    let deadline = started + bound;
    loop {
        match tokio::time::timeout_at(deadline, reader.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => {
                return Some(Ending {
                    received,
                    after: started.elapsed(),
                });
            }
            Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
        }
    }
}

/// A client that connects and then sends `bytes` one at a time, `every` apart,
/// until the server closes; returns how that ended (`None`: still open at `bound`).
fn dribbler(
    addr: std::net::SocketAddr,
    bytes: Vec<u8>,
    every: Duration,
    bound: Duration,
) -> JoinHandle<Option<Ending>> {
    tokio::spawn(async move {
        let started = Instant::now();
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (reader, mut writer) = stream.into_split();
        let closed = tokio::spawn(read_until_closed(reader, started, bound));
        for byte in bytes {
            if closed.is_finished() || writer.write_all(&[byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(every).await;
        }
        closed.await.expect("reader")
    })
}

fn order_head(token: &str, key: Option<&str>, length: usize) -> String {
    let key = key.map_or_else(String::new, |key| format!("idempotency-key: {key}\r\n"));
    format!(
        "POST /api/v1/orders HTTP/1.1\r\nhost: idemgate\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {length}\r\n{key}\r\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slowloris_heads_are_cut_at_the_header_timeout_while_a_normal_post_is_served() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let timeout = Duration::from_millis(1_500);
    let server = Server::start(
        Options::new(&db)
            .gateway(gateway.url())
            .arg("--header-read-timeout-ms", timeout.as_millis()),
    )
    .await;
    let head = order_head("slowloris", Some(&new_key()), ORDER.len());
    let attackers: Vec<_> = (0..100)
        .map(|_| {
            dribbler(
                server.addr,
                head.clone().into_bytes(),
                Duration::from_millis(250),
                timeout + MARGIN,
            )
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = Client::with_timeout(Duration::from_secs(10));
    let key = new_key();
    let answer = client
        .post(&server.url("/api/v1/orders"), Some(&key), ORDER)
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    for attacker in attackers {
        let ending = attacker
            .await
            .unwrap()
            .expect("a slowloris client was still connected after the header timeout");
        let status = ending.status_line();
        assert!(
            ending.received.is_empty() || status.starts_with("HTTP/1.1 408"),
            "a slow head got {status:?}"
        );
    }
    assert_eq!(gateway.calls().len(), 1, "only the normal POST was charged");
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
    assert!(
        Client::new()
            .with_token("slowloris")
            .orders(&server.url(""))
            .await
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_bodies_get_408_and_nothing_is_claimed_or_charged() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let timeout = Duration::from_millis(1_500);
    let server = Server::start(
        Options::new(&db)
            .gateway(gateway.url())
            .arg("--body-read-timeout-ms", timeout.as_millis()),
    )
    .await;
    let token = "slow-body";
    let keys: Vec<_> = (0..20).map(|_| new_key()).collect();
    let clients: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            // Half with a key (the layer buffers the body), half without (the
            // handler reads it).
            let key = (i % 2 == 0).then_some(key.as_str());
            let head = order_head(token, key, ORDER.len());
            let addr = server.addr;
            tokio::spawn(async move {
                let started = Instant::now();
                let stream = TcpStream::connect(addr).await.expect("connect");
                let (reader, mut writer) = stream.into_split();
                writer.write_all(head.as_bytes()).await.expect("head");
                let closed = tokio::spawn(read_until_closed(reader, started, timeout + MARGIN));
                for byte in ORDER.bytes() {
                    if closed.is_finished() || writer.write_all(&[byte]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                closed.await.expect("reader")
            })
        })
        .collect();
    let mut got_408 = 0;
    for client in clients {
        let ending = client
            .await
            .unwrap()
            .expect("a slow body was still connected after the body timeout");
        let status = ending.status_line();
        if status.starts_with("HTTP/1.1 408") {
            got_408 += 1;
            let text = String::from_utf8_lossy(&ending.received);
            assert!(text.contains("problems/body-timeout"), "{text}");
            assert!(text.contains("application/problem+json"), "{text}");
        } else {
            assert!(ending.received.is_empty(), "a slow body got {status:?}");
        }
        assert!(ending.after < timeout + MARGIN);
    }
    eprintln!("slow bodies: {got_408} of 20 read their 408 before the close");
    assert!(got_408 > 0, "no slow body was told 408");
    assert!(
        gateway.calls().is_empty(),
        "a slow body reached the gateway"
    );
    let client = Client::new().with_token(token);
    assert!(client.orders(&server.url("")).await.is_empty());
    // Nothing was claimed: the same key with the whole body runs, once.
    let answer = client
        .post(&server.url("/api/v1/orders"), Some(&keys[0]), ORDER)
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    assert!(!answer.replayed());
    assert_eq!(gateway.calls().len(), 1);
}

/// One `GET /healthz` on an open connection, read up to the end of its body.
async fn health_on(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: idemgate\r\n\r\n")
        .await
        .expect("request");
    let mut received = Vec::new();
    let mut buf = [0_u8; 1024];
    while !String::from_utf8_lossy(&received).contains("\"ok\"}") {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("an answer in time")
            .expect("read");
        assert!(n > 0, "closed before answering: {received:?}");
        received.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&received).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_header_timeout_starts_at_accept_and_idle_keep_alive_has_its_own_timeout() {
    let (db, _dir) = sqlite_url();
    let header = Duration::from_millis(1_000);
    let idle = Duration::from_millis(6_000);
    let server = Server::start(
        Options::new(&db)
            .arg("--header-read-timeout-ms", header.as_millis())
            .arg("--idle-timeout-ms", idle.as_millis()),
    )
    .await;

    // Connected, never a byte: closed at the header timeout.
    let started = Instant::now();
    let silent = TcpStream::connect(server.addr).await.unwrap();
    let (reader, _writer) = silent.into_split();
    let ending = read_until_closed(reader, started, header + MARGIN)
        .await
        .expect("a silent connection outlived the header timeout");
    assert!(ending.received.is_empty());

    // Served once, idle past the header timeout (the timer now waits for the
    // idle one), then half of the next head: the header timeout runs again
    // from its first byte, well before the idle timeout would have.
    let mut halfway = TcpStream::connect(server.addr).await.unwrap();
    let answer = health_on(&mut halfway).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    tokio::time::sleep(header + Duration::from_millis(300)).await;
    halfway
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: idemgate\r\n")
        .await
        .unwrap();
    let head_since = Instant::now();
    let (reader, _writer) = halfway.into_split();
    let ending = read_until_closed(reader, head_since, header + MARGIN)
        .await
        .expect("a half-sent head on a served connection outlived the header timeout");
    assert!(
        ending.after < idle / 2,
        "closed after {:?}: at the idle timeout, not at the header timeout",
        ending.after
    );

    // Served once, then idle: still open past the header timeout (hyper's own
    // header timer would have closed it), closed after the idle timeout.
    let mut kept = TcpStream::connect(server.addr).await.unwrap();
    let answer = health_on(&mut kept).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    tokio::time::sleep(header * 2).await;
    let answer = health_on(&mut kept).await;
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the idle connection was closed at the header timeout: {answer}"
    );
    let idle_since = Instant::now();
    let (reader, _writer) = kept.into_split();
    let ending = read_until_closed(reader, idle_since, idle + MARGIN)
        .await
        .expect("an idle keep-alive connection outlived the idle timeout");
    assert!(ending.received.is_empty());
    assert!(
        ending.after >= idle - Duration::from_millis(200),
        "closed after {:?}, before the idle timeout",
        ending.after
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_the_connection_bound_the_longest_idle_connection_makes_room() {
    let (db, _dir) = sqlite_url();
    let bound = 20;
    let server = Server::start(Options::new(&db).arg("--max-connections", bound)).await;
    let mut held = Vec::new();
    for _ in 0..bound {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        assert!(health_on(&mut stream).await.starts_with("HTTP/1.1 200"));
        held.push(stream);
    }
    // Each new connection at the bound is served; the oldest idle one closes.
    for round in 0..5 {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        assert!(
            health_on(&mut stream).await.starts_with("HTTP/1.1 200"),
            "round {round}: served at the bound"
        );
        let oldest = held.remove(0);
        let (reader, _writer) = oldest.into_split();
        assert!(
            read_until_closed(reader, Instant::now(), MARGIN)
                .await
                .is_some_and(|ending| ending.received.is_empty()),
            "round {round}: the longest idle connection was evicted"
        );
        held.push(stream);
    }
    // The others keep working.
    assert!(health_on(&mut held[0]).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn when_every_connection_is_busy_new_ones_are_shed_and_the_busy_ones_finish() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let bound = 20;
    let server = Server::start(
        Options::new(&db)
            .gateway(gateway.url())
            .arg("--max-connections", bound),
    )
    .await;
    // Each connection busy with a request whose body is half sent. The
    // server's `100 Continue` says the head was parsed (the request is busy)
    // before the half body is sent: no sleep standing for "all heads parsed".
    let (head_half, rest) = ORDER.split_at(ORDER.len() / 2);
    let mut busy = Vec::new();
    for _ in 0..bound {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        let request = format!(
            "POST /api/v1/orders HTTP/1.1\r\nhost: idemgate\r\nauthorization: Bearer token-{}\r\n\
             content-type: application/json\r\nidempotency-key: {}\r\ncontent-length: {}\r\n\
             expect: 100-continue\r\n\r\n",
            new_key(),
            new_key(),
            ORDER.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut interim = Vec::new();
        let mut buf = [0_u8; 256];
        while !interim.ends_with(b"\r\n\r\n") {
            let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
                .await
                .expect("a 100 Continue in time")
                .expect("read");
            assert!(n > 0, "closed before the 100 Continue: {interim:?}");
            interim.extend_from_slice(&buf[..n]);
        }
        assert!(
            interim.starts_with(b"HTTP/1.1 100 Continue\r\n"),
            "{:?}",
            String::from_utf8_lossy(&interim)
        );
        stream.write_all(head_half.as_bytes()).await.unwrap();
        busy.push(stream);
    }
    for _ in 0..10 {
        let started = Instant::now();
        let stream = TcpStream::connect(server.addr).await.unwrap();
        let (reader, mut writer) = stream.into_split();
        let _ = writer
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: idemgate\r\n\r\n")
            .await;
        let ending = read_until_closed(reader, started, MARGIN)
            .await
            .expect("a connection over the bound was left waiting");
        let status = ending.status_line();
        assert!(
            ending.received.is_empty() || status.starts_with("HTTP/1.1 503"),
            "over the bound with every connection busy: {status:?}"
        );
        if !ending.received.is_empty() {
            let text = String::from_utf8_lossy(&ending.received);
            assert!(text.contains("problems/connection-limit"), "{text}");
            assert!(text.contains("retry-after: 1"), "{text}");
        }
    }
    // The busy requests were never cut: each finishes with its 201.
    for stream in &mut busy {
        stream.write_all(rest.as_bytes()).await.unwrap();
        let mut received = Vec::new();
        let mut buf = [0_u8; 4096];
        while !String::from_utf8_lossy(&received).contains("\"status\":\"paid\"") {
            let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
                .await
                .expect("an answer in time")
                .expect("read");
            assert!(n > 0, "a busy connection was cut: {received:?}");
            received.extend_from_slice(&buf[..n]);
        }
        assert!(String::from_utf8_lossy(&received).starts_with("HTTP/1.1 201"));
    }
    assert_eq!(gateway.calls().len(), bound);
    // Now idle, they make room for a new client.
    let answer = Client::with_timeout(Duration::from_secs(5))
        .post(&server.url("/api/v1/orders"), Some(&new_key()), ORDER)
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_every_file_descriptor_taken_by_half_sent_requests_a_normal_post_is_served() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let limit = 256;
    let header = Duration::from_millis(2_000);
    let server = Server::start(
        Options::new(&db)
            .gateway(gateway.url())
            .open_file_limit(limit)
            .arg("--header-read-timeout-ms", header.as_millis()),
    )
    .await;
    // More half-sent requests than the process may open descriptors.
    let half = b"POST /api/v1/orders HTTP/1.1\r\nhost: idemgate\r\n".to_vec();
    let mut attackers = Vec::new();
    for _ in 0..limit + 100 {
        let addr = server.addr;
        let half = half.clone();
        attackers.push(tokio::spawn(async move {
            let started = Instant::now();
            let mut stream = TcpStream::connect(addr).await.expect("connect");
            let _ = stream.write_all(&half).await;
            let (reader, _writer) = stream.into_split();
            read_until_closed(reader, started, header + MARGIN * 2).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A normal client retries (same key: safe) while it is shed.
    let client = Client::with_timeout(Duration::from_secs(5));
    let key = new_key();
    let started = Instant::now();
    let mut shed = 0;
    let answer = loop {
        match client
            .try_post(&server.url("/api/v1/orders"), Some(&key), ORDER)
            .await
        {
            Ok(answer) if answer.status == StatusCode::CREATED => break answer,
            Ok(answer) => {
                assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
                shed += 1;
            }
            Err(_) => shed += 1,
        }
        assert!(
            started.elapsed() < header + MARGIN * 2,
            "no normal request served within seconds ({shed} attempts shed)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "fd exhaustion: normal POST served after {:?} ({shed} attempts shed)",
        started.elapsed()
    );
    assert!(!answer.replayed());
    let mut closed = 0;
    for attacker in attackers {
        if attacker.await.unwrap().is_some() {
            closed += 1;
        }
    }
    assert_eq!(
        closed,
        limit + 100,
        "half-sent requests outlived the header timeout"
    );
    assert_eq!(gateway.calls().len(), 1);
    assert_eq!(gateway.distinct_charges(), 1);
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
}

/// CPU time (user + system) the process has used, in clock ticks.
fn cpu_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("comm")
        .1
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn open_fds(pid: &str) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/PID/fd")
        .count() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_accept_loop_survives_emfile_without_spinning() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let header = Duration::from_millis(2_000);
    let server = Server::start(
        Options::new(&db)
            .gateway(gateway.url())
            .arg("--header-read-timeout-ms", header.as_millis()),
    )
    .await;
    let url = server.url("/api/v1/orders");
    let warm = Client::new();
    assert_eq!(
        warm.post(&url, Some(&new_key()), ORDER).await.status,
        StatusCode::CREATED
    );
    // Lower the running server's limit to a few descriptors above what it holds:
    // its connection bound (computed at startup) no longer protects it, so
    // accept() itself fails with EMFILE.
    let pid = server.pid().to_string();
    let limit = open_fds(&pid) + 16;
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &pid, &format!("--nofile={limit}:{limit}")])
        .status()
        .expect("prlimit");
    assert!(status.success());
    let half = b"POST /api/v1/orders HTTP/1.1\r\nhost: idemgate\r\n".to_vec();
    let mut attackers = Vec::new();
    for _ in 0..40 {
        let mut stream = TcpStream::connect(server.addr).await.expect("connect");
        let _ = stream.write_all(&half).await;
        attackers.push(stream);
    }
    // While accept() fails, the loop pauses between attempts instead of spinning.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (ticks_before, wall) = (cpu_ticks(&pid), Instant::now());
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let used = cpu_ticks(&pid) - ticks_before;
    let elapsed_ticks = wall.elapsed().as_millis() as u64 / 10; // USER_HZ = 100
    assert!(
        used * 2 < elapsed_ticks,
        "the server used {used} of {elapsed_ticks} ticks while out of descriptors: spinning"
    );
    // As the half-sent requests time out, the backlog drains and a normal POST
    // (retried with its key while refused) is served.
    let client = Client::with_timeout(Duration::from_secs(5));
    let key = new_key();
    let started = Instant::now();
    loop {
        match client.try_post(&url, Some(&key), ORDER).await {
            Ok(answer) if answer.status == StatusCode::CREATED => break,
            other => {
                assert!(
                    started.elapsed() < header * 4 + MARGIN,
                    "no normal request served after the descriptors ran out: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    eprintln!(
        "EMFILE: {used} of {elapsed_ticks} CPU ticks while out of descriptors; normal POST served after {:?}",
        started.elapsed()
    );
    drop(attackers);
    let metrics = Client::new().get(&server.url("/metrics")).await;
    let text = String::from_utf8_lossy(&metrics.body);
    let errors: f64 = text
        .lines()
        .find(|line| line.starts_with("idemgate_http_accept_errors_total"))
        .and_then(|line| line.split_whitespace().last())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no accept errors counted:\n{text}"));
    assert!(errors > 0.0);
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
    assert_eq!(gateway.distinct_charges(), 2, "one charge per key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_shutdown_finishes_in_flight_requests_and_does_not_wait_on_slow_clients() {
    let gateway = MockGateway::start().await;
    gateway.set_delay(Duration::from_millis(1_000));
    let (db, _dir) = sqlite_url();
    let header = Duration::from_millis(1_500);
    let server = Server::start(
        Options::new(&db)
            .gateway(gateway.url())
            .arg("--header-read-timeout-ms", header.as_millis()),
    )
    .await;
    // Slow heads and an idle keep-alive connection stay open across the signal.
    let head = order_head("slowloris", None, ORDER.len());
    let slow: Vec<_> = (0..10)
        .map(|_| {
            dribbler(
                server.addr,
                head.clone().into_bytes(),
                Duration::from_millis(250),
                header + MARGIN,
            )
        })
        .collect();
    let mut idle = TcpStream::connect(server.addr).await.unwrap();
    assert!(health_on(&mut idle).await.starts_with("HTTP/1.1 200"));
    let client = Client::new();
    let url = server.url("/api/v1/orders");
    let key = new_key();
    let in_flight = {
        let (client, url, key) = (client.clone(), url.clone(), key.clone());
        let arrived = gateway.next_arrival();
        let request = tokio::spawn(async move { client.post(&url, Some(&key), ORDER).await });
        tokio::time::timeout(Duration::from_secs(20), arrived)
            .await
            .expect("a charge reaches the gateway");
        request
    };
    let stopping = Instant::now();
    server.terminate();
    let answer = in_flight.await.unwrap();
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    let exit = server.wait_exit().await;
    assert!(exit.success(), "{exit}");
    assert!(
        stopping.elapsed() < header + MARGIN,
        "shutdown waited {:?} on slow clients",
        stopping.elapsed()
    );
    for slow in slow {
        assert!(
            slow.await.unwrap().is_some(),
            "a slow client outlived the server"
        );
    }
    assert_eq!(gateway.calls().len(), 1);
}

/// An HTTP/2 request ends on the task of its stream, not the connection's,
/// after the timer set at accept has fired: the connection's watchdog must
/// still learn that it went idle (from the connection's own turn that writes
/// the answer out, or from the wake-up of the stream's end) and close it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_http2_connection_idle_after_a_slow_request_is_closed_at_the_idle_timeout() {
    let gateway = MockGateway::start().await;
    let header = Duration::from_millis(1_000);
    let idle = Duration::from_millis(3_000);
    // Longer than the header timeout: the timer set at accept has fired and
    // nothing is armed while the request runs.
    gateway.set_delay(header + Duration::from_millis(500));
    let (db, _dir) = sqlite_url();
    let server = Server::start(
        Options::new(&db)
            .gateway(gateway.url())
            .arg("--header-read-timeout-ms", header.as_millis())
            .arg("--idle-timeout-ms", idle.as_millis()),
    )
    .await;
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("an h2c connection with prior knowledge");
    let closed = tokio::spawn(connection);
    let request = http::Request::post(format!("http://{}/api/v1/orders", server.addr))
        .header("authorization", "Bearer h2-idle")
        .header("content-type", "application/json")
        .header("idempotency-key", new_key())
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            ORDER.as_bytes(),
        )))
        .unwrap();
    let response = sender.send_request(request).await.expect("an answer");
    assert_eq!(response.status(), http::StatusCode::CREATED);
    http_body_util::BodyExt::collect(response.into_body())
        .await
        .expect("the whole body");
    let idle_since = Instant::now();
    tokio::time::timeout(idle + MARGIN, closed)
        .await
        .expect("an HTTP/2 connection idle after its request outlived the idle timeout")
        .unwrap()
        .ok();
    assert!(
        idle_since.elapsed() >= idle - Duration::from_millis(200),
        "closed after {:?}, before the idle timeout",
        idle_since.elapsed()
    );
    assert_eq!(gateway.distinct_charges(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_http2_connection_that_sends_no_request_is_closed_at_the_header_timeout() {
    let (db, _dir) = sqlite_url();
    let header = Duration::from_millis(1_000);
    let server =
        Server::start(Options::new(&db).arg("--header-read-timeout-ms", header.as_millis())).await;
    let started = Instant::now();
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    // The HTTP/2 preface and an empty SETTINGS frame: a valid h2c start, then silence.
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let (reader, _writer) = stream.into_split();
    let ending = read_until_closed(reader, started, header + MARGIN)
        .await
        .expect("an HTTP/2 connection without a request outlived the header timeout");
    // The server spoke HTTP/2 (its SETTINGS frame, type 4) before closing.
    assert!(
        ending.received.len() >= 9 && ending.received[3] == 4,
        "{:?}",
        ending.received
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_soft_open_file_limit_is_raised_to_the_hard_limit_at_startup() {
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).open_file_limits(256, 4096)).await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", server.pid())).unwrap();
    let open_files: Vec<&str> = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .expect("Max open files")
        .split_whitespace()
        .skip(3)
        .take(2)
        .collect();
    assert_eq!(open_files, ["4096", "4096"], "{limits}");
}
