//! Upgrades (issue 20, class 4): only a `GET` WebSocket is tunnelled, its `101`
//! checked against the request; `h2c` never switches; a covered request never
//! upgrades and a `101` is never stored.

use std::time::Duration;

use idemgate_testkit::raw_client::{RawClient, RawRequest};
use idemgate_testkit::upstreams::{UpstreamKind, websocket_accept};

use crate::support::*;

const WS_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

fn websocket(path: &str) -> RawRequest {
    RawRequest::new("GET", path)
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Key", WS_KEY)
        .header("Sec-WebSocket-Version", "13")
}

#[tokio::test]
async fn a_websocket_get_is_tunnelled_once_its_handshake_checks_out() {
    let proxy = proxy(UpstreamKind::Strict, |c| c).await;
    let mut client = RawClient::connect(proxy.addr).await;
    client.send(&websocket("/ws").bytes()).await.unwrap();
    let answer = client.response().await.unwrap();
    assert_eq!(answer.status, 101);
    assert_eq!(
        answer.header("sec-websocket-accept").as_deref(),
        Some(websocket_accept(WS_KEY.as_bytes()).as_str())
    );
    client.send(b"ping through the tunnel").await.unwrap();
    let mut echoed = Vec::new();
    while echoed.len() < 23 {
        let bytes = client.read_some(Duration::from_secs(5)).await;
        assert!(!bytes.is_empty(), "the tunnel went quiet");
        echoed.extend(bytes);
    }
    assert_eq!(echoed, b"ping through the tunnel");
}

#[tokio::test]
async fn a_101_that_does_not_answer_the_handshake_is_a_502() {
    let proxy = proxy(UpstreamKind::Strict, |c| c).await;
    let mut client = RawClient::connect(proxy.addr).await;
    client
        .send(&websocket("/ws-wrong-accept").bytes())
        .await
        .unwrap();
    let answer = client.response().await.unwrap();
    assert_eq!(answer.status, 502, "{}", answer.text());
    assert_eq!(answer.problem().as_deref(), Some("upstream-failed"));
    // Not a websocket request: a POST asking for one is not upgraded at all.
    let post_ws = RawRequest::new("POST", "/ws")
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Key", WS_KEY)
        .body(b"{}");
    let answer = proxy.send(&post_ws).await;
    assert_eq!(answer.status, 201, "forwarded as a plain POST");
    let seen = proxy.upstream.seen();
    assert!(seen[1].header("upgrade").is_none());
}

#[tokio::test]
async fn h2c_is_never_switched_to_and_no_request_rides_past_the_layer() {
    for kind in [
        UpstreamKind::Strict,
        UpstreamKind::Lenient,
        UpstreamKind::Naive,
    ] {
        let proxy = proxy(kind, |c| c).await;
        let mut client = RawClient::connect(proxy.addr).await;
        let h2c = RawRequest::new("GET", "/search")
            .header("Connection", "Upgrade, HTTP2-Settings")
            .header("Upgrade", "h2c")
            .header("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA");
        client.send(&h2c.bytes()).await.unwrap();
        let answer = client.response().await.unwrap();
        assert_eq!(
            answer.status, 201,
            "{kind:?}: answered as HTTP/1.1, not switched"
        );
        // The same connection goes on through the layer: a keyless POST to the
        // payments route is refused, not tunnelled.
        client.send(&post("/payments", None).bytes()).await.unwrap();
        let next = client.response().await.unwrap();
        assert_eq!(next.problem().as_deref(), Some("missing-key"), "{kind:?}");
        let seen = proxy.upstream.seen();
        assert_eq!(seen.len(), 1, "{kind:?}: only the GET reached the upstream");
        assert!(seen[0].header("upgrade").is_none() && seen[0].header("http2-settings").is_none());
        assert_no_keyless_payment(&proxy, &[]);
    }
}

#[tokio::test]
async fn a_covered_request_never_upgrades_and_a_101_is_never_stored() {
    let proxy = proxy(UpstreamKind::Strict, |c| c).await;
    let key = key();
    let asking = || {
        post("/orders", Some(&key))
            .header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Key", WS_KEY)
    };
    let first = proxy.send(&asking()).await;
    assert_eq!(first.status, 201, "covered, forwarded without the upgrade");
    assert!(proxy.upstream.seen()[0].header("upgrade").is_none());
    assert!(proxy.send(&asking()).await.replayed());

    // An upstream that switches unasked: its 101 becomes a 502, stored as the
    // unknown outcome it is, and replayed as that.
    let other = crate::support::key();
    let first = proxy.send(&post("/switch-anyway", Some(&other))).await;
    assert_eq!(first.status, 502, "{}", first.text());
    let retry = proxy.send(&post("/switch-anyway", Some(&other))).await;
    assert_eq!(retry.status, 502);
    assert!(retry.replayed());
    assert_eq!(proxy.ran("POST", "/switch-anyway").len(), 1);
}
