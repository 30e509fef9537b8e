//! A key reused within its TTL with another JSON body answers 422 naming the
//! differing JSON pointers (`differing`, `differing_complete`; PROTOCOL §6.3,
//! docs/problems.md; issue 32, finding 4) — for every key source (the
//! `Idempotency-Key` header, a `path:` natural key, a `json:` reference, a
//! `query:` key), through `serve` and the proxy, on every store: SQLite,
//! PostgreSQL, Redis and memory. Each refusal is checked against what ran: the
//! gateway's charges, the orders, the balances, the upstream's executions.
//! A body that is not JSON keeps the bare 422.

use axum::http::StatusCode;
use reqwest::Method;

use crate::support::client::{Answer, Client, ORDER, new_key};
use crate::support::gateway::MockGateway;
use crate::support::proxy::{Proxy, ProxyOptions, Upstream};
use crate::support::server::{Options, Server, TempDir, postgres_url, redis_url, sqlite_url};

const JSON: (&str, &str) = ("content-type", "application/json");

/// The 422 of a reused key, naming exactly `pointers`, every differing field.
fn assert_names(answer: &Answer, pointers: &[&str]) {
    assert_eq!(
        answer.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{answer:?}"
    );
    let problem = answer.json();
    assert_eq!(problem["type"], "/problems/key-reused", "{problem}");
    assert_eq!(
        problem["differing"],
        serde_json::json!(pointers),
        "{problem}"
    );
    assert_eq!(problem["differing_complete"], true, "{problem}");
    let detail = problem["detail"].as_str().expect("a detail");
    assert!(
        detail.contains(&format!("differs at {}", pointers.join(", "))),
        "{detail}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_names_the_differing_fields_on_sqlite() {
    let (db, _dir) = sqlite_url();
    serve_names_the_differing_fields(Options::new(&db)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_names_the_differing_fields_on_postgres() {
    serve_names_the_differing_fields(Options::new(&postgres_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_names_the_differing_fields_with_redis_records() {
    let (db, _dir) = sqlite_url();
    serve_names_the_differing_fields(Options::new(&db).store(&redis_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_names_the_differing_fields_with_memory_records() {
    let (db, _dir) = sqlite_url();
    serve_names_the_differing_fields(Options::new(&db).store("memory")).await;
}

/// `POST /api/v1/orders` (the header), `PUT /api/v1/orders/{id}` (a `path:` key)
/// and a transfer's `reference_id` (a `json:` key), each reused with another
/// amount: 422 naming `/amount`, and nothing charged, stored or moved twice.
async fn serve_names_the_differing_fields(options: Options) {
    let gateway = MockGateway::start().await;
    let server = Server::start(options.gateway(gateway.url())).await;
    let client = Client::new();
    let orders = server.url("/api/v1/orders");

    // The header.
    let key = new_key();
    let first = client.post(&orders, Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let other_amount = ORDER.replace("1500", "1600");
    let reused = client.post(&orders, Some(&key), &other_amount).await;
    assert_names(&reused, &["/amount"]);
    // Two fields, and the same document respelled (only the changes count).
    let two = r#"{ "amount": 1600, "currency": "RUB", "items": [ { "quantity": 2, "id": 42 } ] }"#;
    let reused = client.post(&orders, Some(&key), two).await;
    assert_names(&reused, &["/amount", "/items/0/quantity"]);
    // The first body respelled is the same request: its replay.
    let respelled = r#"{"amount":15e2,"currency":"RUB","items":[{"quantity":1,"id":42}]}"#;
    let retry = client.post(&orders, Some(&key), respelled).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);

    // A natural key in the path.
    let id = format!("ORD-{}", uuid::Uuid::new_v4().simple());
    let url = server.url(&format!("/api/v1/orders/{id}"));
    let put = client.send_json("PUT", &url, &[], ORDER).await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    let reused = client.send_json("PUT", &url, &[], &other_amount).await;
    assert_names(&reused, &["/amount"]);

    assert_eq!(
        gateway.calls().len(),
        2,
        "one charge per order, none for a 422"
    );
    let stored = client.orders(&server.url("")).await;
    assert_eq!(stored.len(), 2, "{stored:?}");
    assert!(
        stored.iter().all(|order| order["amount"] == 1500),
        "{stored:?}"
    );

    // A transfer's reference_id (a JSON key), reused with another amount.
    let account = |balance: i64| {
        let (client, url) = (client.clone(), server.url("/api/v1/accounts"));
        async move {
            let body = format!(r#"{{"balance":{balance},"currency":"RUB"}}"#);
            let opened = client.post(&url, Some(&new_key()), &body).await;
            assert_eq!(opened.status, StatusCode::CREATED, "{opened:?}");
            opened.json()["account_id"].as_i64().unwrap()
        }
    };
    let (from, to) = (account(500).await, account(0).await);
    let transfers = server.url(&format!("/api/v1/accounts/{from}/transfers"));
    let reference = format!("tx-{}", uuid::Uuid::new_v4().simple());
    let transfer = |amount: i64| {
        let body = format!(r#"{{"to":{to},"amount":{amount},"reference_id":"{reference}"}}"#);
        let (client, url) = (client.clone(), transfers.clone());
        async move {
            client
                .send(Method::POST, &url, None, &[JSON], Some(&body))
                .await
        }
    };
    let moved = transfer(100).await;
    assert_eq!(moved.status, StatusCode::CREATED, "{moved:?}");
    assert_names(&transfer(50).await, &["/amount"]);
    let balance = |id: i64| {
        let (client, url) = (
            client.clone(),
            server.url(&format!("/api/v1/accounts/{id}")),
        );
        async move { client.get(&url).await.json()["balance"].clone() }
    };
    assert_eq!(balance(from).await, 400, "one debit");
    assert_eq!(balance(to).await, 100, "one credit");
}

/// The routes the proxy test reuses keys on: a JSON reference, a query key;
/// every other path takes the client's `Idempotency-Key`.
const ROUTES: &str = r#"
[[route]]
method = "POST"
path = "/v3/payments"
key = "json:/reference_id"

[[route]]
method = "POST"
path = "/v1/searches"
key = "query:request_id"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_names_the_differing_fields_on_sqlite() {
    proxy_names_the_differing_fields(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_names_the_differing_fields_on_postgres() {
    proxy_names_the_differing_fields(Some(&postgres_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_names_the_differing_fields_on_redis() {
    proxy_names_the_differing_fields(Some(&redis_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_names_the_differing_fields_in_memory() {
    proxy_names_the_differing_fields(Some("memory")).await;
}

/// Through the proxy: a `json:` key, a `query:` key and the header, each reused
/// with another amount → 422 naming `/amount`, the upstream run once per key; a
/// text body reused → the bare 422 (no fields to name).
async fn proxy_names_the_differing_fields(store: Option<&str>) {
    let upstream = Upstream::start().await;
    let dir = TempDir::new("idemgate-differing");
    let path = dir.path().join("routes.toml");
    std::fs::write(&path, ROUTES).unwrap();
    let options = ProxyOptions::new(upstream.url())
        .arg("--config", path.display().to_string())
        .store_or_sqlite_in(store, dir.path());
    let proxy = Proxy::start(options).await;
    let client = Client::new();
    let run = uuid::Uuid::new_v4().simple().to_string();

    let payments = proxy.url("/v3/payments");
    let payment = |amount: u32| format!(r#"{{"reference_id":"p-{run}","amount":{amount}}}"#);
    let first = client.send_json("POST", &payments, &[], &payment(5)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_names(
        &client.send_json("POST", &payments, &[], &payment(6)).await,
        &["/amount"],
    );

    let search = proxy.url(&format!("/v1/searches?request_id=s-{run}"));
    let first = client
        .send_json("POST", &search, &[], r#"{"amount":1}"#)
        .await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_names(
        &client
            .send_json("POST", &search, &[], r#"{"amount":2}"#)
            .await,
        &["/amount"],
    );

    let charges = proxy.url("/v1/charges");
    let key = format!("h-{run}");
    let headers = [("idempotency-key", key.as_str())];
    let first = client
        .send_json(
            "POST",
            &charges,
            &headers,
            r#"{"amount":7,"currency":"EUR"}"#,
        )
        .await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_names(
        &client
            .send_json(
                "POST",
                &charges,
                &headers,
                r#"{"amount":8,"currency":"EUR"}"#,
            )
            .await,
        &["/amount"],
    );
    assert_eq!(upstream.executions(), 3, "one run per key, none for a 422");

    // Not JSON: nothing to name, today's bare 422.
    let text_key = format!("t-{run}");
    let text = |body: &'static str| {
        let (client, url, key) = (client.clone(), charges.clone(), text_key.clone());
        async move {
            client
                .send(
                    Method::POST,
                    &url,
                    Some(&key),
                    &[("content-type", "text/plain")],
                    Some(body),
                )
                .await
        }
    };
    assert_eq!(text("amount=7").await.status, StatusCode::CREATED);
    let reused = text("amount=8").await;
    assert_eq!(
        reused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{reused:?}"
    );
    let problem = reused.json();
    assert_eq!(problem["type"], "/problems/key-reused");
    assert!(problem.get("differing").is_none(), "{problem}");
    assert!(problem.get("differing_complete").is_none(), "{problem}");
    assert_eq!(upstream.executions(), 4);
}
