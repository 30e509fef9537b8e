//! Inspecting and evicting keys: `idemgate keys show|evict` (the real binary)
//! against the real stores a real server wrote to, and the admin API
//! (`GET|DELETE /v1/keys`) of `serve` and `proxy`. Every eviction is followed by
//! the request again, and the effects are counted: an evicted key runs anew.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use crate::support::client::{Client, ORDER, new_key};
use crate::support::gateway::MockGateway;
use crate::support::proxy::{Proxy, ProxyOptions, SECRET, Upstream};
use crate::support::server::{Options, Server, TempDir, postgres_url, redis_url, sqlite_url};

pub(crate) const ADMIN_TOKEN: &str = "e2e-admin-token";

/// What one `idemgate keys …` run printed and returned.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|_| panic!("stdout is not JSON: {self:?}"))
    }
}

/// Runs `idemgate keys <args>` with the principal secret in its environment.
async fn keys(args: &[&str]) -> Run {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .arg("keys")
        .args(args)
        .env_remove("IDEMGATE_PRINCIPAL_SECRET_FILE")
        .env("IDEMGATE_PRINCIPAL_SECRET", SECRET)
        .output()
        .await
        .expect("run idemgate keys");
    Run {
        code: output.status.code().expect("exited"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The `keys` flags naming one order key of `client` on `serve`.
fn order_key_args<'a>(store: &'a str, client: &'a Client, key: &'a str) -> Vec<&'a str> {
    vec![
        "--store",
        store,
        "--bearer",
        &client.token,
        "--method",
        "POST",
        "--path",
        "/api/v1/orders",
        "--key",
        key,
    ]
}

/// How long the server's replay cache may keep answering a key the CLI (another
/// process) evicted: `--replay-cache-max-age-ms`, short here.
const CACHE_MAX_AGE: Duration = Duration::from_millis(300);

/// A completed order key is shown (status, sizes, operation id; the body only
/// with `--body`), evicted, then absent, and — once the server's replay cache has
/// let go of it, as docs/operations.md tells operators to wait — the same request
/// runs again: a second order and a second charge.
async fn show_and_evict_through_the_cli(options: Options, store: &str) {
    let gateway = MockGateway::start().await;
    let options = options
        .gateway(gateway.url())
        .arg("--replay-cache-max-age-ms", CACHE_MAX_AGE.as_millis());
    let server = Server::start(options).await;
    let client = Client::new();
    let key = new_key();
    let url = server.url("/api/v1/orders");
    let first = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let args = order_key_args(store, &client, &key);

    let shown = keys(&[&["show"], args.as_slice()].concat()).await;
    assert_eq!(shown.code, 0, "{shown:?}");
    let view = shown.json();
    assert_eq!(view["status"], "COMPLETED", "{view}");
    assert_eq!(view["response"]["status"], 201);
    assert_eq!(view["response"]["body_bytes"], first.body.len());
    assert_eq!(view["response"]["body_retained"], true);
    assert!(
        view["response"].get("body").is_none(),
        "no body unless --body: {view}"
    );
    assert_eq!(view["operation_id"].as_str().map(str::len), Some(36));
    assert_eq!(
        gateway.calls()[0].body["order_ref"],
        view["operation_id"],
        "the operation id shown is the one the order ran under"
    );
    assert!(
        view["expires_in_ms"].as_u64().unwrap() > 80_000_000,
        "{view}"
    );
    assert!(
        view.get("lease").is_none(),
        "a completed record holds no lease"
    );

    let with_body = keys(&[&["show", "--body"], args.as_slice()].concat()).await;
    assert_eq!(with_body.code, 0, "{with_body:?}");
    assert_eq!(
        with_body.json()["response"]["body"]["text"]
            .as_str()
            .unwrap()
            .as_bytes(),
        &first.body[..],
        "--body prints the stored body byte for byte"
    );

    let evicted = keys(&[&["evict"], args.as_slice()].concat()).await;
    assert_eq!(evicted.code, 0, "{evicted:?}");
    assert_eq!(evicted.json()["outcome"], "evicted");
    assert_eq!(evicted.json()["previous_status"], "COMPLETED");
    let gone = keys(&[&["show"], args.as_slice()].concat()).await;
    assert_eq!(gone.code, 3, "an evicted key is absent: {gone:?}");
    let again = keys(&[&["evict"], args.as_slice()].concat()).await;
    assert_eq!(again.code, 3, "{again:?}");
    assert_eq!(again.json()["outcome"], "absent");

    tokio::time::sleep(CACHE_MAX_AGE).await;
    let rerun = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(rerun.status, StatusCode::CREATED, "{rerun:?}");
    assert!(!rerun.replayed(), "after an eviction the key is new");
    assert_ne!(rerun.json()["order_id"], first.json()["order_id"]);
    assert_eq!(
        client.orders(&server.url("")).await.len(),
        2,
        "the evicted key ran a second time: the danger the docs state"
    );
    assert_eq!(gateway.calls().len(), 2);
    assert_eq!(gateway.distinct_charges(), 2);
    let replay = client.post(&url, Some(&key), ORDER).await;
    assert!(
        replay.replayed(),
        "the new run is stored and replayed as usual"
    );
    assert_eq!(gateway.calls().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_cli_shows_and_evicts_an_order_key_on_sqlite() {
    let (db, _dir) = sqlite_url();
    show_and_evict_through_the_cli(Options::new(&db), &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_cli_shows_and_evicts_an_order_key_on_postgres() {
    let db = postgres_url();
    show_and_evict_through_the_cli(Options::new(&db), &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_cli_shows_and_evicts_an_order_key_on_redis() {
    let (db, _dir) = sqlite_url();
    let redis = redis_url();
    show_and_evict_through_the_cli(Options::new(&db).store(&redis), &redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_cli_refuses_bad_flags_and_missing_stores() {
    let client = Client::new();
    let dir = TempDir::new("idemgate-keys");
    let missing = format!("sqlite://{}", dir.path().join("none.db").display());
    let run = keys(&[&["show"], order_key_args(&missing, &client, "k").as_slice()].concat()).await;
    assert_eq!(
        run.code, 1,
        "a missing store file is a store failure: {run:?}"
    );
    assert!(
        !dir.path().join("none.db").exists(),
        "inspecting must not create a store"
    );
    let run = keys(&[&["show"], order_key_args("memory", &client, "k").as_slice()].concat()).await;
    assert_eq!(run.code, 2, "{run:?}");
    let run = keys(
        &[
            &["show"],
            order_key_args(&missing, &client, "a,b").as_slice(),
        ]
        .concat(),
    )
    .await;
    assert_eq!(run.code, 2, "an invalid key: {run:?}");
    assert!(run.stderr.contains("Idempotency-Key"), "{run:?}");
    let run = keys(&[
        "show", "--store", &missing, "--method", "POST", "--path", "/x", "--key", "k",
    ])
    .await;
    assert_eq!(run.code, 2, "no principal: {run:?}");
}

async fn admin_get(
    url: &str,
    token: Option<&str>,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    admin_call(reqwest::Method::GET, url, token).await
}

pub(crate) async fn admin_call(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let mut request = reqwest::Client::new()
        .request(method, url)
        .timeout(Duration::from_secs(30));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("admin request");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await.expect("body");
    let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (status, headers, json)
}

pub(crate) fn keys_query(principal: &str, key: &str, path: &str) -> String {
    let principal: String = url_encode(principal);
    format!(
        "/v1/keys?principal={principal}&method=POST&path={path}&key={}",
        url_encode(key)
    )
}

fn url_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The principal `serve` stores for a bearer token.
pub(crate) fn bearer_principal(client: &Client) -> String {
    idemgate_server::principal::bearer_principal(&client.token)
        .as_str()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_admin_key_api_is_off_without_a_token_and_refuses_a_bad_one() {
    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).admin(None)).await;
    let (status, _, _) = admin_get(&server.admin_url("/healthz"), None).await;
    assert_eq!(status, StatusCode::OK, "the admin listener serves health");
    let query = keys_query("bearer:x", "k", "/api/v1/orders");
    let (status, _, _) = admin_get(&server.admin_url(&query), Some(ADMIN_TOKEN)).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "no token configured: the key API is off"
    );

    let (db, _dir) = sqlite_url();
    let server = Server::start(Options::new(&db).admin(Some(ADMIN_TOKEN))).await;
    for token in [None, Some("wrong"), Some("e2e-admin-toke")] {
        let (status, headers, body) = admin_get(&server.admin_url(&query), token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(headers["content-type"], "application/problem+json");
        assert_eq!(body["type"], "/problems/admin-unauthorized");
        let (status, _, _) =
            admin_call(reqwest::Method::DELETE, &server.admin_url(&query), token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
    }
    let (status, _, body) = admin_get(&server.admin_url(&query), Some(ADMIN_TOKEN)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["type"], "/problems/key-not-found");
    let (status, _, body) = admin_get(
        &server.admin_url("/v1/keys?principal=p&method=POST&path=/x"),
        Some(ADMIN_TOKEN),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a query without a key: {body}"
    );
    assert_eq!(body["type"], "/problems/invalid-key-query");
}

/// While the order runs (a slow gateway), the key shows `PROCESSING` with its
/// lease; an eviction without force is refused (409), with force it goes; the
/// running request is then fenced off, and the retry runs the order again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_admin_key_api_refuses_a_live_lease_unless_forced() {
    let gateway = MockGateway::start().await;
    gateway.set_delay(Duration::from_secs(3));
    let (db, _dir) = sqlite_url();
    let server = Server::start(
        Options::new(&db)
            .gateway(gateway.url())
            .admin(Some(ADMIN_TOKEN)),
    )
    .await;
    let client = Client::new();
    let key = new_key();
    let url = server.url("/api/v1/orders");
    let running = {
        let (client, url, key) = (client.clone(), url.clone(), key.clone());
        tokio::spawn(async move { client.post(&url, Some(&key), ORDER).await })
    };
    let query = server.admin_url(&keys_query(
        &bearer_principal(&client),
        &key,
        "/api/v1/orders",
    ));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let view = loop {
        let (status, _, view) = admin_get(&query, Some(ADMIN_TOKEN)).await;
        if status == StatusCode::OK {
            break view;
        }
        assert_eq!(status, StatusCode::NOT_FOUND, "{view}");
        assert!(
            std::time::Instant::now() < deadline,
            "the running order's key was never claimed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(view["status"], "PROCESSING", "{view}");
    assert_eq!(view["lease"]["live"], true);
    let left = view["lease"]["remaining_ms"].as_u64().unwrap();
    assert!(left > 20_000 && left <= 30_000, "a 30 s lease: {view}");
    assert!(view.get("response").is_none());

    let (status, headers, refused) =
        admin_call(reqwest::Method::DELETE, &query, Some(ADMIN_TOKEN)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["type"], "/problems/key-in-progress");
    assert!(headers.contains_key("retry-after"));
    let (status, _, still) = admin_get(&query, Some(ADMIN_TOKEN)).await;
    assert_eq!(
        (status, &still["status"]),
        (StatusCode::OK, &Value::from("PROCESSING"))
    );

    let forced = format!("{query}&force=true");
    let (status, _, evicted) =
        admin_call(reqwest::Method::DELETE, &forced, Some(ADMIN_TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{evicted}");
    assert_eq!(evicted["outcome"], "evicted");
    assert_eq!(evicted["previous_status"], "PROCESSING");

    let fenced = running.await.expect("the running request");
    assert_eq!(
        fenced.status,
        StatusCode::CONFLICT,
        "the evicted run's completion is fenced off: {fenced:?}"
    );
    gateway.set_delay(Duration::ZERO);
    let rerun = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(rerun.status, StatusCode::CREATED, "{rerun:?}");
    assert!(!rerun.replayed());
    assert_eq!(
        gateway.calls().len(),
        2,
        "evicting a running key let the operation run a second time"
    );
    assert_eq!(gateway.distinct_charges(), 2, "under a new operation id");
    let orders = client.orders(&server.url("")).await;
    assert_eq!(
        orders.len(),
        1,
        "the fenced run's order rolled back with its record (transactional mode)"
    );

    let (status, _, done) = admin_get(&format!("{query}&body=true"), Some(ADMIN_TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(done["status"], "COMPLETED");
    assert_eq!(
        done["response"]["body"]["text"]
            .as_str()
            .unwrap()
            .as_bytes(),
        &rerun.body[..]
    );
}

/// The proxy's admin listener serves the same key API; the CLI finds an
/// `authorization`-scoped key from the client's Authorization value and the
/// proxy's secret; evicting it sends the next request upstream again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proxy_admin_key_api_and_cli_evict_an_authorization_scoped_key() {
    let upstream = Upstream::start().await;
    let dir = TempDir::new("idemgate-proxy-keys");
    let store = format!("sqlite://{}", dir.path().join("proxy.db").display());
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .store(&store)
            .env("IDEMGATE_ADMIN_TOKEN", ADMIN_TOKEN),
    )
    .await;
    let client = Client::new();
    let key = new_key();
    let url = proxy.url("/v1/charges");
    let first = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");

    let authorization = format!("Bearer {}", client.token);
    let args = [
        "--store",
        &store,
        "--authorization",
        &authorization,
        "--method",
        "POST",
        "--path",
        "/v1/charges",
        "--key",
        &key,
    ];
    let shown = keys(&[&["show"], &args[..]].concat()).await;
    assert_eq!(shown.code, 0, "{shown:?}");
    let view = shown.json();
    assert_eq!(view["status"], "COMPLETED");

    // The README's `--bearer` finds nothing on a proxy's records, and says why.
    let with_bearer = keys(&[
        "show",
        "--store",
        &store,
        "--bearer",
        &client.token,
        "--method",
        "POST",
        "--path",
        "/v1/charges",
        "--key",
        &key,
    ])
    .await;
    assert_eq!(with_bearer.code, 3, "{with_bearer:?}");
    for needle in [
        "looked up principal bearer:",
        "--bearer",
        "HMAC-SHA256 of the whole Authorization value",
        "--authorization",
        "IDEMGATE_PRINCIPAL_SECRET",
    ] {
        assert!(
            with_bearer.stderr.contains(needle),
            "the hint does not say {needle:?}: {with_bearer:?}"
        );
    }
    assert!(
        !with_bearer.stderr.contains(&client.token),
        "never the raw credential: {with_bearer:?}"
    );

    // The admin API names the same record by the principal the layer stored.
    let principal = keys_principal(&authorization).await;
    let query = format!(
        "http://{}{}",
        proxy.admin,
        keys_query(&principal, &key, "/v1/charges")
    );
    let (status, _, api_view) = admin_get(&query, Some(ADMIN_TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{api_view}");
    assert_eq!(api_view["operation_id"], view["operation_id"]);
    let (status, _, _) = admin_get(&query, Some("wrong")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, evicted) = admin_call(reqwest::Method::DELETE, &query, Some(ADMIN_TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{evicted}");
    assert_eq!(keys(&[&["show"], &args[..]].concat()).await.code, 3);

    let rerun = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(rerun.status, StatusCode::CREATED);
    assert!(!rerun.replayed());
    assert_eq!(
        upstream.executions(),
        2,
        "the evicted key went upstream again"
    );
}

/// The principal `idemgate keys principal` derives for an Authorization value.
async fn keys_principal(authorization: &str) -> String {
    let run = keys(&["principal", "--authorization", authorization]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let principal = run.json()["principal"].as_str().unwrap().to_owned();
    assert!(principal.starts_with("authz:"), "{principal}");
    assert!(
        !principal.contains(authorization),
        "never the raw credential"
    );
    principal
}
