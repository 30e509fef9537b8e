//! Upstream body stalls (issue 20, class 3): a response that stops mid-body is
//! cut at the idle timeout (or the total deadline) with a 504, its outcome
//! settled as unknown, the upstream connection closed.

use std::time::{Duration, Instant};

use idemgate_testkit::raw_client::{RawClient, RawRequest};
use idemgate_testkit::upstreams::UpstreamKind;

use crate::support::*;

const IDLE: Duration = Duration::from_millis(300);

/// Waits until the upstream has seen `n` stalled responses cut, or fails.
async fn cut(proxy: &Proxy, n: usize) {
    let until = Instant::now() + Duration::from_secs(5);
    while proxy.upstream.stalls_cut() < n {
        assert!(
            Instant::now() < until,
            "the proxy kept {} stalled upstream connection(s) open",
            n - proxy.upstream.stalls_cut()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_covered_response_that_stalls_is_a_stored_504() {
    let proxy = proxy(UpstreamKind::Strict, |c| c.with_upstream_idle_timeout(IDLE)).await;
    let key = key();
    let started = Instant::now();
    let first = proxy.send(&post("/stall", Some(&key))).await;
    assert_eq!(first.status, 504, "{}", first.text());
    assert_eq!(first.problem().as_deref(), Some("upstream-timeout"));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "cut by the idle timeout, not the upstream"
    );
    cut(&proxy, 1).await;
    let retry = proxy.send(&post("/stall", Some(&key))).await;
    assert_eq!(retry.status, 504);
    assert!(
        retry.replayed(),
        "the outcome is unknown: stored, never run again"
    );
    assert_eq!(retry.body, first.body);
    assert_eq!(proxy.upstream.count(), 1);
}

#[tokio::test]
async fn a_route_that_releases_server_errors_runs_the_stalled_request_again() {
    let extra = r#"
[[route]]
method = "POST"
path = "/stall"
server_errors = "release"
upstream_idle_timeout_ms = 200
"#;
    let proxy = proxy(UpstreamKind::Strict, |c| c.with_routes(routes(extra))).await;
    let key = key();
    for _ in 0..2 {
        let answer = proxy.send(&post("/stall", Some(&key))).await;
        assert_eq!(answer.status, 504);
        assert!(!answer.replayed());
    }
    assert_eq!(proxy.upstream.count(), 2, "released: the retry ran");
    cut(&proxy, 2).await;
}

#[tokio::test]
async fn an_uncovered_stream_that_stalls_is_cut_off() {
    let proxy = proxy(UpstreamKind::Strict, |c| c.with_upstream_idle_timeout(IDLE)).await;
    let started = Instant::now();
    let mut client = RawClient::connect(proxy.addr).await;
    client
        .send(&RawRequest::new("GET", "/stall").bytes())
        .await
        .unwrap();
    let answer = client.response().await.unwrap();
    assert_eq!(answer.status, 200, "the head had gone out");
    assert!(!answer.complete, "the body ends short: 10 of 1000 bytes");
    assert_eq!(answer.body, b"0123456789");
    assert!(started.elapsed() < Duration::from_secs(4));
    cut(&proxy, 1).await;
}

#[tokio::test]
async fn a_trickle_is_cut_by_the_total_deadline() {
    let proxy = proxy(UpstreamKind::Strict, |c| {
        c.with_upstream_idle_timeout(Duration::from_secs(2))
            .with_upstream_response_timeout(Duration::from_millis(800))
    })
    .await;
    let key = key();
    let started = Instant::now();
    let answer = proxy.send(&post("/trickle", Some(&key))).await;
    assert_eq!(answer.status, 504, "{}", answer.text());
    assert_eq!(answer.problem().as_deref(), Some("upstream-timeout"));
    assert!(started.elapsed() < Duration::from_secs(4));
    cut(&proxy, 1).await;
    let retry = proxy.send(&post("/trickle", Some(&key))).await;
    assert!(retry.replayed());
    assert_eq!(proxy.upstream.count(), 1);
}

#[tokio::test]
async fn a_stall_past_the_stored_response_limit_cuts_the_stream_and_stays_not_retained() {
    // Past the limit the layer has sent the head and streams the rest: the
    // client's body ends short, and the record says "not retained".
    let extra = r#"
[[route]]
method = "POST"
path = "/stall"
max_stored_response = 5
upstream_idle_timeout_ms = 300
"#;
    let proxy = proxy(UpstreamKind::Strict, |c| c.with_routes(routes(extra))).await;
    let key = key();
    let first = proxy.send(&post("/stall", Some(&key))).await;
    assert_eq!(first.status, 200);
    assert!(!first.complete, "cut off mid-body");
    cut(&proxy, 1).await;
    let retry = proxy.send(&post("/stall", Some(&key))).await;
    assert_eq!(retry.status, 200);
    assert!(retry.replayed());
    assert_eq!(
        retry.header("idempotency-response").as_deref(),
        Some("not-retained")
    );
    assert!(retry.body.is_empty());
    assert_eq!(proxy.upstream.count(), 1, "never run again");
}
