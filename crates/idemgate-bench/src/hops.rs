//! What the proxy benchmark puts between the load and the answer: a minimal fast
//! upstream (this binary again, as a child process, so its CPU is its own), and
//! nginx as a plain reverse proxy — the physical reference for one proxy hop.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};

use crate::BoxError;
use crate::server::process_cpu_time;

/// Set (to anything) in a child's environment: this binary runs as the upstream.
pub(crate) const UPSTREAM_ROLE: &str = "IDEMGATE_BENCH_UPSTREAM";

/// What the upstream answers to every request: a created order, the size of the
/// orders service's answer.
const UPSTREAM_BODY: &[u8] =
    br#"{"id":"0b8f5c9e-6a2e-4a51-9d1e-1c2f3a4b5c6d","status":"created","amount":1500}"#;

/// The upstream's main: one thread, hyper HTTP/1.1 keep-alive, reads each body
/// and answers `201` with [`UPSTREAM_BODY`]. Prints its address on stdout.
pub(crate) async fn serve_upstream() -> Result<(), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        tokio::spawn(async move {
            let service = hyper::service::service_fn(answer);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// An answer of the upstream: the created order, or a stream (`/stream`,
/// `/bulk`: the streams suite, [`crate::streams`]).
type Answer = Either<Full<Bytes>, Streamed>;

async fn answer(request: Request<Incoming>) -> Result<Response<Answer>, Infallible> {
    let streamed = Streamed::asked_by(request.uri());
    // Read the whole body, as a real handler would.
    let _ = request.into_body().collect().await;
    if let Some(streamed) = streamed {
        let content_type = streamed.content_type();
        let mut response = Response::new(Either::Right(streamed));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(content_type),
        );
        // As an event-stream server behind nginx says: pass each event on as
        // it comes (nginx buffers a proxied answer otherwise).
        response.headers_mut().insert(
            http::HeaderName::from_static("x-accel-buffering"),
            http::HeaderValue::from_static("no"),
        );
        return Ok(response);
    }
    let mut response = Response::new(Either::Left(Full::new(Bytes::from_static(UPSTREAM_BODY))));
    *response.status_mut() = http::StatusCode::CREATED;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// A streamed answer, sent without a length: `/stream?events=N&gap_ms=M`,
/// Server-Sent Events (an LLM's tokens: the first at once, the next `M` ms
/// apart); `/bulk?mib=N`, N MiB of NDJSON in 64 KiB chunks, as fast as read.
pub(crate) struct Streamed {
    kind: StreamKind,
    sent: u64,
    total: u64,
    gap: Duration,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
}

enum StreamKind {
    Events,
    Bulk(Bytes),
}

impl Streamed {
    fn asked_by(uri: &http::Uri) -> Option<Self> {
        let number = |name: &str| -> u64 {
            uri.query()
                .unwrap_or_default()
                .split('&')
                .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
                .and_then(|value| value.parse().ok())
                .unwrap_or(0)
        };
        match uri.path() {
            "/stream" => Some(Self {
                kind: StreamKind::Events,
                sent: 0,
                total: number("events").max(1),
                gap: Duration::from_millis(number("gap_ms")),
                wait: None,
            }),
            "/bulk" => {
                let line = b"{\"row\":\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\"}\n";
                let chunk: Vec<u8> = line.iter().copied().cycle().take(64 * 1024).collect();
                Some(Self {
                    kind: StreamKind::Bulk(Bytes::from(chunk)),
                    sent: 0,
                    total: number("mib").max(1) * 16,
                    gap: Duration::ZERO,
                    wait: None,
                })
            }
            _ => None,
        }
    }

    fn content_type(&self) -> &'static str {
        match self.kind {
            StreamKind::Events => "text/event-stream",
            StreamKind::Bulk(_) => "application/x-ndjson",
        }
    }
}

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.sent == self.total {
            return Poll::Ready(None);
        }
        if self.sent > 0 && !self.gap.is_zero() {
            let gap = self.gap;
            let wait = self
                .wait
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
            if wait.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.wait = None;
        }
        let n = self.sent;
        self.sent += 1;
        let data = match &self.kind {
            StreamKind::Events => Bytes::from(format!(
                "id: {n}\ndata: {{\"token\":{n},\"text\":\"lorem\"}}\n\n"
            )),
            StreamKind::Bulk(chunk) => chunk.clone(),
        };
        Poll::Ready(Some(Ok(Frame::data(data))))
    }
}

/// The upstream child process.
pub(crate) struct UpstreamProcess {
    child: Child,
    pid: u32,
    pub(crate) addr: SocketAddr,
}

impl UpstreamProcess {
    /// Starts this binary as the upstream and reads the address it prints.
    pub(crate) async fn start() -> Result<Self, BoxError> {
        let mut child = Command::new(std::env::current_exe()?)
            .env(UPSTREAM_ROLE, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().ok_or("the upstream exited at once")?;
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        let line = tokio::time::timeout(Duration::from_secs(10), async {
            BufReader::new(stdout).lines().next_line().await
        })
        .await
        .map_err(|_| "the upstream printed no address within 10 s")??
        .ok_or("the upstream exited before listening")?;
        Ok(Self {
            child,
            pid,
            addr: line.trim().parse()?,
        })
    }

    pub(crate) fn cpu_time(&self) -> Result<Duration, BoxError> {
        process_cpu_time(self.pid)
    }

    pub(crate) async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// nginx as a plain reverse proxy to the upstream, with upstream keep-alive, as
/// one would deploy it; master and workers stopped together.
pub(crate) struct NginxProcess {
    child: Child,
    master: u32,
    dir: PathBuf,
    pub(crate) addr: SocketAddr,
    pub(crate) version: String,
    pub(crate) workers: usize,
}

/// The nginx binary: on `PATH`, else Debian's `/usr/sbin/nginx`.
fn nginx_binary() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("nginx"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/nginx"))
}

/// The generated configuration: `worker_processes` as many as the proxy's tokio
/// workers (one per CPU), no access log, HTTP/1.1 keep-alive to the upstream,
/// `X-Forwarded-*` set as `idemgate proxy` sets them.
fn nginx_config(dir: &Path, listen: SocketAddr, upstream: SocketAddr, workers: usize) -> String {
    let dir = dir.display();
    format!(
        "daemon off;\n\
         master_process on;\n\
         worker_processes {workers};\n\
         pid {dir}/nginx.pid;\n\
         error_log {dir}/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
         \x20 access_log off;\n\
         \x20 client_body_temp_path {dir}/body;\n\
         \x20 proxy_temp_path {dir}/proxy;\n\
         \x20 fastcgi_temp_path {dir}/fastcgi;\n\
         \x20 uwsgi_temp_path {dir}/uwsgi;\n\
         \x20 scgi_temp_path {dir}/scgi;\n\
         \x20 upstream app {{ server {upstream}; keepalive 64; }}\n\
         \x20 server {{\n\
         \x20   listen {listen} reuseport;\n\
         \x20   keepalive_requests 1000000;\n\
         \x20   location / {{\n\
         \x20     proxy_pass http://app;\n\
         \x20     proxy_http_version 1.1;\n\
         \x20     proxy_set_header Connection \"\";\n\
         \x20     proxy_set_header Host $host;\n\
         \x20     proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
         \x20     proxy_set_header X-Forwarded-Proto $scheme;\n\
         \x20     proxy_set_header X-Forwarded-Host $host;\n\
         \x20   }}\n\
         \x20 }}\n\
         }}\n"
    )
}

impl NginxProcess {
    /// Writes the configuration under `dir` and starts nginx on a free port.
    pub(crate) async fn start(dir: &Path, upstream: SocketAddr) -> Result<Self, BoxError> {
        let binary = nginx_binary();
        let version = std::process::Command::new(&binary)
            .arg("-v")
            .output()
            .map_err(|e| {
                format!(
                    "{} -v: {e} (scripts/services.sh nginx installs it)",
                    binary.display()
                )
            })?;
        let version = String::from_utf8_lossy(&version.stderr)
            .trim()
            .trim_start_matches("nginx version: ")
            .to_owned();
        std::fs::create_dir_all(dir)?;
        let addr = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
            probe.local_addr()?
        };
        let workers = std::thread::available_parallelism().map_or(2, usize::from);
        let config = dir.join("nginx.conf");
        std::fs::write(&config, nginx_config(dir, addr, upstream, workers))?;
        let child = Command::new(&binary)
            .arg("-p")
            .arg(dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let master = child.id().ok_or("nginx exited at once")?;
        let nginx = Self {
            child,
            master,
            dir: dir.to_owned(),
            addr,
            version,
            workers,
        };
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(nginx);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
        nginx.stop().await;
        Err(format!("nginx did not listen on {addr} within 5 s:\n{log}").into())
    }

    /// The CPU time of the master and its workers so far.
    pub(crate) fn cpu_time(&self) -> Result<Duration, BoxError> {
        let mut total = process_cpu_time(self.master)?;
        for pid in children_of(self.master) {
            total += process_cpu_time(pid).unwrap_or_default();
        }
        Ok(total)
    }

    /// SIGQUIT (graceful), then SIGKILL if the master lingers.
    pub(crate) async fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-QUIT", &self.master.to_string()])
            .status()
            .await;
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The pids whose parent is `parent` (/proc/PID/stat field 4).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nginx_config_proxies_with_keep_alive_to_the_upstream() {
        let config = nginx_config(
            Path::new("/tmp/x"),
            "127.0.0.1:81".parse().unwrap(),
            "127.0.0.1:82".parse().unwrap(),
            2,
        );
        for expected in [
            "worker_processes 2;",
            "upstream app { server 127.0.0.1:82; keepalive 64; }",
            "listen 127.0.0.1:81 reuseport;",
            "proxy_http_version 1.1;",
            "proxy_set_header Connection \"\";",
            "pid /tmp/x/nginx.pid;",
        ] {
            assert!(config.contains(expected), "{expected:?} missing:\n{config}");
        }
    }
}
