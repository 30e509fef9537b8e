//! `PUT /api/v1/orders/{order_id}` (PROTOCOL §15): the client chooses the id, the
//! layer keys the route by it, and the orders table keeps it as the durable
//! natural key. The real binary, every idempotency store `serve` supports, and
//! the counting payment mock.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use tokio::sync::Barrier;

use crate::support::client::{Client, ORDER};
use crate::support::gateway::MockGateway;
use crate::support::server::{Options, Server, postgres_url, redis_url, sqlite_url};

const PROBLEMS: &str = "/problems/";

fn order_id() -> String {
    format!("ORD-{}", uuid::Uuid::new_v4().simple())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_put_under_a_client_id_charges_once_and_is_replayed() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).gateway(gateway.url())).await;
    let client = Client::new();
    let id = order_id();
    let url = server.url(&format!("/api/v1/orders/{id}"));
    let first = client.send_json("PUT", &url, &[], ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(first.headers["location"], format!("/api/v1/orders/{id}"));
    assert_eq!(first.json()["client_order_id"], id.as_str());
    assert_eq!(gateway.calls().len(), 1);
    // The retry (the client never saw the first answer) is the same 201.
    let retry = client.send_json("PUT", &url, &[], ORDER).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(gateway.calls().len(), 1, "the retry charged again");
    // Another body under the id is a reuse: refused, nothing charged.
    let changed = client
        .send_json("PUT", &url, &[], &ORDER.replace("1500", "1600"))
        .await;
    assert_eq!(
        changed.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{changed:?}"
    );
    assert_eq!(gateway.calls().len(), 1);
    // Read back, and in the list.
    let read = client.get(&url).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.json()["client_order_id"], id.as_str());
    assert_eq!(read.json()["amount"], 1500);
    let orders = client.orders(&server.url("")).await;
    assert_eq!(orders.len(), 1);
    assert_eq!(orders[0]["client_order_id"], id.as_str());
    // Another principal: the id reveals nothing of the first one's order.
    let stranger = Client::new();
    assert_eq!(stranger.get(&url).await.status, StatusCode::NOT_FOUND);
    let own = stranger
        .send_json("PUT", &url, &[], &ORDER.replace("1500", "7"))
        .await;
    assert_eq!(own.status, StatusCode::CREATED, "{own:?}");
    assert_eq!(
        own.json()["amount"],
        7,
        "its own order, not the first one's"
    );
    assert_eq!(gateway.calls().len(), 2);
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
    // A bad id or a bad body is refused before any charge.
    let bad = client
        .send_json("PUT", &server.url("/api/v1/orders/no.dots"), &[], ORDER)
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{bad:?}");
    assert_eq!(bad.problem_type(), format!("{PROBLEMS}invalid-order"));
    let bad_body = client
        .send_json(
            "PUT",
            &server.url(&format!("/api/v1/orders/{}", order_id())),
            &[],
            "{}",
        )
        .await;
    assert_eq!(bad_body.status, StatusCode::BAD_REQUEST);
    // The standard header naming another key is ambiguous.
    let ambiguous = client
        .send_json("PUT", &url, &[("idempotency-key", "something-else")], ORDER)
        .await;
    assert_eq!(ambiguous.problem_type(), format!("{PROBLEMS}ambiguous-key"));
    assert_eq!(gateway.calls().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_the_records_ttl_the_order_table_still_knows_the_id() {
    let (db, _dir) = sqlite_url();
    order_table_after_ttl(Options::new(&db)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_the_records_ttl_the_order_table_still_knows_the_id_on_postgres() {
    order_table_after_ttl(Options::new(&postgres_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_the_records_ttl_the_order_table_still_knows_the_id_with_redis_records() {
    let (db, _dir) = sqlite_url();
    order_table_after_ttl(Options::new(&db).store(&redis_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_the_records_ttl_the_order_table_still_knows_the_id_with_memory_records() {
    let (db, _dir) = sqlite_url();
    order_table_after_ttl(Options::new(&db).store("memory")).await;
}

/// A PUT's record expires; its order does not: the id still answers.
async fn order_table_after_ttl(options: Options) {
    let gateway = MockGateway::start().await;
    let mut options = options.gateway(gateway.url());
    options.ttl_seconds = 2;
    options.lease_seconds = 1;
    let server = Server::start(options).await;
    let client = Client::new();
    let url = server.url(&format!("/api/v1/orders/{}", order_id()));
    let first = client.send_json("PUT", &url, &[], ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    // The record expired; the order did not. Another order under the id: 409
    // naming what differs, nothing charged, and the claim undone.
    let other = ORDER.replace("1500", "1600").replace("RUB", "USD");
    let conflict = client.send_json("PUT", &url, &[], &other).await;
    assert_eq!(conflict.status, StatusCode::CONFLICT, "{conflict:?}");
    assert_eq!(conflict.problem_type(), format!("{PROBLEMS}order-exists"));
    let detail = conflict.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("currency") && detail.contains("amount"),
        "{detail}"
    );
    assert!(!detail.contains("items"), "{detail}");
    assert_eq!(
        conflict.json()["differing"],
        serde_json::json!(["/currency", "/amount"])
    );
    assert_eq!(gateway.calls().len(), 1);
    // The same order: 200 with the order as it is now.
    let late = client.send_json("PUT", &url, &[], ORDER).await;
    assert_eq!(late.status, StatusCode::OK, "{late:?}");
    assert!(!late.replayed());
    assert_eq!(late.json()["order_id"], first.json()["order_id"]);
    assert_eq!(late.json()["status"], "paid");
    assert_eq!(gateway.calls().len(), 1, "a late retry charged again");
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
}

/// 64 clients PUT one new id at once: one charge, one order.
async fn natural_key_race(options: Options, gateway: &MockGateway) {
    gateway.set_delay(Duration::from_millis(300));
    let server = Server::start(options).await;
    let client = Client::new();
    let url = server.url(&format!("/api/v1/orders/{}", order_id()));
    let barrier = Arc::new(Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (client, url, barrier) = (client.clone(), url.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                client.send_json("PUT", &url, &[], ORDER).await
            })
        })
        .collect();
    let mut created = Vec::new();
    for task in tasks {
        let answer = task.await.unwrap();
        match answer.status {
            StatusCode::CREATED => created.push(answer.body),
            StatusCode::CONFLICT => {
                assert_eq!(answer.problem_type(), format!("{PROBLEMS}in-progress"));
            }
            other => panic!("unexpected {other}: {answer:?}"),
        }
    }
    assert!(!created.is_empty());
    assert!(
        created.iter().all(|body| *body == created[0]),
        "one outcome"
    );
    assert_eq!(
        gateway.calls().len(),
        1,
        "{} charges for one natural key",
        gateway.calls().len()
    );
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_natural_key_raced_64_ways_is_one_order_on_sqlite() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    natural_key_race(Options::new(&db).gateway(gateway.url()), &gateway).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_natural_key_raced_64_ways_is_one_order_on_postgres() {
    let gateway = MockGateway::start().await;
    natural_key_race(
        Options::new(&postgres_url()).gateway(gateway.url()),
        &gateway,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_natural_key_raced_64_ways_is_one_order_on_redis() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let options = Options::new(&db).gateway(gateway.url()).store(&redis_url());
    natural_key_race(options, &gateway).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_natural_key_raced_64_ways_is_one_order_in_memory() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let options = Options::new(&db).gateway(gateway.url()).store("memory");
    natural_key_race(options, &gateway).await;
}

/// `If-None-Match: *` makes the natural-key `PUT` create-only (PROTOCOL §17):
/// its own retry is still the replayed 201 (the journal answers first), but
/// once the record is gone a create of an id that exists is 412 with the
/// order's `ETag`, nothing charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_only_put_replays_its_retry_and_refuses_an_existing_id() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let mut options = Options::new(&db).gateway(gateway.url());
    options.ttl_seconds = 2;
    options.lease_seconds = 1;
    let server = Server::start(options).await;
    let client = Client::new();
    let url = server.url(&format!("/api/v1/orders/{}", order_id()));
    let create_only = [("if-none-match", "*")];
    let first = client.send_json("PUT", &url, &create_only, ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let retry = client.send_json("PUT", &url, &create_only, ORDER).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let exists = client.send_json("PUT", &url, &create_only, ORDER).await;
    assert_eq!(exists.status, StatusCode::PRECONDITION_FAILED, "{exists:?}");
    let current = client.get(&url).await;
    assert_eq!(
        exists.headers.get("etag"),
        current.headers.get("etag"),
        "the 412 names the current ETag"
    );
    assert!(current.headers.get("etag").is_some());
    // Without the precondition the same order is 200, with the same ETag.
    let late = client.send_json("PUT", &url, &[], ORDER).await;
    assert_eq!(late.status, StatusCode::OK, "{late:?}");
    assert_eq!(late.headers.get("etag"), current.headers.get("etag"));
    assert_eq!(gateway.calls().len(), 1, "one charge");
}
