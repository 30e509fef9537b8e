//! The journal (issue 38) through the real binary on SQLite, PostgreSQL and
//! Redis: new keys, a replay, a 422, a 409, a handler whose transaction rolls
//! back, a takeover after `kill -9` and an eviction leave exactly their events,
//! in order; they are still exported after the records' TTL; `audit verify`
//! passes, and exits 1 naming the entry once one is edited or deleted.
//!
//! Each run has a journal of its own (a fresh SQLite file, a fresh PostgreSQL
//! database, a Redis database only this test uses, its journal keys removed
//! before and after), so tampering with it breaks no other test.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use sqlx::Connection;

use crate::support::client::{Client, ORDER, new_key};
use crate::support::databases::OwnDatabase;
use crate::support::gateway::{Fault, MockGateway};
use crate::support::proxy::{Proxy, ProxyOptions, Upstream};
use crate::support::server::{Options, Server, TempDir, postgres_url, redis_url, sqlite_url};

/// What one `idemgate audit|keys …` run printed and returned.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn idemgate(args: &[&str]) -> Run {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(args)
        .output()
        .await
        .expect("run idemgate");
    Run {
        code: output.status.code().expect("exited"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `audit export --store STORE [--key KEY]`, parsed.
async fn export(store: &str, key: Option<&str>) -> Vec<Value> {
    let mut args = vec!["audit", "export", "--store", store];
    if let Some(key) = key {
        args.extend(["--key", key]);
    }
    let run = idemgate(&args).await;
    assert_eq!(run.code, 0, "{run:?}");
    run.stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}")))
        .collect()
}

fn events(entries: &[Value]) -> Vec<(String, Option<u64>)> {
    entries
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap().to_owned(),
                e["status"].as_u64(),
            )
        })
        .collect()
}

fn ev(event: &str, status: Option<u64>) -> (String, Option<u64>) {
    (event.to_owned(), status)
}

/// Where the test tampers with the journal.
enum Journal {
    Sql(String),
    Redis { url: String },
}

impl Journal {
    /// Changes the status of the entry `seq` (SQL), or deletes it (Redis: a
    /// stream entry cannot be edited in place).
    async fn edit(&self, entry: &Value) {
        let seq = entry["seq"].as_i64().unwrap();
        match self {
            Self::Sql(url) => {
                sql(
                    url,
                    &format!("UPDATE idemgate_records_audit SET status = 299 WHERE seq = {seq}"),
                )
                .await;
            }
            Self::Redis { .. } => self.delete(entry).await,
        }
    }

    async fn restore(&self, entry: &Value) {
        if let Self::Sql(url) = self {
            let seq = entry["seq"].as_i64().unwrap();
            let status = entry["status"].as_i64().unwrap();
            sql(
                url,
                &format!("UPDATE idemgate_records_audit SET status = {status} WHERE seq = {seq}"),
            )
            .await;
        }
    }

    async fn delete(&self, entry: &Value) {
        let seq = entry["seq"].as_i64().unwrap();
        match self {
            Self::Sql(url) => {
                sql(
                    url,
                    &format!("DELETE FROM idemgate_records_audit WHERE seq = {seq}"),
                )
                .await;
            }
            Self::Redis { url } => {
                let stream = format!(
                    "idemgate:{{idemgate:audit}}:stream:{}",
                    entry["instance"].as_str().unwrap()
                );
                let id = format!("0-{seq}");
                let deleted = resp(url, &["XDEL", &stream, &id]).await;
                assert_eq!(deleted, ":1", "XDEL {stream} {id}");
            }
        }
    }
}

async fn sql(url: &str, statement: &str) {
    if url.starts_with("sqlite") {
        let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_owned()))
            .execute(&mut c)
            .await
            .unwrap();
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_owned()))
            .execute(&mut c)
            .await
            .unwrap();
    }
}

/// One Redis command over RESP on a fresh connection to `url`'s host and
/// database; its reply's first line.
async fn resp(url: &str, command: &[&str]) -> String {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let rest = url.strip_prefix("redis://").expect("a redis:// URL");
    let (host, db) = rest.split_once('/').unwrap_or((rest, "0"));
    let mut stream = tokio::net::TcpStream::connect(host).await.expect("Redis");
    let mut wire = String::new();
    for cmd in [vec!["SELECT", db], command.to_vec()] {
        wire.push_str(&format!("*{}\r\n", cmd.len()));
        for arg in cmd {
            wire.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
    }
    stream.write_all(wire.as_bytes()).await.unwrap();
    let mut lines = BufReader::new(stream).lines();
    let selected = lines.next_line().await.unwrap().unwrap();
    assert_eq!(selected, "+OK");
    lines.next_line().await.unwrap().unwrap()
}

/// Removes the journal's keys from the test's Redis database.
async fn clear_redis_journal(url: &str) {
    let script =
        "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end return 1";
    let cleared = resp(url, &["EVAL", script, "0", "idemgate:{idemgate:audit}*"]).await;
    assert_eq!(cleared, ":1");
}

/// Waits until `key`'s journal holds `n` entries.
async fn wait_for_entries(store: &str, key: &str, n: usize) {
    for _ in 0..100 {
        if export(store, Some(key)).await.len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the journal of {key} never reached {n} entries");
}

async fn scenario(options: Options, store: &str, journal: Journal) {
    let gateway = MockGateway::start().await;
    // A journal partition of the scenario's own (the instance name): the
    // servers of tests running beside it on this host do not queue its
    // writer behind their appends.
    let instance = format!("audit-{}", uuid::Uuid::new_v4().simple());
    let mut options = options.gateway(gateway.url()).env("HOSTNAME", instance);
    options.ttl_seconds = 3;
    options.lease_seconds = 1;
    let server = Server::start(options.clone()).await;
    let client = Client::new();
    let url = server.url("/api/v1/orders");

    // k1: a new key, its replay, another body (422).
    let k1 = new_key();
    assert_eq!(
        client.post(&url, Some(&k1), ORDER).await.status,
        StatusCode::CREATED
    );
    let replay = client.post(&url, Some(&k1), ORDER).await;
    assert!(replay.replayed(), "{replay:?}");
    let other = client
        .post(
            &url,
            Some(&k1),
            r#"{"items":[{"id":42,"quantity":9}],"currency":"RUB","amount":1}"#,
        )
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{other:?}");

    // An operator evicts k1.
    let evicted = idemgate(&[
        "keys",
        "evict",
        "--store",
        store,
        "--bearer",
        &client.token,
        "--method",
        "POST",
        "--path",
        "/api/v1/orders",
        "--key",
        &k1,
    ])
    .await;
    assert_eq!(evicted.code, 0, "{evicted:?}");

    // k2: a duplicate while the first runs (409).
    let k2 = new_key();
    gateway.set_delay(Duration::from_millis(1_500));
    let arrival = gateway.next_arrival();
    let running = {
        let (client, url, k2) = (client.clone(), url.clone(), k2.clone());
        tokio::spawn(async move { client.post(&url, Some(&k2), ORDER).await })
    };
    arrival.await;
    assert_eq!(
        client.post(&url, Some(&k2), ORDER).await.status,
        StatusCode::CONFLICT
    );
    assert_eq!(running.await.unwrap().status, StatusCode::CREATED);
    gateway.set_delay(Duration::ZERO);

    // k4: the gateway fails; the handler's writes roll back; nothing executed.
    let k4 = new_key();
    gateway.inject(Fault::FailWithoutCharging(503));
    let failed = client.post(&url, Some(&k4), ORDER).await;
    assert!(failed.status.is_server_error(), "{failed:?}");

    // k3: its holder is killed mid-run; another instance takes it over.
    let k3 = new_key();
    gateway.set_delay(Duration::from_secs(30));
    let arrival = gateway.next_arrival();
    let doomed = {
        let (client, url, k3) = (client.clone(), url.clone(), k3.clone());
        tokio::spawn(async move { client.try_post(&url, Some(&k3), ORDER).await })
    };
    arrival.await;
    wait_for_entries(store, &k3, 1).await;
    server.kill9().await;
    let _ = doomed.await;
    gateway.set_delay(Duration::ZERO);
    let successor = Server::start(options.clone()).await;
    // Past the 1 s lease the killed holder last renewed.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let taken = client
        .post(&successor.url("/api/v1/orders"), Some(&k3), ORDER)
        .await;
    assert_eq!(taken.status, StatusCode::CREATED, "{taken:?}");

    successor.stop().await;

    // Past the records' TTL: the records are gone, their history is not.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let shown = idemgate(&[
        "keys",
        "show",
        "--store",
        store,
        "--bearer",
        &client.token,
        "--method",
        "POST",
        "--path",
        "/api/v1/orders",
        "--key",
        &k2,
    ])
    .await;
    assert_eq!(shown.code, 3, "k2's record expired: {shown:?}");
    let one = export(store, Some(&k1)).await;
    assert_eq!(
        events(&one),
        [
            ev("claimed", None),
            ev("executed", Some(201)),
            ev("replayed", Some(201)),
            ev("mismatch", Some(422)),
            ev("evicted", None),
        ]
    );
    assert_eq!(
        events(&export(store, Some(&k2)).await),
        [
            ev("claimed", None),
            ev("conflict", Some(409)),
            ev("executed", Some(201))
        ]
    );
    let three = export(store, Some(&k3)).await;
    assert_eq!(
        events(&three),
        [
            ev("claimed", None),
            ev("taken_over", None),
            ev("executed", Some(201))
        ]
    );
    assert_eq!(
        three[0]["operation_id"], three[2]["operation_id"],
        "one operation"
    );
    let four = export(store, Some(&k4)).await;
    assert_eq!(
        events(&four),
        [ev("claimed", None), ev("released", None)],
        "no executed entry for a rolled-back handler"
    );
    for entry in one.iter().chain(&three) {
        assert_eq!(entry["method"], "POST");
        assert!(!entry["principal"].as_str().unwrap().is_empty());
        assert_eq!(entry["key_digest"].as_str().unwrap().len(), 64);
        assert!(entry["at"].as_str().unwrap().ends_with('Z'));
        assert_eq!(entry["hash"].as_str().unwrap().len(), 64);
    }
    let whole = export(store, None).await;
    let text = serde_json::to_string(&whole).unwrap();
    for secret in [&k1, &k2, &k3, &client.token] {
        assert!(
            !text.contains(secret.as_str()),
            "no key or credential in the journal"
        );
    }

    // Intact, then edited, restored, and with an entry deleted.
    let intact = idemgate(&["audit", "verify", "--store", store]).await;
    assert_eq!(intact.code, 0, "{intact:?}");
    assert!(intact.stdout.contains("journal intact"), "{intact:?}");
    assert!(
        intact.stdout.contains("head "),
        "the heads to anchor: {intact:?}"
    );

    let executed = &export(store, Some(&k2)).await[2];
    journal.edit(executed).await;
    let broken = idemgate(&["audit", "verify", "--store", store]).await;
    assert_eq!(broken.code, 1, "{broken:?}");
    let seq = executed["seq"].as_u64().unwrap();
    match journal {
        Journal::Sql(_) => {
            assert!(
                broken.stderr.contains(&format!("entry seq {seq} ")),
                "{broken:?}"
            );
            assert!(broken.stderr.contains("edited"), "{broken:?}");
            journal.restore(executed).await;
            let again = idemgate(&["audit", "verify", "--store", store]).await;
            assert_eq!(again.code, 0, "restored: {again:?}");
            journal.delete(&one[2]).await;
            let deleted = idemgate(&["audit", "verify", "--store", store]).await;
            assert_eq!(deleted.code, 1, "{deleted:?}");
            assert_names_the_gap(&deleted, &whole, &one[2]);
        }
        // A stream entry cannot be edited in place: `edit` deleted it.
        Journal::Redis { .. } => assert_names_the_gap(&broken, &whole, executed),
    }
}

/// `verify`'s failure after `deleted` went names where the chain breaks: the
/// entry of the same instance that followed it, or, had it been the newest,
/// the head it no longer reaches.
fn assert_names_the_gap(verify: &Run, whole: &[Value], deleted: &Value) {
    let seq = deleted["seq"].as_u64().unwrap();
    let next = whole
        .iter()
        .filter(|e| e["instance"] == deleted["instance"])
        .filter_map(|e| e["seq"].as_u64())
        .filter(|&s| s > seq)
        .min();
    match next {
        Some(next) => assert!(
            verify.stderr.contains(&format!("entry seq {next} "))
                && verify.stderr.contains("deleted or moved"),
            "names entry {next}, after the deleted {seq}: {verify:?}"
        ),
        None => assert!(
            verify.stderr.contains("newest entries were deleted"),
            "{verify:?}"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_journal_on_sqlite() {
    let (db, _dir) = sqlite_url();
    scenario(Options::new(&db), &db, Journal::Sql(db.clone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_journal_on_postgres() {
    let database = OwnDatabase::create("audit").await;
    let url = database.url();
    scenario(Options::new(&url), &url, Journal::Sql(url.clone())).await;
    database.drop_it().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_journal_on_redis() {
    // Database 13 is this test's alone: its journal can be tampered with.
    let url = format!("{}/13", redis_url().trim_end_matches('/'));
    clear_redis_journal(&url).await;
    let (db, _dir) = sqlite_url();
    scenario(
        Options::new(&db).store(&url),
        &url,
        Journal::Redis { url: url.clone() },
    )
    .await;
    clear_redis_journal(&url).await;
}

/// `GET /v1/audit` on the admin listener: JSON Lines, paged by `seq`, behind
/// the admin token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_admin_api_pages_the_journal() {
    let gateway = MockGateway::start().await;
    let (db, _dir) = sqlite_url();
    let token = "audit-admin-token";
    let server = Server::start(Options::new(&db).gateway(gateway.url()).admin(Some(token))).await;
    let client = Client::new();
    for _ in 0..2 {
        let answer = client
            .post(&server.url("/api/v1/orders"), Some(&new_key()), ORDER)
            .await;
        assert_eq!(answer.status, StatusCode::CREATED);
    }
    let http = reqwest::Client::new();
    let page = |query: String| {
        let (http, url) = (
            http.clone(),
            server.admin_url(&format!("/v1/audit?{query}")),
        );
        async move {
            let answer = http.get(url).bearer_auth(token).send().await.unwrap();
            assert_eq!(answer.status(), StatusCode::OK);
            assert_eq!(answer.headers()["content-type"], "application/jsonl");
            let text = answer.text().await.unwrap();
            text.lines()
                .map(|line| serde_json::from_str::<Value>(line).unwrap())
                .collect::<Vec<_>>()
        }
    };
    // Two claims and two completions, written by the queue shortly after.
    let mut all = Vec::new();
    for _ in 0..50 {
        all = page("limit=1000".to_owned()).await;
        if all.len() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(all.len(), 4, "{all:?}");
    let first = page("limit=3".to_owned()).await;
    assert_eq!(first, all[..3]);
    let rest = page(format!("after={}", first[2]["seq"])).await;
    assert_eq!(rest, all[3..]);
    let since_future = page("since=2999-01-01T00:00:00Z".to_owned()).await;
    assert!(since_future.is_empty());
    let refused = http
        .get(server.admin_url("/v1/audit"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let bad = http
        .get(server.admin_url("/v1/audit?since=yesterday"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
}

/// Through `idemgate proxy` (SQLite, the journal on by default): a new key, its
/// replay and a 422 leave their events in order, under the route's template,
/// with a keyed digest and never the raw key; `GET /v1/audit` on the proxy's
/// admin listener and `audit export` give the same entries; `audit verify`
/// passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_proxy_journals_its_operations() {
    let upstream = Upstream::start().await;
    let dir = TempDir::new("idemgate-proxy-audit");
    let store = format!("sqlite://{}", dir.path().join("proxy.db").display());
    let routes = dir.path().join("routes.toml");
    std::fs::write(
        &routes,
        "[[route]]\nmethod = \"POST\"\npath = \"/v1/payments/{account}\"\n",
    )
    .unwrap();
    let token = "proxy-audit-token";
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .store(&store)
            .arg("--config", routes.display())
            .env("IDEMGATE_ADMIN_TOKEN", token),
    )
    .await;
    let client = Client::new();
    let key = new_key();
    let url = proxy.url("/v1/payments/acc-1");
    let first = client.post(&url, Some(&key), r#"{"amount":5}"#).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let replay = client.post(&url, Some(&key), r#"{"amount":5}"#).await;
    assert!(replay.replayed(), "{replay:?}");
    let reused = client.post(&url, Some(&key), r#"{"amount":6}"#).await;
    assert_eq!(
        reused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{reused:?}"
    );
    assert_eq!(upstream.executions(), 1);

    let http = reqwest::Client::new();
    let mut served: Vec<Value> = Vec::new();
    for _ in 0..50 {
        let answer = http
            .get(proxy.admin_url("/v1/audit?limit=1000"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        served = answer
            .text()
            .await
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        if served.len() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let names: Vec<&str> = served
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["claimed", "executed", "replayed", "mismatch"],
        "{served:#?}"
    );
    for entry in &served {
        assert_eq!(entry["route"], "/v1/payments/{account}", "{entry}");
        assert_eq!(entry["method"], "POST", "{entry}");
        let digest = entry["key_digest"].as_str().unwrap();
        assert_eq!(digest.len(), 64, "{entry}");
        assert!(!entry.to_string().contains(&key), "the raw key: {entry}");
    }
    assert_eq!(served[0]["operation_id"], served[1]["operation_id"]);
    assert_eq!(served[1]["operation_id"], served[2]["operation_id"]);
    assert_eq!(served[1]["status"], 201);

    let exported = export(&store, None).await;
    assert_eq!(exported, served, "the CLI and the admin API agree");
    let verified = idemgate(&["audit", "verify", "--store", &store]).await;
    assert_eq!(verified.code, 0, "{verified:?}");

    // The journal's size, as a second proxy on the store reads it at start
    // (`idemgate_audit_journal_entries`, every instance's partitions).
    let second = Proxy::start(ProxyOptions::new(upstream.url()).store(&store)).await;
    let mut size = None;
    for _ in 0..50 {
        let text = reqwest::get(second.admin_url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        size = text
            .lines()
            .find(|line| line.starts_with("idemgate_audit_journal_entries "))
            .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok());
        if size.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(size, Some(4.0), "the journal's four entries");
}

/// In the transactional mode the `executed` entry commits with the order: a
/// `serve` killed with SIGKILL the moment its 201 arrived — before its journal
/// writer could append anything it had queued — still has the order's
/// `executed` entry, exactly once, and the order it reports.
async fn executed_survives_a_kill_after_the_answer(db: &str) {
    let gateway = MockGateway::start().await;
    let options = Options::new(db).gateway(gateway.url());
    let server = Server::start(options).await;
    let client = Client::new();
    let key = new_key();
    let created = client
        .post(&server.url("/api/v1/orders"), Some(&key), ORDER)
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    server.kill9().await;
    let executed: Vec<_> = events(&export(db, Some(&key)).await)
        .into_iter()
        .filter(|(event, _)| event == "executed")
        .collect();
    assert_eq!(
        executed,
        [ev("executed", Some(201))],
        "the committed order's entry"
    );
    assert_eq!(gateway.distinct_charges(), 1, "one charge");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_committed_orders_entry_survives_kill_9_on_sqlite() {
    let (db, _dir) = sqlite_url();
    executed_survives_a_kill_after_the_answer(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_committed_orders_entry_survives_kill_9_on_postgres() {
    executed_survives_a_kill_after_the_answer(&postgres_url()).await;
}
