//! Conditional requests on the orders service (PROTOCOL §17): strong ETags,
//! `If-None-Match` → 304, `PATCH`/`DELETE` with `If-Match` (412 stale, 428
//! absent), two editors racing on one ETag, and a retried edit whose response was
//! lost replayed rather than refused — on SQLite (the layer's transaction) and
//! PostgreSQL.

use std::sync::Arc;

use idemgate_testkit::relay::{Fault, Relay};
use reqwest::{Method, StatusCode};
use tokio::sync::Barrier;

use crate::support::client::{Answer, Client, ORDER, new_key};
use crate::support::server::{Options, Server, postgres_url, redis_url, run_to_exit, sqlite_url};

const MERGE_PATCH: (&str, &str) = ("content-type", "application/merge-patch+json");

fn etag(answer: &Answer) -> String {
    answer
        .headers
        .get("etag")
        .unwrap_or_else(|| panic!("no ETag: {answer:?}"))
        .to_str()
        .unwrap()
        .to_owned()
}

async fn place_order(server: &Server, client: &Client) -> (String, Answer) {
    let created = client
        .post(&server.url("/api/v1/orders"), Some(&new_key()), ORDER)
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let url = server.url(&format!("/api/v1/orders/{}", created.json()["order_id"]));
    (url, created)
}

async fn patch(
    client: &Client,
    url: &str,
    key: Option<&str>,
    if_match: Option<&str>,
    body: &str,
) -> Answer {
    let mut headers = vec![MERGE_PATCH];
    if let Some(tag) = if_match {
        headers.push(("if-match", tag));
    }
    client
        .send(Method::PATCH, url, key, &headers, Some(body))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_representation_carries_a_strong_etag_and_if_none_match_answers_304() {
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db)).await;
    let client = Client::new();
    let (url, created) = place_order(&server, &client).await;
    let tag = etag(&created);
    assert!(tag.starts_with('"'), "a strong tag: {tag}");
    let read = client.get(&url).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(
        etag(&read),
        tag,
        "the 201 and the GET send one representation"
    );
    assert_eq!(read.body, created.body);
    for current in [
        tag.clone(),
        format!("W/{tag}"),
        format!("\"x\", {tag}"),
        "*".to_owned(),
    ] {
        let cached = client
            .send(
                Method::GET,
                &url,
                None,
                &[("if-none-match", &current)],
                None,
            )
            .await;
        assert_eq!(cached.status, StatusCode::NOT_MODIFIED, "{current}");
        assert_eq!(etag(&cached), tag);
        assert!(cached.body.is_empty());
    }
    let stale = client
        .send(
            Method::GET,
            &url,
            None,
            &[("if-none-match", "\"other\"")],
            None,
        )
        .await;
    assert_eq!(stale.status, StatusCode::OK);
    let malformed = client
        .send(
            Method::GET,
            &url,
            None,
            &[("if-none-match", "unquoted")],
            None,
        )
        .await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    assert!(
        malformed.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("/invalid-precondition")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn patch_requires_if_match_refuses_stale_and_changes_only_mutable_fields() {
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db)).await;
    let client = Client::new();
    let (url, created) = place_order(&server, &client).await;
    let tag = etag(&created);
    let key = new_key();
    let body =
        r#"{"note":"leave at the door","shipping_address":{"city":"Kazan","line1":"Baumana 2"}}"#;

    let missing = patch(&client, &url, Some(&key), None, body).await;
    assert_eq!(
        missing.status,
        StatusCode::PRECONDITION_REQUIRED,
        "{missing:?}"
    );
    assert!(
        missing.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("/precondition-required")
    );
    let stale = patch(&client, &url, Some(&new_key()), Some("\"stale\""), body).await;
    assert_eq!(stale.status, StatusCode::PRECONDITION_FAILED, "{stale:?}");
    assert_eq!(etag(&stale), tag, "the 412 names the current ETag");
    assert_eq!(stale.json()["etag"], tag);
    assert!(
        stale.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("/precondition-failed")
    );
    let immutable = patch(
        &client,
        &url,
        Some(&new_key()),
        Some(&tag),
        r#"{"amount":1}"#,
    )
    .await;
    assert_eq!(immutable.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(immutable.json()["field"], "amount");
    let wrong_type = client
        .send(
            Method::PATCH,
            &url,
            None,
            &[("if-match", &tag), ("content-type", "text/plain")],
            Some(body),
        )
        .await;
    assert_eq!(wrong_type.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    // The 428 freed the key: the same key with If-Match now applies the patch.
    let applied = patch(&client, &url, Some(&key), Some(&tag), body).await;
    assert_eq!(applied.status, StatusCode::OK, "{applied:?}");
    let order = applied.json();
    assert_eq!(order["note"], "leave at the door");
    assert_eq!(order["shipping_address"]["city"], "Kazan");
    assert_eq!(order["version"], 2);
    assert_eq!(order["amount"], 1500, "immutable fields are untouched");
    let new_tag = etag(&applied);
    assert_ne!(new_tag, tag);
    let read = client.get(&url).await;
    assert_eq!(etag(&read), new_tag);
    assert_eq!(read.body, applied.body);

    // A merge patch merges the address and removes with null.
    let merged = patch(
        &client,
        &url,
        None,
        Some(&new_tag),
        r#"{"shipping_address":{"city":null,"zip":"420111"}}"#,
    )
    .await;
    assert_eq!(merged.status, StatusCode::OK, "{merged:?}");
    assert_eq!(
        merged.json()["shipping_address"],
        serde_json::json!({"line1": "Baumana 2", "zip": "420111"})
    );
    assert_eq!(merged.json()["note"], "leave at the door");

    // Cancellation: If-Match required, then stale refused, then cancelled.
    let delete = |tag: Option<String>| {
        let client = client.clone();
        let url = url.clone();
        async move {
            let headers: Vec<(&str, &str)> =
                tag.iter().map(|tag| ("if-match", tag.as_str())).collect();
            client
                .send(Method::DELETE, &url, Some(&new_key()), &headers, None)
                .await
        }
    };
    assert_eq!(delete(None).await.status, StatusCode::PRECONDITION_REQUIRED);
    assert_eq!(
        delete(Some(new_tag.clone())).await.status,
        StatusCode::PRECONDITION_FAILED
    );
    let cancelled = delete(Some(etag(&merged))).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{cancelled:?}");
    assert_eq!(cancelled.json()["status"], "cancelled");
    let after = patch(
        &client,
        &url,
        None,
        Some(&etag(&cancelled)),
        r#"{"note":"x"}"#,
    )
    .await;
    assert_eq!(after.status, StatusCode::CONFLICT, "{after:?}");
    assert_eq!(client.get(&url).await.json()["status"], "cancelled");
}

/// Two (here: 16) editors holding one ETag: exactly one edit applies, every other
/// gets 412 with the winner's ETag, and the order holds the winner's note.
async fn editors_race(server: &Server) {
    let client = Client::new();
    let (url, created) = place_order(server, &client).await;
    let tag = etag(&created);
    let editors = 16;
    let barrier = Arc::new(Barrier::new(editors));
    let tasks: Vec<_> = (0..editors)
        .map(|editor| {
            let (client, url, tag, barrier) =
                (client.clone(), url.clone(), tag.clone(), barrier.clone());
            tokio::spawn(async move {
                let body = format!(r#"{{"note":"editor {editor}"}}"#);
                barrier.wait().await;
                (
                    editor,
                    patch(&client, &url, Some(&new_key()), Some(&tag), &body).await,
                )
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let winners: Vec<_> = answers
        .iter()
        .filter(|(_, a)| a.status == StatusCode::OK)
        .collect();
    assert_eq!(winners.len(), 1, "exactly one editor wins: {answers:?}");
    let (winner, won) = winners[0];
    let won_tag = etag(won);
    for (_, answer) in answers.iter().filter(|(_, a)| a.status != StatusCode::OK) {
        assert_eq!(answer.status, StatusCode::PRECONDITION_FAILED, "{answer:?}");
        assert_eq!(etag(answer), won_tag, "a loser is told the winner's ETag");
    }
    let read = client.get(&url).await;
    assert_eq!(read.json()["note"], format!("editor {winner}"));
    assert_eq!(read.json()["version"], 2, "one edit, one version step");
    assert_eq!(etag(&read), won_tag);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_editors_with_one_etag_one_wins_on_sqlite() {
    let (db, _dir) = sqlite_url();
    editors_race(&Server::start(Options::new(&db)).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_editors_with_one_etag_one_wins_on_postgres() {
    editors_race(&Server::start(Options::new(&postgres_url())).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_editors_with_one_etag_one_wins_with_the_memory_store() {
    let (db, _dir) = sqlite_url();
    editors_race(&Server::start(Options::new(&db).store("memory")).await).await;
}

/// The edit ran and its 200 was lost: the retry with the same key and the now
/// stale If-Match replays the 200 (the journal comes first), the order changed
/// once; a new key with that stale tag is a 412.
async fn lost_edit_is_replayed_not_refused(server: &Server) {
    let client = Client::new();
    let (url, created) = place_order(server, &client).await;
    let tag = etag(&created);
    let relay = Relay::start(server.addr).await;
    let relayed = url.replace(&server.addr.to_string(), &relay.addr().to_string());
    relay.inject_request(Fault::LoseResponse, Some("PATCH"));
    let key = new_key();
    let body = r#"{"note":"first edit"}"#;
    let lost = client
        .try_send(
            Method::PATCH,
            &relayed,
            Some(&key),
            &[MERGE_PATCH, ("if-match", &tag)],
            Some(body),
        )
        .await;
    assert!(lost.is_err(), "the response was lost: {lost:?}");
    let retry = patch(&client, &relayed, Some(&key), Some(&tag), body).await;
    assert_eq!(
        retry.status,
        StatusCode::OK,
        "a replay, not a 412: {retry:?}"
    );
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.json()["note"], "first edit");
    assert_eq!(retry.json()["version"], 2);
    let read = client.get(&url).await;
    assert_eq!(read.json()["version"], 2, "the edit ran once");
    assert_eq!(read.body, retry.body);
    assert_eq!(etag(&read), etag(&retry));
    let fresh = patch(&client, &url, Some(&new_key()), Some(&tag), body).await;
    assert_eq!(fresh.status, StatusCode::PRECONDITION_FAILED, "{fresh:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_edit_response_is_replayed_not_refused_on_sqlite() {
    let (db, _dir) = sqlite_url();
    lost_edit_is_replayed_not_refused(&Server::start(Options::new(&db)).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_edit_response_is_replayed_not_refused_on_postgres() {
    lost_edit_is_replayed_not_refused(&Server::start(Options::new(&postgres_url())).await).await;
}

/// Issue 32, finding 5, in one process: an edit writes, then its answer is
/// lost after the write (the test-only `IDEMGATE_TEST_FAULT_AFTER_EDIT=fail`
/// answers a retryable 503 once the edit has committed, as a lost commit
/// acknowledgement would), so the layer releases the record and the retry runs
/// the operation again with its now stale `If-Match`. It answers the edit's
/// original 200 — the order as that edit left it, its `ETag` — not a 412; the
/// order changed once. The same for a cancellation. With the memory store (whose
/// records a `kill -9` forgets: this is its way to the question), Redis, and
/// both orders databases.
async fn released_edit_answers_its_first_run(options: Options) {
    let server = Server::start(options.env("IDEMGATE_TEST_FAULT_AFTER_EDIT", "fail")).await;
    let client = Client::new();
    let (url, created) = place_order(&server, &client).await;
    let tag = etag(&created);
    let key = new_key();
    let body = r#"{"note":"once","shipping_address":{"city":"Kazan"}}"#;
    let failed = patch(&client, &url, Some(&key), Some(&tag), body).await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE, "{failed:?}");
    let edited = client.get(&url).await;
    assert_eq!(
        edited.json()["version"],
        2,
        "the edit committed before the 503"
    );
    let retry = patch(&client, &url, Some(&key), Some(&tag), body).await;
    assert_eq!(
        retry.status,
        StatusCode::OK,
        "the first run's 200, not a 412: {retry:?}"
    );
    assert_eq!(retry.body, edited.body, "the order as the edit left it");
    assert_eq!(etag(&retry), etag(&edited));
    assert_eq!(retry.json()["note"], "once");
    // Completed now: a third try replays it.
    let replay = patch(&client, &url, Some(&key), Some(&tag), body).await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, edited.body);
    // A new edit on top, then a cancellation that fails after its write: the
    // retry answers the cancelled order once more, though the order has moved on
    // since neither; each changed the order once.
    let second = patch(
        &client,
        &url,
        Some(&new_key()),
        Some(&etag(&edited)),
        r#"{"note":"twice"}"#,
    )
    .await;
    assert_eq!(second.status, StatusCode::SERVICE_UNAVAILABLE, "{second:?}");
    let now = client.get(&url).await;
    assert_eq!(now.json()["version"], 3);
    let cancel_key = new_key();
    let cancel = |tag: String| {
        let (client, url, key) = (client.clone(), url.clone(), cancel_key.clone());
        async move {
            client
                .send(
                    Method::DELETE,
                    &url,
                    Some(&key),
                    &[("if-match", tag.as_str())],
                    None,
                )
                .await
        }
    };
    let failed = cancel(etag(&now)).await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE, "{failed:?}");
    let cancelled = client.get(&url).await;
    assert_eq!(cancelled.json()["status"], "cancelled");
    assert_eq!(cancelled.json()["version"], 4);
    let retry = cancel(etag(&now)).await;
    assert_eq!(retry.status, StatusCode::OK, "{retry:?}");
    assert_eq!(retry.body, cancelled.body);
    assert_eq!(etag(&retry), etag(&cancelled));
    assert_eq!(
        client.get(&url).await.json()["version"],
        4,
        "each write ran once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn released_edit_answers_its_first_run_with_memory_records_and_sqlite_orders() {
    let (db, _dir) = sqlite_url();
    released_edit_answers_its_first_run(Options::new(&db).store("memory")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn released_edit_answers_its_first_run_with_memory_records_and_postgres_orders() {
    released_edit_answers_its_first_run(Options::new(&postgres_url()).store("memory")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn released_edit_answers_its_first_run_with_redis_records_and_postgres_orders() {
    released_edit_answers_its_first_run(Options::new(&postgres_url()).store(&redis_url())).await;
}

/// A run of the earlier outcome test by the kill -9 harness lives in
/// `tests/faults/edits.rs`; here, the test-only variable itself: an unknown
/// value stops `serve` at startup (exit 2), naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_test_fault_stops_serve_at_startup() {
    let (db, _dir) = sqlite_url();
    let output = run_to_exit(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
            .args(["serve", "--listen", "127.0.0.1:0", "--database", &db])
            .env("IDEMGATE_TEST_FAULT_AFTER_EDIT", "sometimes"),
    )
    .await;
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("IDEMGATE_TEST_FAULT_AFTER_EDIT"),
        "{stderr}"
    );
}
