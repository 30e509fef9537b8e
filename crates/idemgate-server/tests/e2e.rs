//! End to end: the real `idemgate` binary as a process, over real HTTP, against
//! real SQLite, PostgreSQL and Redis, with a counting mock payment gateway. Every
//! scenario asserts orders (through the API) and gateway charges.

#![allow(dead_code, unreachable_pub)]

mod support;

/// The scenarios beyond the seed ones, a file each under `tests/e2e/`.
mod e2e {
    mod audit;
    mod conditional;
    mod connections;
    mod differing_fields;
    mod encodings;
    mod eviction;
    mod keys;
    mod manual;
    mod monitoring;
    mod natural_keys;
    mod otlp;
    mod payment_webhook;
    mod problem_types;
    mod proxy;
    mod proxy_conditional;
    mod proxy_guard;
    mod proxy_key_sources;
    mod proxy_keys;
    mod proxy_policies;
    mod reload;
    mod replay_cache;
    mod require_key;
    mod retry_after;
    mod round_trips;
    mod strategies;
    mod streams;
    mod strict_input;
    mod transfers;
    mod webhooks;
}

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use support::client::{Client, ORDER, new_key};
use support::gateway::{Fault, MockGateway};
use support::server::{Options, Server, postgres_url, redis_url, sqlite_url};
use tokio::sync::Barrier;

fn orders_url(server: &Server) -> String {
    server.url("/api/v1/orders")
}

/// The keys the gateway saw: all the same for one operation, never the client's.
fn assert_one_downstream_key(gateway: &MockGateway, client_key: &str) {
    let keys: Vec<_> = gateway
        .calls()
        .into_iter()
        .map(|c| c.idempotency_key.expect("keyed call"))
        .collect();
    assert!(!keys.is_empty());
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "one operation, one downstream key: {keys:?}"
    );
    assert_ne!(
        keys[0], client_key,
        "the raw client key must never be propagated"
    );
}

// --- The seed scenarios, on the embedded default (SQLite, transactional) ---------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_response_is_replayed_byte_for_byte() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).gateway(gateway.url())).await;
    let client = Client::new();
    let key = new_key();
    let first = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let order = first.json();
    assert_eq!(order["amount"], 1500);
    assert_eq!(order["currency"], "RUB");
    assert_eq!(order["status"], "paid");
    assert_eq!(
        first.headers["location"],
        format!("/api/v1/orders/{}", order["order_id"])
    );
    let retry = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body, "the replay must be byte-identical");
    assert_eq!(retry.headers["location"], first.headers["location"]);
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
    assert_eq!(gateway.calls().len(), 1);
    assert_eq!(gateway.distinct_charges(), 1);
    assert_one_downstream_key(&gateway, &key);
    let call = &gateway.calls()[0].body;
    assert_eq!(call["amount"], 1500);
    assert_eq!(call["currency"], "RUB");
    assert_eq!(
        call["order_ref"].as_str().map(str::len),
        Some(36),
        "order_ref is the operation id"
    );
}

async fn race(server: &[&Server], gateway: &MockGateway, concurrency: usize) {
    gateway.set_delay(Duration::from_millis(500));
    let client = Client::new();
    let key = new_key();
    let barrier = Arc::new(Barrier::new(concurrency));
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let (client, key, barrier) = (client.clone(), key.clone(), Arc::clone(&barrier));
            let url = orders_url(server[i % server.len()]);
            tokio::spawn(async move {
                barrier.wait().await;
                client.post(&url, Some(&key), ORDER).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let created: Vec<_> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .collect();
    assert!(!created.is_empty());
    for answer in &answers {
        assert!(
            answer.status == StatusCode::CREATED || answer.status == StatusCode::CONFLICT,
            "unexpected answer {answer:?}"
        );
    }
    assert!(
        created.iter().all(|a| a.body == created[0].body),
        "every 201 is the one outcome"
    );
    assert_eq!(
        client.orders(&server[0].url("")).await.len(),
        1,
        "{concurrency} racing requests made more than one order"
    );
    assert_eq!(gateway.distinct_charges(), 1);
    assert_eq!(
        gateway.calls().len(),
        1,
        "duplicates must not even reach the gateway"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_of_twenty_makes_one_order_and_one_charge() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).gateway(gateway.url())).await;
    race(&[&server], &gateway, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tampered_payload_is_422_and_charges_nothing_more() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).gateway(gateway.url())).await;
    let client = Client::new();
    let key = new_key();
    assert_eq!(
        client
            .post(&orders_url(&server), Some(&key), ORDER)
            .await
            .status,
        StatusCode::CREATED
    );
    let tampered = client
        .post(
            &orders_url(&server),
            Some(&key),
            &ORDER.replace("1500", "15"),
        )
        .await;
    assert_eq!(tampered.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(tampered.problem_type(), "/problems/key-reused");
    // The detail promises what the fingerprint covers, not method or path: those
    // are the scope, so another method or path is a new operation.
    let detail = tampered.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("on this endpoint") && detail.contains("body"),
        "{detail}"
    );
    assert!(!detail.contains("method"), "{detail}");
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
    assert_eq!(gateway.calls().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_are_scoped_by_principal() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).gateway(gateway.url())).await;
    let alice = Client::new();
    let bob = alice.with_token(&format!("bob-{}", new_key()));
    let key = new_key();
    let a = alice.post(&orders_url(&server), Some(&key), ORDER).await;
    let b = bob.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!b.replayed(), "bob must never get alice's response");
    assert_ne!(a.json()["order_id"], b.json()["order_id"]);
    assert_eq!(alice.orders(&server.url("")).await.len(), 1);
    assert_eq!(bob.orders(&server.url("")).await.len(), 1);
    let alices_order = server.url(&format!("/api/v1/orders/{}", a.json()["order_id"]));
    assert_eq!(alice.get(&alices_order).await.status, StatusCode::OK);
    assert_eq!(
        bob.get(&alices_order).await.status,
        StatusCode::NOT_FOUND,
        "another principal's order is 404"
    );
    assert_eq!(gateway.distinct_charges(), 2);
    let keys: Vec<_> = gateway
        .calls()
        .into_iter()
        .map(|c| c.idempotency_key.unwrap())
        .collect();
    assert_ne!(keys[0], keys[1], "downstream keys differ across principals");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_key_every_request_is_a_new_order() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).gateway(gateway.url())).await;
    let client = Client::new();
    for _ in 0..2 {
        assert_eq!(
            client.post(&orders_url(&server), None, ORDER).await.status,
            StatusCode::CREATED
        );
    }
    assert_eq!(client.orders(&server.url("")).await.len(), 2);
    assert_eq!(gateway.distinct_charges(), 2);
    assert!(
        gateway.calls().iter().all(|c| c.idempotency_key.is_none()),
        "no key, nothing to propagate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalid_keys_and_missing_tokens_are_refused_and_create_nothing() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).gateway(gateway.url())).await;
    let client = Client::new();
    let too_long = "k".repeat(256);
    for key in ["a,b", "\"a\";p=1", "\"open", too_long.as_str()] {
        let answer = client.post(&orders_url(&server), Some(key), ORDER).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "key {key:?}");
        assert_eq!(answer.problem_type(), "/problems/invalid-key");
    }
    let anonymous = reqwest::Client::new()
        .post(orders_url(&server))
        .header("idempotency-key", new_key())
        .header("content-type", "application/json")
        .body(ORDER)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        anonymous.headers()["content-type"],
        "application/problem+json"
    );
    assert!(client.orders(&server.url("")).await.is_empty());
    assert!(gateway.calls().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_body_then_the_corrected_body_with_the_same_key_makes_one_order() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).gateway(gateway.url())).await;
    let client = Client::new();
    let key = new_key();
    for bad in [
        "{not json",
        r#"{"items":[],"currency":"RUB","amount":1500}"#,
        r#"{"items":[{"id":42,"quantity":0}],"currency":"RUB","amount":1500}"#,
        r#"{"items":[{"id":42,"quantity":1}],"currency":"RUB","amount":0}"#,
        r#"{"items":[{"id":42,"quantity":1}],"currency":"RUBLE","amount":1500}"#,
    ] {
        let answer = client.post(&orders_url(&server), Some(&key), bad).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(answer.problem_type(), "/problems/invalid-order");
    }
    let good = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(
        good.status,
        StatusCode::CREATED,
        "the rejected bodies freed the key"
    );
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
    assert_eq!(
        gateway.calls().len(),
        1,
        "validation failures never reach the gateway"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateway_failure_then_a_retry_makes_one_order_and_one_charge() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).gateway(gateway.url())).await;
    let client = Client::new();
    let key = new_key();
    gateway.inject(Fault::FailAfterCharging(503));
    let failed = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(failed.status, StatusCode::BAD_GATEWAY);
    assert_eq!(failed.problem_type(), "/problems/gateway-failed");
    assert!(client.orders(&server.url("")).await.is_empty());
    let retry = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(
        retry.status,
        StatusCode::CREATED,
        "a released record runs again"
    );
    assert!(!retry.replayed());
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
    assert_eq!(gateway.calls().len(), 2);
    assert_eq!(
        gateway.distinct_charges(),
        1,
        "the propagated key folds the retry into the first charge"
    );
    assert_one_downstream_key(&gateway, &key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateway_timeout_is_504_and_the_retry_completes_once() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let mut options = Options::new(&db).gateway(gateway.url());
    options.gateway_timeout_ms = 300;
    let server = Server::start(options).await;
    let client = Client::new();
    let key = new_key();
    gateway.set_delay(Duration::from_millis(1_000));
    let timed_out = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(timed_out.status, StatusCode::GATEWAY_TIMEOUT);
    gateway.set_delay(Duration::ZERO);
    let retry = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
    assert_eq!(gateway.distinct_charges(), 1);
    assert_one_downstream_key(&gateway, &key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_declined_payment_is_402_and_replayed() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).gateway(gateway.url())).await;
    let client = Client::new();
    let key = new_key();
    gateway.inject(Fault::Decline);
    let declined = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(declined.problem_type(), "/problems/payment-declined");
    let again = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(again.status, StatusCode::PAYMENT_REQUIRED);
    assert!(again.replayed(), "a decline is final");
    assert_eq!(again.body, declined.body);
    assert_eq!(gateway.calls().len(), 1);
    assert!(client.orders(&server.url("")).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_key_is_a_new_operation_with_a_new_charge() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let mut options = Options::new(&db).gateway(gateway.url());
    options.ttl_seconds = 2;
    options.lease_seconds = 1;
    let server = Server::start(options).await;
    let client = Client::new();
    let key = new_key();
    let first = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(
        client
            .post(&orders_url(&server), Some(&key), ORDER)
            .await
            .replayed()
    );
    tokio::time::sleep(Duration::from_millis(2_600)).await;
    let after = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(after.status, StatusCode::CREATED);
    assert!(!after.replayed(), "after the TTL the key is new");
    assert_ne!(after.json()["order_id"], first.json()["order_id"]);
    assert_eq!(client.orders(&server.url("")).await.len(), 2);
    assert_eq!(
        gateway.distinct_charges(),
        2,
        "a new operation gets a new downstream key"
    );
}

// --- Processes: restarts, crashes, disconnects, shutdown ------------------------------

async fn restart_replays_identically(database: &str, gateway: &MockGateway) {
    let server = Server::start(Options::new(database).gateway(gateway.url())).await;
    let client = Client::new();
    let key = new_key();
    let first = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED);
    server.stop().await;
    let server = Server::start(Options::new(database).gateway(gateway.url())).await;
    let replay = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert!(replay.replayed(), "the record survived the restart");
    assert_eq!(replay.body, first.body);
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
    assert_eq!(gateway.calls().len(), 1);
    server.stop().await;
}

/// Four servers started at once on one fresh SQLite file: all come up (they race
/// to switch it to WAL and to create the tables; the losers retry), and a key is
/// one order whichever of them answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn servers_starting_together_on_a_fresh_sqlite_file_all_come_up() {
    let gateway = MockGateway::start().await;
    for round in 0..3 {
        let (db, _dir) = sqlite_url();
        let servers = futures_util::future::join_all(
            (0..4).map(|_| Server::start(Options::new(&db).gateway(gateway.url()))),
        )
        .await;
        let client = Client::new();
        let key = new_key();
        let mut answers = Vec::new();
        for server in &servers {
            let answer = client.post(&orders_url(server), Some(&key), ORDER).await;
            assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
            answers.push(answer);
        }
        for later in &answers[1..] {
            assert!(later.replayed(), "{later:?}");
            assert_eq!(later.body, answers[0].body);
        }
        assert_eq!(client.orders(&servers[0].url("")).await.len(), 1);
        assert_eq!(gateway.calls().len(), round + 1, "one charge per round");
        for server in servers {
            server.stop().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_records_survive_a_restart() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    restart_replays_identically(&db, &gateway).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_records_survive_a_restart() {
    let gateway = MockGateway::start().await;
    restart_replays_identically(&postgres_url(), &gateway).await;
}

async fn crash_while_the_gateway_holds_the_charge(database: &str) {
    let gateway = MockGateway::start().await;
    gateway.set_delay(Duration::from_secs(3));
    let mut options = Options::new(database).gateway(gateway.url());
    options.lease_seconds = 1;
    let server = Server::start(options.clone()).await;
    let client = Client::with_timeout(Duration::from_secs(10));
    let key = new_key();
    let arrival = gateway.next_arrival();
    let request = {
        let (client, url, key) = (client.clone(), orders_url(&server), key.clone());
        tokio::spawn(async move { client.try_post(&url, Some(&key), ORDER).await })
    };
    arrival.await; // the gateway has charged and is holding its answer
    server.kill9().await;
    assert!(
        request.await.unwrap().is_err(),
        "the client lost its response"
    );
    gateway.set_delay(Duration::ZERO);
    let server = Server::start(options).await;
    // Until the dead holder's lease lapses, the operation is in progress.
    let early = client.post(&orders_url(&server), Some(&key), ORDER).await;
    if early.status == StatusCode::CONFLICT {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    }
    let retry = if early.status == StatusCode::CONFLICT {
        client.post(&orders_url(&server), Some(&key), ORDER).await
    } else {
        early
    };
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert_eq!(
        client.orders(&server.url("")).await.len(),
        1,
        "exactly one order after the crash"
    );
    assert_eq!(
        gateway.calls().len(),
        2,
        "the takeover ran the operation again"
    );
    assert_eq!(
        gateway.distinct_charges(),
        1,
        "and the gateway folded it into the first charge"
    );
    assert_one_downstream_key(&gateway, &key);
    let replay = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(replay.body, retry.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_charge_then_retry_makes_one_order_sqlite() {
    let (db, _dir) = sqlite_url();
    crash_while_the_gateway_holds_the_charge(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_charge_then_retry_makes_one_order_postgres() {
    crash_while_the_gateway_holds_the_charge(&postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_disconnects_mid_request_gets_the_order_on_retry() {
    let gateway = MockGateway::start().await;
    gateway.set_delay(Duration::from_millis(800));
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).gateway(gateway.url())).await;
    let impatient = Client::with_timeout(Duration::from_millis(200));
    let key = new_key();
    assert!(
        impatient
            .try_post(&orders_url(&server), Some(&key), ORDER)
            .await
            .is_err(),
        "the client gave up"
    );
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let retry = impatient
        .with_token(&impatient.token)
        .post(&orders_url(&server), Some(&key), ORDER)
        .await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(
        retry.replayed(),
        "the handler finished without its client and stored the outcome"
    );
    assert_eq!(
        Client::new()
            .with_token(&impatient.token)
            .orders(&server.url(""))
            .await
            .len(),
        1
    );
    assert_eq!(gateway.calls().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_shutdown_lets_a_detached_handler_store_its_result() {
    let gateway = MockGateway::start().await;
    gateway.set_delay(Duration::from_millis(1_000));
    let (db, _dir) = sqlite_url();
    let options = Options::new(&db).gateway(gateway.url());
    let server = Server::start(options.clone()).await;
    let impatient = Client::with_timeout(Duration::from_millis(300));
    let key = new_key();
    let arrival = gateway.next_arrival();
    let request = {
        let (client, url, key) = (impatient.clone(), orders_url(&server), key.clone());
        tokio::spawn(async move { client.try_post(&url, Some(&key), ORDER).await })
    };
    arrival.await;
    assert!(
        request.await.unwrap().is_err(),
        "the client left mid-request"
    );
    server.terminate();
    let exit = server.wait_exit().await;
    assert!(exit.success(), "{exit}");
    gateway.set_delay(Duration::ZERO);
    let server = Server::start(options).await;
    let client = Client::new().with_token(&impatient.token);
    let retry = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(
        retry.replayed(),
        "shutdown waited for the handler, which stored its response"
    );
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
    assert_eq!(gateway.calls().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_on_one_postgres_race_to_one_order() {
    let gateway = MockGateway::start().await;
    let options = Options::new(&postgres_url()).gateway(gateway.url());
    let (a, b) = tokio::join!(Server::start(options.clone()), Server::start(options));
    race(&[&a, &b], &gateway, 20).await;
}

// --- Other idempotency stores -------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_memory_store_mode_replays_and_races_to_one_order() {
    store_mode_fresh("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_redis_store_mode_replays_and_races_to_one_order() {
    store_mode_fresh(&redis_url()).await;
}

async fn store_mode_fresh(store: &str) {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).gateway(gateway.url()).store(store)).await;
    let client = Client::new();
    let key = new_key();
    let first = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let replay = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    let tampered = client
        .post(
            &orders_url(&server),
            Some(&key),
            &ORDER.replace("RUB", "USD"),
        )
        .await;
    assert_eq!(tampered.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
    assert_eq!(gateway.calls().len(), 1);

    let racing_gateway = MockGateway::start().await;
    let racing = Server::start(Options::new(&db).gateway(racing_gateway.url()).store(store)).await;
    race(&[&racing], &racing_gateway, 20).await;
}

// --- The service's edges ---------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_and_metrics_answer() {
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db)).await;
    let client = Client::new();
    assert_eq!(
        client
            .post(&orders_url(&server), Some(&new_key()), ORDER)
            .await
            .status,
        StatusCode::CREATED
    );
    let health = reqwest::get(server.url("/healthz")).await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let metrics = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("idemgate_requests_total{outcome=\"executed\"} 1\n"),
        "{metrics}"
    );
    // Histograms (aggregatable across instances), not per-process summaries.
    assert!(
        metrics.contains("# TYPE idemgate_store_seconds histogram")
            && metrics.contains("idemgate_store_seconds_bucket{op=\"claim\",le=\"0.001\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("# TYPE idemgate_request_duration_seconds histogram")
            && metrics
                .contains("idemgate_request_duration_seconds_count{outcome=\"executed\"} 1\n"),
        "{metrics}"
    );
    // Registered at zero before any event, so `rate()` sees the first one.
    assert!(
        metrics.contains("idemgate_fenced_completions_total 0\n")
            && metrics.contains("idemgate_store_errors_total{op=\"claim\"} 0\n"),
        "{metrics}"
    );
    assert!(metrics.contains("idemgate_lease_seconds 30\n"), "{metrics}");
    assert!(
        metrics.contains("idemgate_oldest_in_flight_seconds"),
        "{metrics}"
    );
}

#[test]
fn serve_help_names_every_flag_and_variable() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for needle in [
        "--listen",
        "IDEMGATE_LISTEN",
        "--database",
        "DATABASE_URL",
        "--idempotency-store",
        "--gateway-url",
        "PAYMENT_GATEWAY_URL",
        "--ttl",
        "IDEMPOTENCY_TTL_SECONDS",
        "--lease",
        "IDEMPOTENCY_LEASE_SECONDS",
        "--log-format",
        "PORT",
        "--gateway-timeout-ms",
        "--shutdown-timeout",
        "--simulated-gateway-delay-ms",
        "--header-read-timeout-ms",
        "IDEMGATE_HEADER_READ_TIMEOUT_MS",
        "--body-read-timeout-ms",
        "IDEMGATE_BODY_READ_TIMEOUT_MS",
        "--idle-timeout-ms",
        "IDEMGATE_IDLE_TIMEOUT_MS",
        "--max-connections",
        "IDEMGATE_MAX_CONNECTIONS",
        "--otlp",
        "IDEMGATE_OTLP",
        "--require-key",
        "IDEMGATE_REQUIRE_KEY",
    ] {
        assert!(
            help.contains(needle),
            "`serve --help` does not mention {needle}:\n{help}"
        );
    }
}

#[test]
fn a_bad_setting_names_its_flag_and_variable() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["serve", "--database", "mysql://localhost/x"])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("--database") && stderr.contains("DATABASE_URL"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_of_a_running_request_is_409_then_replayed() {
    // The README's session: the default run, with a slow simulated gateway.
    let (db, _dir) = sqlite_url();
    let mut options = Options::new(&db);
    options.simulated_delay_ms = 1_500;
    let server = Server::start(options).await;
    let client = Client::new();
    let key = new_key();
    let first = {
        let (client, url, key) = (client.clone(), orders_url(&server), key.clone());
        tokio::spawn(async move { client.post(&url, Some(&key), ORDER).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let duplicate = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert_eq!(duplicate.problem_type(), "/problems/in-progress");
    let retry_after: u64 = duplicate.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let replay = client.post(&orders_url(&server), Some(&key), ORDER).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(client.orders(&server.url("")).await.len(), 1);
}
