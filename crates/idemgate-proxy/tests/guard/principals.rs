//! Principals from exact bytes (issue 20, class 2): two byte strings are two
//! principals or are refused; never one principal by a lossy decode.

use idemgate_testkit::raw_client::RawRequest;
use idemgate_testkit::upstreams::UpstreamKind;

use crate::support::*;

fn as_user(user: &[u8], key: &str) -> RawRequest {
    RawRequest::new("POST", "/orders")
        .header(USER, user)
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(br#"{"amount":1}"#)
}

#[tokio::test]
async fn bytes_a_lossy_decode_would_fold_are_refused() {
    let proxy = proxy(UpstreamKind::Strict, |c| c).await;
    let key = key();
    for user in [
        &b"user\xff1"[..],
        b"user\xfe1",
        "usér".as_bytes(),
        b"user\x801",
    ] {
        let answer = proxy.send(&as_user(user, &key)).await;
        assert_eq!(answer.status, 401, "{user:?}: {}", answer.text());
        assert_eq!(answer.problem().as_deref(), Some("unauthenticated"));
    }
    assert_eq!(
        proxy.upstream.count(),
        0,
        "nothing claimed, nothing forwarded"
    );
}

#[tokio::test]
async fn no_two_principals_collide() {
    let proxy = proxy(UpstreamKind::Strict, |c| c).await;
    let key = key();
    let users: [&[u8]; 7] = [
        b"user1", b"User1", b"user 1", b"user1 x", b"user\t1", b"user-1", b"user_1",
    ];
    let mut bodies = Vec::new();
    for user in users {
        let answer = proxy.send(&as_user(user, &key)).await;
        assert_eq!(answer.status, 201, "{user:?}: {}", answer.text());
        assert!(
            !answer.replayed(),
            "{user:?} got another principal's replay"
        );
        bodies.push(answer.body);
    }
    assert_eq!(proxy.upstream.count(), users.len(), "one run per principal");
    bodies.dedup();
    assert_eq!(bodies.len(), users.len(), "each its own answer");
    let again = proxy.send(&as_user(b"user 1", &key)).await;
    assert!(again.replayed(), "the same bytes are the same principal");
    assert_eq!(proxy.upstream.count(), users.len());
}
