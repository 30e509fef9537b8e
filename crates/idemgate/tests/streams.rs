//! Streamed answers through the layer (PROTOCOL §20): a handler whose Server-Sent
//! Events the test releases one at a time, so every assertion about "before the
//! next event" holds by construction, not by timing.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use http_body_util::BodyExt;
use idemgate::{IdempotencyLayer, MemoryStore, ServerErrorPolicy};
use support::{Answer, authenticate, new_key, post_json, send};
use tokio::sync::mpsc;
use tower::ServiceExt;

/// One event, or the stream breaking off.
type Event = Result<Bytes, std::io::Error>;

/// The streaming upstream: counts its runs; each run streams what the test
/// sends through the channel it prepared.
#[derive(Default)]
struct Upstream {
    runs: AtomicUsize,
    prepared: Mutex<Vec<mpsc::Receiver<Event>>>,
}

impl Upstream {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// The next run's events: what is sent here is streamed; dropping the
    /// sender ends the stream cleanly.
    fn prepare(&self) -> mpsc::Sender<Event> {
        let (events, prepared) = mpsc::channel(16);
        self.prepared.lock().unwrap().push(prepared);
        events
    }
}

async fn stream_events(State(upstream): State<Arc<Upstream>>) -> Response {
    upstream.runs.fetch_add(1, Ordering::SeqCst);
    let mut events = upstream
        .prepared
        .lock()
        .unwrap()
        .pop()
        .expect("the test prepared this run's events");
    let body = Body::from_stream(futures_util::stream::poll_fn(move |cx| {
        events.poll_recv(cx)
    }));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap()
}

fn app(layer: IdempotencyLayer) -> (Router, Arc<Upstream>) {
    let upstream = Arc::new(Upstream::default());
    let app = Router::new()
        .route("/v1/chat/completions", post(stream_events))
        .route_layer(layer)
        .layer(axum::middleware::from_fn(authenticate))
        .with_state(Arc::clone(&upstream));
    (app, upstream)
}

const COMPLETION: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

fn completion(key: &str) -> axum::http::Request<Body> {
    post_json("/v1/chat/completions", Some("alice"), Some(key), COMPLETION)
}

fn event(n: usize) -> Event {
    Ok(Bytes::from(format!("id: {n}\ndata: {{\"token\":{n}}}\n\n")))
}

/// Sends `request` and returns the answer's head with its body unread.
async fn open(app: &Router, request: axum::http::Request<Body>) -> Response {
    tokio::time::timeout(Duration::from_secs(5), app.clone().oneshot(request))
        .await
        .expect("the head arrives while the stream is still produced")
        .unwrap()
}

/// The next data frame of `body` (trailers skipped); `None` at a clean end.
async fn next_data(body: &mut Body) -> Option<Result<Bytes, axum::Error>> {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("a frame or the end within 5 s")?;
        match frame {
            Ok(frame) => match frame.into_data() {
                Ok(data) => return Some(Ok(data)),
                Err(_trailers) => continue,
            },
            Err(error) => return Some(Err(error)),
        }
    }
}

fn bytes_of(events: &[usize]) -> Vec<u8> {
    events
        .iter()
        .flat_map(|&n| event(n).unwrap().to_vec())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_reach_the_client_as_they_are_produced_and_the_retry_replays_them_all() {
    let (app, upstream) = app(IdempotencyLayer::new(MemoryStore::new()));
    let key = new_key();
    let events = upstream.prepare();
    events.send(event(1)).await.unwrap();
    let response = open(&app, completion(&key)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/event-stream"
    );
    assert!(
        !response.headers().contains_key(header::CONTENT_LENGTH),
        "a stream is not re-framed with a length"
    );
    let mut body = response.into_body();
    // The second event does not exist yet: the first arrived on its own.
    let first = next_data(&mut body).await.expect("an event").unwrap();
    assert_eq!(first, event(1).unwrap());

    // A retry while the stream is produced joins it: from its first byte,
    // then live (PROTOCOL §20), running nothing.
    let joined = open(&app, completion(&key)).await;
    assert_eq!(joined.status(), StatusCode::OK);
    assert_eq!(joined.headers()["idempotent-replayed"], "true");
    assert_eq!(joined.headers()[header::CONTENT_TYPE], "text/event-stream");
    let mut joined = joined.into_body();
    let data = next_data(&mut joined).await.expect("an event").unwrap();
    assert_eq!(data, event(1).unwrap(), "from the first byte");
    assert_eq!(upstream.runs(), 1);

    for n in 2..=4 {
        events.send(event(n)).await.unwrap();
        for client in [&mut body, &mut joined] {
            let data = next_data(client).await.expect("an event").unwrap();
            assert_eq!(data, event(n).unwrap(), "live, in order");
        }
    }
    drop(events);
    assert!(
        next_data(&mut body).await.is_none(),
        "a clean end once the upstream ended"
    );
    assert!(
        next_data(&mut joined).await.is_none(),
        "the joined stream ends as cleanly"
    );

    // The end reached the client only once the record was written: the retry
    // replays every byte.
    let retry = send(&app, completion(&key)).await;
    assert_eq!(retry.status, StatusCode::OK);
    assert!(retry.replayed());
    assert_eq!(retry.headers[header::CONTENT_TYPE], "text/event-stream");
    assert_eq!(retry.body, bytes_of(&[1, 2, 3, 4]));

    // An SSE client reconnecting after event 2 gets 3 and 4 (HTML standard,
    // `Last-Event-ID`).
    let mut resuming = completion(&key);
    resuming
        .headers_mut()
        .insert("last-event-id", "2".parse().unwrap());
    let resumed = send(&app, resuming).await;
    assert!(resumed.replayed());
    assert_eq!(resumed.body, bytes_of(&[3, 4]));
    assert_eq!(upstream.runs(), 1, "the upstream ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_during_the_stream_gets_every_byte_by_its_end() {
    let (app, upstream) =
        app(IdempotencyLayer::new(MemoryStore::new()).with_wait(Duration::from_secs(10)));
    let key = new_key();
    let events = upstream.prepare();
    events.send(event(1)).await.unwrap();
    let mut first = open(&app, completion(&key)).await.into_body();
    next_data(&mut first).await.expect("an event").unwrap();
    let retry = {
        let app = app.clone();
        let request = completion(&key);
        tokio::spawn(async move { send(&app, request).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !retry.is_finished(),
        "the retry waits while the stream runs"
    );
    events.send(event(2)).await.unwrap();
    drop(events);
    let mut seen = event(1).unwrap().to_vec();
    while let Some(data) = next_data(&mut first).await {
        seen.extend_from_slice(&data.unwrap());
    }
    let retry: Answer = retry.await.unwrap();
    assert_eq!(retry.status, StatusCode::OK);
    assert!(retry.replayed());
    assert_eq!(
        retry.body, seen,
        "byte-identical to what the first client got"
    );
    assert_eq!(upstream.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_that_breaks_off_is_cut_for_its_client_and_never_replayed_as_complete() {
    for policy in [ServerErrorPolicy::Store, ServerErrorPolicy::Release] {
        let (app, upstream) =
            app(IdempotencyLayer::new(MemoryStore::new()).with_server_error_policy(policy));
        let key = new_key();
        let events = upstream.prepare();
        events.send(event(1)).await.unwrap();
        let mut body = open(&app, completion(&key)).await.into_body();
        next_data(&mut body).await.expect("an event").unwrap();
        events
            .send(Err(std::io::Error::other("upstream reset")))
            .await
            .unwrap();
        let cut = next_data(&mut body).await;
        assert!(
            matches!(cut, Some(Err(_))),
            "{policy:?}: the client sees the cut, never a clean end: {cut:?}"
        );

        let second_run = upstream.prepare();
        drop(second_run); // a second run, if there is one, streams nothing
        let retry = send(&app, completion(&key)).await;
        match policy {
            ServerErrorPolicy::Store => {
                // Kept failed: its problem is replayed, not the events.
                assert_eq!(retry.status, StatusCode::INTERNAL_SERVER_ERROR);
                assert!(retry.replayed());
                assert_eq!(upstream.runs(), 1);
            }
            _ => {
                // Released: the retry ran the operation again.
                assert_eq!(retry.status, StatusCode::OK);
                assert!(!retry.replayed());
                assert_eq!(upstream.runs(), 2);
            }
        }
        assert_ne!(
            retry.body,
            bytes_of(&[1]),
            "{policy:?}: the cut prefix is never replayed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_leaves_mid_stream_does_not_stop_the_operation() {
    let (app, upstream) = app(IdempotencyLayer::new(MemoryStore::new()));
    let key = new_key();
    let events = upstream.prepare();
    events.send(event(1)).await.unwrap();
    let mut body = open(&app, completion(&key)).await.into_body();
    next_data(&mut body).await.expect("an event").unwrap();
    drop(body); // the client's connection dropped
    for n in 2..=3 {
        events.send(event(n)).await.unwrap();
    }
    drop(events);
    // The stream is read to its end and recorded without anyone reading it.
    let mut retry = send(&app, completion(&key)).await;
    for _ in 0..50 {
        if retry.status != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        retry = send(&app, completion(&key)).await;
    }
    assert_eq!(retry.status, StatusCode::OK);
    assert!(retry.replayed());
    assert_eq!(retry.body, bytes_of(&[1, 2, 3]));
    assert_eq!(upstream.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_over_the_limit_flows_whole_and_is_recorded_as_not_retained() {
    let (app, upstream) = app(IdempotencyLayer::new(MemoryStore::new()).with_response_limit(100));
    let key = new_key();
    let events = upstream.prepare();
    let mut body = {
        events.send(event(1)).await.unwrap();
        open(&app, completion(&key)).await.into_body()
    };
    let mut seen = Vec::new();
    for n in 2..=10 {
        events.send(event(n)).await.unwrap();
    }
    drop(events);
    while let Some(data) = next_data(&mut body).await {
        seen.extend_from_slice(&data.unwrap());
    }
    assert_eq!(
        seen,
        bytes_of(&(1..=10).collect::<Vec<_>>()),
        "every byte flows"
    );
    let retry = send(&app, completion(&key)).await;
    assert_eq!(retry.status, StatusCode::OK);
    assert!(retry.replayed());
    assert_eq!(retry.headers["idempotency-response"], "not-retained");
    assert!(retry.body.is_empty(), "never a truncated replay");
    assert_eq!(upstream.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_joining_with_last_event_id_starts_after_it() {
    let (app, upstream) = app(IdempotencyLayer::new(MemoryStore::new()));
    let key = new_key();
    let events = upstream.prepare();
    for n in 1..=3 {
        events.send(event(n)).await.unwrap();
    }
    let mut first = open(&app, completion(&key)).await.into_body();
    let mut seen = Vec::new();
    while seen != bytes_of(&[1, 2, 3]) {
        seen.extend_from_slice(&next_data(&mut first).await.expect("an event").unwrap());
    }
    let mut resuming = completion(&key);
    resuming
        .headers_mut()
        .insert("last-event-id", "2".parse().unwrap());
    let mut joined = open(&app, resuming).await.into_body();
    events.send(event(4)).await.unwrap();
    drop(events);
    let mut got = Vec::new();
    while let Some(data) = next_data(&mut joined).await {
        got.extend_from_slice(&data.unwrap());
    }
    assert_eq!(got, bytes_of(&[3, 4]), "the events after 2, then live");
    assert_eq!(upstream.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_joined_stream_is_cut_when_the_first_is() {
    let (app, upstream) = app(IdempotencyLayer::new(MemoryStore::new()));
    let key = new_key();
    let events = upstream.prepare();
    events.send(event(1)).await.unwrap();
    let mut first = open(&app, completion(&key)).await.into_body();
    next_data(&mut first).await.expect("an event").unwrap();
    let mut joined = open(&app, completion(&key)).await.into_body();
    next_data(&mut joined).await.expect("an event").unwrap();
    events
        .send(Err(std::io::Error::other("upstream reset")))
        .await
        .unwrap();
    for (who, body) in [("first", &mut first), ("joined", &mut joined)] {
        let cut = next_data(body).await;
        assert!(
            matches!(cut, Some(Err(_))),
            "{who}: cut, not ended: {cut:?}"
        );
    }
    assert_eq!(upstream.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_past_the_limit_cannot_be_joined_from_its_first_byte() {
    let (app, upstream) = app(IdempotencyLayer::new(MemoryStore::new()).with_response_limit(100));
    let key = new_key();
    let events = upstream.prepare();
    events.send(event(1)).await.unwrap();
    let mut first = open(&app, completion(&key)).await.into_body();
    next_data(&mut first).await.expect("an event").unwrap();
    let mut joined = open(&app, completion(&key)).await.into_body();
    next_data(&mut joined).await.expect("an event").unwrap();
    // Past 100 bytes nothing is kept: the joiner is cut, a new retry is a 409.
    for n in 2..=5 {
        events.send(event(n)).await.unwrap();
        next_data(&mut first).await.expect("an event").unwrap();
    }
    let mut cut = None;
    while let Some(data) = next_data(&mut joined).await {
        if data.is_err() {
            cut = Some(data);
            break;
        }
    }
    assert!(cut.is_some(), "the joiner is cut, never given a gap");
    let late = send(&app, completion(&key)).await;
    assert_eq!(late.status, StatusCode::CONFLICT, "{late:?}");
    drop(events);
    while next_data(&mut first).await.is_some() {}
    assert_eq!(upstream.runs(), 1);
}

/// Events of about `size` bytes each, so a stream of them spans many store
/// pieces (`idemgate_core::stream::PIECE_BUDGET`).
fn large_event(n: usize, size: usize) -> Bytes {
    let filler: String = std::iter::repeat_n(char::from(b'a' + (n % 26) as u8), size).collect();
    Bytes::from(format!("id: {n}\ndata: {filler}\n\n"))
}

/// A stream of many store pieces is recorded in the store, not in the
/// record: the record names its pieces, and a replay reads them back
/// byte-identical; `Last-Event-ID` resumes after an event that ends inside a
/// piece, and an id no event has gets the whole stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_of_many_pieces_replays_from_the_store() {
    let store: Arc<dyn idemgate::Store> = Arc::new(MemoryStore::new());
    let (app, upstream) =
        app(IdempotencyLayer::from_arc(Arc::clone(&store)).with_response_limit(4 << 20));
    let key = new_key();
    let events = upstream.prepare();
    let sent: Vec<Bytes> = (1..=40).map(|n| large_event(n, 10_000)).collect();
    let feeding = {
        let sent = sent.clone();
        tokio::spawn(async move {
            for event in sent {
                events.send(Ok(event)).await.unwrap();
            }
        })
    };
    let first = send(&app, completion(&key)).await;
    feeding.await.unwrap();
    assert_eq!(first.status, StatusCode::OK);
    let whole: Vec<u8> = sent.concat();
    assert_eq!(first.body, whole);

    let record = record_of(&*store, &key).await;
    let pieces = match record.response().map(|response| &response.body) {
        Some(idemgate_core::record::StoredBody::InPieces(pieces)) => *pieces,
        other => panic!("the stream's body is in pieces, not {other:?}"),
    };
    assert!(pieces >= 6, "400 kB in pieces of at most 64 KiB: {pieces}");

    let replayed = send(&app, completion(&key)).await;
    assert_eq!(replayed.headers["idempotent-replayed"], "true");
    assert_eq!(replayed.body, whole, "byte-identical, read from the pieces");

    let resumed = |id: &'static str| {
        let mut request = completion(&key);
        request
            .headers_mut()
            .insert("last-event-id", header::HeaderValue::from_static(id));
        send(&app, request)
    };
    assert_eq!(resumed("17").await.body, sent[17..].concat());
    assert_eq!(resumed("40").await.body, Bytes::new(), "after the last");
    assert_eq!(resumed("nope").await.body, whole, "no such id: the whole");
    assert_eq!(upstream.runs(), 1);
}

/// The record of alice's completion under `key`, read from `store`.
async fn record_of(store: &dyn idemgate::Store, key: &str) -> idemgate_core::record::Record {
    use idemgate_core::key::IdempotencyKey;
    use idemgate_core::scope::{Identity, Principal, Scope};
    let identity = Identity::new(
        Scope {
            principal: Principal::new("user:alice"),
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
        },
        IdempotencyKey::parse(key.as_bytes(), 255).unwrap(),
    );
    store
        .get(identity.digest())
        .await
        .unwrap()
        .expect("the completion's record")
        .record
}

/// Two layers (two instances) over one store: a retry reaching the other
/// one joins the stream in flight from the store, then live, and ends when
/// the first ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_on_another_layer_over_the_store_joins_live() {
    let store: Arc<dyn idemgate::Store> = Arc::new(MemoryStore::new());
    let (first_app, upstream) = app(IdempotencyLayer::from_arc(Arc::clone(&store)));
    let (second_app, second_upstream) = app(IdempotencyLayer::from_arc(Arc::clone(&store)));
    let key = new_key();
    let events = upstream.prepare();
    events.send(event(1)).await.unwrap();
    let mut first = open(&first_app, completion(&key)).await.into_body();
    assert_eq!(
        next_data(&mut first).await.unwrap().unwrap(),
        bytes_of(&[1])
    );
    let joined = open(&second_app, completion(&key)).await;
    assert_eq!(joined.headers()["idempotent-replayed"], "true");
    let mut joined = joined.into_body();
    assert_eq!(
        next_data(&mut joined).await.unwrap().unwrap(),
        bytes_of(&[1])
    );
    for n in 2..=4 {
        events.send(event(n)).await.unwrap();
        assert_eq!(
            next_data(&mut first).await.unwrap().unwrap(),
            bytes_of(&[n])
        );
        assert_eq!(
            next_data(&mut joined).await.unwrap().unwrap(),
            bytes_of(&[n])
        );
    }
    drop(events);
    assert!(next_data(&mut first).await.is_none(), "a clean end");
    assert!(
        next_data(&mut joined).await.is_none(),
        "a clean end, joined"
    );
    assert_eq!(upstream.runs(), 1);
    assert_eq!(second_upstream.runs(), 0);
}
