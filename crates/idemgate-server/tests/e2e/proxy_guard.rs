//! Issue 20 against the real `idemgate proxy` binary: the proxy cannot be talked
//! around. Each test runs the binary (its guard set by the flags under test) in
//! front of one of the test kit's three upstreams — strict, lenient
//! (framework-style routing) and naive (keep-alive that ignores `GET` bodies) —
//! which count every request they parsed, as they parsed it, so the assertions
//! are about what the upstream *ran*: no keyless request on a `require_key`
//! route, one key never run twice under two spellings, no principal collision,
//! stalls cut and settled, no `101` stored, framing errors blamed on the client.

use std::time::{Duration, Instant};

use idemgate_testkit::guard_cases::{self, assert_no_lookalike_arrived, with_lookalikes};
use idemgate_testkit::raw_client::{RawClient, RawRequest, RawResponse};
use idemgate_testkit::upstreams::{Seen, TestUpstream, UpstreamKind, websocket_accept};

use crate::support::proxy::{Proxy, ProxyOptions};
use crate::support::server::TempDir;

/// The upstream's stalling paths' releasing `PATCH` route, after the guard
/// suites' shared routes (`guard_cases::ROUTES`: payments and profiles' `PUT`
/// require a key, webhooks are a disabled prefix).
const STALL_ROUTE: &str = r#"
[[route]]
method = "PATCH"
path = "/stall"
server_errors = "release"
upstream_idle_timeout_ms = 300
"#;

/// The principal header (`--principal header:x-user`).
const USER: &str = "x-user";

/// The binary in front of its own upstream; both stop when dropped.
struct Guarded {
    proxy: Proxy,
    upstream: TestUpstream,
    _dir: TempDir,
}

/// Half of guarded()'s 60 s `--upstream-timeout-ms`: an answer sooner than this
/// was ended by the idle or total flag under test, not by the head timeout. Not a
/// speed bound: the flags under test are below one second.
const FALLBACK_BOUND: Duration = Duration::from_secs(30);

/// `idemgate proxy --principal header:x-user --config ROUTES FLAGS…` (the shared
/// routes and `STALL_ROUTE`) in front of
/// a new upstream of `kind`.
async fn guarded(kind: UpstreamKind, flags: &[(&str, &str)]) -> Guarded {
    let upstream = TestUpstream::start(kind).await;
    let dir = TempDir::new("idemgate-guard");
    let routes = dir.path().join("routes.toml");
    std::fs::write(&routes, format!("{}\n{STALL_ROUTE}", guard_cases::ROUTES)).unwrap();
    let mut options = ProxyOptions::new(upstream.url())
        .arg("--principal", format!("header:{USER}"))
        .arg("--config", routes.display())
        // Far beyond every bound the tests set (300 ms idle, 800 ms total): a 504
        // that arrives inside FALLBACK_BOUND can only be theirs, never this one's,
        // without the test timing how fast the proxy is.
        .arg("--upstream-timeout-ms", 60_000);
    for (flag, value) in flags {
        options = options.arg(flag, value);
    }
    Guarded {
        proxy: Proxy::start(options).await,
        upstream,
        _dir: dir,
    }
}

impl Guarded {
    async fn send(&self, request: &RawRequest) -> RawResponse {
        RawClient::exchange(self.proxy.addr, request)
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "no answer to {:?}: {error}",
                    String::from_utf8_lossy(&request.bytes())
                )
            })
    }

    fn ran(&self, method: &str, path: &str) -> Vec<Seen> {
        self.upstream
            .seen()
            .into_iter()
            .filter(|seen| seen.is(method, path))
            .collect()
    }

    /// Every `POST /payments` the upstream ran carried a (derived) key.
    fn assert_no_keyless_payment(&self, sent: &[String]) {
        let keyless: Vec<_> = self
            .ran("POST", "/payments")
            .into_iter()
            .filter(|seen| seen.headers_named("idempotency-key").is_empty())
            .map(|seen| seen.target)
            .collect();
        assert!(
            keyless.is_empty(),
            "the {:?} upstream ran keyless POST /payments as {keyless:?} (sent: {sent:?})",
            self.upstream.kind()
        );
    }

    /// Waits (bounded) until the upstream saw `n` stalled responses cut.
    async fn cut(&self, n: usize) {
        let until = Instant::now() + Duration::from_secs(5);
        while self.upstream.stalls_cut() < n {
            assert!(
                Instant::now() < until,
                "the proxy kept a stalled upstream connection open"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn key() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A `POST` from `alice` with a small JSON body, keyed when `key` is given.
fn post(target: &str, key: Option<&str>) -> RawRequest {
    let request = RawRequest::new("POST", target)
        .header(USER, "alice")
        .header("Content-Type", "application/json");
    match key {
        Some(key) => request.header("Idempotency-Key", key),
        None => request,
    }
    .body(br#"{"amount":1500}"#)
}

const KINDS: [UpstreamKind; 3] = [
    UpstreamKind::Strict,
    UpstreamKind::Lenient,
    UpstreamKind::Naive,
];

// --- 1. Path confusion ------------------------------------------------------------

/// Sends every spelling of `/payments` in the shared table (`guard_cases`)
/// keyless: each is answered as the table says (refused, or passed as something
/// the upstream does not run as a keyless `POST /payments`).
async fn keyless_spellings_need_a_key(guarded: &Guarded) {
    let mut sent = Vec::new();
    for spelling in guard_cases::payment_spellings() {
        let answer = guarded.send(&post(spelling.target, None)).await;
        sent.push(spelling.check(&answer));
    }
    guarded.assert_no_keyless_payment(&sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_keyless_spelling_reaches_a_require_key_route_on_any_upstream() {
    for kind in KINDS {
        // The lenient router lower-cases: the proxy folds case to match it.
        let flags: &[(&str, &str)] = match kind {
            UpstreamKind::Lenient => &[("--case-insensitive-paths", "true")],
            _ => &[],
        };
        let guarded = guarded(kind, flags).await;
        keyless_spellings_need_a_key(&guarded).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_key_and_case_insensitive_paths_close_what_the_defaults_leave_to_the_router() {
    // Defaults in front of a case-folding router: `/PAYMENTS` meets no route,
    // goes out keyless, and the router runs it as `/payments`.
    let open = guarded(UpstreamKind::Lenient, &[]).await;
    assert_eq!(open.send(&post("/PAYMENTS", None)).await.status, 201);
    assert_eq!(
        open.ran("POST", "/payments").len(),
        1,
        "the gap the flags close"
    );

    for flag in ["--require-key", "--case-insensitive-paths"] {
        let guarded = guarded(UpstreamKind::Lenient, &[(flag, "true")]).await;
        for spelling in ["/PAYMENTS", "/Payments", "//PayMents/"] {
            let answer = guarded.send(&post(spelling, None)).await;
            assert_eq!(
                answer.problem().as_deref(),
                Some("missing-key"),
                "{flag}: {spelling}"
            );
        }
        guarded.assert_no_keyless_payment(&[]);
        assert_eq!(guarded.upstream.count(), 0, "{flag}");
    }

    // --require-key covers the defaults' POST everywhere, not only routes.
    let guarded = guarded(UpstreamKind::Strict, &[("--require-key", "true")]).await;
    let answer = guarded.send(&post("/anything", None)).await;
    assert_eq!(answer.problem().as_deref(), Some("missing-key"));
    let keyed = guarded.send(&post("/anything", Some(&key()))).await;
    assert_eq!(keyed.status, 201);
    assert_eq!(guarded.upstream.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_never_runs_twice_under_two_spellings() {
    for kind in KINDS {
        let guarded = guarded(kind, &[("--case-insensitive-paths", "true")]).await;
        let key = key();
        let first = guarded
            .send(&post(guard_cases::first_order_spelling(), Some(&key)))
            .await;
        assert_eq!(first.status, 201, "{kind:?}: {}", first.text());
        for spelling in guard_cases::order_spellings() {
            let answer = guarded.send(&post(spelling, Some(&key))).await;
            assert!(
                answer.replayed() || answer.status == 422 || answer.status == 400,
                "{kind:?} {spelling}: {} {}",
                answer.status,
                answer.text()
            );
        }
        let runs: Vec<_> = guarded
            .upstream
            .seen()
            .into_iter()
            .filter(|seen| seen.method == "POST")
            .collect();
        assert_eq!(runs.len(), 1, "{kind:?}: one key, one run: {runs:?}");
    }
}

/// Spellings each `--path-*` flag decides: refused by default, read as
/// `/payments` (and so needing a key) with the flag.
const PATH_CLASSES: &[(&str, &str, &str)] = &[
    ("--path-encoded-slash", "decode", "/x%2F..%2Fpayments"),
    (
        "--path-encoded-dot-segment",
        "resolve",
        "/webhooks/%2e%2e/payments",
    ),
    ("--path-parameters", "strip", "/payments;jsessionid=1"),
    ("--path-above-root", "clamp", "/../payments"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_path_flag_changes_how_its_class_is_read() {
    let strict = guarded(UpstreamKind::Strict, &[]).await;
    for (_, _, spelling) in PATH_CLASSES {
        let answer = strict.send(&post(spelling, None)).await;
        assert_eq!(
            answer.problem().as_deref(),
            Some("ambiguous-path"),
            "{spelling}"
        );
    }
    for spelling in ["/paymënts", "/a%2Fb"] {
        let answer = strict.send(&post(spelling, None)).await;
        assert_eq!(answer.problem().as_deref(), Some("ambiguous-path"));
    }
    assert_eq!(strict.upstream.count(), 0, "refused before the upstream");

    for (flag, value, spelling) in PATH_CLASSES {
        let guarded = guarded(UpstreamKind::Strict, &[(flag, value)]).await;
        let keyless = guarded.send(&post(spelling, None)).await;
        assert_eq!(
            keyless.problem().as_deref(),
            Some("missing-key"),
            "{flag} {value}: {spelling} is the payments route"
        );
        let keyed = guarded.send(&post(spelling, Some(&key()))).await;
        assert_eq!(keyed.status, 201, "{flag}: {}", keyed.text());
        let ran = guarded.ran("POST", "/payments");
        assert_eq!(ran.len(), 1, "{flag}: forwarded as the canonical path");
        assert!(ran[0].header("idempotency-key").is_some());
    }

    let guarded = guarded(
        UpstreamKind::Strict,
        &[
            ("--path-control-or-non-ascii", "encode"),
            ("--path-encoded-slash", "keep"),
            ("--path-parameters", "keep"),
        ],
    )
    .await;
    for (sent, forwarded) in [
        ("/paymënts", "/paym%C3%ABnts"),
        ("/a%2fb", "/a%2Fb"),
        ("/a;v=1", "/a;v=1"),
    ] {
        let answer = guarded.send(&post(sent, None)).await;
        assert_eq!(answer.status, 201, "{sent}: {}", answer.text());
        assert_eq!(
            guarded.upstream.seen().last().unwrap().target,
            forwarded,
            "{sent}"
        );
    }
}

// --- 2. Principals -----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_principals_collide() {
    for kind in KINDS {
        let guarded = guarded(kind, &[]).await;
        let key = key();
        let as_user = |user: &[u8]| {
            RawRequest::new("POST", "/orders")
                .header(USER, user)
                .header("Idempotency-Key", &key)
                .header("Content-Type", "application/json")
                .body(br#"{"amount":1500}"#)
        };
        for lossy in [
            &b"user\xff1"[..],
            b"user\xfe1",
            "usér".as_bytes(),
            b"user\x801",
        ] {
            let answer = guarded.send(&as_user(lossy)).await;
            assert_eq!(answer.status, 401, "{kind:?} {lossy:?}: {}", answer.text());
            assert_eq!(answer.problem().as_deref(), Some("unauthenticated"));
        }
        assert_eq!(
            guarded.upstream.count(),
            0,
            "{kind:?}: nothing claimed or run"
        );
        let users: [&[u8]; 7] = [
            b"user1", b"User1", b"user 1", b"user1 x", b"user\t1", b"user-1", b"user_1",
        ];
        let mut bodies = Vec::new();
        for user in users {
            let answer = guarded.send(&as_user(user)).await;
            assert_eq!(answer.status, 201, "{kind:?}");
            assert!(
                !answer.replayed(),
                "{kind:?} {:?} got another principal's replay",
                String::from_utf8_lossy(user)
            );
            bodies.push(answer.body);
        }
        bodies.sort();
        bodies.dedup();
        assert_eq!(bodies.len(), users.len(), "{kind:?}: each its own answer");
        assert_eq!(guarded.upstream.count(), users.len(), "{kind:?}");
        // Derived keys differ per principal even for one client key.
        let mut keys: Vec<_> = guarded
            .upstream
            .seen()
            .iter()
            .map(|seen| seen.header("idempotency-key").expect("derived key"))
            .collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), users.len(), "{kind:?}");
    }
}

// --- 3. Upstream body stalls -------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_a_504_within_the_idle_flag_and_settled_per_policy() {
    let guarded = guarded(
        UpstreamKind::Strict,
        &[("--upstream-idle-timeout-ms", "300")],
    )
    .await;
    let key = key();
    let started = Instant::now();
    let first = guarded.send(&post("/stall", Some(&key))).await;
    assert_eq!(first.status, 504, "{}", first.text());
    assert_eq!(first.problem().as_deref(), Some("upstream-timeout"));
    // The upstream never finishes; only the 300 ms flag can have ended it.
    assert!(started.elapsed() < FALLBACK_BOUND);
    guarded.cut(1).await;
    let retry = guarded.send(&post("/stall", Some(&key))).await;
    assert_eq!(retry.status, 504);
    assert!(retry.replayed(), "server_errors = store: never run again");
    assert_eq!(retry.body, first.body);
    assert_eq!(guarded.ran("POST", "/stall").len(), 1);

    // The PATCH route releases server errors (its own idle key, 300 ms): the
    // key is free again and the retry runs.
    let key = self::key();
    let patch = || {
        RawRequest::new("PATCH", "/stall")
            .header(USER, "alice")
            .header("Idempotency-Key", &key)
            .body(b"{}")
    };
    for _ in 0..2 {
        let answer = guarded.send(&patch()).await;
        assert_eq!(answer.status, 504);
        assert!(!answer.replayed());
    }
    assert_eq!(
        guarded.ran("PATCH", "/stall").len(),
        2,
        "released: run again"
    );
    guarded.cut(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickle_is_cut_by_the_total_response_flag() {
    let guarded = guarded(
        UpstreamKind::Strict,
        &[
            ("--upstream-idle-timeout-ms", "2000"),
            ("--upstream-response-timeout-ms", "800"),
        ],
    )
    .await;
    let key = key();
    let started = Instant::now();
    let answer = guarded.send(&post("/trickle", Some(&key))).await;
    assert_eq!(answer.status, 504, "{}", answer.text());
    // Idle 2 s never fires on a byte per 100 ms; the 60 s fallback has not come.
    assert!(started.elapsed() < FALLBACK_BOUND);
    guarded.cut(1).await;
    assert!(guarded.send(&post("/trickle", Some(&key))).await.replayed());
    assert_eq!(guarded.upstream.count(), 1);

    // An uncovered stream is cut at the same bound: its body ends short.
    let mut client = RawClient::connect(guarded.proxy.addr).await;
    client
        .send(&RawRequest::new("GET", "/trickle").bytes())
        .await
        .unwrap();
    let answer = client.response().await.unwrap();
    assert_eq!(answer.status, 200);
    assert!(!answer.complete);
    guarded.cut(2).await;
}

// --- 4. Upgrades -------------------------------------------------------------------

const WS_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_never_switches_so_no_request_rides_past_the_layer() {
    for kind in KINDS {
        let guarded = guarded(kind, &[]).await;
        for (method, target) in [("GET", "/search"), ("POST", "/orders"), ("OPTIONS", "/x")] {
            let mut client = RawClient::connect(guarded.proxy.addr).await;
            let h2c = RawRequest::new(method, target)
                .header(USER, "alice")
                .header("Connection", "Upgrade, HTTP2-Settings")
                .header("Upgrade", "h2c")
                .header("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA");
            client.send(&h2c.bytes()).await.unwrap();
            let answer = client.response().await.unwrap();
            assert_ne!(answer.status, 101, "{kind:?} {method}: never switched");
            // What the client sends next is a request the proxy reads itself.
            client.send(&post("/payments", None).bytes()).await.unwrap();
            let next = client.response().await.unwrap();
            assert_eq!(next.problem().as_deref(), Some("missing-key"), "{kind:?}");
        }
        let seen = guarded.upstream.seen();
        assert_eq!(seen.len(), 3, "{kind:?}: only the three requests sent");
        for request in &seen {
            assert!(request.header("upgrade").is_none());
            assert!(request.header("http2-settings").is_none());
        }
        guarded.assert_no_keyless_payment(&[]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_post_never_upgrades_and_a_101_is_never_stored() {
    let guarded = guarded(UpstreamKind::Strict, &[]).await;
    let key = key();
    let asking = |target: &str| {
        post(target, Some(&key))
            .header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Key", WS_KEY)
            .header("Sec-WebSocket-Version", "13")
    };
    let first = guarded.send(&asking("/ws")).await;
    assert_eq!(first.status, 201, "covered, forwarded without the upgrade");
    let replay = guarded.send(&asking("/ws")).await;
    assert!(replay.replayed());
    assert_eq!(replay.status, 201);
    assert!(guarded.upstream.seen()[0].header("upgrade").is_none());

    // An upstream that switches whatever was asked: 502, stored as that, and
    // the retry replays the 502, never a 101.
    let other = self::key();
    for _ in 0..3 {
        let answer = guarded.send(&post("/switch-anyway", Some(&other))).await;
        assert_eq!(answer.status, 502, "{}", answer.text());
    }
    assert_eq!(guarded.ran("POST", "/switch-anyway").len(), 1);

    // A WebSocket GET is the one upgrade carried, its 101 checked.
    let mut client = RawClient::connect(guarded.proxy.addr).await;
    let ws = RawRequest::new("GET", "/ws")
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Key", WS_KEY)
        .header("Sec-WebSocket-Version", "13");
    client.send(&ws.bytes()).await.unwrap();
    let answer = client.response().await.unwrap();
    assert_eq!(answer.status, 101);
    assert_eq!(
        answer.header("sec-websocket-accept").as_deref(),
        Some(websocket_accept(WS_KEY.as_bytes()).as_str())
    );
    client.send(b"ping").await.unwrap();
    let mut echoed = Vec::new();
    while echoed.len() < 4 {
        let bytes = client.read_some(Duration::from_secs(5)).await;
        assert!(!bytes.is_empty(), "the tunnel went quiet");
        echoed.extend(bytes);
    }
    assert_eq!(echoed, b"ping");
}

// --- 5. Underscored headers --------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn underscored_headers_follow_the_flag_and_never_shadow_ours() {
    for (value, trace_forwarded) in [("drop", false), ("forward", true)] {
        let flags: &[(&str, &str)] = &[("--underscore-headers", value)];
        let guarded = guarded(UpstreamKind::Lenient, flags).await;
        let raw_key = key();
        let key = key();
        for request in [
            post("/orders", None),
            post("/orders", Some(&key)),
            post("/webhooks/a", None),
            post("/payments", Some(&self::key())),
        ] {
            let answer = guarded.send(&with_lookalikes(request, &raw_key)).await;
            assert_eq!(answer.status, 201, "{value}: {}", answer.text());
        }
        let seen = guarded.upstream.seen();
        assert_eq!(seen.len(), 4);
        for request in &seen {
            assert_no_lookalike_arrived(request, &raw_key, (USER, "alice"));
            assert_eq!(
                request.header("x-trace").is_some(),
                trace_forwarded,
                "{value}: an unrelated underscored header"
            );
        }
        assert!(
            seen[0].header("idempotency-key").is_none(),
            "uncovered: none"
        );
        assert_eq!(
            seen[1].headers_named("idempotency-key").len(),
            1,
            "derived only"
        );
        guarded.assert_no_keyless_payment(&[]);
    }
    // Forwarding, a look-alike of the principal header alone (no real one to
    // collide with) is still never forwarded: `--principal header:x-user` names
    // it to the guard.
    let guarded = guarded(
        UpstreamKind::Lenient,
        &[("--underscore-headers", "forward")],
    )
    .await;
    for name in ["X_User", "x_user", "X_USER"] {
        let request = RawRequest::new("POST", "/orders")
            .header(name, "mallory")
            .header("X_Trace", "t-1")
            .body(b"{}");
        assert_eq!(guarded.send(&request).await.status, 201, "{name}");
    }
    for seen in guarded.upstream.seen() {
        assert!(
            seen.headers_named("x-user").is_empty(),
            "{:?}",
            seen.headers
        );
        assert_eq!(seen.header("x-trace").as_deref(), Some("t-1"));
    }
    let guarded = self::guarded(UpstreamKind::Lenient, &[("--underscore-headers", "reject")]).await;
    for name in ["X_Trace", "Idempotency_Key", "x_user"] {
        let answer = guarded.send(&post("/orders", None).header(name, "v")).await;
        assert_eq!(
            answer.problem().as_deref(),
            Some("underscore-header"),
            "{name}"
        );
    }
    assert_eq!(guarded.upstream.count(), 0);
}

// --- 6. Method override ------------------------------------------------------------

const OVERRIDES: [&str; 3] = [
    "X-HTTP-Method-Override",
    "X-HTTP-Method",
    "X-Method-Override",
];

fn overridden(method: &str, target: &str, header: &str, value: &str) -> RawRequest {
    RawRequest::new(method, target)
        .header(USER, "alice")
        .header(header, value)
        .body(b"{}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_overrides_are_refused_by_default_and_honoured_with_the_flag() {
    let refusing = guarded(UpstreamKind::Lenient, &[]).await;
    for header in OVERRIDES {
        for (method, value) in [("PUT", "POST"), ("GET", "post"), ("PATCH", "DELETE")] {
            let answer = refusing
                .send(&overridden(method, "/payments", header, value))
                .await;
            assert_eq!(
                answer.problem().as_deref(),
                Some("ambiguous-method"),
                "{method} with {header}: {value}"
            );
        }
    }
    for method in ["post", "Post", "pOST"] {
        let answer = refusing
            .send(&RawRequest::new(method, "/payments").body(b"{}"))
            .await;
        assert_eq!(answer.problem().as_deref(), Some("ambiguous-method"));
    }
    assert_eq!(refusing.upstream.count(), 0, "nothing reached the router");

    let honouring = guarded(UpstreamKind::Lenient, &[("--method-override", "honour")]).await;
    for header in OVERRIDES {
        let answer = honouring
            .send(&overridden("PUT", "/payments", header, "POST"))
            .await;
        assert_eq!(answer.problem().as_deref(), Some("missing-key"), "{header}");
    }
    honouring.assert_no_keyless_payment(&[]);
    let key = key();
    for header in OVERRIDES {
        let answer = honouring
            .send(&overridden("PUT", "/payments", header, "POST").header("Idempotency-Key", &key))
            .await;
        assert_eq!(answer.status, 201, "{header}: {}", answer.text());
    }
    let ran = honouring.ran("POST", "/payments");
    assert_eq!(
        ran.len(),
        1,
        "one operation, however the override is spelled"
    );
    assert!(ran[0].header("idempotency-key").is_some());
    for header in OVERRIDES {
        assert!(ran[0].header(&header.to_ascii_lowercase()).is_none());
    }
}

// --- 7. Bodies on safe methods -----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_body_never_smuggles_a_request_to_a_naive_upstream() {
    let guarded = guarded(UpstreamKind::Naive, &[]).await;
    let smuggled = b"POST /payments HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
    let mut sent = Vec::new();
    for method in ["GET", "HEAD", "OPTIONS"] {
        for request in [
            RawRequest::new(method, "/search").body(smuggled),
            RawRequest::new(method, "/search")
                .header("Transfer-Encoding", "chunked")
                .body(
                    [
                        format!("{:x}\r\n", smuggled.len()).as_bytes(),
                        smuggled,
                        b"\r\n0\r\n\r\n",
                    ]
                    .concat(),
                ),
        ] {
            let mut client = RawClient::connect(guarded.proxy.addr).await;
            client.send(&request.bytes()).await.unwrap();
            let answer = client.response_to(method == "HEAD").await.unwrap();
            sent.push(format!("{method} → {}", answer.status));
            assert_eq!(answer.status, 400, "{method}");
            if method != "HEAD" {
                assert_eq!(answer.problem().as_deref(), Some("unexpected-body"));
            }
        }
    }
    // A plain GET after them on pooled connections: the upstream parses it
    // alone.
    let answer = guarded.send(&RawRequest::new("GET", "/search")).await;
    assert_eq!(answer.status, 201);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        guarded.upstream.count(),
        1,
        "{sent:?}: {:?}",
        guarded.upstream.seen()
    );
    guarded.assert_no_keyless_payment(&sent);

    // With --safe-method-body forward, for an upstream that reads them.
    let forwarding =
        self::guarded(UpstreamKind::Strict, &[("--safe-method-body", "forward")]).await;
    let answer = forwarding
        .send(&RawRequest::new("GET", "/search").body(b"q=1"))
        .await;
    assert_eq!(answer.status, 201, "{}", answer.text());
    assert_eq!(forwarding.upstream.seen()[0].body, b"q=1");
}

// --- 8. Framing --------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_framing_errors_are_400_never_502() {
    let guarded = guarded(UpstreamKind::Strict, &[]).await;
    let key = key();
    let chunked = |key: Option<&str>, body: &[u8]| {
        post("/orders", key)
            .header("Transfer-Encoding", "chunked")
            .body(body)
    };
    for body in guard_cases::bad_chunked_bodies() {
        for request in [chunked(None, body), chunked(Some(&key), body)] {
            guard_cases::assert_framing_refused(body, &guarded.send(&request).await);
        }
    }
    for request in [
        post("/orders", None).header("Transfer-Encoding", "gzip"),
        post("/orders", None)
            .header("Content-Length", "2")
            .header("Content-Length", "3"),
        post("/orders", None).header("Content-Length", "-1"),
    ] {
        let answer = guarded.send(&request.body(b"{}")).await;
        assert_eq!(answer.status, 400, "{}", answer.text());
    }
    assert_eq!(guarded.upstream.count(), 0, "refused before the upstream");
    // Cut off mid-chunk while streaming to the upstream: the client's error.
    let mut client = RawClient::connect(guarded.proxy.addr).await;
    client
        .send(&chunked(None, b"a\r\n01234").bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    client.send(b"zz-not-a-chunk\r\n").await.unwrap();
    let answer = client.response().await.unwrap();
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert_eq!(answer.problem().as_deref(), Some("unreadable-body"));
    assert!(
        guarded.ran("POST", "/orders").is_empty(),
        "no broken body ran: {:?}",
        guarded.upstream.seen()
    );
}

#[test]
fn proxy_help_names_every_guard_flag_and_variable() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["proxy", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for needle in [
        "--path-encoded-slash",
        "IDEMGATE_PATH_ENCODED_SLASH",
        "--path-encoded-dot-segment",
        "IDEMGATE_PATH_ENCODED_DOT_SEGMENT",
        "--path-parameters",
        "IDEMGATE_PATH_PARAMETERS",
        "--path-control-or-non-ascii",
        "IDEMGATE_PATH_CONTROL_OR_NON_ASCII",
        "--path-above-root",
        "IDEMGATE_PATH_ABOVE_ROOT",
        "--case-insensitive-paths",
        "IDEMGATE_CASE_INSENSITIVE_PATHS",
        "--require-key",
        "IDEMGATE_REQUIRE_KEY",
        "--underscore-headers",
        "IDEMGATE_UNDERSCORE_HEADERS",
        "--method-override",
        "IDEMGATE_METHOD_OVERRIDE",
        "--safe-method-body",
        "IDEMGATE_SAFE_METHOD_BODY",
        "--upstream-idle-timeout-ms",
        "IDEMGATE_UPSTREAM_IDLE_TIMEOUT_MS",
        "--upstream-response-timeout-ms",
        "IDEMGATE_UPSTREAM_RESPONSE_TIMEOUT_MS",
    ] {
        assert!(help.contains(needle), "`proxy --help` lacks {needle}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_variables_work_like_their_flags() {
    let upstream = TestUpstream::start(UpstreamKind::Lenient).await;
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .arg("--principal", format!("header:{USER}"))
            .env("IDEMGATE_REQUIRE_KEY", "true")
            .env("IDEMGATE_UNDERSCORE_HEADERS", "reject")
            .env("IDEMGATE_PATH_PARAMETERS", "strip"),
    )
    .await;
    let addr = proxy.addr;
    let send =
        |request: RawRequest| async move { RawClient::exchange(addr, &request).await.unwrap() };
    let answer = send(post("/orders;v=1", None)).await;
    assert_eq!(answer.problem().as_deref(), Some("missing-key"));
    let answer = send(post("/orders", Some(&key())).header("X_Trace", "t")).await;
    assert_eq!(answer.problem().as_deref(), Some("underscore-header"));
    assert_eq!(upstream.count(), 0);
}
