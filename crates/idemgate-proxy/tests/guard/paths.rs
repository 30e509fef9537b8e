//! Path confusion (issue 20, class 1): what routes match, what keys are scoped by
//! and what the upstream receives is one canonical path; the ambiguous rest is
//! refused before any claim.

use idemgate::path::{EncodedSlash, PathParameters, PathPolicy};
use idemgate_testkit::guard_cases;
use idemgate_testkit::raw_client::RawRequest;
use idemgate_testkit::upstreams::UpstreamKind;

use crate::support::*;

/// Every spelling of `/payments` in the shared table (`guard_cases`), keyless:
/// each answered as the table says, none run keyless by the upstream.
async fn keyless_spellings_need_a_key(proxy: &Proxy) {
    let mut sent = Vec::new();
    for spelling in guard_cases::payment_spellings() {
        let answer = proxy.send(&post(spelling.target, None)).await;
        sent.push(spelling.check(&answer));
    }
    assert_no_keyless_payment(proxy, &sent);
}

#[tokio::test]
async fn no_keyless_spelling_reaches_a_require_key_route_on_a_strict_upstream() {
    let proxy = proxy(UpstreamKind::Strict, |c| c).await;
    keyless_spellings_need_a_key(&proxy).await;
}

#[tokio::test]
async fn no_keyless_spelling_reaches_a_require_key_route_on_a_lenient_upstream() {
    // The lenient router lower-cases: the proxy must fold case to match it.
    let proxy = proxy(UpstreamKind::Lenient, |c| {
        c.with_case_insensitive_paths(true)
    })
    .await;
    keyless_spellings_need_a_key(&proxy).await;
    assert_eq!(
        proxy
            .send(&post("/PAYMENTS", None))
            .await
            .problem()
            .as_deref(),
        Some("missing-key")
    );
}

#[tokio::test]
async fn a_global_require_key_covers_spellings_no_route_anticipated() {
    // Case-sensitive matching in front of a router that is not: `/PAYMENTS`
    // misses the route, and the proxy-wide require_key still stops it.
    let proxy = proxy(UpstreamKind::Lenient, |c| c.with_require_key(true)).await;
    keyless_spellings_need_a_key(&proxy).await;
    let answer = proxy.send(&post("/PAYMENTS", None)).await;
    assert_eq!(answer.problem().as_deref(), Some("missing-key"));
}

#[tokio::test]
async fn no_keyless_spelling_reaches_a_require_key_route_on_a_naive_upstream() {
    let proxy = proxy(UpstreamKind::Naive, |c| c).await;
    keyless_spellings_need_a_key(&proxy).await;
}

#[tokio::test]
async fn one_key_never_runs_twice_under_two_spellings() {
    for kind in [
        UpstreamKind::Strict,
        UpstreamKind::Lenient,
        UpstreamKind::Naive,
    ] {
        let proxy = proxy(kind, |c| c.with_case_insensitive_paths(true)).await;
        let key = key();
        let first = proxy
            .send(&post(guard_cases::first_order_spelling(), Some(&key)))
            .await;
        assert_eq!(first.status, 201, "{kind:?}: {}", first.text());
        for spelling in guard_cases::order_spellings() {
            let again = proxy.send(&post(spelling, Some(&key))).await;
            let ok = (again.status == 201 && again.replayed() && again.body == first.body)
                || again.status == 422
                || again.problem().as_deref() == Some("ambiguous-path");
            assert!(ok, "{kind:?} {spelling}: {} {}", again.status, again.text());
        }
        let runs = proxy.upstream.count();
        assert_eq!(
            runs, 1,
            "{kind:?}: the upstream ran the operation {runs} times"
        );
    }
}

#[tokio::test]
async fn the_upstream_receives_exactly_the_path_that_was_matched() {
    let proxy = proxy(UpstreamKind::Strict, |c| c).await;
    let answer = proxy.send(&post("//a/./b/../%63/?q=%41&r", None)).await;
    assert_eq!(answer.status, 201, "{}", answer.text());
    let absolute = proxy
        .send(&post("http://api.example//a/x/..//c", None).without_host())
        .await;
    assert_eq!(absolute.status, 201, "{}", absolute.text());
    let seen = proxy.upstream.seen();
    assert_eq!(
        seen[0].target, "/a/c/?q=%41&r",
        "canonical path, query as sent"
    );
    assert_eq!(seen[1].target, "/a/c", "origin form");
    assert_eq!(
        seen[1].header("host").as_deref(),
        Some("api.example"),
        "an absolute-form target's authority is the Host"
    );
}

#[tokio::test]
async fn paths_stay_under_the_upstream_base() {
    let upstream = idemgate_testkit::upstreams::TestUpstream::start(UpstreamKind::Strict).await;
    let config =
        idemgate_proxy::ProxyConfig::new(format!("{}/api", upstream.url()).parse().unwrap());
    let app = idemgate_proxy::app(
        config,
        idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serve = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
        .unwrap();
    });
    for target in ["/../admin", "/a/../../admin", "/%2e%2e/admin"] {
        let answer = idemgate_testkit::raw_client::RawClient::exchange(
            addr,
            &RawRequest::new("GET", target),
        )
        .await
        .unwrap();
        assert_eq!(
            answer.problem().as_deref(),
            Some("ambiguous-path"),
            "{target}"
        );
    }
    let answer =
        idemgate_testkit::raw_client::RawClient::exchange(addr, &RawRequest::new("GET", "/a/../b"))
            .await
            .unwrap();
    assert_eq!(answer.status, 201);
    let targets: Vec<String> = upstream.seen().into_iter().map(|s| s.target).collect();
    assert_eq!(targets, ["/api/b"]);
    serve.abort();
}

#[tokio::test]
async fn each_ambiguous_class_is_refused_before_anything_is_forwarded() {
    let proxy = proxy(UpstreamKind::Strict, |c| c).await;
    for target in [
        "/a%2Fb",
        "/a%5cb",
        "/a\\b",
        "/%2e%2e/a",
        "/a/.%2e",
        "/a;b=1",
        "/a%00",
        "/a%0A",
        "/a%FF",
        "/é",
        "/a%zz",
        "/../a",
    ] {
        let key = key();
        for request in [post(target, Some(&key)), RawRequest::new("GET", target)] {
            let answer = proxy.send(&request).await;
            assert_eq!(answer.status, 400, "{target}: {}", answer.text());
            assert_eq!(
                answer.problem().as_deref(),
                Some("ambiguous-path"),
                "{target}"
            );
        }
    }
    assert_eq!(proxy.upstream.count(), 0, "nothing ambiguous was forwarded");
}

#[tokio::test]
async fn an_allowed_class_is_read_the_way_the_upstream_reads_it() {
    // An upstream that decodes %2F and strips ;params: the proxy reads them so
    // too, so the spellings meet the route (and its key) before it forwards.
    let policy = PathPolicy {
        encoded_slash: EncodedSlash::Decode,
        path_parameters: PathParameters::Strip,
        ..PathPolicy::STRICT
    };
    let proxy = proxy(UpstreamKind::Lenient, |c| c.with_path_policy(policy)).await;
    for spelling in [
        "/x%2F..%2Fpayments",
        "/payments;v=1",
        "/x/..;/payments",
        "/a%2fb/..%2f..%2fpayments",
    ] {
        let answer = proxy.send(&post(spelling, None)).await;
        assert_eq!(
            answer.problem().as_deref(),
            Some("missing-key"),
            "{spelling}"
        );
    }
    let key = key();
    let first = proxy.send(&post("/payments;v=1", Some(&key))).await;
    assert_eq!(first.status, 201);
    let seen = proxy.upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].target, "/payments",
        "forwarded as read: the parameter stripped"
    );
    assert_no_keyless_payment(&proxy, &[]);
}

#[tokio::test]
async fn a_disabled_route_cannot_be_walked_out_of() {
    let proxy = proxy(UpstreamKind::Lenient, |c| c).await;
    let answer = proxy.send(&post("/webhooks/../payments", None)).await;
    assert_eq!(answer.problem().as_deref(), Some("missing-key"));
    let key = key();
    let hook = proxy.send(&post("/webhooks/stripe", Some(&key))).await;
    assert_eq!(hook.status, 201);
    let seen = proxy.upstream.seen();
    assert_eq!(seen.len(), 1, "only the webhook ran");
    assert_eq!(
        seen[0].header("idempotency-key").as_deref(),
        Some(key.as_str()),
        "a disabled route passes the client's key on, as documented"
    );
}

#[tokio::test]
async fn case_and_format_suffix_spellings_meet_a_route_that_folds_them() {
    let extra = r#"
[[route]]
method = "POST"
path = "/charges"
require_key = true
case_insensitive = true
format_suffix = true
"#;
    let proxy = proxy(UpstreamKind::Strict, |c| c.with_routes(routes(extra))).await;
    for spelling in [
        "/charges.json",
        "/Charges",
        "/CHARGES.xml",
        "//charges.json/",
    ] {
        let answer = proxy.send(&post(spelling, None)).await;
        assert_eq!(
            answer.problem().as_deref(),
            Some("missing-key"),
            "{spelling}"
        );
    }
    let key = key();
    let first = proxy.send(&post("/charges.json", Some(&key))).await;
    assert_eq!(first.status, 201);
    let replay = proxy.send(&post("/charges.json", Some(&key))).await;
    assert!(replay.replayed());
    for other in ["/charges", "/Charges.xml"] {
        let answer = proxy.send(&post(other, Some(&key))).await;
        assert_eq!(answer.status, 422, "{other}: one scope, another spelling");
    }
    let targets: Vec<String> = proxy
        .upstream
        .seen()
        .into_iter()
        .map(|s| s.target)
        .collect();
    assert_eq!(
        targets,
        ["/charges.json"],
        "ran once, forwarded as the client spelled it"
    );
}
