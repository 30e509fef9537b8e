//! The streams suite (`--suite streams`, issue 37): what `idemgate proxy` adds
//! to a streamed answer (PROTOCOL §20) against the same upstream straight.
//!
//! - **Time to the first event and to the end** of a Server-Sent Events answer
//!   (an LLM's tokens: the first at once, the rest a few ms apart), one request
//!   per connection, direct, through nginx as a plain reverse proxy (the
//!   reference hop; the upstream says `X-Accel-Buffering: no`, as an event
//!   stream behind nginx does) and through the proxy with a new key each,
//!   interleaved; then each of those keys again: the stored stream replayed.
//! - **Throughput** of a large NDJSON answer (past the stored-response limit:
//!   it flows through and is not retained), direct, through nginx and through
//!   the proxy.
//!
//! Latencies are wall-clock on a shared machine: compare the rows of one run.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::BoxError;
use crate::hops::{NginxProcess, UpstreamProcess};
use crate::server::{ServerProcess, build_server};

/// Requests per row of the latency table.
const ROUNDS: usize = 200;
/// Events per streamed answer, and the upstream's pause between them.
const EVENTS: u64 = 10;
const GAP_MS: u64 = 5;
/// The bulk answer's size, and how many times each way.
const BULK_MIB: u64 = 256;
const BULK_RUNS: usize = 3;

/// One streamed answer as a client saw it.
struct Timing {
    first_event: Duration,
    end: Duration,
    replayed: bool,
    /// The `data:` lines of the body (SSE events; none in NDJSON).
    events: usize,
}

/// The stores the proxy streams through, each a proxy of its own: its name
/// in the report, and its `--idempotency-store`.
fn stores(root: &Path, postgres_url: &str, redis_url: &str) -> Vec<(&'static str, String)> {
    let sqlite = root.join("target/bench/streams-sqlite.db");
    vec![
        ("memory", "memory".to_owned()),
        ("SQLite", format!("sqlite://{}", sqlite.display())),
        ("PostgreSQL", postgres_url.to_owned()),
        ("Redis", redis_url.to_owned()),
    ]
}

/// Runs the suite; its report as Markdown.
pub(crate) async fn suite(
    root: &Path,
    postgres_url: &str,
    redis_url: &str,
) -> Result<String, BoxError> {
    let binary = build_server(root).await?;
    let bench_dir = root.join("target/bench");
    std::fs::create_dir_all(&bench_dir)?;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(bench_dir.join(format!("streams-sqlite.db{suffix}")));
        let _ = std::fs::remove_file(bench_dir.join(format!("streams-recorded.db{suffix}")));
    }
    // The bulk answer recorded whole, on SQLite: a route whose stored-response
    // limit is past it.
    let routes = bench_dir.join("streams-routes.toml");
    std::fs::write(
        &routes,
        format!(
            "[[route]]\nmethod = \"POST\"\npath = \"/bulk\"\nmax_stored_response = {}\n",
            (BULK_MIB + 1) << 20
        ),
    )?;
    let upstream = UpstreamProcess::start().await?;
    let mut proxies: Vec<(&'static str, ServerProcess)> = Vec::new();
    let started = async {
        // The journal is off: what is measured is the stream, not the audit trail.
        for (name, store) in stores(root, postgres_url, redis_url) {
            let args = [
                "--idempotency-store".to_owned(),
                store,
                "--audit".to_owned(),
                "off".to_owned(),
            ];
            proxies.push((
                name,
                ServerProcess::start_proxy(&binary, upstream.addr, &args, &[]).await?,
            ));
        }
        let recorded = bench_dir.join("streams-recorded.db");
        let args = [
            "--idempotency-store".to_owned(),
            format!("sqlite://{}", recorded.display()),
            "--audit".to_owned(),
            "off".to_owned(),
            "--config".to_owned(),
            routes.display().to_string(),
        ];
        let recording = ServerProcess::start_proxy(&binary, upstream.addr, &args, &[]).await?;
        let nginx =
            NginxProcess::start(&root.join("target/bench/streams-nginx"), upstream.addr).await?;
        Ok::<_, BoxError>((recording, nginx))
    }
    .await;
    let (recording, nginx) = match started {
        Ok(started) => started,
        Err(error) => {
            for (_, proxy) in proxies {
                proxy.stop().await;
            }
            upstream.stop().await;
            return Err(error);
        }
    };
    let stream_path = format!("/stream?events={EVENTS}&gap_ms={GAP_MS}");
    let outcome = async {
        let (mut direct, mut via_nginx) = (Vec::new(), Vec::new());
        let mut through: Vec<Vec<Timing>> = proxies.iter().map(|_| Vec::new()).collect();
        let mut replayed: Vec<Vec<Timing>> = proxies.iter().map(|_| Vec::new()).collect();
        let mut keys = Vec::with_capacity(ROUNDS);
        let ways = 2 + proxies.len();
        for round in 0..ROUNDS {
            let key = uuid::Uuid::new_v4().to_string();
            // Rotate which goes first, so none always follows another.
            for turn in 0..ways {
                match (round + turn) % ways {
                    0 => direct.push(request(upstream.addr, &stream_path, None).await?),
                    1 => via_nginx.push(request(nginx.addr, &stream_path, None).await?),
                    way => {
                        let proxy = &proxies[way - 2].1;
                        through[way - 2].push(request(proxy.addr, &stream_path, Some(&key)).await?);
                    }
                }
            }
            keys.push(key);
        }
        for key in &keys {
            for (at, (_, proxy)) in proxies.iter().enumerate() {
                replayed[at].push(request(proxy.addr, &stream_path, Some(key)).await?);
            }
        }
        let new_replayed = through.iter().flatten().any(|t| t.replayed);
        if new_replayed || replayed.iter().flatten().any(|t| !t.replayed) {
            return Err::<_, BoxError>("a new key was replayed, or a retry was not".into());
        }
        if through
            .iter()
            .flatten()
            .chain(replayed.iter().flatten())
            .chain(&via_nginx)
            .any(|t| t.events != direct[0].events)
        {
            return Err("the proxy's stream has other events than the upstream's".into());
        }
        let bulk_path = format!("/bulk?mib={BULK_MIB}");
        let mut bulk = Bulk::default();
        for _ in 0..BULK_RUNS {
            bulk.direct
                .push(request(upstream.addr, &bulk_path, None).await?);
            bulk.nginx
                .push(request(nginx.addr, &bulk_path, None).await?);
            let key = uuid::Uuid::new_v4().to_string();
            bulk.proxy
                .push(request(proxies[0].1.addr, &bulk_path, Some(&key)).await?);
            let key = uuid::Uuid::new_v4().to_string();
            bulk.recorded
                .push(request(recording.addr, &bulk_path, Some(&key)).await?);
            let replay = request(recording.addr, &bulk_path, Some(&key)).await?;
            if !replay.replayed {
                return Err("the recorded bulk answer was not replayed".into());
            }
            bulk.recorded_replay.push(replay);
        }
        let names: Vec<&str> = proxies.iter().map(|(name, _)| *name).collect();
        Ok(markdown(
            &direct, &via_nginx, &names, &through, &replayed, &bulk,
        ))
    }
    .await;
    nginx.stop().await;
    recording.stop().await;
    for (_, proxy) in proxies {
        proxy.stop().await;
    }
    upstream.stop().await;
    outcome
}

/// `POST path` on a new connection (`Connection: close`), keyed when `key`
/// is given; read to the end.
async fn request(addr: SocketAddr, path: &str, key: Option<&str>) -> Result<Timing, BoxError> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let key_line = key.map_or(String::new(), |key| format!("Idempotency-Key: {key}\r\n"));
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer bench\r\n\
         Content-Type: application/json\r\n{key_line}Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    let started = Instant::now();
    stream.write_all(head.as_bytes()).await?;
    let mut seen = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0; 256 * 1024];
    let mut header_end = None;
    let mut first_event = None;
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        // Kept whole while small (the events are counted at the end); a bulk
        // answer is only read.
        if seen.len() < 1024 * 1024 {
            seen.extend_from_slice(&chunk[..n]);
        }
        if first_event.is_some() {
            continue;
        }
        if header_end.is_none() {
            header_end = seen
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map(|at| at + 4);
        }
        // The first event (`data:`) or record (`{`) of the body.
        if let Some(end) = header_end
            && seen[end..]
                .windows(5)
                .any(|w| w == b"data:" || w.starts_with(b"{\""))
        {
            first_event = Some(started.elapsed());
        }
    }
    let end = started.elapsed();
    let header_end = header_end.ok_or("no response head")?;
    let head = String::from_utf8_lossy(&seen[..header_end]).to_ascii_lowercase();
    if !head.starts_with("http/1.1 200") {
        return Err(format!("{path}: {}", head.lines().next().unwrap_or_default()).into());
    }
    Ok(Timing {
        first_event: first_event.ok_or("no event in the body")?,
        end,
        replayed: head.contains("idempotent-replayed: true"),
        events: seen[header_end..]
            .windows(5)
            .filter(|w| *w == b"data:")
            .count(),
    })
}

fn percentile(values: &mut [Duration], p: f64) -> Duration {
    values.sort_unstable();
    let at = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[at]
}

fn ms(duration: Duration) -> String {
    format!("{:.2}", duration.as_secs_f64() * 1e3)
}

/// The bulk answers, each way.
#[derive(Default)]
struct Bulk {
    direct: Vec<Timing>,
    nginx: Vec<Timing>,
    /// Through the proxy on the memory store, past the limit (not retained).
    proxy: Vec<Timing>,
    /// Through the proxy on SQLite, recorded whole in pieces.
    recorded: Vec<Timing>,
    /// That recorded answer, replayed from the SQLite pieces.
    recorded_replay: Vec<Timing>,
}

fn markdown(
    direct: &[Timing],
    via_nginx: &[Timing],
    names: &[&str],
    through: &[Vec<Timing>],
    replayed: &[Vec<Timing>],
    bulk: &Bulk,
) -> String {
    let row = |name: &str, timings: &[Timing]| {
        let mut first: Vec<Duration> = timings.iter().map(|t| t.first_event).collect();
        let mut end: Vec<Duration> = timings.iter().map(|t| t.end).collect();
        format!(
            "| {name} | {} | {} | {} | {} |\n",
            ms(percentile(&mut first, 0.5)),
            ms(percentile(&mut first, 0.99)),
            ms(percentile(&mut end, 0.5)),
            ms(percentile(&mut end, 0.99)),
        )
    };
    let rate = |timings: &[Timing]| {
        let mut ends: Vec<Duration> = timings.iter().map(|t| t.end).collect();
        BULK_MIB as f64 / percentile(&mut ends, 0.5).as_secs_f64()
    };
    let (rate_direct, rate_nginx, rate_proxy) =
        (rate(&bulk.direct), rate(&bulk.nginx), rate(&bulk.proxy));
    let (rate_recorded, rate_replay) = (rate(&bulk.recorded), rate(&bulk.recorded_replay));
    let mut out = format!(
        "{ROUNDS} Server-Sent Events answers of {EVENTS} events, {GAP_MS} ms apart, each way \
         (one request per connection, every way interleaved; the proxy on each store, \
         the journal off, recording each stream in the store in pieces as it flows):\n\n\
         | path | first event p50 ms | first event p99 ms | end p50 ms | end p99 ms |\n\
         |---|---:|---:|---:|---:|\n"
    );
    out.push_str(&row("direct", direct));
    out.push_str(&row("nginx, plain reverse proxy", via_nginx));
    for (at, name) in names.iter().enumerate() {
        out.push_str(&row(
            &format!("proxy on {name}, new key (streamed through)"),
            &through[at],
        ));
    }
    for (at, name) in names.iter().enumerate() {
        out.push_str(&row(
            &format!("proxy on {name}, replay (read from the store)"),
            &replayed[at],
        ));
    }
    out.push_str(&format!(
        "\n{BULK_MIB} MiB of NDJSON, median of {BULK_RUNS} runs each: direct \
         {rate_direct:.0} MiB/s, through nginx {rate_nginx:.0} MiB/s ({:.2}×), through the \
         proxy past the stored-response limit (memory store, streamed through, not retained) \
         {rate_proxy:.0} MiB/s ({:.2}×; {:.2}× nginx's); through the proxy on SQLite recorded \
         whole in pieces (the route's limit past it) {rate_recorded:.0} MiB/s ({:.2}×), and \
         that answer replayed from the SQLite pieces {rate_replay:.0} MiB/s ({:.2}×).\n",
        rate_nginx / rate_direct,
        rate_proxy / rate_direct,
        rate_proxy / rate_nginx,
        rate_recorded / rate_direct,
        rate_replay / rate_direct,
    ));
    out
}
