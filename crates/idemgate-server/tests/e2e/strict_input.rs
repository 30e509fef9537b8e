//! Strict input against the real binary: a body that is not UTF-8 and ambiguous
//! header lines are refused with 400 problem+json before anything is claimed,
//! ordered or charged; the same key then works, once.

use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};

use crate::support::client::{Answer, Client, ORDER, new_key};
use crate::support::gateway::MockGateway;
use crate::support::server::{Options, Server, sqlite_url};

async fn send(request: reqwest::RequestBuilder) -> Answer {
    let response = request.send().await.expect("send");
    Answer {
        status: response.status(),
        headers: response.headers().clone(),
        body: response.bytes().await.expect("body"),
    }
}

async fn started() -> (MockGateway, Server, crate::support::server::TempDir) {
    let gateway = MockGateway::start().await;
    let (db, dir) = sqlite_url();
    let server = Server::start(Options::new(&db).gateway(gateway.url())).await;
    (gateway, server, dir)
}

/// The seed order with its last member's value replaced by raw bytes.
fn order_with_raw_string(raw: &[u8]) -> Vec<u8> {
    let mut body =
        br#"{"items":[{"id":42,"quantity":1}],"currency":"RUB","amount":1500,"x":""#.to_vec();
    body.extend_from_slice(raw);
    body.extend_from_slice(b"\"}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_that_is_not_utf8_is_400_and_charges_nothing() {
    let (gateway, server, _dir) = started().await;
    let client = Client::new();
    let http = reqwest::Client::new();
    let url = server.url("/api/v1/orders");
    let key = new_key();
    // A broken two-byte sequence, and an overlong-encoded `/`.
    for raw in [&b"\xc3\x28"[..], &b"\xc0\xaf"[..]] {
        let answer = send(
            http.post(&url)
                .bearer_auth(&client.token)
                .header(CONTENT_TYPE, "application/json")
                .header("idempotency-key", &key)
                .body(order_with_raw_string(raw)),
        )
        .await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
        assert_eq!(answer.problem_type(), "/problems/invalid-order");
        assert!(
            answer.json()["detail"].as_str().unwrap().contains("UTF-8"),
            "{answer:?}"
        );
    }
    assert!(
        gateway.calls().is_empty(),
        "invalid UTF-8 reached the gateway"
    );
    assert!(client.orders(&server.url("")).await.is_empty());
    // The refusal freed the key: the corrected body runs once.
    let answer = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    assert!(!answer.replayed());
    assert_eq!(gateway.calls().len(), 1);
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_authorization_lines_are_400_and_claim_nothing() {
    let (gateway, server, _dir) = started().await;
    let client = Client::new();
    let mallory = Client::new();
    let url = server.url("/api/v1/orders");
    let key = new_key();
    let answer = send(
        reqwest::Client::new()
            .post(&url)
            .header(AUTHORIZATION, format!("Bearer {}", client.token))
            .header(AUTHORIZATION, format!("Bearer {}", mallory.token))
            .header(CONTENT_TYPE, "application/json")
            .header("idempotency-key", &key)
            .body(ORDER),
    )
    .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    assert_eq!(answer.problem_type(), "/problems/ambiguous-header");
    assert!(gateway.calls().is_empty());
    assert!(client.orders(&server.url("")).await.is_empty());
    assert!(mallory.orders(&server.url("")).await.is_empty());
    // Nothing was claimed under either: one Authorization line runs once.
    let first = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.replayed());
    let retry = client.post(&url, Some(&key), ORDER).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(gateway.calls().len(), 1);
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_content_type_or_idempotency_key_lines_are_400_and_claim_nothing() {
    let (gateway, server, _dir) = started().await;
    let client = Client::new();
    let url = server.url("/api/v1/orders");
    let key = new_key();
    let two_types = send(
        reqwest::Client::new()
            .post(&url)
            .bearer_auth(&client.token)
            .header(CONTENT_TYPE, "application/json")
            .header(CONTENT_TYPE, "text/plain")
            .header("idempotency-key", &key)
            .body(ORDER),
    )
    .await;
    assert_eq!(two_types.status, StatusCode::BAD_REQUEST, "{two_types:?}");
    assert_eq!(two_types.problem_type(), "/problems/ambiguous-header");
    let two_keys = send(
        reqwest::Client::new()
            .post(&url)
            .bearer_auth(&client.token)
            .header(CONTENT_TYPE, "application/json")
            .header("idempotency-key", &key)
            .header("idempotency-key", new_key())
            .body(ORDER),
    )
    .await;
    assert_eq!(two_keys.status, StatusCode::BAD_REQUEST, "{two_keys:?}");
    assert_eq!(two_keys.problem_type(), "/problems/invalid-key");
    assert!(gateway.calls().is_empty());
    assert!(client.orders(&server.url("")).await.is_empty());
    let answer = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    assert!(!answer.replayed());
    assert_eq!(gateway.calls().len(), 1);
}

/// Framing headers are hyper's: two different `Content-Length` lines are refused
/// with 400 before any handler or the layer sees the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_different_content_length_lines_are_400_and_charge_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let (gateway, server, _dir) = started().await;
    let client = Client::new();
    let request = format!(
        "POST /api/v1/orders HTTP/1.1\r\nhost: idemgate\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\nidempotency-key: {}\r\n\
         content-length: {}\r\ncontent-length: 2\r\n\r\n{ORDER}",
        client.token,
        new_key(),
        ORDER.len()
    );
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("an answer and a close");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(gateway.calls().is_empty());
    assert!(client.orders(&server.url("")).await.is_empty());
}
