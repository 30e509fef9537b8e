//! Issue 20, item 9, against the real binary: at the connection bound the
//! listener evicts the connection that has waited longest for a request head
//! instead of refusing the new one, so clients holding half a head cannot keep
//! a normal client out — under `prlimit --nofile=1024` (`serve`) and under a low
//! `--max-connections` (`proxy`). Every attacker count is bounded, every
//! process is killed when its handle drops.

use std::time::Duration;

use reqwest::StatusCode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::client::{Client, ORDER, new_key};
use crate::support::gateway::MockGateway;
use crate::support::proxy::{Proxy, ProxyOptions};
use crate::support::server::{Options, Server, sqlite_url};
use idemgate_testkit::raw_client::{RawClient, RawRequest};
use idemgate_testkit::upstreams::{TestUpstream, UpstreamKind};

/// Far beyond anything a test waits: the half-sent heads outlive every test.
const HEADER_TIMEOUT_MS: u64 = 60_000;

/// `n` connections to `addr`, each holding half a request head.
async fn half_heads(addr: std::net::SocketAddr, n: usize, head: &[u8]) -> Vec<TcpStream> {
    // The test process holds them all (and the server's side as many).
    let _ = rlimit::increase_nofile_limit(4 * n as u64 + 1024);
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(head).await.expect("half a head");
        held.push(stream);
    }
    held
}

/// How many of `held` the server has closed (EOF or reset), without waiting on
/// the open ones.
async fn closed(held: &[TcpStream]) -> usize {
    // Let the last evictions' FINs arrive.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut buf = [0_u8; 1024];
    held.iter()
        .filter(|stream| match stream.try_read(&mut buf) {
            Ok(0) => true,
            Ok(_) => false,
            Err(error) => error.kind() != std::io::ErrorKind::WouldBlock,
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_nofile_1024_half_sent_heads_never_keep_a_normal_post_out() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(
        Options::new(&db)
            .gateway(gateway.url())
            .open_file_limit(1024)
            .arg("--header-read-timeout-ms", HEADER_TIMEOUT_MS),
    )
    .await;
    let attackers = half_heads(
        server.addr,
        1_100,
        b"POST /api/v1/orders HTTP/1.1\r\nhost: idemgate\r\n",
    )
    .await;
    // No retry loop: every POST must be served on its first attempt, long
    // before the header timeout could have cut a single attacker.
    let client = Client::with_timeout(Duration::from_secs(10));
    for round in 0..5 {
        let answer = client
            .try_post(&server.url("/api/v1/orders"), Some(&new_key()), ORDER)
            .await
            .unwrap_or_else(|error| panic!("round {round}: {error}"));
        assert_eq!(
            answer.status,
            StatusCode::CREATED,
            "round {round}: {answer:?}"
        );
        assert!(!answer.replayed());
    }
    assert_eq!(gateway.calls().len(), 5);
    assert_eq!(gateway.distinct_charges(), 5);
    assert_eq!(client.orders(&server.url("")).await.len(), 5);
    // The bound (1024 minus the reserve) was reached: attackers were evicted.
    let evicted = closed(&attackers).await;
    eprintln!(
        "nofile 1024: 5 POSTs served on their first attempt; {evicted} of 1100 half-sent heads evicted"
    );
    assert!(
        evicted >= 100,
        "only {evicted} of 1100 half-sent heads closed"
    );
    assert!(
        evicted < 1_100,
        "every attacker closed: the bound was not the cause"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_proxy_at_its_connection_bound_serves_a_normal_post_at_once() {
    let upstream = TestUpstream::start(UpstreamKind::Strict).await;
    let bound = 50;
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .arg("--principal", "header:x-user")
            .arg("--max-connections", bound)
            .arg("--header-read-timeout-ms", HEADER_TIMEOUT_MS),
    )
    .await;
    let attackers = half_heads(
        proxy.addr,
        bound + 100,
        b"POST /payments HTTP/1.1\r\nhost: idemgate\r\nx-user: mallory\r\n",
    )
    .await;
    for round in 0..5 {
        let request = RawRequest::new("POST", "/payments")
            .header("x-user", "alice")
            .header("Idempotency-Key", new_key())
            .body(br#"{"amount":1}"#);
        let answer = RawClient::exchange(proxy.addr, &request)
            .await
            .unwrap_or_else(|error| panic!("round {round}: {error}"));
        assert_eq!(answer.status, 201, "round {round}: {}", answer.text());
    }
    assert_eq!(upstream.ran("POST", "/payments"), 5);
    let evicted = closed(&attackers).await;
    assert!(evicted >= 100, "only {evicted} half-sent heads closed");
    let metrics = reqwest::get(format!("http://{}/metrics", proxy.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counted: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("idemgate_http_connections_evicted_total "))
        .unwrap_or_else(|| panic!("no eviction counter: {metrics}"))
        .parse()
        .unwrap();
    assert!(counted >= 100, "{counted} evictions counted");
}
