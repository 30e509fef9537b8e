//! `idemgate proxy`, the real binary, as a child process ([`Proxy`]), and the
//! counting test upstream it fronts ([`Upstream`]), which records every request it
//! received so tests assert upstream executions.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use super::server::{send_signal, spawn_listening, wait_exit};

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub uri: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Default)]
struct UpstreamState {
    /// Requests whose handler started, before their body was read.
    started: AtomicUsize,
    executions: AtomicUsize,
    seen: Mutex<Vec<Seen>>,
    delay_ms: AtomicU64,
    /// Statuses the next executions answer instead of 201.
    statuses: Mutex<VecDeque<u16>>,
    /// Gates the next executions wait on (after they are counted) before they
    /// answer; see [`Upstream::hold_next`].
    holds: Mutex<VecDeque<oneshot::Receiver<()>>>,
    /// Event streams the next executions answer with; see
    /// [`Upstream::stream_next`].
    streams: Mutex<VecDeque<(&'static str, tokio::sync::mpsc::Receiver<StreamedEvent>)>>,
}

/// One event of a streamed answer, or the stream breaking off (the upstream
/// resets the connection).
pub type StreamedEvent = Result<Bytes, std::io::Error>;

/// Keeps one upstream execution from answering until [`Hold::release`] (or the
/// drop of the handle, so a failing test never leaves the request hanging). A
/// test that needs a request in flight across some event holds it for exactly
/// as long as it needs, instead of guessing a delay long enough.
pub struct Hold(Option<oneshot::Sender<()>>);

impl Hold {
    pub fn release(mut self) {
        if let Some(gate) = self.0.take() {
            let _ = gate.send(());
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(gate) = self.0.take() {
            let _ = gate.send(());
        }
    }
}

/// An API with no idempotency of its own: every request it receives is one
/// execution, answered with a body unique to that execution.
pub struct Upstream {
    pub addr: SocketAddr,
    state: Arc<UpstreamState>,
}

impl Upstream {
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    pub async fn start_on(addr: SocketAddr) -> Self {
        let state = Arc::new(UpstreamState::default());
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .fallback(execute)
            .with_state(Arc::clone(&state));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn executions(&self) -> usize {
        self.state.executions.load(Ordering::SeqCst)
    }

    pub fn started(&self) -> usize {
        self.state.started.load(Ordering::SeqCst)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    pub fn set_delay(&self, delay: Duration) {
        self.state
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    pub fn answer_next(&self, status: u16) {
        self.state.statuses.lock().unwrap().push_back(status);
    }

    /// The next execution (in arrival order, after the ones already held) is
    /// counted and recorded, then waits for the returned handle before it answers.
    pub fn hold_next(&self) -> Hold {
        let (gate, held) = oneshot::channel();
        self.state.holds.lock().unwrap().push_back(held);
        Hold(Some(gate))
    }
}

impl Upstream {
    /// The next execution (after the ones already queued) answers `200
    /// text/event-stream`, chunked, with what is sent on the returned channel:
    /// each event as it is sent, the end when the sender drops, a reset on an
    /// `Err`.
    pub fn stream_next(&self) -> tokio::sync::mpsc::Sender<StreamedEvent> {
        self.stream_next_as("text/event-stream")
    }

    /// As [`Upstream::stream_next`], answering `content_type`.
    pub fn stream_next_as(
        &self,
        content_type: &'static str,
    ) -> tokio::sync::mpsc::Sender<StreamedEvent> {
        let (events, streamed) = tokio::sync::mpsc::channel(64);
        self.state
            .streams
            .lock()
            .unwrap()
            .push_back((content_type, streamed));
        events
    }
}

async fn execute(State(state): State<Arc<UpstreamState>>, request: Request) -> Response {
    state.started.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let run = state.executions.fetch_add(1, Ordering::SeqCst) + 1;
    state.seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        uri: parts.uri.to_string(),
        headers: parts.headers.clone(),
        body,
    });
    let held = state.holds.lock().unwrap().pop_front();
    if let Some(held) = held {
        // Released or dropped: either way the execution answers.
        let _ = held.await;
    }
    let streamed = state.streams.lock().unwrap().pop_front();
    if let Some((content_type, mut events)) = streamed {
        let body = axum::body::Body::from_stream(futures_util::stream::poll_fn(move |cx| {
            events.poll_recv(cx)
        }));
        let mut response = (StatusCode::OK, body).into_response();
        let headers = response.headers_mut();
        headers.insert("content-type", HeaderValue::from_static(content_type));
        headers.insert("cache-control", HeaderValue::from_static("no-cache"));
        headers.insert("x-upstream-run", HeaderValue::from(run));
        return response;
    }
    let delay = state.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let status = state
        .statuses
        .lock()
        .unwrap()
        .pop_front()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::CREATED);
    let body = serde_json::json!({ "run": run, "id": uuid::Uuid::new_v4() }).to_string();
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert("x-upstream-run", HeaderValue::from(run));
    // Hop-by-hop on the way back: the client must see none of them.
    headers.insert("connection", HeaderValue::from_static("x-upstream-hop"));
    headers.insert("x-upstream-hop", HeaderValue::from_static("secret"));
    headers.insert("proxy-authenticate", HeaderValue::from_static("Basic"));
    response
}

pub const SECRET: &str = "e2e-principal-secret";

/// How to start the proxy.
#[derive(Clone)]
pub struct ProxyOptions {
    pub upstream: String,
    pub store: String,
    pub extra: Vec<(String, String)>,
    /// Environment variables set for the process.
    pub env: Vec<(String, String)>,
}

impl ProxyOptions {
    pub fn new(upstream: String) -> Self {
        Self {
            upstream,
            store: "memory".to_owned(),
            extra: Vec::new(),
            env: Vec::new(),
        }
    }

    pub fn store(mut self, store: &str) -> Self {
        self.store = store.to_owned();
        self
    }

    /// `store`, or with `None` the SQLite store: a file `proxy.db` in `dir`.
    pub fn store_or_sqlite_in(self, store: Option<&str>, dir: &std::path::Path) -> Self {
        match store {
            Some(store) => self.store(store),
            None => self.store(&format!("sqlite://{}", dir.join("proxy.db").display())),
        }
    }

    pub fn arg(mut self, flag: &str, value: impl ToString) -> Self {
        self.extra.push((flag.to_owned(), value.to_string()));
        self
    }

    pub fn env(mut self, name: &str, value: impl ToString) -> Self {
        self.env.push((name.to_owned(), value.to_string()));
        self
    }
}

/// The variables of `idemgate proxy`, cleared so the flags alone decide.
const PROXY_VARIABLES: [&str; 48] = [
    "IDEMGATE_UPSTREAM",
    "IDEMGATE_CHECK_CONFIG",
    "IDEMGATE_LISTEN",
    "PORT",
    "IDEMGATE_ADMIN_LISTEN",
    "IDEMGATE_IDEMPOTENCY_STORE",
    "IDEMGATE_PRINCIPAL",
    "IDEMGATE_PRINCIPAL_SECRET",
    "IDEMGATE_PRINCIPAL_SECRET_FILE",
    "IDEMGATE_UPSTREAM_TIMEOUT_MS",
    "IDEMPOTENCY_TTL_SECONDS",
    "IDEMPOTENCY_LEASE_SECONDS",
    "IDEMPOTENCY_WAIT_MS",
    "IDEMGATE_STORE_TIMEOUT_MS",
    "IDEMGATE_LOG_FORMAT",
    "IDEMGATE_SHUTDOWN_TIMEOUT_SECONDS",
    "IDEMGATE_MAX_CONNECTIONS",
    "IDEMGATE_ADMIN_TOKEN",
    "IDEMGATE_OTLP",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "IDEMGATE_CONFIG",
    "IDEMGATE_UPSTREAM_HOST_HEADER",
    "IDEMGATE_JWT_CLAIM",
    "IDEMGATE_JWT_SECRET_FILE",
    "IDEMGATE_JWKS_FILE",
    "IDEMGATE_JWT_ISSUER",
    "IDEMGATE_JWT_AUDIENCE",
    "IDEMGATE_TLS_CERT",
    "IDEMGATE_TLS_KEY",
    "IDEMGATE_PROBLEM_TYPE_BASE",
    "IDEMGATE_PROBLEM_LINK",
    "IDEMGATE_PROBLEM_SHAPE",
    "IDEMGATE_UPSTREAM_IDLE_TIMEOUT_MS",
    "IDEMGATE_UPSTREAM_RESPONSE_TIMEOUT_MS",
    "IDEMGATE_PATH_ENCODED_SLASH",
    "IDEMGATE_PATH_ENCODED_DOT_SEGMENT",
    "IDEMGATE_PATH_PARAMETERS",
    "IDEMGATE_PATH_CONTROL_OR_NON_ASCII",
    "IDEMGATE_PATH_ABOVE_ROOT",
    "IDEMGATE_CASE_INSENSITIVE_PATHS",
    "IDEMGATE_REQUIRE_KEY",
    "IDEMGATE_UNDERSCORE_HEADERS",
    "IDEMGATE_METHOD_OVERRIDE",
    "IDEMGATE_SAFE_METHOD_BODY",
    "IDEMGATE_WORKERS",
    "IDEMGATE_REPLAY_HEADERS",
    "IDEMGATE_REPLAY_SET_COOKIE",
];

pub fn proxy_command(options: &ProxyOptions) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idemgate"));
    command
        .arg("proxy")
        .args(["--upstream", &options.upstream])
        .args(["--listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0"])
        .args(["--idempotency-store", &options.store])
        .args(["--shutdown-timeout", "5"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for variable in PROXY_VARIABLES {
        command.env_remove(variable);
    }
    for (flag, value) in &options.extra {
        command.args([flag, value]);
    }
    command.envs(options.env.iter().map(|(k, v)| (k, v)));
    command
}

/// A running `idemgate proxy`.
pub struct Proxy {
    child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
}

impl Proxy {
    pub async fn start(options: ProxyOptions) -> Self {
        Self::start_listening(options, "proxy listening on http://").await
    }

    /// A proxy whose public listener speaks HTTPS (`--tls-cert`/`--tls-key`).
    pub async fn start_tls(options: ProxyOptions) -> Self {
        Self::start_listening(options, "proxy listening on https://").await
    }

    async fn start_listening(options: ProxyOptions, public_marker: &str) -> Self {
        let mut command = proxy_command(&options);
        command.env("IDEMGATE_PRINCIPAL_SECRET", SECRET);
        let (child, addrs) =
            spawn_listening(&mut command, &[public_marker, "admin listening on http://"]).await;
        Self {
            child,
            addr: addrs[0],
            admin: addrs[1],
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// SIGTERM: a graceful shutdown.
    pub fn terminate(&self) {
        send_signal(&self.pid().to_string(), "TERM");
    }

    pub async fn wait_exit(mut self) -> std::process::ExitStatus {
        wait_exit(&mut self.child).await
    }

    /// The names of the process's threads (`/proc/PID/task/*/comm`).
    pub fn thread_names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", self.pid()))
            .expect("the proxy's threads")
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .map(|name| name.trim().to_owned())
            .collect();
        names.sort();
        names
    }

    /// `kill -9`: no shutdown, the record stays PROCESSING.
    pub async fn kill9(mut self) {
        self.child.kill().await.expect("kill -9");
    }
}

pub fn derived_key(seen: &Seen) -> String {
    seen.headers
        .get("idempotency-key")
        .expect("a keyed request reaches the upstream with a derived key")
        .to_str()
        .unwrap()
        .to_owned()
}
