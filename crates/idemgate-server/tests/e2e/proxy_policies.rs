//! `idemgate proxy --config` (per-route policies), rejections, `--principal jwt`,
//! `--upstream-host-header` and the upstream failures that happen mid-response —
//! the real binary in front of the counting upstream of `proxy.rs`.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::http::StatusCode;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode, get_current_timestamp};
use serde_json::json;

use crate::support::client::{Answer, Client, ORDER, new_key};
use crate::support::net::read_head;
use crate::support::proxy::{Proxy, ProxyOptions, Upstream, derived_key, proxy_command};
use crate::support::server::{TempDir, run_to_exit};
use idemgate_testkit::wait::wait_until;

/// Writes `text` as `routes.toml` in `dir`; returns its path.
fn routes_file(dir: &TempDir, text: &str) -> String {
    let path = dir.path().join("routes.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/jwt/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// One policy per route, each exercised by a test below.
const ROUTES: &str = r#"
# Webhooks have their own dedupe: pass them through untouched.
[[route]]
method = "POST"
path = "/hooks/*"
enabled = false

[[route]]
method = "POST"
path = "/payments"
require_key = true
forward_key = "original"

[[route]]
method = "POST"
path = "/orders/{id}/notes"
forward_key = "none"
rejections = [409]

[[route]]
method = "POST"
path = "/orders"
fingerprint = { except = ["/sent_at"] }
max_request_body = 200

[[route]]
method = "POST"
path = "/quotes"
fingerprint = { only = ["/amount", "/currency"] }

[[route]]
method = "PUT"
path = "/profiles/{id}"

[[route]]
method = "POST"
path = "/exports"
max_stored_response = 16

[[route]]
method = "POST"
path = "/retryable"
server_errors = "release"

[[route]]
method = "POST"
path = "/impatient"
wait_ms = 0
"#;

async fn with_routes() -> (Upstream, Proxy, TempDir) {
    let upstream = Upstream::start().await;
    let dir = TempDir::new("idemgate-proxy-routes");
    let config = routes_file(&dir, ROUTES);
    let proxy = Proxy::start(ProxyOptions::new(upstream.url()).arg("--config", config)).await;
    (upstream, proxy, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_undoes_a_rejected_claim_so_the_corrected_body_runs_once_then_replays() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(ProxyOptions::new(upstream.url())).await;
    let client = Client::new();
    let key = new_key();
    let url = proxy.url("/orders");
    upstream.answer_next(422);
    let refused = client.post(&url, Some(&key), r#"{"amount":-1}"#).await;
    assert_eq!(
        refused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{refused:?}"
    );
    assert_eq!(upstream.executions(), 1);
    // The upstream refused before doing anything: the key is free again, and a
    // corrected body under it is not a 422 of the proxy's (another payload).
    let fixed = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(fixed.status, StatusCode::CREATED, "{fixed:?}");
    assert!(!fixed.replayed());
    assert_eq!(upstream.executions(), 2, "the corrected request ran");
    let retry = client.post(&url, Some(&key), ORDER).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, fixed.body);
    assert_eq!(upstream.executions(), 2, "and then only once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_may_pass_through_require_a_key_or_forward_the_original_key() {
    let (upstream, proxy, _dir) = with_routes().await;
    let client = Client::new();
    let key = new_key();
    for _ in 0..2 {
        let hook = client
            .post(&proxy.url("/hooks/github/push"), Some(&key), ORDER)
            .await;
        assert_eq!(hook.status, StatusCode::CREATED);
        assert!(!hook.replayed(), "enabled = false: never replayed");
    }
    assert_eq!(upstream.executions(), 2, "a disabled route runs every time");
    assert!(
        upstream
            .seen()
            .iter()
            .all(|seen| seen.headers["idempotency-key"] == key.as_str()),
        "passed through untouched: the client's own key"
    );

    let keyless = client.post(&proxy.url("/payments"), None, ORDER).await;
    assert_eq!(keyless.status, StatusCode::BAD_REQUEST, "{keyless:?}");
    assert_eq!(keyless.problem_type(), "/problems/missing-key");
    assert_eq!(upstream.executions(), 2, "refused before forwarding");
    let keyed = client
        .post(&proxy.url("/payments"), Some(&key), ORDER)
        .await;
    assert_eq!(keyed.status, StatusCode::CREATED);
    let seen = upstream.seen();
    assert_eq!(
        seen.last().unwrap().headers["idempotency-key"],
        key.as_str(),
        "forward_key = original"
    );
    // Elsewhere a keyless POST still passes through (no require_key).
    let elsewhere = client.post(&proxy.url("/carts"), None, ORDER).await;
    assert_eq!(elsewhere.status, StatusCode::CREATED);
    assert_eq!(upstream.executions(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_may_forward_no_key_and_choose_its_own_rejections() {
    let (upstream, proxy, _dir) = with_routes().await;
    let client = Client::new();
    let key = new_key();
    let url = proxy.url("/orders/7/notes");
    upstream.answer_next(400);
    let first = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::BAD_REQUEST);
    assert!(
        !upstream.seen()[0].headers.contains_key("idempotency-key"),
        "forward_key = none"
    );
    // rejections = [409]: this route's 400 is a final answer, stored.
    let retry = client.post(&url, Some(&key), ORDER).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, first.body);
    assert_eq!(upstream.executions(), 1);
    // …and its 409 is undone.
    let key = new_key();
    upstream.answer_next(409);
    let conflict = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(conflict.status, StatusCode::CONFLICT);
    let again = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(!again.replayed());
    assert_eq!(upstream.executions(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fingerprint_pointers_ignore_what_the_route_lists_and_the_body_limit_is_the_routes() {
    let (upstream, proxy, _dir) = with_routes().await;
    let client = Client::new();
    let order = |sent_at: &str, amount: u32| {
        format!(r#"{{"amount":{amount},"currency":"RUB","sent_at":"{sent_at}"}}"#)
    };
    let key = new_key();
    let url = proxy.url("/orders");
    let first = client
        .post(&url, Some(&key), &order("12:00:01", 1500))
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let retry = client
        .post(&url, Some(&key), &order("12:00:07", 1500))
        .await;
    assert!(retry.replayed(), "sent_at is excluded: {retry:?}");
    assert_eq!(retry.body, first.body);
    let tampered = client.post(&url, Some(&key), &order("12:00:07", 1)).await;
    assert_eq!(tampered.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.executions(), 1);

    // `only`: anything but amount and currency may change.
    let key = new_key();
    let url = proxy.url("/quotes");
    let quote = client
        .post(
            &url,
            Some(&key),
            r#"{"amount":5,"currency":"RUB","note":"a"}"#,
        )
        .await;
    let retry = client
        .post(
            &url,
            Some(&key),
            r#"{"note":"b","currency":"RUB","amount":5.0}"#,
        )
        .await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, quote.body);
    let tampered = client
        .post(
            &url,
            Some(&key),
            r#"{"amount":5,"currency":"USD","note":"a"}"#,
        )
        .await;
    assert_eq!(tampered.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.executions(), 2);

    // max_request_body = 200 on /orders; the default (1 MiB) elsewhere.
    let large = format!(r#"{{"amount":1,"pad":"{}"}}"#, "x".repeat(300));
    let refused = client
        .post(&proxy.url("/orders"), Some(&new_key()), &large)
        .await;
    assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE);
    let accepted = client
        .post(&proxy.url("/carts"), Some(&new_key()), &large)
        .await;
    assert_eq!(accepted.status, StatusCode::CREATED);
    assert_eq!(upstream.executions(), 3, "the 413 was never forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_may_cover_another_method() {
    let (upstream, proxy, _dir) = with_routes().await;
    let http = reqwest::Client::new();
    let key = new_key();
    let put = |path: &str| {
        http.put(proxy.url(path))
            .bearer_auth("token-put")
            .header("idempotency-key", &key)
            .body(ORDER)
            .send()
    };
    let first = put("/profiles/1").await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let retry = put("/profiles/1").await.unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(upstream.executions(), 1);
    // A keyed PUT elsewhere is covered by the default route too (every method
    // that is not safe, carrying a key); a keyless one passes through.
    put("/settings").await.unwrap();
    let again = put("/settings").await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(upstream.executions(), 2);
    for _ in 0..2 {
        let keyless = http
            .put(proxy.url("/settings"))
            .bearer_auth("token-put")
            .body(ORDER)
            .send()
            .await
            .unwrap();
        assert!(!keyless.headers().contains_key("idempotent-replayed"));
    }
    assert_eq!(upstream.executions(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_stored_limit_streams_whole_and_is_never_run_again() {
    let (upstream, proxy, _dir) = with_routes().await;
    let client = Client::new();
    let key = new_key();
    let first = client.post(&proxy.url("/exports"), Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(
        first.body.len() > 16,
        "the body is over the route's limit: {first:?}"
    );
    assert_eq!(first.json()["run"], 1, "the client got all of it");
    let retry = client.post(&proxy.url("/exports"), Some(&key), ORDER).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(retry.headers["idempotency-response"], "not-retained");
    assert!(retry.body.is_empty(), "{retry:?}");
    assert_eq!(upstream.executions(), 1, "not retained, yet not run again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_may_release_server_errors_so_the_retry_runs_again() {
    let (upstream, proxy, _dir) = with_routes().await;
    let client = Client::new();
    for path in ["/retryable", "/carts"] {
        let key = new_key();
        upstream.answer_next(503);
        let failed = client.post(&proxy.url(path), Some(&key), ORDER).await;
        assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
        let retry = client.post(&proxy.url(path), Some(&key), ORDER).await;
        match path {
            "/retryable" => {
                assert_eq!(retry.status, StatusCode::CREATED, "released: {retry:?}");
                assert!(!retry.replayed());
            }
            _ => {
                assert_eq!(retry.status, StatusCode::SERVICE_UNAVAILABLE);
                assert!(retry.replayed(), "stored as FAILED by default");
            }
        }
    }
    assert_eq!(upstream.executions(), 3);
    let seen = upstream.seen();
    assert_eq!(
        derived_key(&seen[0]),
        derived_key(&seen[1]),
        "the released operation is retried under its forwarded key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waits_for_the_running_request_by_default_and_a_route_may_refuse_at_once() {
    let (upstream, proxy, _dir) = with_routes().await;
    upstream.set_delay(std::time::Duration::from_millis(700));
    let client = Client::new();
    let key = new_key();
    for path in ["/carts", "/impatient"] {
        // Counted before the first is sent: read after, it may already include
        // the first request, and the wait below would never end.
        let started = upstream.started();
        let first = {
            let (client, key, url) = (client.clone(), key.clone(), proxy.url(path));
            tokio::spawn(async move { client.post(&url, Some(&key), ORDER).await })
        };
        wait_until(
            "the upstream runs the first request",
            std::time::Duration::from_secs(10),
            || upstream.started() > started,
        )
        .await;
        let duplicate = client.post(&proxy.url(path), Some(&key), ORDER).await;
        let first = first.await.unwrap();
        match path {
            "/carts" => {
                assert_eq!(
                    duplicate.status,
                    StatusCode::CREATED,
                    "waited by default: {duplicate:?}"
                );
                assert!(duplicate.replayed());
                assert_eq!(duplicate.body, first.body);
            }
            _ => assert_eq!(
                duplicate.status,
                StatusCode::CONFLICT,
                "wait_ms = 0: 409 at once"
            ),
        }
    }
    assert_eq!(upstream.executions(), 2);
}

/// An upstream that answers each request with a head and part of its body, then
/// resets the connection. Counts the requests it received.
async fn resetting_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::AsyncWriteExt;
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
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"run\":1,\"part",
                    )
                    .await;
                let _ = stream.flush().await;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                // SO_LINGER 0: close with a reset, not a clean end. (Deprecated
                // because a non-zero linger blocks the thread on drop; zero does not.)
                #[allow(deprecated)]
                let _ = stream.set_linger(Some(std::time::Duration::ZERO));
                drop(stream);
            });
        }
    });
    (addr, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_stores_an_upstream_reset_mid_response_so_a_retry_does_not_run_again() {
    let (addr, received) = resetting_upstream().await;
    let proxy = Proxy::start(ProxyOptions::new(format!("http://{addr}"))).await;
    let client = Client::new();
    let key = new_key();
    let broken = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    // The body broke before the stored-response limit, so the client has had
    // nothing yet: it gets a problem, never the truncated body.
    assert_eq!(
        broken.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{broken:?}"
    );
    assert_eq!(broken.problem_type(), "/problems/handler-failed");
    assert_eq!(received.load(Ordering::SeqCst), 1);
    let retry = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert!(retry.replayed(), "it may have run: replayed, not re-sent");
    assert_eq!(retry.status, broken.status);
    assert_eq!(retry.body, broken.body);
    assert_eq!(received.load(Ordering::SeqCst), 1, "no second send");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_rewrites_host_to_the_upstream_only_when_asked() {
    let upstream = Upstream::start().await;
    let kept = Proxy::start(ProxyOptions::new(upstream.url())).await;
    let rewritten =
        Proxy::start(ProxyOptions::new(upstream.url()).arg("--upstream-host-header", "upstream"))
            .await;
    let http = reqwest::Client::new();
    for proxy in [&kept, &rewritten] {
        http.get(proxy.url("/status"))
            .header("host", "api.example")
            .send()
            .await
            .unwrap();
    }
    let seen = upstream.seen();
    assert_eq!(seen[0].headers["host"], "api.example");
    assert_eq!(seen[1].headers["host"], upstream.addr.to_string().as_str());
    assert_eq!(seen[1].headers["x-forwarded-host"], "api.example");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_refuses_a_bad_config_file_naming_the_file_and_line() {
    let dir = TempDir::new("idemgate-proxy-bad-config");
    let config = routes_file(
        &dir,
        "[[route]]\nmethod = \"POST\"\npath = \"/orders\"\nserver_errors = \"retry\"\n",
    );
    let options = ProxyOptions::new("http://127.0.0.1:9".to_owned())
        .arg("--principal", "header:x-user")
        .arg("--config", &config);
    let output = run_to_exit(proxy_command(&options).stderr(Stdio::piped())).await;
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("IDEMGATE_CONFIG"), "{stderr}");
    assert!(stderr.contains(&format!("{config}:4:")), "{stderr}");
    assert!(stderr.contains("retry"), "names the bad value: {stderr}");

    let options = ProxyOptions::new("http://127.0.0.1:9".to_owned())
        .arg("--principal", "header:x-user")
        .arg("--config", "/nonexistent/routes.toml");
    let output = run_to_exit(&mut proxy_command(&options)).await;
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot read /nonexistent/routes.toml"),
        "{stderr}"
    );
}

// --- --principal jwt -----------------------------------------------------------

const ISSUER: &str = "https://auth.idemgate.test";
const AUDIENCE: &str = "orders";

fn claims(sub: &str) -> serde_json::Value {
    let now = get_current_timestamp();
    json!({ "sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 600 })
}

fn hs256(claims: &serde_json::Value, secret: &[u8]) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret),
    )
    .unwrap()
}

fn signed(algorithm: Algorithm, kid: &str, claims: &serde_json::Value) -> String {
    let pem = |name| std::fs::read(fixture(name)).unwrap();
    let key = match algorithm {
        Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem("rs256-private.pem")).unwrap(),
        Algorithm::ES256 => EncodingKey::from_ec_pem(&pem("es256-private.pem")).unwrap(),
        other => panic!("{other:?}"),
    };
    let mut header = Header::new(algorithm);
    header.kid = Some(kid.to_owned());
    encode(&header, claims, &key).unwrap()
}

fn with(mut claims: serde_json::Value, key: &str, value: serde_json::Value) -> serde_json::Value {
    claims[key] = value;
    claims
}

async fn refused(proxy: &Proxy, token: &str, why: &str) {
    let answer: Answer = Client::new()
        .with_token(token)
        .post(&proxy.url("/orders"), Some(&new_key()), ORDER)
        .await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{why}: {answer:?}");
    assert_eq!(answer.problem_type(), "/problems/unauthenticated", "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_scopes_keys_by_a_verified_hs256_jwt_and_forwards_no_bad_token() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .arg("--principal", "jwt")
            .arg("--jwt-secret-file", fixture("hs256-secret"))
            .arg("--jwt-issuer", ISSUER)
            .arg("--jwt-audience", AUDIENCE),
    )
    .await;
    let secret = b"e2e-hs256-secret";
    let key = new_key();
    let alice = Client::new().with_token(&hs256(&claims("alice"), secret));
    let first = alice.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    // A fresh token of the same subject is the same principal.
    let renewed = Client::new().with_token(&hs256(&with(claims("alice"), "iat", json!(1)), secret));
    let retry = renewed.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert!(retry.replayed(), "{retry:?}");
    let bob = Client::new().with_token(&hs256(&claims("bob"), secret));
    let bobs = bob.post(&proxy.url("/orders"), Some(&key), ORDER).await;
    assert!(!bobs.replayed(), "bob's key is bob's");
    assert_eq!(upstream.executions(), 2);

    let now = get_current_timestamp();
    refused(
        &proxy,
        &hs256(&with(claims("eve"), "exp", json!(now - 3600)), secret),
        "expired",
    )
    .await;
    refused(
        &proxy,
        &hs256(&with(claims("eve"), "nbf", json!(now + 3600)), secret),
        "nbf",
    )
    .await;
    refused(&proxy, &hs256(&claims("eve"), b"another-secret"), "forged").await;
    refused(
        &proxy,
        &hs256(
            &with(claims("eve"), "iss", json!("https://evil.test")),
            secret,
        ),
        "issuer",
    )
    .await;
    refused(
        &proxy,
        &hs256(&with(claims("eve"), "aud", json!("billing")), secret),
        "audience",
    )
    .await;
    refused(
        &proxy,
        &signed(Algorithm::RS256, "rsa-1", &claims("eve")),
        "not HS256",
    )
    .await;
    refused(&proxy, "not-a-jwt", "garbage").await;
    assert_eq!(upstream.executions(), 2, "no refused request was forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_verifies_rs256_and_es256_jwts_against_a_jwks_file() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .arg("--principal", "jwt")
            .arg("--jwks-file", fixture("jwks.json"))
            .arg("--jwt-claim", "sub"),
    )
    .await;
    for (algorithm, kid, sub) in [
        (Algorithm::RS256, "rsa-1", "alice"),
        (Algorithm::ES256, "ec-1", "bob"),
    ] {
        let client = Client::new().with_token(&signed(algorithm, kid, &claims(sub)));
        let key = new_key();
        let first = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
        assert_eq!(
            first.status,
            StatusCode::CREATED,
            "{algorithm:?}: {first:?}"
        );
        let retry = client.post(&proxy.url("/orders"), Some(&key), ORDER).await;
        assert!(retry.replayed(), "{algorithm:?}");
    }
    assert_eq!(upstream.executions(), 2);

    // A valid token whose payload was swapped: the signature no longer matches.
    let genuine = signed(Algorithm::RS256, "rsa-1", &claims("alice"));
    let other = signed(Algorithm::RS256, "rsa-1", &claims("mallory"));
    let parts: Vec<&str> = genuine.split('.').collect();
    let swapped = format!(
        "{}.{}.{}",
        parts[0],
        other.split('.').nth(1).unwrap(),
        parts[2]
    );
    refused(&proxy, &swapped, "forged payload").await;
    let now = get_current_timestamp();
    refused(
        &proxy,
        &signed(
            Algorithm::ES256,
            "ec-1",
            &with(claims("bob"), "exp", json!(now - 3600)),
        ),
        "expired",
    )
    .await;
    refused(
        &proxy,
        &signed(Algorithm::RS256, "ec-1", &claims("alice")),
        "kid of another algorithm",
    )
    .await;
    refused(
        &proxy,
        &signed(Algorithm::RS256, "unknown", &claims("alice")),
        "unknown kid",
    )
    .await;
    refused(
        &proxy,
        &hs256(&claims("alice"), b"e2e-hs256-secret"),
        "HS256 against a JWKS",
    )
    .await;
    assert_eq!(upstream.executions(), 2, "no refused request was forwarded");
    // The derived key the upstream saw is distinct per principal.
    let seen = upstream.seen();
    assert_ne!(derived_key(&seen[0]), derived_key(&seen[1]));
}

// --- --tls-cert / --tls-key -----------------------------------------------------

/// One HTTP/1.1 exchange over TLS to `addr`, trusting only the test certificate;
/// the whole answer as text.
async fn https_exchange(addr: SocketAddr, request: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto};

    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(tls_fixture("cert.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = ClientConfig::builder_with_provider(Arc::new(crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("the handshake with the test certificate succeeds");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}

fn tls_fixture(name: &str) -> String {
    format!("{}/tests/fixtures/tls/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_terminates_tls_itself_when_given_a_certificate() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start_tls(
        ProxyOptions::new(upstream.url())
            .arg("--tls-cert", tls_fixture("cert.pem"))
            .arg("--tls-key", tls_fixture("key.pem")),
    )
    .await;
    let key = new_key();
    let request = format!(
        "POST /orders HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer tls\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{ORDER}",
        ORDER.len()
    );
    let first = https_exchange(proxy.addr, request.clone()).await;
    assert!(first.starts_with("HTTP/1.1 201"), "{first}");
    let retry = https_exchange(proxy.addr, request).await;
    assert!(retry.starts_with("HTTP/1.1 201"), "{retry}");
    assert!(retry.contains("idempotent-replayed: true"), "{retry}");
    assert_eq!(
        first.split("\r\n\r\n").nth(1),
        retry.split("\r\n\r\n").nth(1),
        "the same body"
    );
    assert_eq!(upstream.executions(), 1);
    assert_eq!(upstream.seen()[0].headers["x-forwarded-proto"], "https");
    // Plain HTTP to the TLS listener is not served.
    let plain = reqwest::Client::new()
        .post(format!("http://{}/orders", proxy.addr))
        .header("idempotency-key", new_key())
        .body(ORDER)
        .send()
        .await;
    assert!(
        plain
            .as_ref()
            .map_or(true, |r| r.status() != StatusCode::CREATED),
        "{plain:?}"
    );
    assert_eq!(upstream.executions(), 1);
}
