//! Client framing errors (issue 20, class 9) are the client's: `400`, never
//! `502`; and re-framed requests never carry a second request to the upstream.

use std::time::Duration;

use idemgate_testkit::guard_cases;
use idemgate_testkit::raw_client::{RawClient, RawRequest};
use idemgate_testkit::upstreams::UpstreamKind;

use crate::support::*;

fn chunked(path: &str, key: Option<&str>, body: &[u8]) -> RawRequest {
    post(path, key)
        .header("Transfer-Encoding", "chunked")
        .body(body)
}

#[tokio::test]
async fn bad_chunked_framing_is_a_400_covered_or_not() {
    let proxy = proxy(UpstreamKind::Strict, |c| c).await;
    let key = key();
    for body in guard_cases::bad_chunked_bodies() {
        for request in [
            chunked("/orders", None, body),
            chunked("/orders", Some(&key), body),
        ] {
            guard_cases::assert_framing_refused(body, &proxy.send(&request).await);
        }
    }
    assert!(
        proxy
            .upstream
            .seen()
            .iter()
            .all(|s| !s.is("POST", "/orders")),
        "no broken body ran"
    );
}

#[tokio::test]
async fn a_body_cut_off_mid_chunk_is_not_blamed_on_the_upstream() {
    let proxy = proxy(UpstreamKind::Strict, |c| c).await;
    let mut client = RawClient::connect(proxy.addr).await;
    client
        .send(&chunked("/orders", None, b"a\r\n01234").bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    client.send(b"zz-not-a-chunk\r\n").await.unwrap();
    let answer = client.response().await.unwrap();
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert_eq!(answer.problem().as_deref(), Some("unreadable-body"));
}

#[tokio::test]
async fn framing_the_proxy_refuses_never_reaches_the_upstream() {
    let proxy = proxy(UpstreamKind::Naive, |c| c).await;
    for request in [
        post("/orders", None)
            .header("Transfer-Encoding", "gzip")
            .body(b"{}"),
        post("/orders", None)
            .header("Content-Length", "2")
            .header("Content-Length", "3")
            .body(b"{}"),
        post("/orders", None)
            .header("Content-Length", "-1")
            .body(b"{}"),
    ] {
        let answer = proxy.send(&request).await;
        assert_eq!(answer.status, 400);
    }
    assert_eq!(proxy.upstream.count(), 0);
}

#[tokio::test]
async fn content_length_beside_chunked_is_reframed_as_one_request() {
    // The naive upstream reads bodies by Content-Length only: if the proxy passed
    // both headers on, the chunk bytes would be a second request there.
    let proxy = proxy(UpstreamKind::Naive, |c| c).await;
    let smuggle = b"2\r\n{}\r\n0\r\n\r\nPOST /payments HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
    let request = post("/orders", None)
        .header("Content-Length", "4")
        .header("Transfer-Encoding", "chunked")
        .body(smuggle);
    let mut client = RawClient::connect(proxy.addr).await;
    client.send(&request.bytes()).await.unwrap();
    let _ = client.response().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen = proxy.upstream.seen();
    assert!(
        seen.iter()
            .all(|s| !s.is("POST", "/payments") || s.header("idempotency-key").is_some())
    );
    assert_no_keyless_payment(&proxy, &[]);
    assert!(seen.iter().filter(|s| s.is("POST", "/orders")).count() <= 1);
}
