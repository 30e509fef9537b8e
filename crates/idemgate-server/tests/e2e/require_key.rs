//! `serve --require-key` (`IDEMGATE_REQUIRE_KEY`): a keyless POST to the orders
//! API is the layer's 400 `missing-key` problem, and charges and stores nothing;
//! keyed requests and reads work as before.

use reqwest::StatusCode;

use crate::support::client::{Client, ORDER, new_key};
use crate::support::gateway::MockGateway;
use crate::support::server::{Options, Server, sqlite_url};

async fn keyless_posts_are_refused(options: Options, gateway: &MockGateway) {
    let server = Server::start(options).await;
    let client = Client::new();
    let url = server.url("/api/v1/orders");
    for _ in 0..2 {
        let answer = client.post(&url, None, ORDER).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
        assert_eq!(
            answer.headers["content-type"], "application/problem+json",
            "{answer:?}"
        );
        assert!(answer.problem_type().ends_with("missing-key"), "{answer:?}");
        assert!(
            answer.json()["detail"]
                .as_str()
                .unwrap()
                .contains("Idempotency-Key"),
            "{answer:?}"
        );
    }
    assert!(gateway.calls().is_empty(), "a keyless POST was charged");
    assert!(
        client.orders(&server.url("")).await.is_empty(),
        "a keyless POST made an order"
    );
    // A keyed request still runs once, and its retry replays.
    let key = new_key();
    let first = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let retry = client.post(&url, Some(&key), ORDER).await;
    assert!(retry.replayed());
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
    assert_eq!(gateway.calls().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn require_key_refuses_keyless_orders_and_creates_nothing() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let options = Options::new(&db)
        .gateway(gateway.url())
        .switch("--require-key");
    keyless_posts_are_refused(options, &gateway).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_require_key_variable_does_the_same() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let options = Options::new(&db)
        .gateway(gateway.url())
        .env("IDEMGATE_REQUIRE_KEY", "true");
    keyless_posts_are_refused(options, &gateway).await;
}
