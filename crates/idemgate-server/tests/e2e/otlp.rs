//! `--otlp`: the real binary (`serve` and `proxy`) exports its `idempotency` spans
//! over OTLP/HTTP to a minimal receiver here, which decodes the protobuf the way a
//! collector does. Without the flag nothing is sent, even with the endpoint set.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use prost::Message;
use sha2::{Digest, Sha256};

use crate::support::client::{Client, ORDER, new_key};
use crate::support::proxy::{Proxy, ProxyOptions, Upstream};
use crate::support::server::{Options, Server, sqlite_url};

/// One span as the receiver decoded it.
#[derive(Debug, Clone)]
struct ReceivedSpan {
    service: Option<String>,
    name: String,
    attributes: Vec<(String, String)>,
}

impl ReceivedSpan {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// An OTLP/HTTP trace receiver: `POST /v1/traces` with a protobuf body.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

fn string_of(attribute: &KeyValue) -> (String, String) {
    let value = match attribute.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    };
    (attribute.key.clone(), value)
}

async fn receive(
    State(spans): State<Arc<Mutex<Vec<ReceivedSpan>>>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Vec<u8>) {
    assert_eq!(headers["content-type"], "application/x-protobuf");
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
    let mut received = spans.lock().unwrap();
    for resource_spans in request.resource_spans {
        let service = resource_spans.resource.as_ref().and_then(|resource| {
            resource
                .attributes
                .iter()
                .map(string_of)
                .find(|(k, _)| k == "service.name")
                .map(|(_, v)| v)
        });
        for scope_spans in resource_spans.scope_spans {
            for span in scope_spans.spans {
                received.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name,
                    attributes: span.attributes.iter().map(string_of).collect(),
                });
            }
        }
    }
    (
        StatusCode::OK,
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

impl Receiver {
    async fn start() -> Self {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(Arc::clone(&spans));
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { addr, spans }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `idempotency` spans of `key`.
    fn spans_of(&self, key: &str) -> Vec<ReceivedSpan> {
        let digest = key_digest(key);
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|span| span.name == "idempotency" && span.attribute("key") == Some(&digest))
            .cloned()
            .collect()
    }

    /// Waits until `key` has spans with every one of `outcomes`.
    async fn wait_for(&self, key: &str, outcomes: &[&str]) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let spans = self.spans_of(key);
            if outcomes
                .iter()
                .all(|o| spans.iter().any(|s| s.attribute("outcome") == Some(o)))
            {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "no spans with outcomes {outcomes:?} for key digest {} within 15 s; received: {:?}",
                key_digest(key),
                self.spans.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What the layer records instead of the key: the first 6 bytes of its SHA-256, hex.
fn key_digest(key: &str) -> String {
    hex::encode(&Sha256::digest(key.as_bytes())[..6])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn otlp_exports_the_idempotency_spans_of_serve_and_proxy() {
    let receiver = Receiver::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(
        Options::new(&db)
            .env("IDEMGATE_OTLP", "true")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
            // Export batches every 100 ms instead of every 5 s.
            .env("OTEL_BSP_SCHEDULE_DELAY", 100),
    )
    .await;
    let client = Client::new();
    let key = new_key();
    let url = server.url("/api/v1/orders");
    assert_eq!(
        client.post(&url, Some(&key), ORDER).await.status,
        StatusCode::CREATED
    );
    assert!(client.post(&url, Some(&key), ORDER).await.replayed());
    let spans = receiver.wait_for(&key, &["executed", "replayed"]).await;
    let executed = spans
        .iter()
        .find(|s| s.attribute("outcome") == Some("executed"))
        .unwrap();
    assert_eq!(
        executed.service.as_deref(),
        Some("idemgate"),
        "{executed:?}"
    );
    assert!(
        executed
            .attribute("operation_id")
            .is_some_and(|id| uuid::Uuid::parse_str(id).is_ok()),
        "{executed:?}"
    );
    // A graceful stop flushes and exits in time.
    server.stop().await;

    let upstream = Upstream::start().await;
    let proxy = Proxy::start(
        ProxyOptions::new(upstream.url())
            .env("IDEMGATE_OTLP", "1")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
            .env("OTEL_BSP_SCHEDULE_DELAY", 100),
    )
    .await;
    let proxied = new_key();
    let answer = client
        .post(&proxy.url("/v1/charges"), Some(&proxied), ORDER)
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    receiver.wait_for(&proxied, &["executed"]).await;
    assert!(
        receiver
            .spans
            .lock()
            .unwrap()
            .iter()
            .flat_map(|s| &s.attributes)
            .all(|(_, value)| !value.contains(&key) && !value.contains(&proxied)),
        "the raw keys must never leave either process"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_otlp_no_span_is_sent_even_with_the_endpoint_set() {
    let receiver = Receiver::start().await;
    let (db, _dir) = sqlite_url();
    let server = Server::start(
        Options::new(&db)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
            .env("OTEL_BSP_SCHEDULE_DELAY", 100),
    )
    .await;
    let client = Client::new();
    let key = new_key();
    assert_eq!(
        client
            .post(&server.url("/api/v1/orders"), Some(&key), ORDER)
            .await
            .status,
        StatusCode::CREATED
    );
    // A graceful stop would flush an exporter if there were one.
    server.stop().await;
    assert!(
        receiver.spans.lock().unwrap().is_empty(),
        "spans sent without --otlp: {:?}",
        receiver.spans.lock().unwrap()
    );
}
