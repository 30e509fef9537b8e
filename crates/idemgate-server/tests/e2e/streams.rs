//! Streamed answers through the real `idemgate proxy` (PROTOCOL §20), on every
//! store: an upstream answering Server-Sent Events that the test releases one at
//! a time, so "the client saw event 1 before event 2 existed" holds by
//! construction; the retry's replay is byte-identical, and with `Last-Event-ID`
//! starts after that event; a cut stream is never replayed as complete; the
//! upstream ran once.

use std::time::Duration;

use axum::http::StatusCode;
use bytes::Bytes;

use crate::support::client::{Client, new_key};
use crate::support::proxy::{Proxy, ProxyOptions, StreamedEvent, Upstream};
use crate::support::server::{TempDir, postgres_url, redis_url};

const COMPLETION: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

fn event(n: usize) -> StreamedEvent {
    Ok(Bytes::from(format!("id: {n}\ndata: {{\"token\":{n}}}\n\n")))
}

fn bytes_of(events: std::ops::RangeInclusive<usize>) -> Vec<u8> {
    events.flat_map(|n| event(n).unwrap().to_vec()).collect()
}

/// A streaming client (reqwest, as an application's would be): the keyed
/// completion POST as `client`, resuming after `last_event_id` when given;
/// its head within 5 s, its body unread.
async fn post_completion(
    proxy: &Proxy,
    client: &Client,
    key: &str,
    last_event_id: Option<&str>,
) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(proxy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .bearer_auth(&client.token)
        .body(COMPLETION);
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id);
    }
    tokio::time::timeout(Duration::from_secs(5), request.send())
        .await
        .expect("the head arrives while the stream is still produced")
        .expect("the head")
}

/// [`post_completion`]'s answer, checked to be an event stream sent as one.
async fn open(proxy: &Proxy, client: &Client, key: &str) -> reqwest::Response {
    let response = post_completion(proxy, client, key, None).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert!(
        response.headers().get("content-length").is_none(),
        "a stream is not re-framed with a length"
    );
    response
}

/// Reads `response`'s clean end (within 10 s), nothing before it.
async fn expect_clean_end(who: &str, response: &mut reqwest::Response) {
    let end = tokio::time::timeout(Duration::from_secs(10), response.chunk())
        .await
        .expect("the end within 10 s");
    assert!(
        matches!(end, Ok(None)),
        "{who}: a clean end once the stream is recorded: {end:?}"
    );
}

/// Reads from `response` until `seen` ends with `expected`.
async fn read_until(response: &mut reqwest::Response, seen: &mut Vec<u8>, expected: &[u8]) {
    while !seen.ends_with(expected) {
        let chunk = tokio::time::timeout(Duration::from_secs(5), response.chunk())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "waited 5 s for {:?}; the proxy held back {:?}",
                    String::from_utf8_lossy(expected),
                    String::from_utf8_lossy(seen)
                )
            })
            .expect("the stream goes on")
            .expect("not ended before the expected bytes");
        seen.extend_from_slice(&chunk);
    }
}

async fn streams_through_and_replays(store: &str) {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(ProxyOptions::new(upstream.url()).store(store)).await;
    let key = new_key();
    let events = upstream.stream_next();
    events.send(event(1)).await.unwrap();
    let client = Client::new();
    let mut response = open(&proxy, &client, &key).await;
    let mut seen = Vec::new();
    // (a) The first event, while the upstream has not produced the second.
    read_until(&mut response, &mut seen, &event(1).unwrap()).await;
    // (b) A retry mid-stream (the client's connection dropped, say) joins it on
    // this instance: from its first byte, then live.
    let mut joined = open(&proxy, &client, &key).await;
    assert_eq!(joined.headers()["idempotent-replayed"], "true");
    let mut joined_seen = Vec::new();
    read_until(&mut joined, &mut joined_seen, &event(1).unwrap()).await;
    for n in 2..=5 {
        events.send(event(n)).await.unwrap();
        read_until(&mut response, &mut seen, &event(n).unwrap()).await;
        read_until(&mut joined, &mut joined_seen, &event(n).unwrap()).await;
    }
    drop(events);
    expect_clean_end("first", &mut response).await;
    expect_clean_end("joined", &mut joined).await;
    assert_eq!(seen, bytes_of(1..=5));
    assert_eq!(joined_seen, seen, "the joined stream is byte-identical");

    // (c) After the end: the same bytes, replayed; (f) the upstream ran once.
    let retry = client
        .post(&proxy.url("/v1/chat/completions"), Some(&key), COMPLETION)
        .await;
    assert_eq!(retry.status, StatusCode::OK, "{retry:?}");
    assert!(retry.replayed());
    assert_eq!(retry.headers["content-type"], "text/event-stream");
    assert_eq!(
        retry.body, seen,
        "byte-identical to the first client's stream"
    );

    // (d) An SSE client reconnecting with `Last-Event-ID: 3`: events 4 and 5.
    let resumed = client
        .send(
            reqwest::Method::POST,
            &proxy.url("/v1/chat/completions"),
            Some(&key),
            &[("content-type", "application/json"), ("last-event-id", "3")],
            Some(COMPLETION),
        )
        .await;
    assert_eq!(resumed.status, StatusCode::OK, "{resumed:?}");
    assert!(resumed.replayed());
    assert_eq!(resumed.body, bytes_of(4..=5));
    assert_eq!(upstream.executions(), 1);
}

/// An NDJSON stream to a client that accepts gzip (as most HTTP libraries
/// say by default): each record reaches it as the upstream sends it, not held
/// in a compressor's buffer until the end, and the replay is the same bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ndjson_stream_flows_uncompressed_to_a_gzip_client() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(ProxyOptions::new(upstream.url())).await;
    let key = new_key();
    let records = upstream.stream_next_as("application/x-ndjson");
    let record = |n: usize| Bytes::from(format!("{{\"row\":{n}}}\n"));
    records.send(Ok(record(1))).await.unwrap();
    let client = Client::new();
    let mut response = tokio::time::timeout(
        Duration::from_secs(5),
        reqwest::Client::new()
            .post(proxy.url("/v1/exports"))
            .header("content-type", "application/json")
            .header("accept-encoding", "gzip")
            .header("idempotency-key", &key)
            .bearer_auth(&client.token)
            .body("{}")
            .send(),
    )
    .await
    .expect("the head arrives while the stream is still produced")
    .expect("the head");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers().get("content-encoding").is_none(),
        "a stream is not compressed: {:?}",
        response.headers()
    );
    let mut seen = Vec::new();
    read_until(&mut response, &mut seen, &record(1)).await;
    records.send(Ok(record(2))).await.unwrap();
    read_until(&mut response, &mut seen, &record(2)).await;
    drop(records);
    let end = tokio::time::timeout(Duration::from_secs(10), response.chunk())
        .await
        .expect("the end within 10 s");
    assert!(matches!(end, Ok(None)), "a clean end: {end:?}");
    let retry = client
        .send(
            reqwest::Method::POST,
            &proxy.url("/v1/exports"),
            Some(&key),
            &[
                ("content-type", "application/json"),
                ("accept-encoding", "gzip"),
            ],
            Some("{}"),
        )
        .await;
    assert!(retry.replayed(), "{retry:?}");
    assert!(retry.headers.get("content-encoding").is_none(), "{retry:?}");
    assert_eq!(retry.body, seen);
    assert_eq!(upstream.executions(), 1);
}

async fn a_cut_stream_is_never_complete(store: &str) {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(ProxyOptions::new(upstream.url()).store(store)).await;
    let key = new_key();
    let events = upstream.stream_next();
    events.send(event(1)).await.unwrap();
    let client = Client::new();
    let mut response = open(&proxy, &client, &key).await;
    let mut seen = Vec::new();
    read_until(&mut response, &mut seen, &event(1).unwrap()).await;
    events.send(event(2)).await.unwrap();
    read_until(&mut response, &mut seen, &event(2).unwrap()).await;
    // (e) The upstream resets after half of the events.
    events
        .send(Err(std::io::Error::other("upstream reset")))
        .await
        .unwrap();
    let cut = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match response.chunk().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the cut reaches the client within 10 s");
    assert!(
        cut.is_err(),
        "the client sees the cut, never a clean end: {cut:?}"
    );
    let retry = client
        .post(&proxy.url("/v1/chat/completions"), Some(&key), COMPLETION)
        .await;
    assert_ne!(
        retry.status,
        StatusCode::OK,
        "the cut stream is not replayed as a success: {retry:?}"
    );
    assert!(
        !retry.body.starts_with(&bytes_of(1..=2)),
        "the cut prefix is never replayed"
    );
    assert_eq!(upstream.executions(), 1, "kept failed: not run again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_flows_through_and_replays_on_sqlite() {
    let dir = TempDir::new("idemgate-streams");
    let store = format!("sqlite://{}", dir.path().join("proxy.db").display());
    streams_through_and_replays(&store).await;
    a_cut_stream_is_never_complete(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_flows_through_and_replays_on_postgres() {
    streams_through_and_replays(&postgres_url()).await;
    a_cut_stream_is_never_complete(&postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_flows_through_and_replays_on_redis() {
    streams_through_and_replays(&redis_url()).await;
    a_cut_stream_is_never_complete(&redis_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_flows_through_and_replays_on_memory() {
    streams_through_and_replays("memory").await;
    a_cut_stream_is_never_complete("memory").await;
}

/// A retry that reaches another instance sharing the store while the stream
/// runs joins it there (PROTOCOL §20): the stream from its first byte, read
/// from the store's pieces, then live — each event before the upstream has
/// produced the next, woken by the store (LISTEN/NOTIFY, pub/sub) — ending
/// cleanly with the first client's, byte-identical; a second one resuming
/// with `Last-Event-ID: 2` gets the events after 2; after the end, the other
/// instance replays the same bytes from the store; the upstream ran once.
async fn a_retry_on_another_instance_joins_the_stream(store: &str) {
    let upstream = Upstream::start().await;
    let first = Proxy::start(ProxyOptions::new(upstream.url()).store(store)).await;
    let second = Proxy::start(ProxyOptions::new(upstream.url()).store(store)).await;
    let key = new_key();
    let events = upstream.stream_next();
    events.send(event(1)).await.unwrap();
    let client = Client::new();
    let mut response = open(&first, &client, &key).await;
    let mut seen = Vec::new();
    read_until(&mut response, &mut seen, &event(1).unwrap()).await;
    let mut joined = open(&second, &client, &key).await;
    assert_eq!(joined.headers()["idempotent-replayed"], "true");
    let mut joined_seen = Vec::new();
    read_until(&mut joined, &mut joined_seen, &event(1).unwrap()).await;
    events.send(event(2)).await.unwrap();
    read_until(&mut response, &mut seen, &event(2).unwrap()).await;
    read_until(&mut joined, &mut joined_seen, &event(2).unwrap()).await;
    let mut resumed = post_completion(&second, &client, &key, Some("2")).await;
    assert_eq!(resumed.status(), StatusCode::OK);
    let mut resumed_seen = Vec::new();
    for n in 3..=5 {
        events.send(event(n)).await.unwrap();
        read_until(&mut response, &mut seen, &event(n).unwrap()).await;
        read_until(&mut joined, &mut joined_seen, &event(n).unwrap()).await;
        read_until(&mut resumed, &mut resumed_seen, &event(n).unwrap()).await;
    }
    drop(events);
    expect_clean_end("first", &mut response).await;
    expect_clean_end("joined", &mut joined).await;
    expect_clean_end("resumed", &mut resumed).await;
    assert_eq!(seen, bytes_of(1..=5));
    assert_eq!(joined_seen, seen, "byte-identical to the first client's");
    assert_eq!(resumed_seen, bytes_of(3..=5), "the events after id 2");
    let retry = client
        .post(&second.url("/v1/chat/completions"), Some(&key), COMPLETION)
        .await;
    assert_eq!(retry.status, StatusCode::OK, "{retry:?}");
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.headers["content-type"], "text/event-stream");
    assert_eq!(
        retry.body, seen,
        "the replay from the store, byte-identical"
    );
    assert_eq!(upstream.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_another_instance_joins_the_stream_on_postgres() {
    a_retry_on_another_instance_joins_the_stream(&postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_another_instance_joins_the_stream_on_redis() {
    a_retry_on_another_instance_joins_the_stream(&redis_url()).await;
}

/// The proxy's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|n| n.trim().parse().ok())
        .expect("VmHWM in kB");
    kib * 1024
}

/// A 1 GiB stream through the proxy: it flows whole, the proxy's memory stays
/// bounded (the kept part stops at the stored-response limit, at most 16 frames
/// wait for the client), and the record is "not retained" — never a truncated
/// replay, never a second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gibibyte_stream_flows_in_bounded_memory() {
    const CHUNK: usize = 64 * 1024;
    const CHUNKS: usize = 16 * 1024; // 1 GiB
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(ProxyOptions::new(upstream.url())).await;
    let before = peak_rss(proxy.pid());
    let key = new_key();
    let events = upstream.stream_next();
    let producer = tokio::spawn(async move {
        let chunk = Bytes::from(vec![b'x'; CHUNK]);
        for _ in 0..CHUNKS {
            if events.send(Ok(chunk.clone())).await.is_err() {
                return;
            }
        }
    });
    let client = Client::new();
    let mut response = open(&proxy, &client, &key).await;
    let mut received = 0_usize;
    let read = tokio::time::timeout(Duration::from_secs(240), async {
        while let Some(chunk) = response.chunk().await.expect("the stream goes on") {
            received += chunk.len();
        }
    })
    .await;
    assert!(read.is_ok(), "1 GiB within 240 s; got {received} bytes");
    producer.await.unwrap();
    assert_eq!(received, CHUNK * CHUNKS, "every byte flows");
    let peak = peak_rss(proxy.pid());
    eprintln!(
        "1 GiB streamed: the proxy's peak RSS {} MiB ({} MiB before)",
        peak >> 20,
        before >> 20
    );
    assert!(
        peak < 128 << 20,
        "the proxy's peak RSS is {} MiB (from {} MiB before the stream)",
        peak >> 20,
        before >> 20
    );
    let retry = client
        .post(&proxy.url("/v1/chat/completions"), Some(&key), COMPLETION)
        .await;
    assert_eq!(retry.status, StatusCode::OK, "{retry:?}");
    assert!(retry.replayed());
    assert_eq!(retry.headers["idempotency-response"], "not-retained");
    assert!(retry.body.is_empty());
    assert_eq!(upstream.executions(), 1);
}

/// A 256 MiB stream recorded whole (the route's `max_stored_response` is
/// 512 MiB) on the SQLite store: it flows to the client, is appended to the
/// store in pieces as it flows — the proxy's memory stays bounded, there is
/// no whole-stream buffer — and the retry's replay, read back from the store
/// piece by piece, is every byte, identical, again in bounded memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_stream_is_recorded_and_replayed_in_bounded_memory() {
    const CHUNK: usize = 64 * 1024;
    const CHUNKS: usize = 4 * 1024; // 256 MiB
    let upstream = Upstream::start().await;
    let dir = TempDir::new("idemgate-large-stream");
    let routes = dir.path().join("routes.toml");
    std::fs::write(
        &routes,
        "[[route]]\nmethod = \"POST\"\npath = \"/v1/chat/completions\"\n\
         max_stored_response = 536870912\n",
    )
    .unwrap();
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .arg("--config", routes.display())
            .store_or_sqlite_in(None, dir.path()),
    )
    .await;
    // Every chunk differs (its number in its first bytes), so a replay that
    // misses, repeats or reorders one is found.
    let chunk = |n: usize| {
        let mut chunk = vec![b'a' + (n % 26) as u8; CHUNK];
        chunk[..8].copy_from_slice(&(n as u64).to_be_bytes());
        Bytes::from(chunk)
    };
    let key = new_key();
    let events = upstream.stream_next_as("application/x-ndjson");
    let producer = tokio::spawn(async move {
        for n in 0..CHUNKS {
            if events.send(Ok(chunk(n))).await.is_err() {
                return;
            }
        }
    });
    let client = Client::new();
    let mut response = post_completion(&proxy, &client, &key, None).await;
    assert_eq!(response.status(), StatusCode::OK);
    let received = read_counting(&mut response, &chunk).await;
    producer.await.unwrap();
    assert_eq!(received, CHUNK * CHUNKS, "every byte flows");
    let streamed_peak = peak_rss(proxy.pid());

    let mut replay = post_completion(&proxy, &client, &key, None).await;
    assert_eq!(replay.status(), StatusCode::OK);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert!(replay.headers().get("idempotency-response").is_none());
    let replayed = read_counting(&mut replay, &chunk).await;
    assert_eq!(replayed, CHUNK * CHUNKS, "the replay is every byte");
    let peak = peak_rss(proxy.pid());
    eprintln!(
        "256 MiB recorded in pieces: the proxy's peak RSS {} MiB streaming, {} MiB after the replay",
        streamed_peak >> 20,
        peak >> 20
    );
    assert!(
        peak < 128 << 20,
        "the proxy's peak RSS is {} MiB",
        peak >> 20
    );
    assert_eq!(upstream.executions(), 1);
}

/// Reads `response` to its clean end, checking each byte against the chunks
/// `chunk` makes (in order); the count read.
async fn read_counting(response: &mut reqwest::Response, chunk: &impl Fn(usize) -> Bytes) -> usize {
    let mut read = 0_usize;
    let mut expected = chunk(0);
    let done = tokio::time::timeout(Duration::from_secs(240), async {
        while let Some(mut data) = response.chunk().await.expect("the stream goes on") {
            while !data.is_empty() {
                let offset = read % expected.len();
                if offset == 0 && read > 0 {
                    expected = chunk(read / expected.len());
                }
                let take = data.len().min(expected.len() - offset);
                assert_eq!(
                    data[..take],
                    expected[offset..offset + take],
                    "the bytes at offset {read}"
                );
                read += take;
                data = data.split_off(take);
            }
        }
    })
    .await;
    assert!(done.is_ok(), "read within 240 s; got {read} bytes");
    read
}
