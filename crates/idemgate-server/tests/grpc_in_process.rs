//! The example tonic service (`crates/idemgate/examples/grpc_orders`) with the
//! idempotency layer in-process — `Server::builder().layer(IdempotencyLayer)` —
//! and a real tonic client over HTTP/2 (PROTOCOL §22): the scenarios the
//! proxy's gRPC suite runs through the binary, here in-process, each on every
//! store (`memory::…`, `sqlite::…`, `postgres::…`, `redis::…`), opened as
//! `idemgate serve` opens them.
//!
//! A lost reply (the client gone mid-call) is replayed to the retry, one order
//! created; a retry in flight waits for the outcome; another message under the
//! key is `FAILED_PRECONDITION`; a deterministic error is replayed, `UNAVAILABLE`
//! released; the key may be the message's `request_id` (AIP-155). The Rust
//! client's interceptor keys each call once, and its retry loop keeps an
//! operation's key across attempts until the one outcome.

#[path = "../../idemgate/examples/grpc_orders/shop.rs"]
mod shop;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http::uri::PathAndQuery;
use idemgate::{IdempotencyLayer, Store};
use idemgate_server::config::{RedisSafety, StoreUrl};
use idemgate_server::store::{Opening, open};
use idemgate_testkit::wait::wait_until;
use shop::{CreateOrderRequest, Order, OrdersServer, Shop};
use tonic::transport::Channel;

/// The stores the scenarios run on.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Memory,
    Sqlite,
    Postgres,
    Redis,
}

/// What keeps a store usable while its test runs: a SQL store's purge task,
/// a SQLite file's directory.
struct Kept {
    _purge: Option<idemgate_sqlx::PurgeTask>,
    _dir: Option<TempDir>,
}

/// Removes its directory when dropped.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `kind` store, opened as `idemgate serve` opens it; the shared
/// PostgreSQL and Redis from scripts/test.sh's environment.
async fn open_store(kind: Kind) -> (Arc<dyn Store>, Kept) {
    let variable = |name: &str| {
        std::env::var(name)
            .unwrap_or_else(|_| panic!("{name} is not set: run scripts/test.sh, which sets it"))
    };
    let mut dir = None;
    let url = match kind {
        Kind::Memory => "memory".to_owned(),
        Kind::Sqlite => {
            let path = std::env::temp_dir().join(format!("idemgate-grpc-{}", new_key()));
            std::fs::create_dir_all(&path).unwrap();
            let url = format!("sqlite://{}", path.join("records.db").display());
            dir = Some(TempDir(path));
            url
        }
        Kind::Postgres => variable("IDEMGATE_TEST_POSTGRES_URL"),
        Kind::Redis => variable("IDEMGATE_TEST_REDIS_URL"),
    };
    let url: StoreUrl = url.parse().unwrap();
    let opened = open(
        &url,
        Opening::Serve,
        Duration::from_secs(5),
        RedisSafety::default(),
    )
    .await
    .unwrap();
    let kept = Kept {
        _purge: opened.purge,
        _dir: dir,
    };
    (opened.store, kept)
}

/// Each scenario as a test per store: `memory::a_lost_reply_…`, `sqlite::…`.
macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {
        on_every_store!(@store memory Memory [$($scenario)*]);
        on_every_store!(@store sqlite Sqlite [$($scenario)*]);
        on_every_store!(@store postgres Postgres [$($scenario)*]);
        on_every_store!(@store redis Redis [$($scenario)*]);
    };
    (@store $module:ident $kind:ident [$($scenario:ident)*]) => {
        mod $module {
            $(
                #[tokio::test]
                async fn $scenario() {
                    let (store, _kept) = super::open_store(super::Kind::$kind).await;
                    super::$scenario(store).await;
                }
            )*
        }
    };
}

on_every_store!(
    a_lost_reply_is_replayed_and_the_order_created_once,
    a_retry_in_flight_waits_for_the_outcome,
    another_message_under_the_key_is_failed_precondition,
    deterministic_errors_are_replayed_and_unavailable_is_released,
    the_key_can_be_the_message_s_request_id,
    the_rust_client_keeps_an_operation_s_key_across_its_retries,
);

/// A layer on `store` whose duplicates in flight wait up to 5 s for the
/// outcome.
fn waiting(store: &Arc<dyn Store>) -> IdempotencyLayer {
    IdempotencyLayer::from_arc(Arc::clone(store)).with_wait(Duration::from_secs(5))
}

/// The service on a port of its own behind `layer` (replays repeat the
/// `x-order-run` initial metadata, which like any header is replayed only when
/// listed), and its shop.
async fn serve(layer: IdempotencyLayer) -> (Channel, Arc<Shop>) {
    let layer = layer.with_replayed_header_names([http::HeaderName::from_static("x-order-run")]);
    let shop = Arc::new(Shop::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder()
        .layer(layer.with_principal(shop::tenant))
        .add_service(OrdersServer::new(Arc::clone(&shop)));
    tokio::spawn(server.serve_with_incoming(tokio_stream(listener)));
    let channel = Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (channel, shop)
}

/// `listener`'s connections as the stream tonic serves.
fn tokio_stream(
    listener: tokio::net::TcpListener,
) -> impl futures_util::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    })
}

fn order(item: &str, amount: i64) -> CreateOrderRequest {
    CreateOrderRequest {
        request_id: String::new(),
        item: item.into(),
        amount,
    }
}

/// One `CreateOrder` call with `key` (when given) as metadata.
async fn create(
    channel: &Channel,
    key: Option<&str>,
    message: CreateOrderRequest,
) -> Result<tonic::Response<Order>, tonic::Status> {
    let mut request = tonic::Request::new(message);
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("idempotency-key", key.parse().unwrap());
    }
    send(tonic::client::Grpc::new(channel.clone()), request).await
}

/// `request` as the tenant `acme`, over `client` — what a generated
/// `OrdersClient::create_order` does.
async fn send<S>(
    mut client: tonic::client::Grpc<S>,
    mut request: tonic::Request<CreateOrderRequest>,
) -> Result<tonic::Response<Order>, tonic::Status>
where
    S: tonic::client::GrpcService<tonic::body::Body>,
    S::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <S::ResponseBody as http_body::Body>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    client
        .ready()
        .await
        .map_err(|error| tonic::Status::unavailable(error.into().to_string()))?;
    request
        .metadata_mut()
        .insert("x-tenant", "acme".parse().unwrap());
    client
        .unary(
            request,
            PathAndQuery::from_static(shop::CREATE_ORDER),
            tonic_prost::ProstCodec::default(),
        )
        .await
}

fn replayed(response: &tonic::Response<Order>) -> bool {
    response.metadata().get("idempotent-replayed").is_some()
}

fn new_key() -> String {
    uuid::Uuid::new_v4().to_string()
}

async fn a_lost_reply_is_replayed_and_the_order_created_once(store: Arc<dyn Store>) {
    let (channel, shop) = serve(waiting(&store)).await;
    *shop.pause.lock().unwrap() = Duration::from_millis(300);
    let key = new_key();
    let lost = {
        let (channel, key) = (channel.clone(), key.clone());
        tokio::spawn(async move { create(&channel, Some(&key), order("pizza", 1500)).await })
    };
    wait_until("the shop runs the call", Duration::from_secs(10), || {
        shop.runs.load(Ordering::SeqCst) > 0
    })
    .await;
    lost.abort(); // the caller goes; its call is reset
    assert!(lost.await.unwrap_err().is_cancelled());
    *shop.pause.lock().unwrap() = Duration::ZERO;
    let retry = create(&channel, Some(&key), order("pizza", 1500))
        .await
        .unwrap();
    let again = create(&channel, Some(&key), order("pizza", 1500))
        .await
        .unwrap();
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
    assert_eq!(shop.orders.lock().unwrap().len(), 1);
    assert!(replayed(&retry) && replayed(&again));
    assert_eq!(retry.get_ref().id, "ord-1");
    assert_eq!(retry.get_ref(), again.get_ref());
    assert_eq!(retry.metadata().get("x-order-run").unwrap(), "1");
}

async fn a_retry_in_flight_waits_for_the_outcome(store: Arc<dyn Store>) {
    let (channel, shop) = serve(waiting(&store)).await;
    *shop.pause.lock().unwrap() = Duration::from_millis(300);
    let key = new_key();
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let (channel, key) = (channel.clone(), key.clone());
            tokio::spawn(async move { create(&channel, Some(&key), order("sushi", 900)).await })
        })
        .collect();
    let mut orders = Vec::new();
    for call in calls {
        orders.push(call.await.unwrap().unwrap().into_inner());
    }
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
    assert!(orders.iter().all(|order| order.id == "ord-1"));
}

async fn another_message_under_the_key_is_failed_precondition(store: Arc<dyn Store>) {
    let (channel, shop) = serve(waiting(&store)).await;
    let key = new_key();
    create(&channel, Some(&key), order("pizza", 1500))
        .await
        .unwrap();
    let other = create(&channel, Some(&key), order("pizza", 9999))
        .await
        .unwrap_err();
    assert_eq!(other.code(), tonic::Code::FailedPrecondition);
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
}

async fn deterministic_errors_are_replayed_and_unavailable_is_released(store: Arc<dyn Store>) {
    let (channel, shop) = serve(waiting(&store)).await;
    let key = new_key();
    let refused = create(&channel, Some(&key), order("pizza", 0))
        .await
        .unwrap_err();
    let again = create(&channel, Some(&key), order("pizza", 0))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert_eq!(again.code(), tonic::Code::InvalidArgument);
    assert_eq!(again.message(), refused.message());
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);

    let key = new_key();
    let later = create(&channel, Some(&key), order("sold-out-for-now", 5))
        .await
        .unwrap_err();
    assert_eq!(later.code(), tonic::Code::Unavailable);
    create(&channel, Some(&key), order("sold-out-for-now", 5))
        .await
        .unwrap_err();
    assert_eq!(shop.runs.load(Ordering::SeqCst), 3, "released: run again");
}

async fn the_key_can_be_the_message_s_request_id(store: Arc<dyn Store>) {
    let layer = waiting(&store).with_key_source("protobuf:1".parse().unwrap());
    let (channel, shop) = serve(layer).await;
    let keyed = CreateOrderRequest {
        request_id: new_key(),
        ..order("ramen", 700)
    };
    let first = create(&channel, None, keyed.clone()).await.unwrap();
    let retry = create(&channel, None, keyed).await.unwrap();
    assert!(!replayed(&first) && replayed(&retry));
    assert_eq!(first.get_ref(), retry.get_ref());
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
}

/// The Rust client: an `Operation`'s retry loop keeps its key on every
/// attempt — here `ABORTED` (no wait on this server) retried after the
/// pushback, then the replay — and the interceptor keys each call once.
async fn the_rust_client_keeps_an_operation_s_key_across_its_retries(store: Arc<dyn Store>) {
    use idemgate_client::{Operation, RetryPolicy, grpc};

    // No waiting: a duplicate in flight is ABORTED at once.
    let (channel, shop) = serve(IdempotencyLayer::from_arc(store)).await;
    // History for the route, so the pushback is what a run takes (about 1 s).
    create(&channel, Some(&new_key()), order("warm-up", 1))
        .await
        .unwrap();
    *shop.pause.lock().unwrap() = Duration::from_millis(300);
    let pay = Operation::new();
    let first = {
        let (channel, key) = (channel.clone(), pay.key().to_owned());
        tokio::spawn(async move { create(&channel, Some(&key), order("pho", 800)).await })
    };
    wait_until(
        "the shop runs the first call",
        Duration::from_secs(10),
        || shop.runs.load(Ordering::SeqCst) >= 2,
    )
    .await;
    let attempts = std::sync::atomic::AtomicUsize::new(0);
    let attempt = |request| {
        attempts.fetch_add(1, Ordering::SeqCst);
        send(tonic::client::Grpc::new(channel.clone()), request)
    };
    let started = tokio::time::Instant::now();
    let retried = grpc::call(&RetryPolicy::default(), &pay, order("pho", 800), attempt)
        .await
        .unwrap();
    assert!(replayed(&retried));
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        2,
        "ABORTED, then the replay"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "the pushback was honoured"
    );
    assert_eq!(retried.get_ref(), first.await.unwrap().unwrap().get_ref());
    assert_eq!(shop.runs.load(Ordering::SeqCst), 2);

    // Without an operation, the interceptor gives each call its own key.
    let keyed = tonic::service::interceptor::InterceptedService::new(
        channel.clone(),
        grpc::IdempotencyKeys,
    );
    *shop.pause.lock().unwrap() = Duration::ZERO;
    for _ in 0..2 {
        let request = tonic::Request::new(order("tea", 300));
        let answer = send(tonic::client::Grpc::new(keyed.clone()), request)
            .await
            .unwrap();
        assert!(!replayed(&answer));
    }
    assert_eq!(shop.runs.load(Ordering::SeqCst), 4);
}
