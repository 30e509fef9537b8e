//! The gRPC suite (`--suite grpc`, issue 34): unary calls per second and CPU
//! per call of the example tonic service (`crates/idemgate/examples/grpc_orders`,
//! `shop.Orders/CreateOrder`), three ways in one run:
//!
//! - **direct**: the service without idempotency, calls without a key;
//! - **through the proxy**: `idemgate proxy` (memory store, journal off) in
//!   front of that service, speaking h2c to it, every call with a new key;
//! - **in-process**: the service with the layer around its tonic server
//!   (memory store), every call with a new key.
//!
//! The load is closed-loop: [`STREAMS`] calls in flight over [`CONNECTIONS`]
//! HTTP/2 connections, for a warm-up and then a measured window, the ways
//! interleaved over rounds. CPU is the server processes' user + system time
//! over the window (the proxy's own, and the hop's total with the service's).
//! Wall-clock figures on a shared machine: compare the rows of one run.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::BoxError;
use crate::server::{ServerProcess, build_release, build_server, process_cpu_time};

/// Calls in flight at once, and the connections they share.
const STREAMS: usize = 32;
const CONNECTIONS: usize = 2;
/// The measured window, its warm-up, and the rounds each way gets.
const WARM_UP: Duration = Duration::from_secs(1);
const WINDOW: Duration = Duration::from_secs(5);
const ROUNDS: usize = 2;
/// The call's path.
const METHOD: &str = "/shop.Orders/CreateOrder";

/// The example service, running.
struct Service {
    child: Child,
    pid: u32,
    addr: std::net::SocketAddr,
}

impl Service {
    /// Starts `binary` (the example) with the layer or without, on a free port.
    async fn start(binary: &Path, idempotency: bool) -> Result<Self, BoxError> {
        let mut child = Command::new(binary)
            .env("GRPC_ORDERS_LISTEN", "127.0.0.1:0")
            .env(
                "GRPC_ORDERS_IDEMPOTENCY",
                if idempotency { "on" } else { "off" },
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().ok_or("the gRPC service exited at once")?;
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        let line = tokio::time::timeout(Duration::from_secs(10), async {
            BufReader::new(stdout).lines().next_line().await
        })
        .await
        .map_err(|_| "the gRPC service printed no address within 10 s")??
        .ok_or("the gRPC service exited before listening")?;
        let addr = line
            .split_whitespace()
            .nth(3)
            .ok_or("no address in the service's line")?
            .parse()?;
        Ok(Self { child, pid, addr })
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Builds the example in release mode.
async fn build_example(root: &Path) -> Result<PathBuf, BoxError> {
    let target = ["-p", "idemgate", "--example", "grpc_orders"];
    build_release(root, &target, "examples/grpc_orders").await
}

/// One way of calling, measured: calls per second, and CPU per call.
#[derive(Debug, Default, Clone)]
struct Row {
    calls: u64,
    failures: u64,
    seconds: f64,
    /// CPU of the process(es) the row is about, over the windows.
    cpu: Duration,
    /// CPU of the proxy alone (the hop), when there is one.
    hop_cpu: Option<Duration>,
}

impl Row {
    fn add(&mut self, other: &Row) {
        self.calls += other.calls;
        self.failures += other.failures;
        self.seconds += other.seconds;
        self.cpu += other.cpu;
        self.hop_cpu = match (self.hop_cpu, other.hop_cpu) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
    }

    fn per_second(&self) -> f64 {
        self.calls as f64 / self.seconds.max(f64::EPSILON)
    }

    fn micros_per_call(cpu: Duration, calls: u64) -> f64 {
        cpu.as_secs_f64() * 1e6 / calls.max(1) as f64
    }
}

/// Runs the suite; its report as Markdown.
pub(crate) async fn suite(root: &Path) -> Result<String, BoxError> {
    let example = build_example(root).await?;
    let binary = build_server(root).await?;
    let plain = Service::start(&example, false).await?;
    let layered = match Service::start(&example, true).await {
        Ok(layered) => layered,
        Err(error) => {
            plain.stop().await;
            return Err(error);
        }
    };
    let args = [
        "--idempotency-store".to_owned(),
        "memory".to_owned(),
        "--audit".to_owned(),
        "off".to_owned(),
    ];
    let proxy = match ServerProcess::start_proxy(&binary, plain.addr, &args, &[]).await {
        Ok(proxy) => proxy,
        Err(error) => {
            plain.stop().await;
            layered.stop().await;
            return Err(error);
        }
    };
    let outcome = measure(&plain, &layered, &proxy).await;
    proxy.stop().await;
    plain.stop().await;
    layered.stop().await;
    let [direct, through, in_process] = outcome?;
    Ok(report(&direct, &through, &in_process))
}

/// The three ways, interleaved over [`ROUNDS`].
async fn measure(
    plain: &Service,
    layered: &Service,
    proxy: &ServerProcess,
) -> Result<[Row; 3], BoxError> {
    let mut rows: [Row; 3] = Default::default();
    for round in 0..ROUNDS {
        for turn in 0..3 {
            let way = (round + turn) % 3;
            let row = match way {
                0 => {
                    let cpu = || process_cpu_time(plain.pid);
                    load(plain.addr, false, cpu, None::<fn() -> _>).await?
                }
                1 => {
                    let both = || Ok(process_cpu_time(plain.pid)? + proxy.cpu_time()?);
                    load(proxy.addr, true, both, Some(|| proxy.cpu_time())).await?
                }
                _ => {
                    let cpu = || process_cpu_time(layered.pid);
                    load(layered.addr, true, cpu, None::<fn() -> _>).await?
                }
            };
            eprintln!(
                "[bench] grpc round {round} way {way}: {:.0} calls/s",
                row.per_second()
            );
            rows[way].add(&row);
        }
    }
    Ok(rows)
}

/// [`STREAMS`] callers against `addr` for the warm-up, then the window; the
/// CPU `cpu` (and `hop`) report over the window.
async fn load(
    addr: std::net::SocketAddr,
    keyed: bool,
    cpu: impl Fn() -> Result<Duration, BoxError>,
    hop: Option<impl Fn() -> Result<Duration, BoxError>>,
) -> Result<Row, BoxError> {
    let mut senders = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .handshake::<_, Full<Bytes>>(TokioIo::new(stream))
            .await?;
        tokio::spawn(connection);
        senders.push(sender);
    }
    let counting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let stop_at = Instant::now() + WARM_UP + WINDOW;
    let tasks: Vec<_> = (0..STREAMS)
        .map(|i| {
            let mut sender = senders[i % CONNECTIONS].clone();
            let (counting, calls, failures) = (
                Arc::clone(&counting),
                Arc::clone(&calls),
                Arc::clone(&failures),
            );
            tokio::spawn(async move {
                while Instant::now() < stop_at {
                    let ok = call(&mut sender, addr, keyed).await;
                    if counting.load(Ordering::Relaxed) {
                        match ok {
                            true => calls.fetch_add(1, Ordering::Relaxed),
                            false => failures.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(WARM_UP).await;
    let (cpu_before, hop_before) = (cpu()?, hop.as_ref().map(|hop| hop()).transpose()?);
    counting.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep_until(tokio::time::Instant::from_std(stop_at)).await;
    let seconds = started.elapsed().as_secs_f64();
    let (cpu_after, hop_after) = (cpu()?, hop.as_ref().map(|hop| hop()).transpose()?);
    counting.store(false, Ordering::Relaxed);
    for task in tasks {
        task.await?;
    }
    Ok(Row {
        calls: calls.load(Ordering::Relaxed),
        failures: failures.load(Ordering::Relaxed),
        seconds,
        cpu: cpu_after.saturating_sub(cpu_before),
        hop_cpu: hop_after.zip(hop_before).map(|(a, b)| a.saturating_sub(b)),
    })
}

/// One `CreateOrder` call; whether it ended `OK`.
async fn call(
    sender: &mut http2::SendRequest<Full<Bytes>>,
    addr: std::net::SocketAddr,
    keyed: bool,
) -> bool {
    let mut request = http::Request::post(format!("http://{addr}{METHOD}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("x-tenant", "bench")
        .header("authorization", "Bearer bench");
    if keyed {
        request = request.header("idempotency-key", uuid::Uuid::new_v4().to_string());
    }
    let Ok(request) = request.body(Full::new(Bytes::from_static(MESSAGE))) else {
        return false;
    };
    let Ok(response) = sender.send_request(request).await else {
        return false;
    };
    let (parts, body) = response.into_parts();
    let Ok(collected) = body.collect().await else {
        return false;
    };
    let status = collected
        .trailers()
        .and_then(|trailers| trailers.get("grpc-status"))
        .or_else(|| parts.headers.get("grpc-status"));
    status.is_some_and(|status| status == "0")
}

/// `CreateOrderRequest { item: "pizza", amount: 1500 }`, one gRPC message.
const MESSAGE: &[u8] = &[
    0, 0, 0, 0, 10, 0x12, 5, b'p', b'i', b'z', b'z', b'a', 0x18, 0xdc, 0x0b,
];

fn report(direct: &Row, through: &Row, in_process: &Row) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "gRPC unary calls (`shop.Orders/CreateOrder`, {STREAMS} in flight over {CONNECTIONS} HTTP/2 connections, {ROUNDS} × {} s per way, interleaved):\n\n",
        WINDOW.as_secs()
    ));
    out.push_str("| way | calls/s | vs direct | CPU µs/call (servers) | CPU µs/call (the hop alone) | failed |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|\n");
    let base = direct.per_second();
    for (name, row) in [
        ("direct (no idempotency, no key)", direct),
        ("through `idemgate proxy` (memory, new key)", through),
        ("in-process layer (memory, new key)", in_process),
    ] {
        let hop = row.hop_cpu.map_or("—".to_owned(), |cpu| {
            format!("{:.1}", Row::micros_per_call(cpu, row.calls))
        });
        out.push_str(&format!(
            "| {name} | {:.0} | {:.2}× | {:.1} | {hop} | {} |\n",
            row.per_second(),
            row.per_second() / base.max(f64::EPSILON),
            Row::micros_per_call(row.cpu, row.calls),
            row.failures,
        ));
    }
    out
}
