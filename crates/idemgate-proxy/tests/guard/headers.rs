//! Headers a CGI-style framework maps onto ours (issue 20, class 5): the
//! upstream never reads the client's raw key, a second principal or a forged
//! `X-Forwarded-*` through an underscored look-alike.

use idemgate_proxy::UnderscoreHeaders;
use idemgate_testkit::guard_cases::{self, with_lookalikes};
use idemgate_testkit::upstreams::{Seen, UpstreamKind};

use crate::support::*;

/// The shared table's checks (`guard_cases`), alice the one principal.
fn assert_no_lookalike_arrived(seen: &Seen, raw_key: &str) {
    guard_cases::assert_no_lookalike_arrived(seen, raw_key, (USER, "alice"));
}

#[tokio::test]
async fn underscored_headers_are_dropped_by_default() {
    let proxy = proxy(UpstreamKind::Lenient, |c| c).await;
    let raw_key = key();
    // Keyless to the proxy (it reads no Idempotency_Key), covered-and-keyed, and
    // on a disabled route that forwards the client's own key.
    let key = key();
    for request in [
        post("/orders", None),
        post("/orders", Some(&key)),
        post("/webhooks/a", None),
    ] {
        let answer = proxy.send(&with_lookalikes(request, &raw_key)).await;
        assert_eq!(answer.status, 201, "{}", answer.text());
    }
    let seen = proxy.upstream.seen();
    assert_eq!(seen.len(), 3);
    for request in &seen {
        assert_no_lookalike_arrived(request, &raw_key);
        assert!(request.header("x-trace").is_none(), "dropped: it has '_'");
    }
    assert!(
        seen[0].header("idempotency-key").is_none(),
        "uncovered: no key upstream"
    );
    let derived = seen[1]
        .header("idempotency-key")
        .expect("covered: the derived key");
    assert_ne!(derived, key, "the derived key, never the client's");
}

#[tokio::test]
async fn underscored_headers_may_be_refused() {
    let proxy = proxy(UpstreamKind::Lenient, |c| {
        c.with_underscore_headers(UnderscoreHeaders::Reject)
    })
    .await;
    let answer = proxy
        .send(&post("/orders", None).header("X_Trace", "t-1"))
        .await;
    assert_eq!(answer.problem().as_deref(), Some("underscore-header"));
    assert_eq!(proxy.upstream.count(), 0);
}

#[tokio::test]
async fn forwarded_underscored_headers_never_shadow_ours() {
    let proxy = proxy(UpstreamKind::Lenient, |c| {
        c.with_underscore_headers(UnderscoreHeaders::Forward)
    })
    .await;
    let raw_key = key();
    let key = key();
    for request in [post("/orders", None), post("/orders", Some(&key))] {
        let answer = proxy.send(&with_lookalikes(request, &raw_key)).await;
        assert_eq!(answer.status, 201, "{}", answer.text());
    }
    for request in proxy.upstream.seen() {
        assert_no_lookalike_arrived(&request, &raw_key);
        assert_eq!(
            request.header("x-trace").as_deref(),
            Some("t-1"),
            "an unrelated one goes on"
        );
    }
}
