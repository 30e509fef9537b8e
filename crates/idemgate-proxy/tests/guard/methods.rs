//! Method override (issue 20, class 6) and methods spelled in another case: the
//! method the layer covers is the method the upstream runs.

use idemgate_proxy::MethodOverride;
use idemgate_testkit::raw_client::RawRequest;
use idemgate_testkit::upstreams::UpstreamKind;

use crate::support::*;

const OVERRIDES: [&str; 3] = [
    "X-HTTP-Method-Override",
    "X-HTTP-Method",
    "X-Method-Override",
];

#[tokio::test]
async fn override_headers_are_refused_by_default() {
    let proxy = proxy(UpstreamKind::Lenient, |c| c).await;
    for header in OVERRIDES {
        for (method, value) in [
            ("PUT", "POST"),
            ("POST", "PUT"),
            ("GET", "post"),
            ("PATCH", "DELETE"),
        ] {
            let request = RawRequest::new(method, "/payments")
                .header(USER, "alice")
                .header(header, value)
                .body(b"{}");
            let answer = proxy.send(&request).await;
            assert_eq!(
                answer.problem().as_deref(),
                Some("ambiguous-method"),
                "{method} with {header}: {value}"
            );
        }
    }
    // Look-alikes a CGI-style server reads as the same header are dropped.
    let request = RawRequest::new("PUT", "/payments")
        .header(USER, "alice")
        .header("X_HTTP_Method_Override", "POST")
        .body(b"{}");
    let answer = proxy.send(&request).await;
    assert_eq!(answer.status, 201, "forwarded as the PUT it is");
    assert_eq!(proxy.upstream.count(), 1);
    assert!(proxy.ran("POST", "/payments").is_empty(), "no POST ran");
}

#[tokio::test]
async fn a_route_that_honours_overrides_covers_the_method_they_name() {
    let extra = r#"
[[route]]
method = "POST"
path = "/transfers"
require_key = true
method_override = "honour"
"#;
    let proxy = proxy(UpstreamKind::Lenient, |c| c.with_routes(routes(extra))).await;
    for header in OVERRIDES {
        let keyless = RawRequest::new("PUT", "/transfers")
            .header(USER, "alice")
            .header(header, "post")
            .body(b"{}");
        let answer = proxy.send(&keyless).await;
        assert_eq!(answer.problem().as_deref(), Some("missing-key"), "{header}");
    }
    let key = key();
    let keyed = |header: &str| {
        RawRequest::new("PUT", "/transfers")
            .header(USER, "alice")
            .header("Idempotency-Key", &key)
            .header(header, "POST")
            .body(b"{}")
    };
    let first = proxy.send(&keyed(OVERRIDES[0])).await;
    assert_eq!(first.status, 201, "{}", first.text());
    let again = proxy.send(&keyed(OVERRIDES[1])).await;
    assert!(
        again.replayed(),
        "one operation, however the override is spelled"
    );
    let ran = proxy.ran("POST", "/transfers");
    assert_eq!(ran.len(), 1);
    assert!(ran[0].target.starts_with("/transfers"));
    assert!(
        ran[0].header("idempotency-key").is_some(),
        "covered: the derived key"
    );
    for header in [
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
    ] {
        assert!(ran[0].header(header).is_none(), "{header} is not forwarded");
    }
    // Elsewhere the proxy-wide default still refuses.
    let elsewhere = RawRequest::new("PUT", "/other")
        .header(OVERRIDES[0], "POST")
        .body(b"{}");
    assert_eq!(
        proxy.send(&elsewhere).await.problem().as_deref(),
        Some("ambiguous-method")
    );
}

#[tokio::test]
async fn honouring_overrides_everywhere_keeps_one_method() {
    let proxy = proxy(UpstreamKind::Lenient, |c| {
        c.with_method_override(MethodOverride::Honour)
    })
    .await;
    let request = RawRequest::new("PUT", "/payments")
        .header(USER, "alice")
        .header("X-HTTP-Method-Override", "POST")
        .body(b"{}");
    assert_eq!(
        proxy.send(&request).await.problem().as_deref(),
        Some("missing-key")
    );
    let twice = RawRequest::new("PUT", "/payments")
        .header("X-HTTP-Method-Override", "POST")
        .header("X-HTTP-Method", "POST")
        .body(b"{}");
    assert_eq!(
        proxy.send(&twice).await.problem().as_deref(),
        Some("ambiguous-method")
    );
    assert_no_keyless_payment(&proxy, &[]);
    assert_eq!(proxy.upstream.count(), 0);
}

#[tokio::test]
async fn standard_methods_in_another_case_are_refused() {
    let proxy = proxy(UpstreamKind::Lenient, |c| c).await;
    for method in ["post", "Post", "pOST", "patch", "put"] {
        let request = RawRequest::new(method, "/payments")
            .header(USER, "alice")
            .body(b"{}");
        let answer = proxy.send(&request).await;
        assert_eq!(
            answer.problem().as_deref(),
            Some("ambiguous-method"),
            "{method}"
        );
    }
    assert_eq!(proxy.upstream.count(), 0);
}
