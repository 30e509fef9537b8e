//! The `idemgate-relay` binary over its control channel, against a counting HTTP
//! upstream, with a client that reuses its connection (as browsers and pooled
//! clients do): request faults land on the right request, and the counts are exact.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// An HTTP/1.1 upstream that answers every request `200 ok` on kept-alive
/// connections and counts the requests it answered.
async fn upstream() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&answered);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0; 4096];
                while let Ok(n @ 1..) = stream.read(&mut chunk).await {
                    buf.extend_from_slice(&chunk[..n]);
                    // These tests send heads without bodies.
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        counter.fetch_add(1, Ordering::SeqCst);
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, answered)
}

struct RelayProcess {
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    addr: String,
}

impl RelayProcess {
    async fn start(upstream: std::net::SocketAddr) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_idemgate-relay"))
            .arg(upstream.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start idemgate-relay");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = within("the listening line", stdout.next_line())
            .await
            .unwrap()
            .expect("the listening line");
        let addr = first
            .strip_prefix("{\"listening\":\"")
            .and_then(|rest| rest.strip_suffix("\"}"))
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .to_owned();
        Self {
            _child: child,
            stdin,
            stdout,
            addr,
        }
    }

    async fn command(&mut self, line: &str) -> String {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        within("the relay's answer", self.stdout.next_line())
            .await
            .unwrap()
            .expect("an answer")
    }
}

/// Sends one bodiless request on `stream` and reads its answer; `None` when the
/// connection ended (closed or reset) before a whole answer came.
async fn get(stream: &mut TcpStream, method: &str) -> Option<String> {
    let head = format!("{method} / HTTP/1.1\r\nhost: relay\r\ncontent-length: 0\r\n\r\n");
    stream.write_all(head.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    let mut chunk = [0; 256];
    while !answer.ends_with(b"\r\n\r\nok") {
        match within("an answer from the relay", stream.read(&mut chunk)).await {
            Ok(n @ 1..) => answer.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
    Some(String::from_utf8(answer).unwrap())
}

#[tokio::test]
async fn a_request_fault_lands_on_a_reused_connection_and_requests_are_counted() {
    let (upstream, answered) = upstream().await;
    let mut relay = RelayProcess::start(upstream).await;
    let mut stream = TcpStream::connect(&relay.addr).await.unwrap();
    assert!(get(&mut stream, "GET").await.is_some());
    assert_eq!(
        relay.command("request lose-response").await,
        "{\"ok\":true}"
    );
    assert_eq!(get(&mut stream, "POST").await, None, "the answer was lost");
    assert_eq!(
        answered.load(Ordering::SeqCst),
        2,
        "the server answered the lost one"
    );
    let stats = relay.command("stats").await;
    assert!(
        stats.starts_with("{\"connections\":1,\"forwarded\":1,\"requests\":2,"),
        "{stats}"
    );
}

#[tokio::test]
async fn a_method_filter_lets_other_requests_pass_and_a_reset_keeps_the_request_from_the_server() {
    let (upstream, answered) = upstream().await;
    let mut relay = RelayProcess::start(upstream).await;
    assert_eq!(relay.command("request reset POST").await, "{\"ok\":true}");
    let mut stream = TcpStream::connect(&relay.addr).await.unwrap();
    assert!(
        get(&mut stream, "GET").await.is_some(),
        "a GET passes it by"
    );
    assert!(get(&mut stream, "GET").await.is_some());
    assert_eq!(get(&mut stream, "POST").await, None, "reset");
    assert_eq!(
        answered.load(Ordering::SeqCst),
        2,
        "the reset POST never reached the server"
    );
    let mut fresh = TcpStream::connect(&relay.addr).await.unwrap();
    assert!(
        get(&mut fresh, "POST").await.is_some(),
        "one fault, one POST"
    );
    assert_eq!(answered.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn connection_faults_delay_and_reset_new_connections() {
    let (upstream, answered) = upstream().await;
    let mut relay = RelayProcess::start(upstream).await;
    assert_eq!(relay.command("connection reset").await, "{\"ok\":true}");
    assert_eq!(relay.command("connection delay 400").await, "{\"ok\":true}");
    // The relay accepts and resets at once; the reset can reach us before
    // `connect` has finished, and then `connect` itself reports it.
    match TcpStream::connect(&relay.addr).await {
        Ok(mut reset) => assert_eq!(get(&mut reset, "POST").await, None),
        Err(error) => assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset),
    }
    let mut delayed = TcpStream::connect(&relay.addr).await.unwrap();
    let started = Instant::now();
    assert!(get(&mut delayed, "POST").await.is_some());
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(answered.load(Ordering::SeqCst), 1);
    assert!(
        relay
            .command("stats")
            .await
            .starts_with("{\"connections\":2,\"forwarded\":1,"),
        "the reset connection forwarded nothing"
    );
}

#[tokio::test]
async fn a_trickled_answer_comes_whole_one_byte_per_interval_and_only_for_its_request() {
    let (upstream, answered) = upstream().await;
    let mut relay = RelayProcess::start(upstream).await;
    let mut stream = TcpStream::connect(&relay.addr).await.unwrap();
    assert_eq!(relay.command("request trickle 10").await, "{\"ok\":true}");
    let head = "GET / HTTP/1.1\r\nhost: relay\r\ncontent-length: 0\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let reads = read_answer(&mut stream).await;
    assert!(
        reads >= 2,
        "it came in pieces, not as one write: {reads} reads"
    );
    let least = Duration::from_millis(10) * u32::try_from(ANSWER.len()).unwrap();
    assert!(started.elapsed() >= least, "{:?}", started.elapsed());
    assert_eq!(answered.load(Ordering::SeqCst), 1);
    // The trickle was that request's: the next one's answer is one write again.
    stream.write_all(head.as_bytes()).await.unwrap();
    assert_eq!(read_answer(&mut stream).await, 1, "passed on untouched");
    assert_eq!(answered.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_cut_body_passes_the_head_and_one_byte_then_closes() {
    let (upstream, answered) = upstream().await;
    let mut relay = RelayProcess::start(upstream).await;
    assert_eq!(relay.command("request cut-body").await, "{\"ok\":true}");
    let mut stream = TcpStream::connect(&relay.addr).await.unwrap();
    let head = "GET / HTTP/1.1\r\nhost: relay\r\ncontent-length: 0\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut received = Vec::new();
    // The end: a close (or a reset).
    let _ = within("the relay's close", stream.read_to_end(&mut received)).await;
    assert_eq!(
        received,
        &ANSWER[..ANSWER.len() - 1],
        "the head and the first byte of `ok`"
    );
    assert_eq!(answered.load(Ordering::SeqCst), 1, "the server answered it");
}

/// Awaits `io`, failing the test after 10 s: a relay that stops answering or
/// closing fails the test instead of hanging the suite.
async fn within<T>(what: &str, io: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), io)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within 10 s"))
}

/// What the upstream answers to every request.
const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// Reads one whole [`ANSWER`] from `stream`; returns how many reads it took.
async fn read_answer(stream: &mut TcpStream) -> usize {
    let (mut answer, mut reads) = (Vec::new(), 0);
    let mut chunk = [0; 256];
    while answer.len() < ANSWER.len() {
        let n = within("an answer from the relay", stream.read(&mut chunk))
            .await
            .unwrap();
        assert!(n > 0, "the connection ended after {answer:?}");
        answer.extend_from_slice(&chunk[..n]);
        reads += 1;
    }
    assert_eq!(answer, ANSWER, "every byte, in order");
    reads
}

#[tokio::test]
async fn a_bad_line_is_answered_with_an_error_and_closing_stdin_ends_it() {
    let (upstream, _) = upstream().await;
    let mut relay = RelayProcess::start(upstream).await;
    let answer = relay.command("request explode").await;
    assert!(
        answer.starts_with("{\"error\":\"FAULT is one of"),
        "{answer}"
    );
    let RelayProcess {
        mut _child, stdin, ..
    } = relay;
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(10), _child.wait())
        .await
        .expect("it exits when its input closes")
        .unwrap();
    assert!(status.success(), "{status}");
}
