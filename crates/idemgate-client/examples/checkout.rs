//! A checkout that survives a flaky network.
//!
//! Start the service, then run the checkout against it:
//!
//! ```sh
//! cargo run --release -p idemgate-server -- serve &
//! cargo run -p idemgate-client --example checkout -- http://127.0.0.1:8080
//! ```
//!
//! Between the two it puts a fault relay that resets the first connection and
//! loses the answer to the second, the worst case: the order was made and the
//! payment charged, and the client never heard. The checkout retries under one
//! key, gets the first outcome replayed, and the server holds one order.

use std::time::Duration;

use idemgate_client::{Client, Error, Operation, RetryPolicy};
use idemgate_testkit::relay::{Fault, Relay};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
    let server_addr = reqwest::Url::parse(&server)?.socket_addrs(|| None)?[0];
    let flaky = Relay::start(server_addr).await;
    flaky.inject(Fault::Reset);
    flaky.inject(Fault::LoseResponse);
    println!(
        "idemgate at {server}; a flaky network in front of it at {}",
        flaky.url("")
    );

    // One client for the app; no connection reuse, so each attempt meets the relay.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?;
    let client =
        Client::new(http).with_policy(RetryPolicy::default().deadline(Duration::from_secs(20)));
    let user = format!("checkout-demo-{}", uuid::Uuid::new_v4());
    let cart = serde_json::json!({"items": [{"id": 42, "quantity": 1}], "currency": "RUB", "amount": 1500});

    // The user clicks "Pay": one operation, whatever the network does next.
    let pay = Operation::new();
    println!("pay clicked: {pay} (its key would be saved with the cart)");
    let paid = match client
        .post(flaky.url("/api/v1/orders"))
        .bearer_auth(&user)
        .json(&cart)
        .operation(&pay)
        .send()
        .await
    {
        Ok(response) => response,
        Err(error) if error.may_have_run() => {
            // Never "payment failed" here: it may have gone through. Keep the
            // key and resume the operation later to learn its outcome.
            return Err(format!("outcome unknown, retry later with the same key: {error}").into());
        }
        Err(Error::KeyReused { problem }) => return Err(format!("a bug: {problem}").into()),
        Err(error) => return Err(format!("not paid: {error}").into()),
    };
    let order: serde_json::Value = paid.json()?;
    println!(
        "{} after {} attempts through {} connections (replayed: {}): order {}, {}",
        paid.status(),
        paid.attempts(),
        flaky.connections(),
        paid.replayed(),
        order["order_id"],
        order["status"],
    );

    // The user, impatient, clicks again: the same operation, the same outcome.
    let again = client
        .post(flaky.url("/api/v1/orders"))
        .bearer_auth(&user)
        .json(&cart)
        .operation(&pay)
        .send()
        .await?;
    let same: serde_json::Value = again.json()?;
    println!(
        "clicked again: {} (replayed: {}), order {}",
        again.status(),
        again.replayed(),
        same["order_id"]
    );

    let orders: serde_json::Value = client
        .get(format!("{server}/api/v1/orders"))
        .bearer_auth(&user)
        .send()
        .await?
        .json()?;
    let count = orders["orders"].as_array().map_or(0, Vec::len);
    println!("orders on the server for this user: {count}");
    if count != 1 || order["order_id"] != same["order_id"] {
        return Err("expected exactly one order".into());
    }
    Ok(())
}
