//! `idemgate proxy`, the real binary, in front of a counting test upstream that
//! records what it received: every scenario asserts upstream executions.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::StatusCode;
use tokio::sync::Barrier;

use crate::support::client::{Client, ORDER, new_key};
use crate::support::net::read_head;
use crate::support::proxy::{Proxy, ProxyOptions, Upstream, derived_key, proxy_command};
use crate::support::server::{TempDir, postgres_url, run_to_exit};

/// A port nothing listens on, held (bound, not listening) so that no other
/// test's listener takes it meanwhile: connecting to it is refused. With
/// SO_REUSEADDR a listener may still bind it on purpose ([`Upstream::start_on`]).
fn reserved_port() -> (tokio::net::TcpSocket, SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proxy_replays_a_lost_response_byte_for_byte_with_one_upstream_execution() {
    let upstream = Upstream::start().await;
    let dir = TempDir::new("idemgate-proxy");
    let store = format!("sqlite://{}", dir.path().join("proxy.db").display());
    // The upstream's own header is replayed only because it is listed: a
    // replay repeats what it needs (PROTOCOL §7), not every header.
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .store(&store)
            .arg("--replay-header", "X-Upstream-Run"),
    )
    .await;
    let unlisted = Proxy::start(ProxyOptions::new(upstream.url())).await;
    let client = Client::new();
    let key = new_key();
    let url = proxy.url("/v1/charges?currency=RUB");
    let first = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.replayed());
    let retry = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body, "the replay is byte-identical");
    assert_eq!(
        retry.headers["x-upstream-run"],
        first.headers["x-upstream-run"]
    );
    assert_eq!(upstream.executions(), 1);
    let other = unlisted.url("/v1/charges");
    let first_there = client.post(&other, Some(&key), ORDER).await;
    let retry_there = client.post(&other, Some(&key), ORDER).await;
    assert!(retry_there.replayed(), "{retry_there:?}");
    assert_eq!(first_there.headers["x-upstream-run"], "2");
    assert!(
        !retry_there.headers.contains_key("x-upstream-run"),
        "an unlisted upstream header is per response: {:?}",
        retry_there.headers
    );
    assert_eq!(upstream.executions(), 2);
    let seen = &upstream.seen()[0];
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.uri, "/v1/charges?currency=RUB");
    assert_eq!(seen.body, ORDER.as_bytes());
    let forwarded = derived_key(seen);
    assert_ne!(forwarded, key, "the raw client key is never forwarded");
    assert_eq!(forwarded.len(), 36, "the operation id: {forwarded}");
}

/// `concurrency` same-key requests at once, spread over `proxies`: every answer
/// is the one outcome or 409, and the upstream ran once.
async fn race(proxies: &[&Proxy], upstream: &Upstream, concurrency: usize) {
    let client = Client::new();
    let key = new_key();
    let barrier = Arc::new(Barrier::new(concurrency));
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let (client, key, barrier, url) = (
                client.clone(),
                key.clone(),
                Arc::clone(&barrier),
                proxies[i % proxies.len()].url("/orders"),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                client.post(&url, Some(&key), ORDER).await
            })
        })
        .collect();
    let mut created = Vec::new();
    for task in tasks {
        let answer = task.await.unwrap();
        match answer.status {
            StatusCode::CREATED => created.push(answer.body),
            StatusCode::CONFLICT => assert_eq!(answer.problem_type(), "/problems/in-progress"),
            other => panic!("unexpected {other}: {answer:?}"),
        }
    }
    assert!(!created.is_empty());
    assert!(
        created.iter().all(|body| *body == created[0]),
        "one outcome"
    );
    let replay = client
        .post(&proxies[0].url("/orders"), Some(&key), ORDER)
        .await;
    assert!(replay.replayed());
    assert_eq!(replay.body, created[0]);
    assert_eq!(
        upstream.executions(),
        1,
        "{concurrency} racers, one execution"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proxy_runs_64_racing_same_key_requests_upstream_once() {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_millis(500));
    let proxy = Proxy::start(ProxyOptions::new(upstream.url())).await;
    race(&[&proxy], &upstream, 64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_proxies_on_one_postgres_run_64_racers_upstream_once() {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_millis(500));
    let a = Proxy::start(ProxyOptions::new(upstream.url()).store(&postgres_url())).await;
    let b = Proxy::start(ProxyOptions::new(upstream.url()).store(&postgres_url())).await;
    race(&[&a, &b], &upstream, 64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_proxies_on_one_redis_run_64_racers_upstream_once() {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_millis(500));
    let store = crate::support::server::redis_url();
    let a = Proxy::start(ProxyOptions::new(upstream.url()).store(&store)).await;
    let b = Proxy::start(ProxyOptions::new(upstream.url()).store(&store)).await;
    race(&[&a, &b], &upstream, 64).await;
}

/// With the default settings, a duplicate sent to instance `b` while instance `a`
/// runs the operation waits, and is woken by `a`'s completion through the shared
/// store's notification: it returns the replay well before the layer's 1 s
/// recheck could have found it (the upstream's 1.6 s run ends ~0.55 s before the
/// second recheck), and the upstream runs once.
async fn a_duplicate_on_another_instance_is_woken_by_the_completion(store: &str) {
    let upstream = Upstream::start().await;
    let a = Proxy::start(ProxyOptions::new(upstream.url()).store(store)).await;
    let b = Proxy::start(ProxyOptions::new(upstream.url()).store(store)).await;
    let client = Client::new();
    // A first operation on each instance: the listeners are up before measuring.
    for proxy in [&a, &b] {
        let warm = client
            .post(&proxy.url("/orders"), Some(&new_key()), ORDER)
            .await;
        assert_eq!(warm.status, StatusCode::CREATED, "{warm:?}");
    }
    upstream.set_delay(Duration::from_millis(1_600));
    let key = new_key();
    // Counted before the first is sent, so the wait cannot miss it.
    let started = upstream.started();
    let first = {
        let (client, key, url) = (client.clone(), key.clone(), a.url("/orders"));
        tokio::spawn(async move {
            let answer = client.post(&url, Some(&key), ORDER).await;
            (answer, std::time::Instant::now())
        })
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        while upstream.started() == started {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the upstream runs the first request");
    let duplicate = client.post(&b.url("/orders"), Some(&key), ORDER).await;
    let duplicate_done = std::time::Instant::now();
    let (first, first_done) = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(
        duplicate.status,
        StatusCode::CREATED,
        "waited: {duplicate:?}"
    );
    assert!(duplicate.replayed(), "{duplicate:?}");
    assert_eq!(duplicate.body, first.body);
    let late = duplicate_done.saturating_duration_since(first_done);
    assert!(
        late < Duration::from_millis(300),
        "the duplicate on the other instance returned {late:?} after the first: \
         woken by polling, not by the store's notification"
    );
    assert_eq!(
        upstream.executions(),
        3,
        "two warm-ups and one run of the key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_on_another_instance_on_postgres_is_woken_by_listen_notify() {
    a_duplicate_on_another_instance_is_woken_by_the_completion(&postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_on_another_instance_on_redis_is_woken_by_pub_sub() {
    a_duplicate_on_another_instance_is_woken_by_the_completion(
        &crate::support::server::redis_url(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_refuses_a_changed_payload_without_forwarding_it() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(ProxyOptions::new(upstream.url())).await;
    let client = Client::new();
    let key = new_key();
    let first = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let tampered = ORDER.replace("1500", "1");
    let answer = client
        .post(&proxy.url("/orders"), Some(&key), &tampered)
        .await;
    assert_eq!(
        answer.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{answer:?}"
    );
    assert_eq!(answer.problem_type(), "/problems/key-reused");
    assert_eq!(
        upstream.executions(),
        1,
        "the tampered request was not forwarded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_releases_the_key_when_the_upstream_is_down_and_runs_the_retry_once() {
    let (reservation, addr) = reserved_port();
    let proxy = Proxy::start(ProxyOptions::new(format!("http://{addr}"))).await;
    let client = Client::new();
    let key = new_key();
    let down = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert_eq!(down.status, StatusCode::BAD_GATEWAY, "{down:?}");
    assert_eq!(down.problem_type(), "/problems/upstream-unreachable");
    let upstream = Upstream::start_on(addr).await;
    drop(reservation);
    let retry = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.replayed(), "nothing ran before: the retry runs");
    let again = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert!(again.replayed());
    assert_eq!(again.body, retry.body);
    assert_eq!(upstream.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_stores_an_upstream_timeout_so_a_retry_does_not_run_again() {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_millis(1_500));
    let proxy =
        Proxy::start(ProxyOptions::new(upstream.url()).arg("--upstream-timeout-ms", 300)).await;
    let client = Client::new();
    let key = new_key();
    let slow = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert_eq!(slow.status, StatusCode::GATEWAY_TIMEOUT, "{slow:?}");
    assert_eq!(slow.problem_type(), "/problems/upstream-timeout");
    assert_eq!(upstream.executions(), 1, "the upstream received it");
    // Even once the upstream is fast again, the outcome is unknown: replayed.
    upstream.set_delay(Duration::ZERO);
    let retry = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert_eq!(retry.status, StatusCode::GATEWAY_TIMEOUT, "{retry:?}");
    assert!(retry.replayed());
    assert_eq!(retry.body, slow.body);
    assert_eq!(upstream.executions(), 1, "no second execution");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_forwards_a_derived_key_stable_across_runs_of_one_operation() {
    let upstream = Upstream::start().await;
    // 429 releases the claim (PROTOCOL §8): the retry runs the same operation.
    upstream.answer_next(429);
    let proxy = Proxy::start(ProxyOptions::new(upstream.url())).await;
    let client = Client::new();
    let key = new_key();
    let limited = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    let retry = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    // The same client key from another principal is another operation.
    let other = client.with_token("another-user");
    let theirs = other.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert_eq!(theirs.status, StatusCode::CREATED);
    assert!(!theirs.replayed());
    assert_eq!(upstream.executions(), 3);
    let keys: Vec<String> = upstream.seen().iter().map(derived_key).collect();
    assert_eq!(keys[0], keys[1], "one operation, one forwarded key");
    assert_ne!(keys[0], keys[2], "another principal, another key");
    assert!(keys.iter().all(|k| *k != key));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_strips_hop_by_hop_headers_both_ways_and_appends_forwarded_ones() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(ProxyOptions::new(format!("{}/base/", upstream.url()))).await;
    let http = reqwest::Client::new();
    let response = http
        .get(proxy.url("/items?page=2"))
        .header("connection", "keep-alive, x-client-hop")
        .header("x-client-hop", "secret")
        .header("keep-alive", "timeout=5")
        .header("proxy-authorization", "Basic c2VjcmV0")
        .header("x-forwarded-for", "203.0.113.7")
        .header("x-end-to-end", "kept")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    for name in ["connection", "x-upstream-hop", "proxy-authenticate"] {
        assert!(
            !response.headers().contains_key(name),
            "{name} reached the client: {:?}",
            response.headers()
        );
    }
    assert_eq!(response.headers()["x-upstream-run"], "1");
    let seen = &upstream.seen()[0];
    assert_eq!(seen.uri, "/base/items?page=2");
    for name in ["x-client-hop", "keep-alive", "proxy-authorization"] {
        assert!(
            !seen.headers.contains_key(name),
            "{name} reached the upstream"
        );
    }
    assert_eq!(seen.headers["x-end-to-end"], "kept");
    assert_eq!(
        seen.headers["host"],
        proxy.addr.to_string(),
        "Host as the client sent it"
    );
    assert_eq!(seen.headers["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
    assert_eq!(seen.headers["x-forwarded-host"], proxy.addr.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_passes_gets_and_keyless_posts_through_to_run_every_time() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(ProxyOptions::new(upstream.url())).await;
    let http = reqwest::Client::new();
    let key = new_key();
    for _ in 0..2 {
        let get = http
            .get(proxy.url("/orders/7"))
            .header("idempotency-key", &key)
            .send()
            .await
            .unwrap();
        assert_eq!(get.status(), StatusCode::CREATED);
        assert!(!get.headers().contains_key("idempotent-replayed"));
    }
    let client = Client::new();
    for _ in 0..2 {
        let post = client.post(&proxy.url("/orders"), None, ORDER).await;
        assert_eq!(post.status, StatusCode::CREATED);
        assert!(!post.replayed());
    }
    assert_eq!(upstream.executions(), 4, "nothing covered, everything runs");
    let seen = upstream.seen();
    assert!(
        seen[..2]
            .iter()
            .all(|seen| seen.headers["idempotency-key"] == key.as_str()),
        "an uncovered GET keeps the key it carries, as sent"
    );
    assert!(
        seen[2..]
            .iter()
            .all(|seen| !seen.headers.contains_key("idempotency-key")),
        "a keyless POST: no key to derive"
    );
    // Every public path is the upstream's, /healthz too; the admin has its own.
    let public = http.get(proxy.url("/healthz")).send().await.unwrap();
    assert_eq!(public.status(), StatusCode::CREATED);
    assert_eq!(upstream.executions(), 5);
    for path in ["/healthz", "/readyz", "/metrics"] {
        let admin = http
            .get(format!("http://{}{path}", proxy.admin))
            .send()
            .await
            .unwrap();
        assert_eq!(admin.status(), StatusCode::OK, "{path}");
    }
    assert_eq!(upstream.executions(), 5);
    // The same histograms as `serve`: one recorder, built in one place.
    let metrics = http
        .get(format!("http://{}/metrics", proxy.admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        "# TYPE idemgate_request_duration_seconds histogram",
        "idemgate_request_duration_seconds_bucket{outcome=\"passed_through\",le=\"0.001\"}",
    ] {
        assert!(metrics.contains(needle), "no {needle} in:\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_refuses_to_start_without_a_principal_secret() {
    let options = ProxyOptions::new("http://127.0.0.1:9".to_owned());
    let output = run_to_exit(proxy_command(&options).stderr(Stdio::piped())).await;
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("IDEMGATE_PRINCIPAL_SECRET"), "{stderr}");
    assert!(stderr.contains("--principal-secret-file"), "{stderr}");
}

/// An upstream that reads each request head and then closes the connection
/// without a byte of answer: the request was sent, whether it ran is unknown.
/// Counts the requests it received.
async fn hanging_up_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&received);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                if read_head(&mut stream).await.is_none() {
                    return;
                }
                counter.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            });
        }
    });
    (addr, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_stores_a_broken_exchange_so_a_retry_does_not_run_again() {
    let (addr, received) = hanging_up_upstream().await;
    let proxy = Proxy::start(ProxyOptions::new(format!("http://{addr}"))).await;
    let client = Client::new();
    let key = new_key();
    let broken = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert_eq!(broken.status, StatusCode::BAD_GATEWAY, "{broken:?}");
    assert_eq!(broken.problem_type(), "/problems/upstream-failed");
    assert_eq!(received.load(Ordering::SeqCst), 1, "the request was sent");
    let retry = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert_eq!(retry.status, StatusCode::BAD_GATEWAY);
    assert!(
        retry.replayed(),
        "the outcome is unknown: replayed, not re-sent"
    );
    assert_eq!(retry.body, broken.body);
    assert_eq!(received.load(Ordering::SeqCst), 1, "no second send");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_refuses_an_oversized_keyed_body_and_streams_a_keyless_one() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(ProxyOptions::new(upstream.url())).await;
    let client = Client::new();
    // Far beyond the layer's 1 MiB limit and the socket buffers: refused by
    // its Content-Length, unread, and still the client reads the 413 (the
    // listener's lingering close drains the rest instead of resetting).
    let large = "x".repeat(3 * 1024 * 1024);
    let keyed = client
        .post(&proxy.url("/uploads"), Some(&new_key()), &large)
        .await;
    assert_eq!(keyed.status, StatusCode::PAYLOAD_TOO_LARGE, "{keyed:?}");
    assert_eq!(keyed.problem_type(), "/problems/body-too-large");
    assert_eq!(upstream.executions(), 0, "refused before forwarding");
    let keyless = client.post(&proxy.url("/uploads"), None, &large).await;
    assert_eq!(keyless.status, StatusCode::CREATED, "{keyless:?}");
    assert_eq!(upstream.executions(), 1);
    assert_eq!(
        upstream.seen()[0].body.len(),
        large.len(),
        "the whole body arrived"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_answers_401_to_a_keyed_request_without_a_principal_and_forwards_nothing() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(ProxyOptions::new(upstream.url())).await;
    let response = reqwest::Client::new()
        .post(proxy.url("/orders"))
        .header("idempotency-key", new_key())
        .body(ORDER)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(upstream.executions(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_scopes_keys_by_a_trusted_header_principal() {
    let upstream = Upstream::start().await;
    let proxy =
        Proxy::start(ProxyOptions::new(upstream.url()).arg("--principal", "header:x-user-id"))
            .await;
    let http = reqwest::Client::new();
    let key = new_key();
    let post = |user: &'static str| {
        http.post(proxy.url("/orders"))
            .header("x-user-id", user)
            .header("idempotency-key", &key)
            .body(ORDER)
            .send()
    };
    let alice = post("alice").await.unwrap();
    assert_eq!(alice.status(), StatusCode::CREATED);
    let alice_again = post("alice").await.unwrap();
    assert_eq!(alice_again.headers()["idempotent-replayed"], "true");
    let bob = post("bob").await.unwrap();
    assert_eq!(bob.status(), StatusCode::CREATED);
    assert!(
        !bob.headers().contains_key("idempotent-replayed"),
        "bob's key is bob's"
    );
    assert_eq!(upstream.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_on_redis_replays_a_lost_response_with_one_upstream_execution() {
    let upstream = Upstream::start().await;
    let proxy =
        Proxy::start(ProxyOptions::new(upstream.url()).store(&crate::support::server::redis_url()))
            .await;
    let client = Client::new();
    let key = new_key();
    let first = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let retry = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(upstream.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_streams_an_uncovered_body_to_the_upstream_before_it_ends() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(ProxyOptions::new(upstream.url())).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    // A keyless POST, chunked: the first chunk now, the end only once the
    // upstream's handler has started — which it cannot if the proxy buffers.
    stream
        .write_all(
            b"POST /stream HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while upstream.started() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the upstream got the request while its body was still being sent");
    assert_eq!(upstream.executions(), 0, "the body has not ended yet");
    stream.write_all(b"6\r\n world\r\n0\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0_u8; 4096];
    while !String::from_utf8_lossy(&answer).contains("\"run\"") {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
            .await
            .expect("an answer")
            .unwrap();
        assert!(
            n > 0,
            "closed before the answer: {:?}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&buffer[..n]);
    }
    assert!(
        answer.starts_with(b"HTTP/1.1 201"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(upstream.seen()[0].body, "hello world".as_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proxy_killed_mid_request_hands_the_same_forwarded_key_to_the_retry() {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_millis(2_000));
    let dir = TempDir::new("idemgate-proxy-kill");
    let store = format!("sqlite://{}", dir.path().join("proxy.db").display());
    let options = || {
        ProxyOptions::new(upstream.url())
            .store(&store)
            .arg("--lease", 1)
            .arg("--ttl", 60)
    };
    let first = Proxy::start(options()).await;
    let client = Client::new();
    let key = new_key();
    let in_flight = {
        let (client, key, url) = (client.clone(), key.clone(), first.url("/orders"));
        tokio::spawn(async move { client.try_post(&url, Some(&key), ORDER).await })
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        while upstream.started() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the upstream holds the request");
    first.kill9().await;
    assert!(
        in_flight.await.unwrap().is_err(),
        "the client lost its answer"
    );

    upstream.set_delay(Duration::ZERO);
    let second = Proxy::start(options()).await;
    // Until the dead holder's lease lapses the key is in progress; then the retry
    // takes the operation over.
    let retried = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let answer = client.post(&second.url("/orders"), Some(&key), ORDER).await;
            if answer.status != StatusCode::CONFLICT {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("the lease lapses");
    assert_eq!(retried.status, StatusCode::CREATED, "{retried:?}");
    let replay = client.post(&second.url("/orders"), Some(&key), ORDER).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, retried.body);
    // The upstream saw the operation twice (the first run's outcome is unknown
    // to the proxy), both times under one forwarded key, so an upstream that
    // dedupes by it executes once.
    let keys: Vec<String> = upstream.seen().iter().map(derived_key).collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(keys[0], keys[1], "a takeover keeps the operation's key");
    assert_ne!(keys[0], key);
}

/// An upstream that switches every request to the `shout` protocol (101), keeps
/// the request head it got, then answers each byte it reads in upper case.
async fn upgrading_upstream() -> (SocketAddr, Arc<std::sync::Mutex<String>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(String::new()));
    let head_seen = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let head_seen = Arc::clone(&head_seen);
            tokio::spawn(async move {
                let Some(head) = read_head(&mut stream).await else {
                    return;
                };
                let text = String::from_utf8_lossy(&head);
                *head_seen.lock().unwrap() = text.to_lowercase();
                let key = text
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("sec-websocket-key")
                            .then(|| value.trim().to_owned())
                    })
                    .unwrap_or_default();
                let switched = format!(
                    "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: {}\r\n\r\n",
                    idemgate_testkit::upstreams::websocket_accept(key.as_bytes())
                );
                let mut buffer = [0_u8; 4096];
                if stream.write_all(switched.as_bytes()).await.is_err() {
                    return;
                }
                while let Ok(n) = stream.read(&mut buffer).await {
                    if n == 0
                        || stream
                            .write_all(&buffer[..n].to_ascii_uppercase())
                            .await
                            .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_tunnels_a_websocket_upgrade_both_ways() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (upstream, seen) = upgrading_upstream().await;
    let proxy = Proxy::start(ProxyOptions::new(format!("http://{upstream}"))).await;
    let address = proxy
        .url("/")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    stream
        .write_all(b"GET /chat HTTP/1.1\r\nhost: example.test\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut stream)
        .await
        .expect("the proxy answered the upgrade before closing");
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    assert!(
        head.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    let upstream_head = seen.lock().unwrap().clone();
    assert!(
        upstream_head.contains("upgrade: websocket"),
        "{upstream_head}"
    );
    assert!(
        upstream_head.contains("connection: upgrade"),
        "{upstream_head}"
    );
    assert!(
        upstream_head.contains("x-forwarded-for: 127.0.0.1"),
        "{upstream_head}"
    );
    for word in ["ping", "again"] {
        stream.write_all(word.as_bytes()).await.unwrap();
        let mut echoed = vec![0_u8; word.len()];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut echoed))
            .await
            .expect("the tunnel carries bytes both ways")
            .unwrap();
        assert_eq!(echoed, word.to_ascii_uppercase().as_bytes());
    }
}

/// The worker model (`--workers`): one thread per worker, each with its own
/// `SO_REUSEPORT` listener, and a SIGTERM drains every worker's requests in
/// flight — each answered, each record completed (a restarted proxy on the same
/// store replays them all, nothing runs twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigterm_drains_the_in_flight_requests_of_every_worker() {
    const REQUESTS: usize = 24;
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_millis(800));
    let dir = TempDir::new("idemgate-proxy-workers");
    let store = format!("sqlite://{}", dir.path().join("proxy.db").display());
    let options = ProxyOptions::new(upstream.url())
        .store(&store)
        .arg("--workers", 4);
    let proxy = Proxy::start(options.clone()).await;
    // The workers start as the proxy says it listens (connections wait in the
    // listening sockets' queues meanwhile).
    let started = tokio::time::Instant::now();
    let workers = loop {
        let workers: Vec<_> = proxy
            .thread_names()
            .into_iter()
            .filter(|name| name.starts_with("worker-"))
            .collect();
        if workers.len() == 4 || started.elapsed() > Duration::from_secs(5) {
            break workers;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(workers, ["worker-0", "worker-1", "worker-2", "worker-3"]);
    let keys: Vec<String> = (0..REQUESTS).map(|_| new_key()).collect();
    let url = proxy.url("/orders");
    // One principal, a client (a connection) per request, so the kernel
    // spreads them over the workers' listeners.
    let client = Client::new();
    let requests: Vec<_> = keys
        .iter()
        .map(|key| {
            let (url, key) = (url.clone(), key.clone());
            let client = Client::new().with_token(&client.token);
            tokio::spawn(async move { client.post(&url, Some(&key), ORDER).await })
        })
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while upstream.started() < REQUESTS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {REQUESTS} reached the upstream",
            upstream.started()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.terminate();
    for request in requests {
        let answer = request.await.unwrap();
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    }
    let exit = proxy.wait_exit().await;
    assert!(exit.success(), "{exit}");
    assert_eq!(upstream.executions(), REQUESTS);

    let restarted = Proxy::start(options).await;
    for key in &keys {
        let retry = client
            .post(&restarted.url("/orders"), Some(key), ORDER)
            .await;
        assert!(retry.replayed(), "every record was completed: {retry:?}");
    }
    assert_eq!(upstream.executions(), REQUESTS, "nothing ran twice");
}

/// What 1,000 duplicates waiting on one running operation cost the proxy and its
/// store (docs/benchmarks.md, "Waiting duplicates"): the proxy's resident memory
/// and the store's connections and statements while they wait. A measurement,
/// run by hand: `cargo test -p idemgate-server --test e2e -- --ignored
/// thousand_waiting_duplicates --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement for docs/benchmarks.md, run by hand"]
async fn thousand_waiting_duplicates() {
    const WAITERS: usize = 1_000;
    let rss = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let pg = sqlx::PgPool::connect(&postgres_url()).await.unwrap();
    let pg_counts = || async {
        let row: (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()), \
             (SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database \
              WHERE datname = current_database())",
        )
        .fetch_one(&pg)
        .await
        .unwrap();
        row
    };
    let redis_addr = crate::support::server::redis_url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let redis_counts = || async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(&redis_addr).await.unwrap();
        stream.write_all(b"INFO\r\nQUIT\r\n").await.unwrap();
        let mut info = String::new();
        stream.read_to_string(&mut info).await.unwrap();
        let field = |name: &str| -> i64 {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        (
            field("connected_clients"),
            field("total_commands_processed"),
        )
    };
    for store in [
        "memory",
        &postgres_url(),
        &crate::support::server::redis_url(),
    ] {
        let upstream = Upstream::start().await;
        let proxy = Proxy::start(ProxyOptions::new(upstream.url()).store(store)).await;
        let client = Client::with_timeout(Duration::from_secs(60));
        let warm = client
            .post(&proxy.url("/orders"), Some(&new_key()), ORDER)
            .await;
        assert_eq!(warm.status, StatusCode::CREATED);
        upstream.set_delay(Duration::from_secs(6));
        let key = new_key();
        let first = {
            let (client, key, url) = (client.clone(), key.clone(), proxy.url("/orders"));
            tokio::spawn(async move { client.post(&url, Some(&key), ORDER).await })
        };
        while upstream.started() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let before_rss = rss(proxy.pid());
        let (pg0, redis0) = (pg_counts().await, redis_counts().await);
        let waiters: Vec<_> = (0..WAITERS)
            .map(|_| {
                let (client, key, url) = (client.clone(), key.clone(), proxy.url("/orders"));
                tokio::spawn(async move { client.post(&url, Some(&key), ORDER).await })
            })
            .collect();
        // Let every waiter arrive and wait 3 s.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let during_rss = rss(proxy.pid());
        let (pg1, redis1) = (pg_counts().await, redis_counts().await);
        let first = first.await.unwrap();
        let mut replayed = 0;
        for waiter in waiters {
            let answer = waiter.await.unwrap();
            assert_eq!(answer.body, first.body, "{answer:?}");
            replayed += usize::from(answer.replayed());
        }
        println!(
            "{store}: {replayed} of {WAITERS} replayed; proxy RSS {before_rss} KiB -> {during_rss} KiB \
             (+{} B per waiter); over 4 s of waiting: PostgreSQL backends {} -> {}, transactions +{}; \
             Redis clients {} -> {}, commands +{}; upstream runs {}",
            (during_rss.saturating_sub(before_rss) * 1024) / WAITERS as u64,
            pg0.0,
            pg1.0,
            pg1.1 - pg0.1,
            redis0.0,
            redis1.0,
            redis1.1 - redis0.1,
            upstream.executions(),
        );
        assert_eq!(upstream.executions(), 2);
    }
}
