//! The `shop.Orders` gRPC service: its messages and its tonic service, written
//! as `tonic-prost-build` would generate them from
//!
//! ```proto
//! service Orders { rpc CreateOrder(CreateOrderRequest) returns (Order); }
//! message CreateOrderRequest { string request_id = 1; string item = 2; int64 amount = 3; }
//! message Order { string id = 1; string item = 2; int64 amount = 3; }
//! ```
//!
//! (by hand, so the example builds without `protoc`), and a shop that counts
//! the orders it creates. Shared by the example and idemgate-server's
//! `tests/grpc_in_process.rs`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use std::sync::Arc;

/// `shop.Orders/CreateOrder`'s request.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CreateOrderRequest {
    /// AIP-155's request id: what a route may read the key from (`protobuf:1`).
    #[prost(string, tag = "1")]
    pub(crate) request_id: String,
    /// What is ordered.
    #[prost(string, tag = "2")]
    pub(crate) item: String,
    /// What it costs; refused unless positive.
    #[prost(int64, tag = "3")]
    pub(crate) amount: i64,
}

/// `shop.Orders/CreateOrder`'s reply.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Order {
    /// The order's id, one per order created.
    #[prost(string, tag = "1")]
    pub(crate) id: String,
    /// What was ordered.
    #[prost(string, tag = "2")]
    pub(crate) item: String,
    /// What it cost.
    #[prost(int64, tag = "3")]
    pub(crate) amount: i64,
}

/// The principal that scopes keys: the tenant the `x-tenant` metadata names.
pub(crate) fn tenant(
    parts: &http::request::Parts,
) -> Result<idemgate::Principal, idemgate::PrincipalError> {
    parts
        .headers
        .get("x-tenant")
        .and_then(|value| value.to_str().ok())
        .map(|tenant| idemgate::Principal::new(format!("tenant:{tenant}")))
        .ok_or(idemgate::PrincipalError::Missing)
}

/// The full name of the one method.
pub(crate) const CREATE_ORDER: &str = "/shop.Orders/CreateOrder";

/// The business: creates orders, counting every run.
#[derive(Debug, Default)]
pub(crate) struct Shop {
    /// How many times `CreateOrder` ran.
    pub(crate) runs: AtomicUsize,
    /// The orders created.
    pub(crate) orders: Mutex<Vec<Order>>,
    /// How long each run takes (to be caught in flight).
    pub(crate) pause: Mutex<Duration>,
}

impl Shop {
    /// Creates an order: `INVALID_ARGUMENT` for a non-positive amount,
    /// `UNAVAILABLE` for the item `"sold-out-for-now"` (nothing created).
    pub(crate) async fn create_order(
        &self,
        request: tonic::Request<CreateOrderRequest>,
    ) -> Result<tonic::Response<Order>, tonic::Status> {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let pause = *self.pause.lock().unwrap();
        tokio::time::sleep(pause).await;
        let request = request.into_inner();
        if request.amount <= 0 {
            return Err(tonic::Status::invalid_argument(
                "the amount must be positive",
            ));
        }
        if request.item == "sold-out-for-now" {
            return Err(tonic::Status::unavailable("restocking; try again"));
        }
        let order = Order {
            id: format!("ord-{run}"),
            item: request.item,
            amount: request.amount,
        };
        self.orders.lock().unwrap().push(order.clone());
        let mut response = tonic::Response::new(order);
        response
            .metadata_mut()
            .insert("x-order-run", run.to_string().parse().unwrap());
        Ok(response)
    }
}

/// The tonic service for `shop.Orders`: a tower service of HTTP requests, as
/// generated code is — which is why the idempotency layer wraps it.
#[derive(Debug, Clone)]
pub(crate) struct OrdersServer {
    shop: Arc<Shop>,
}

impl OrdersServer {
    /// The service over `shop`.
    pub(crate) fn new(shop: Arc<Shop>) -> Self {
        Self { shop }
    }
}

impl tonic::server::NamedService for OrdersServer {
    const NAME: &'static str = "shop.Orders";
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

impl<B> tower::Service<http::Request<B>> for OrdersServer
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != CREATE_ORDER {
            return Box::pin(async { Ok(tonic::Status::unimplemented("").into_http()) });
        }
        let shop = Arc::clone(&self.shop);
        let method = tower::service_fn(move |request| {
            let shop = Arc::clone(&shop);
            async move { shop.create_order(request).await }
        });
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(method, request).await)
        })
    }
}
