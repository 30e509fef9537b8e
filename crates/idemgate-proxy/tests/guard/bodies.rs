//! Bodies on safe methods (issue 20, class 7): a body an upstream may not read
//! never reaches it, so it cannot be parsed there as a request of its own.

use idemgate_proxy::SafeMethodBodies;
use idemgate_testkit::raw_client::RawRequest;
use idemgate_testkit::upstreams::UpstreamKind;

use crate::support::*;

/// A complete keyless `POST /payments`: what a naive upstream would run if it
/// parsed a `GET`'s body as the next request.
const SMUGGLED: &[u8] =
    b"POST /payments HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nX-User: alice\r\n\r\n{}";

#[tokio::test]
async fn safe_methods_with_content_are_refused() {
    let proxy = proxy(UpstreamKind::Naive, |c| c).await;
    let chunked = {
        let mut body = format!("{:x}\r\n", SMUGGLED.len()).into_bytes();
        body.extend_from_slice(SMUGGLED);
        body.extend_from_slice(b"\r\n0\r\n\r\n");
        body
    };
    for method in ["GET", "HEAD", "OPTIONS"] {
        let by_length = RawRequest::new(method, "/search").body(SMUGGLED);
        let by_chunks = RawRequest::new(method, "/search")
            .header("Transfer-Encoding", "chunked")
            .body(&chunked);
        for request in [by_length, by_chunks] {
            let mut client = idemgate_testkit::raw_client::RawClient::connect(proxy.addr).await;
            client.send(&request.bytes()).await.unwrap();
            let answer = client.response_to(method == "HEAD").await.unwrap();
            assert_eq!(answer.status, 400, "{method}");
            if method != "HEAD" {
                assert_eq!(
                    answer.problem().as_deref(),
                    Some("unexpected-body"),
                    "{method}"
                );
            }
        }
    }
    assert_eq!(proxy.upstream.count(), 0, "nothing forwarded");
    assert_no_keyless_payment(&proxy, &[]);
    // Without content they go through.
    let empty = proxy
        .send(&RawRequest::new("GET", "/search").header("Content-Length", "0"))
        .await;
    assert_eq!(empty.status, 201);
    assert_eq!(proxy.upstream.count(), 1);
}

#[tokio::test]
async fn an_option_forwards_them_to_an_upstream_that_reads_them() {
    let proxy = proxy(UpstreamKind::Strict, |c| {
        c.with_safe_method_bodies(SafeMethodBodies::Forward)
    })
    .await;
    let answer = proxy
        .send(&RawRequest::new("GET", "/search").body(b"{\"q\":1}"))
        .await;
    assert_eq!(answer.status, 201);
    let seen = proxy.upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].body, b"{\"q\":1}",
        "the strict upstream read the body"
    );
}

#[tokio::test]
async fn a_route_may_forward_them_where_the_default_refuses() {
    let extra = r#"
[[route]]
method = "GET"
path = "/search"
enabled = false
safe_method_body = "forward"
"#;
    let proxy = proxy(UpstreamKind::Strict, |c| c.with_routes(routes(extra))).await;
    let search = proxy
        .send(&RawRequest::new("GET", "/search").body(b"q"))
        .await;
    assert_eq!(search.status, 201);
    let other = proxy
        .send(&RawRequest::new("GET", "/other").body(b"q"))
        .await;
    assert_eq!(other.problem().as_deref(), Some("unexpected-body"));
    assert_eq!(proxy.upstream.count(), 1);
}
