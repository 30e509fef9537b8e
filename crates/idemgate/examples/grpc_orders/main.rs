//! A tonic gRPC service with exactly-once `CreateOrder` calls: the idempotency
//! layer wraps the tonic server in-process (PROTOCOL §22).
//!
//! ```text
//! cargo run -p idemgate --example grpc_orders            # 127.0.0.1:50051
//! grpcurl -plaintext -H 'idempotency-key: 7c4a…' -H 'x-tenant: acme' \
//!   -d '{"item":"pizza","amount":1500}' 127.0.0.1:50051 shop.Orders/CreateOrder
//! ```
//!
//! A retry with the same key and message gets the first call's reply (and
//! `idempotent-replayed: true` in its initial metadata); the same key with
//! another message is `FAILED_PRECONDITION`; a retry while the call runs waits
//! for it. The tenant (`x-tenant` metadata) is the principal that scopes keys.

mod shop;

use std::sync::Arc;

use idemgate::{IdempotencyLayer, MemoryStore, Principal, PrincipalError};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address = std::env::var("GRPC_ORDERS_LISTEN").unwrap_or_else(|_| "127.0.0.1:50051".into());
    let by_tenant = |parts: &http::request::Parts| {
        parts
            .headers
            .get("x-tenant")
            .and_then(|value| value.to_str().ok())
            .map(|tenant| Principal::new(format!("tenant:{tenant}")))
            .ok_or(PrincipalError::Missing)
    };
    let idempotency = IdempotencyLayer::new(MemoryStore::new()).with_principal(by_tenant);
    let shop = Arc::new(shop::Shop::default());
    println!("shop.Orders listening on {address}");
    tonic::transport::Server::builder()
        .layer(idempotency)
        .add_service(shop::OrdersServer::new(shop))
        .serve(address.parse()?)
        .await?;
    Ok(())
}
