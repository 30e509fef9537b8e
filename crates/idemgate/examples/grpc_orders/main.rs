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
//!
//! `GRPC_ORDERS_LISTEN` sets the address (`127.0.0.1:0`: any free port; the
//! one taken is printed); `GRPC_ORDERS_IDEMPOTENCY=off` serves without the
//! layer — the baseline the benchmark's gRPC suite measures against.

mod shop;

use std::sync::Arc;
use std::time::Duration;

use idemgate::{IdempotencyLayer, MemoryStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address = std::env::var("GRPC_ORDERS_LISTEN").unwrap_or_else(|_| "127.0.0.1:50051".into());
    let listener = tokio::net::TcpListener::bind(&address).await?;
    let bound = listener.local_addr()?;
    let incoming = futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    let shop = shop::OrdersServer::new(Arc::new(shop::Shop::default()));
    let plain = std::env::var("GRPC_ORDERS_IDEMPOTENCY").is_ok_and(|value| value == "off");
    // A Rust `Server` with a layer is another type: two arms, one service.
    let mut server = tonic::transport::Server::builder();
    let served = if plain {
        let server = server.add_service(shop);
        announce(bound, "without idempotency");
        tokio::spawn(server.serve_with_incoming(incoming))
    } else {
        let idempotency = IdempotencyLayer::new(MemoryStore::new())
            .with_principal(shop::tenant)
            .with_wait(Duration::from_secs(10));
        let server = server.layer(idempotency).add_service(shop);
        announce(bound, "with idempotency");
        tokio::spawn(server.serve_with_incoming(incoming))
    };
    served.await??;
    Ok(())
}

fn announce(address: std::net::SocketAddr, how: &str) {
    println!("shop.Orders listening on {address} ({how})");
}
