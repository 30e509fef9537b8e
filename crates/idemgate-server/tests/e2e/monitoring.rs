//! The shipped dashboard (`deploy/grafana/idemgate.json`) and alert rules
//! (`deploy/prometheus/alerts.yml`) against a real Prometheus scraping three real
//! `idemgate serve` processes, after traffic of every outcome and every failure
//! the alerts are for: store errors and 503s (the Redis store is killed), a fenced
//! completion and a lease takeover (a holder frozen past its lease), an operation
//! in flight longer than its lease with a 409 beside it, 422s and 400s, and on
//! the proxy forged webhook deliveries and a delivery id reused with another
//! payload.
//!
//! Every panel query (read from the dashboard JSON) must return a finite sample
//! and every alert expression (read back from Prometheus, which loaded the rule
//! file) must return a series: each alert fires on this traffic. `promtool check
//! rules` and the rule unit tests (`alerts_test.yml`) run first.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::support::client::{Client, ORDER, new_key};
use crate::support::proxy::{Proxy, ProxyOptions, Upstream};
use crate::support::server::{Options, Server, TempDir, send_signal, sqlite_url};
use crate::support::webhooks::{Delivery, deliver, sign};
use idemgate_testkit::free_port;

/// The scrape and rule evaluation interval of the test Prometheus.
const SCRAPE: Duration = Duration::from_secs(1);

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(path)
}

/// Runs `program args` and panics with its output unless it succeeds. A missing
/// program fails too: `scripts/services.sh` installs it.
fn run_tool(program: &str, args: &[&Path]) {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} not runnable ({e}): run scripts/services.sh"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A child process killed (by its PID) when dropped.
struct Process(Child);

impl Process {
    /// SIGTERM, then wait for the exit.
    fn stop(mut self) {
        send_signal(&self.0.id().to_string(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.0.try_wait().expect("wait").is_none() {
            assert!(
                Instant::now() < deadline,
                "did not stop within 10 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A Redis of this test's own, so killing it breaks no one else's store.
async fn own_redis() -> (Process, String) {
    let port = free_port();
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (scripts/services.sh installs it)");
    let process = Process(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "own Redis did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (process, format!("redis://127.0.0.1:{port}"))
}

/// A Prometheus scraping `targets` every [`SCRAPE`], with the shipped rules.
struct Prometheus {
    process: Process,
    url: String,
    http: reqwest::Client,
    _dir: TempDir,
}

impl Prometheus {
    async fn start(targets: &[SocketAddr]) -> Self {
        let dir = TempDir::new("idemgate-prometheus");
        let targets: Vec<String> = targets.iter().map(|addr| format!("\"{addr}\"")).collect();
        let config = format!(
            "global:\n  scrape_interval: {s}s\n  evaluation_interval: {s}s\n\
             rule_files:\n  - \"{rules}\"\n\
             scrape_configs:\n  - job_name: idemgate\n    static_configs:\n      - targets: [{targets}]\n",
            s = SCRAPE.as_secs(),
            rules = deploy("prometheus/alerts.yml").display(),
            targets = targets.join(", "),
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus (scripts/services.sh installs it)");
        let prometheus = Self {
            process: Process(child),
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = prometheus
                .http
                .get(format!("{}/-/ready", prometheus.url))
                .send()
                .await;
            if ready.is_ok_and(|r| r.status() == StatusCode::OK) {
                return prometheus;
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus not ready within 20 s; its log: {}",
                std::fs::read_to_string(prometheus._dir.path().join("prometheus.log"))
                    .unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn api(&self, path: &str, params: &[(&str, &str)]) -> Value {
        let url = reqwest::Url::parse_with_params(&format!("{}{path}", self.url), params).unwrap();
        let body: Value = self
            .http
            .get(url)
            .send()
            .await
            .expect("Prometheus API")
            .json()
            .await
            .expect("Prometheus API JSON");
        assert_eq!(body["status"], "success", "{path} {params:?}: {body}");
        body["data"].clone()
    }

    /// An instant query's samples: (labels, value).
    async fn query(&self, expr: &str) -> Vec<(Value, f64)> {
        let data = self.api("/api/v1/query", &[("query", expr)]).await;
        assert_eq!(data["resultType"], "vector", "{expr}: {data}");
        data["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|sample| {
                let value = sample["value"][1].as_str().unwrap();
                (sample["metric"].clone(), value.parse::<f64>().unwrap())
            })
            .collect()
    }

    /// Waits until `expr` (one sample) reaches `at_least`.
    async fn wait_for(&self, expr: &str, at_least: f64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let samples = self.query(expr).await;
            if samples.iter().any(|(_, v)| *v >= at_least) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{expr} did not reach {at_least} within 20 s: {samples:?}"
            );
            tokio::time::sleep(SCRAPE / 4).await;
        }
    }
}

/// Every `expr` of every panel's targets, with Grafana's `$__rate_interval`
/// replaced by a window that holds several scrapes.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deploy("grafana/idemgate.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().expect("a panel title");
        let targets = panel["targets"].as_array().expect("panel targets");
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for target in targets {
            let expr = target["expr"].as_str().expect("a PromQL expr");
            queries.push((title.to_owned(), expr.replace("$__rate_interval", "1m")));
        }
    }
    queries
}

/// A metric of one server, read from its `/metrics`.
async fn scraped(server: &Server, series: &str) -> f64 {
    let text = reqwest::Client::new()
        .get(server.url("/metrics"))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} not in /metrics:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Waits until `server` runs a keyed operation.
async fn wait_in_flight(server: &Server) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while scraped(server, "idemgate_in_flight").await < 1.0 {
        assert!(
            Instant::now() < deadline,
            "no operation in flight after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dashboard_and_alerts_work_against_a_real_prometheus() {
    let rules = deploy("prometheus/alerts.yml");
    run_tool(
        "promtool",
        &[Path::new("check"), Path::new("rules"), &rules],
    );
    run_tool(
        "promtool",
        &[
            Path::new("test"),
            Path::new("rules"),
            &deploy("prometheus/alerts_test.yml"),
        ],
    );

    // A and B share a Redis store (1 s lease, 1.5 s charges); C has the default
    // database store and charges that take a minute.
    let (redis, redis_url) = own_redis().await;
    let ((db_a, _a), (db_b, _b), (db_c, _c)) = (sqlite_url(), sqlite_url(), sqlite_url());
    let shared = |db: &str| {
        let mut options = Options::new(db).store(&redis_url);
        options.lease_seconds = 1;
        options.simulated_delay_ms = 1_500;
        options
    };
    let mut slow = Options::new(&db_c);
    slow.lease_seconds = 1;
    slow.simulated_delay_ms = 60_000;
    let (a, b, c) = tokio::join!(
        Server::start(shared(&db_a)),
        Server::start(shared(&db_b)),
        Server::start(slow)
    );
    // And a proxy, for the metrics only it has (the route file's reloads).
    let upstream = Upstream::start().await;
    let routes = TempDir::new("idemgate-monitoring-routes");
    let route_file = routes.path().join("routes.toml");
    // And a webhook route, for the webhook alerts.
    let webhook_secret = format!("whsec_{}", uuid::Uuid::new_v4().simple());
    std::fs::write(
        &route_file,
        "[[route]]\nmethod = \"POST\"\npath = \"/pay\"\nrequire_key = true\n\n[[route]]\nmethod = \"POST\"\npath = \"/hooks/stripe\"\nwebhook = { provider = \"stripe\", secret = \"env:WH_MONITORING\" }\n",
    )
    .unwrap();
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .arg("--config", route_file.display())
            .env("WH_MONITORING", &webhook_secret),
    )
    .await;
    let targets = [a.addr, b.addr, c.addr, proxy.admin];
    let prometheus = Prometheus::start(&targets).await;
    // Every counter of every target is at zero in a first scrape before any
    // traffic, or its first increase would be invisible to rate(). (Prometheus
    // hands targets to its scraper some seconds after it is ready.)
    prometheus
        .wait_for("count(up == 1)", targets.len() as f64)
        .await;
    let client = Client::new();
    let orders = |server: &Server| server.url("/api/v1/orders");

    // C: an operation that outlives its lease, and a retry of it: 409.
    let long_key = new_key();
    let long_running = {
        let (client, url, key) = (
            // The same principal: the retry below is of this request.
            Client::with_timeout(Duration::from_secs(120)).with_token(&client.token),
            orders(&c),
            long_key.clone(),
        );
        tokio::spawn(async move { client.try_post(&url, Some(&key), ORDER).await })
    };
    wait_in_flight(&c).await;
    let conflict = client.post(&orders(&c), Some(&long_key), ORDER).await;
    assert_eq!(conflict.status, StatusCode::CONFLICT, "{conflict:?}");

    // A: first runs, a replay, a key reused with another body (422), a malformed
    // key (400).
    let keys: Vec<String> = (0..3).map(|_| new_key()).collect();
    let firsts: Vec<_> = keys
        .iter()
        .map(|key| {
            let (client, url, key) = (client.clone(), orders(&a), key.clone());
            tokio::spawn(async move { client.post(&url, Some(&key), ORDER).await })
        })
        .collect();
    for first in firsts {
        let first = first.await.unwrap();
        assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    }
    let replay = client.post(&orders(&a), Some(&keys[0]), ORDER).await;
    assert!(replay.replayed(), "{replay:?}");
    let other = ORDER.replace("1500", "1501");
    let mismatch = client.post(&orders(&a), Some(&keys[0]), &other).await;
    assert_eq!(
        mismatch.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{mismatch:?}"
    );
    let invalid = client.post(&orders(&a), Some("a,b"), ORDER).await;
    assert_eq!(invalid.status, StatusCode::BAD_REQUEST, "{invalid:?}");

    // A holds a key, is frozen past its lease; B takes the operation over; A,
    // thawed, finishes its charge and its completion is fenced off.
    let fenced_key = new_key();
    let held = {
        let (client, url, key) = (client.clone(), orders(&a), fenced_key.clone());
        tokio::spawn(async move { client.try_post(&url, Some(&key), ORDER).await })
    };
    wait_in_flight(&a).await;
    a.freeze();
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let winner = {
        let (client, url, key) = (client.clone(), orders(&b), fenced_key.clone());
        tokio::spawn(async move { client.post(&url, Some(&key), ORDER).await })
    };
    // Thawed only once B holds the lease: earlier, A could still complete.
    let deadline = Instant::now() + Duration::from_secs(10);
    while scraped(&b, "idemgate_lease_takeovers_total").await < 1.0 {
        assert!(Instant::now() < deadline, "B did not take the lease over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.thaw();
    let winner = winner.await.unwrap();
    assert_eq!(winner.status, StatusCode::CREATED, "{winner:?}");
    let _ = held.await.unwrap();
    assert_eq!(scraped(&a, "idemgate_fenced_completions_total").await, 1.0);

    // The proxy's webhook route: a burst of forged deliveries (401) and a
    // delivery id seen again with another, validly signed, payload (422).
    let reused = Delivery::new("stripe", &webhook_secret);
    let mut deliveries = vec![reused.clone(), reused.with_other_payload()];
    deliveries.extend((0..12).map(|_| Delivery::new("stripe", "whsec_forged")));
    let signed = sign(&deliveries).await;
    assert_eq!(
        deliver(&proxy, &signed[0]).await.status,
        StatusCode::CREATED
    );
    let changed = deliver(&proxy, &signed[1]).await;
    assert_eq!(
        changed.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{changed:?}"
    );
    for forged in &signed[2..] {
        let refused = deliver(&proxy, forged).await;
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{refused:?}");
    }

    // The store goes away: A fails closed, 503.
    redis.stop();
    for _ in 0..5 {
        let refused = client.post(&orders(&a), Some(&new_key()), ORDER).await;
        assert_eq!(
            refused.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{refused:?}"
        );
    }

    // A route file the proxy must refuse: it keeps its routes and says so.
    std::fs::write(
        &route_file,
        "[[route]]\nmethod = \"POST\"\npath = \"/pay\"\nrequire_key = maybe\n",
    )
    .unwrap();
    send_signal(&proxy.pid().to_string(), "HUP");

    // Prometheus has scraped all of it.
    prometheus
        .wait_for("sum(idemgate_config_reloads_total{result=\"error\"})", 1.0)
        .await;
    prometheus
        .wait_for(
            r#"sum(idemgate_requests_total{outcome="store_unavailable"})"#,
            5.0,
        )
        .await;
    prometheus
        .wait_for("sum(idemgate_fenced_completions_total)", 1.0)
        .await;
    prometheus
        .wait_for(
            r#"sum(idemgate_webhooks_total{outcome="bad_signature"})"#,
            12.0,
        )
        .await;
    prometheus
        .wait_for("max(idemgate_oldest_in_flight_seconds)", 2.0)
        .await;

    let mut failures = Vec::new();
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "only {} panel queries", queries.len());
    for (title, expr) in &queries {
        let samples = prometheus.query(expr).await;
        if !samples.iter().any(|(_, value)| value.is_finite()) {
            failures.push(format!("panel {title:?}: {expr} → {samples:?}"));
        }
    }
    let groups = prometheus.api("/api/v1/rules", &[("type", "alert")]).await;
    let alerts: Vec<(String, String)> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap().iter())
        .map(|rule| {
            (
                rule["name"].as_str().unwrap().to_owned(),
                rule["query"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let in_file = std::fs::read_to_string(&rules)
        .unwrap()
        .matches("- alert:")
        .count();
    assert_eq!(alerts.len(), in_file, "Prometheus loaded {alerts:?}");
    for (name, expr) in &alerts {
        let samples = prometheus.query(expr).await;
        if samples.is_empty() {
            failures.push(format!("alert {name} does not fire: {expr}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!(
        "{} panel queries and {} alert expressions answered",
        queries.len(),
        alerts.len()
    );

    long_running.abort();
    prometheus.process.stop();
}
