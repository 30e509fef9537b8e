//! `idemgate proxy --check-config FILE` and the `SIGHUP` reload of `--config`,
//! against the real binary: exact `file:line:col` for each kind of bad file, and
//! a reload under continuous concurrent load (good, bad, good) in which no
//! request fails, the new routes take effect, a bad file leaves the old ones,
//! and `GET /v1/config` and `idemgate_config_reloads_total` follow.

use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use sha2::{Digest, Sha256};

use crate::support::client::{Client, ORDER, new_key};
use crate::support::proxy::{Proxy, ProxyOptions, Upstream};
use crate::support::server::{TempDir, send_signal};

fn check_config(path: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["proxy", "--check-config", path])
        .args(extra)
        .env_remove("IDEMGATE_UPSTREAM")
        .env_remove("IDEMGATE_CONFIG")
        .env_remove("IDEMPOTENCY_TTL_SECONDS")
        .env_remove("IDEMPOTENCY_LEASE_SECONDS")
        .output()
        .expect("run idemgate")
}

fn write(dir: &TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn sha256(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

#[test]
fn check_config_accepts_a_good_file_without_an_upstream_or_a_store() {
    let dir = TempDir::new("check-config");
    let text = "[[route]]\nmethod = \"POST\"\npath = \"/pay\"\nrequire_key = true\n\n[[route]]\nmethod = \"POST\"\npath = \"/hooks/*\"\nenabled = false\n";
    let path = write(&dir, "routes.toml", text);
    // An unreachable store and an invalid upstream: neither is opened or read.
    let output = check_config(&path, &["--idempotency-store", "redis://127.0.0.1:1"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(output.stderr.is_empty(), "{output:?}");
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        format!("{path}: OK: 2 routes, sha256 {}\n", sha256(text))
    );
}

#[test]
fn check_config_names_the_file_line_and_column_of_each_problem() {
    let dir = TempDir::new("check-config-bad");
    let cases = [
        // Syntax: an unterminated string.
        (
            "# payments\n[[route]]\nmethod = \"POST\"\npath = \"/pay\n",
            "4:13: invalid basic string",
        ),
        // An unknown key, indented: its own column.
        (
            "[[route]]\nmethod = \"POST\"\npath = \"/pay\"\n  require_keys = true\n",
            "4:3: unknown field `require_keys`",
        ),
        // Invalid values.
        (
            "[[route]]\nmethod = \"POST\"\npath = \"/pay\"\nwait_ms = -5\n",
            "4:11: invalid value: integer `-5`",
        ),
        (
            "[[route]]\nmethod = \"POST\"\npath = \"/pay\"\nserver_errors = \"retry\"\n",
            "4:17: unknown variant `retry`",
        ),
        // A combination: the second route's TTL is not longer than the
        // default lease (30 s) it inherits; named at its [[route]].
        (
            "[[route]]\nmethod = \"POST\"\npath = \"/pay\"\n\n[[route]]\nmethod = \"POST\"\npath = \"/refunds\"\nttl = 20\n",
            "5:1: route POST /refunds: ttl (20 s) must be longer than lease (30 s)",
        ),
    ];
    for (i, (text, problem)) in cases.into_iter().enumerate() {
        let path = write(&dir, &format!("bad-{i}.toml"), text);
        let output = check_config(&path, &[]);
        assert_eq!(output.status.code(), Some(2), "{text:?}: {output:?}");
        assert!(output.stdout.is_empty(), "{output:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.starts_with(&format!("{path}:{problem}")),
            "{text:?}: {stderr}"
        );
    }
    // The combination depends on the flags it inherits, as at startup.
    let path = write(
        &dir,
        "combination.toml",
        "[[route]]\nmethod = \"POST\"\npath = \"/refunds\"\nttl = 20\n",
    );
    assert_eq!(
        check_config(&path, &["--lease", "10"]).status.code(),
        Some(0)
    );
    let output = check_config(&format!("{path}.missing"), &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8(output.stderr)
            .unwrap()
            .starts_with(&format!("cannot read {path}.missing: ")),
    );
}

/// File A: `/pay` is not special (a keyless POST passes through).
const ROUTES_A: &str = "[[route]]\nmethod = \"POST\"\npath = \"/hooks/*\"\nenabled = false\n";
/// File B: `/pay` requires a key.
const ROUTES_B: &str = "[[route]]\nmethod = \"POST\"\npath = \"/pay\"\nrequire_key = true\n\n[[route]]\nmethod = \"POST\"\npath = \"/hooks/*\"\nenabled = false\n";
/// Bad: a typo in a key.
const ROUTES_BAD: &str = "[[route]]\nmethod = \"POST\"\npath = \"/pay\"\nrequire_keys = true\n";

/// Whether a keyless `POST /pay` is refused (file B) rather than forwarded.
async fn pay_requires_a_key(client: &Client, proxy: &Proxy) -> bool {
    let answer = client.post(&proxy.url("/pay"), None, ORDER).await;
    match answer.status {
        StatusCode::CREATED => false,
        StatusCode::BAD_REQUEST => {
            assert_eq!(answer.problem_type(), "/problems/missing-key");
            true
        }
        other => panic!("unexpected {other}: {answer:?}"),
    }
}

async fn config(proxy: &Proxy) -> serde_json::Value {
    reqwest::get(proxy.admin_url("/v1/config"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn reloads(proxy: &Proxy, result: &str) -> u64 {
    metric(
        proxy,
        &format!("idemgate_config_reloads_total{{result=\"{result}\"}}"),
    )
    .await
}

async fn last_reload_successful(proxy: &Proxy) -> u64 {
    metric(proxy, "idemgate_config_last_reload_successful").await
}

async fn metric(proxy: &Proxy, series: &str) -> u64 {
    let metrics = reqwest::get(proxy.admin_url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let prefix = format!("{series} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {prefix}in {metrics}"))
        .parse()
        .unwrap()
}

/// Rewrites the file (write then rename, as a ConfigMap update does), sends
/// SIGHUP, and waits until `GET /v1/config` shows `done`.
async fn reload(
    proxy: &Proxy,
    dir: &TempDir,
    path: &str,
    text: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let staged = write(dir, "routes.toml.new", text);
    std::fs::rename(staged, path).unwrap();
    send_signal(&proxy.pid().to_string(), "HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view = config(proxy).await;
        if done(&view) {
            return view;
        }
        assert!(Instant::now() < deadline, "reload not seen: {view}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sighup_reloads_the_route_file_under_load_and_refuses_a_bad_one() {
    let upstream = Upstream::start().await;
    // Requests spend a while upstream, so every reload lands on requests in flight.
    upstream.set_delay(Duration::from_millis(20));
    let dir = TempDir::new("reload");
    let path = write(&dir, "routes.toml", ROUTES_A);
    let proxy = Arc::new(
        Proxy::start(
            ProxyOptions::new(upstream.url())
                .arg("--config", &path)
                .arg("--principal", "header:x-user"),
        )
        .await,
    );
    let client = Client::new();
    let view = config(&proxy).await;
    assert_eq!(view["loaded"]["sha256"], sha256(ROUTES_A), "{view}");
    assert_eq!(view["loaded"]["path"], path.as_str());
    assert_eq!(view["loaded"]["routes"], 1);
    assert!(view["last_error"].is_null());
    assert_eq!(
        (reloads(&proxy, "ok").await, reloads(&proxy, "error").await),
        (0, 0),
        "exported at zero from the start"
    );
    assert_eq!(last_reload_successful(&proxy).await, 1);
    assert!(!pay_requires_a_key(&client, &proxy).await);

    // The load: clients sending continuously, keyed and keyless, to paths every
    // file treats alike; bounded by count and by time.
    const CLIENTS: usize = 16;
    const MAX_PER_CLIENT: usize = 400;
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (proxy, stop) = (Arc::clone(&proxy), Arc::clone(&stop));
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                let mut answers = Vec::new();
                let deadline = Instant::now() + Duration::from_secs(60);
                while !stop.load(Ordering::SeqCst)
                    && answers.len() < MAX_PER_CLIENT
                    && Instant::now() < deadline
                {
                    let mut request = http
                        .post(proxy.url(&format!("/orders/{i}")))
                        .header("x-user", format!("user-{i}"))
                        .header("content-type", "application/json")
                        .body(ORDER);
                    if answers.len() % 2 == 0 {
                        request = request.header("idempotency-key", new_key());
                    }
                    let answer = match request.send().await {
                        Ok(response) => Ok(response.status()),
                        Err(error) => Err(error.to_string()),
                    };
                    answers.push(answer);
                }
                answers
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Good: B's route takes effect.
    let view = reload(&proxy, &dir, &path, ROUTES_B, |view| {
        view["loaded"]["sha256"] == sha256(ROUTES_B)
    })
    .await;
    assert_eq!(view["loaded"]["routes"], 2, "{view}");
    assert!(pay_requires_a_key(&client, &proxy).await);
    assert_eq!(reloads(&proxy, "ok").await, 1);
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Bad: refused, B keeps serving, the error is shown and counted.
    let view = reload(&proxy, &dir, &path, ROUTES_BAD, |view| {
        !view["last_error"].is_null()
    })
    .await;
    assert_eq!(view["loaded"]["sha256"], sha256(ROUTES_B), "{view}");
    let error = view["last_error"]["error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!("{path}:4:1: unknown field `require_keys`")),
        "{error}"
    );
    assert!(pay_requires_a_key(&client, &proxy).await, "B still serves");
    assert_eq!(reloads(&proxy, "error").await, 1);
    assert_eq!(reloads(&proxy, "ok").await, 1);
    assert_eq!(last_reload_successful(&proxy).await, 0, "the alert's input");
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Good again: back to A.
    let view = reload(&proxy, &dir, &path, ROUTES_A, |view| {
        view["loaded"]["sha256"] == sha256(ROUTES_A)
    })
    .await;
    assert!(view["last_error"].is_null(), "{view}");
    assert!(!pay_requires_a_key(&client, &proxy).await);
    assert_eq!(reloads(&proxy, "ok").await, 2);
    assert_eq!(reloads(&proxy, "error").await, 1);
    assert_eq!(last_reload_successful(&proxy).await, 1);
    tokio::time::sleep(Duration::from_millis(100)).await;

    stop.store(true, Ordering::SeqCst);
    let mut sent = 0;
    for task in load {
        let answers = task.await.unwrap();
        assert!(!answers.is_empty());
        for answer in &answers {
            assert_eq!(
                answer.as_ref().ok(),
                Some(&StatusCode::CREATED),
                "a request failed during a reload: {answer:?}"
            );
        }
        sent += answers.len();
    }
    eprintln!("{sent} requests under load across three reloads");
    assert!(sent >= CLIENTS * 4, "the load ran: {sent} requests");
    // Every load request and the two forwarded probes (A's) ran once upstream.
    assert_eq!(upstream.executions(), sent + 2, "one execution per request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_config_file_sighup_is_harmless_and_v1_config_says_so() {
    let upstream = Upstream::start().await;
    let proxy =
        Proxy::start(ProxyOptions::new(upstream.url()).arg("--principal", "header:x-user")).await;
    let view = config(&proxy).await;
    assert!(
        view["loaded"].is_null() && view["last_error"].is_null(),
        "{view}"
    );
    send_signal(&proxy.pid().to_string(), "HUP");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = Client::new().post(&proxy.url("/x"), None, ORDER).await;
    assert_eq!(answer.status, StatusCode::CREATED, "still serving");
    assert_eq!(reloads(&proxy, "ok").await, 0);
    assert_eq!(reloads(&proxy, "error").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_finishes_under_the_routes_it_started_with() {
    // Under RELEASE a 500 frees the key (a retry runs again); under STORE it is
    // stored and replayed. The request starts under RELEASE and ends after the
    // reload to STORE.
    const RELEASE: &str =
        "[[route]]\nmethod = \"POST\"\npath = \"/pay\"\nserver_errors = \"release\"\n";
    const STORE: &str =
        "[[route]]\nmethod = \"POST\"\npath = \"/pay\"\nserver_errors = \"store\"\n";
    let upstream = Upstream::start().await;
    let dir = TempDir::new("reload-in-flight");
    let path = write(&dir, "routes.toml", RELEASE);
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .arg("--config", &path)
            .arg("--principal", "header:x-user"),
    )
    .await;
    let post = |key: String| {
        let url = proxy.url("/pay");
        async move {
            reqwest::Client::new()
                .post(url)
                .header("x-user", "alice")
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .body(ORDER)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    // Held at the upstream until the reload is observed: in flight across it by
    // construction, not by a delay long enough.
    let hold = upstream.hold_next();
    upstream.answer_next(500);
    let key = new_key();
    let in_flight = tokio::spawn(post(key.clone()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while upstream.executions() == 0 {
        assert!(
            Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    reload(&proxy, &dir, &path, STORE, |view| {
        view["loaded"]["sha256"] == sha256(STORE)
    })
    .await;
    assert!(!in_flight.is_finished(), "the reload landed mid-request");
    hold.release();
    assert_eq!(in_flight.await.unwrap(), StatusCode::INTERNAL_SERVER_ERROR);
    // Released under the old routes: the retry runs.
    assert_eq!(post(key).await, StatusCode::CREATED);
    assert_eq!(upstream.executions(), 2, "the old route's release applied");
    // And the new routes apply to new requests: a 500 is stored and replayed.
    upstream.answer_next(500);
    let key = new_key();
    assert_eq!(post(key.clone()).await, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(post(key).await, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(upstream.executions(), 3, "the new route's store applied");
}
