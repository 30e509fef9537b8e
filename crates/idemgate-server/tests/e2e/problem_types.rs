//! Problem types the operator owns: `--problem-type-base` and `--problem-link`
//! (and their variables) on `serve` and `proxy`, for the layer's own problems,
//! the handler's stored ones (and their replays, byte for byte), the ones
//! answered outside the layer and the listener's own refusals; a bad base stops
//! the start.

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::client::{Client, ORDER, new_key};
use crate::support::gateway::{Fault, MockGateway};
use crate::support::proxy::{Proxy, ProxyOptions, Upstream};
use crate::support::server::{Options, Server, sqlite_url};

const BASE: &str = "https://docs.example.com/errors/";

fn link(slug: &str) -> String {
    format!("<{BASE}{slug}>; rel=\"describedby\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_sends_every_problem_under_the_operators_base_with_a_link() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(
        Options::new(&db)
            .gateway(gateway.url())
            .arg("--problem-type-base", BASE)
            .env("IDEMGATE_PROBLEM_LINK", "true"),
    )
    .await;
    let client = Client::new();
    let url = server.url("/api/v1/orders");

    // The layer's own problem.
    let key = new_key();
    assert_eq!(
        client.post(&url, Some(&key), ORDER).await.status,
        StatusCode::CREATED
    );
    let reused = client
        .post(&url, Some(&key), &ORDER.replace("1500", "15"))
        .await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reused.problem_type(), format!("{BASE}key-reused"));
    assert_eq!(reused.headers["link"], link("key-reused").as_str());

    // The handler's problem, stored: the replay is the same bytes and headers.
    gateway.inject(Fault::Decline);
    let key = new_key();
    let declined = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(declined.problem_type(), format!("{BASE}payment-declined"));
    assert_eq!(declined.headers["link"], link("payment-declined").as_str());
    let replay = client.post(&url, Some(&key), ORDER).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, declined.body, "the replay is the styled bytes");
    assert_eq!(replay.headers["link"], declined.headers["link"]);

    // Outside the layer: authentication's 401.
    let anonymous = reqwest::Client::new()
        .post(&url)
        .header("idempotency-key", new_key())
        .header("content-type", "application/json")
        .body(ORDER)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        anonymous.headers()["link"],
        link("unauthenticated").as_str()
    );
    let body: serde_json::Value = anonymous.json().await.unwrap();
    assert_eq!(body["type"], format!("{BASE}unauthenticated"));

    assert_eq!(client.orders(&server.url("")).await.len(), 1);
    assert_eq!(gateway.calls().len(), 2, "one charge, one decline");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_default_base_is_relative_and_sends_no_link() {
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db)).await;
    let answer = Client::new()
        .post(&server.url("/api/v1/orders"), Some("a,b"), ORDER)
        .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.problem_type(), "/problems/invalid-key");
    assert!(answer.headers.get("link").is_none(), "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_proxy_takes_the_same_flags() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .store("memory")
            .env("IDEMGATE_PROBLEM_TYPE_BASE", BASE)
            .env("IDEMGATE_PROBLEM_LINK", "1"),
    )
    .await;
    let client = Client::new();
    let url = proxy.url("/v1/charges");
    let key = new_key();
    assert_eq!(
        client.post(&url, Some(&key), ORDER).await.status,
        StatusCode::CREATED
    );
    let reused = client.post(&url, Some(&key), "{}").await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reused.problem_type(), format!("{BASE}key-reused"));
    assert_eq!(reused.headers["link"], link("key-reused").as_str());
    assert_eq!(upstream.executions(), 1);
}

/// A keyed `POST` whose body never comes, answered by the listener (`408
/// body-timeout`) once the body-read timeout passes: what was read to the close.
async fn slow_body(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: idemgate\r\nauthorization: Bearer slow-body\r\n\
         content-type: application/json\r\nidempotency-key: {}\r\ncontent-length: 100\r\n\r\n{{",
        new_key()
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    let mut received = Vec::new();
    // The 408 is followed by a close; a reset after it ends the read too.
    let _ = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut received))
        .await
        .expect("the connection was closed after the body timeout");
    String::from_utf8_lossy(&received).into_owned()
}

/// The listener's 408 under `BASE`: status, content type and `type`.
fn assert_body_timeout_under_the_base(answer: &str) {
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/problem+json"),
        "{head}"
    );
    let problem: serde_json::Value = serde_json::from_str(body).expect("problem+json");
    assert_eq!(problem["type"], format!("{BASE}body-timeout"), "{body}");
    assert_eq!(problem["status"], 408);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_listeners_own_refusals_carry_the_operators_base_on_serve_and_proxy() {
    let (db, _dir) = sqlite_url();
    let server = Server::start(
        Options::new(&db)
            .arg("--problem-type-base", BASE)
            .arg("--body-read-timeout-ms", 500),
    )
    .await;
    assert_body_timeout_under_the_base(&slow_body(server.addr, "/api/v1/orders").await);

    let upstream = Upstream::start().await;
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .store("memory")
            .env("IDEMGATE_PROBLEM_TYPE_BASE", BASE)
            .arg("--body-read-timeout-ms", 500),
    )
    .await;
    assert_body_timeout_under_the_base(&slow_body(proxy.addr, "/v1/charges").await);
    assert_eq!(upstream.executions(), 0, "nothing ran");
}

#[test]
fn a_base_that_cannot_be_a_uri_stops_the_start() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["serve", "--problem-type-base", "https://x.example/a b/"])
        .env_remove("IDEMGATE_PROBLEM_TYPE_BASE")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("--problem-type-base") && stderr.contains("IDEMGATE_PROBLEM_TYPE_BASE"),
        "{stderr}"
    );
}
