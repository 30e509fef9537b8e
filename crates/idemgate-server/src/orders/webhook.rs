//! The payment gateway's webhook, `POST /webhooks/payments`: the gateway
//! confirms an order's charge, and the order is marked confirmed exactly once
//! — the inbox pattern, with the idempotency layer's record as the inbox.
//!
//! `serve` answers an order `201 paid` once its charge is approved, as before;
//! a gateway then confirms the payment asynchronously with a `payment.succeeded`
//! event, which sets the order's `payment_confirmed_at` and `payment_event_id`
//! (and its version: the representation changed). Deliveries follow the
//! [Standard Webhooks](https://www.standardwebhooks.com) specification: a
//! `webhook-id` kept across redeliveries, a `webhook-timestamp`, a
//! `webhook-signature` (`v1,` + base64 HMAC-SHA256 of `id.timestamp.payload`)
//! under the endpoint's `whsec_` secret (`--payment-webhook-secret`,
//! [`SECRET_VARIABLE`]). Without a secret the route does not exist.
//!
//! The route is behind the layer's webhook receiver
//! ([`idemgate::IdempotencyLayer::with_webhook`]): the signature is checked
//! before anything is claimed, the event is keyed by its `webhook-id`, and the
//! handler writes in the transaction the layer lends it, which also completes
//! the event's record — so the event id and the order's change commit
//! together, or neither does. That needs the records in the orders database
//! (`--idempotency-store database`, SQLite or PostgreSQL); `serve` refuses a
//! secret with any other store. A redelivery of a completed event is answered
//! from its record without running; one racing a running delivery waits for it;
//! a crash before the commit leaves neither, so the redelivery runs again.
//!
//! The built-in simulated gateway ([`Confirmations`]) delivers such an event
//! to the server itself after each approved charge, signed with the same
//! secret, redelivering on anything but a 2xx with backoff as providers do. A
//! real gateway (`--gateway-url`) would call the endpoint the same way.
//!
//! Test-only fault: [`FAULT_VARIABLE`] `=stall` makes the handler wait forever
//! once it has written (uncommitted), so a test can `kill -9` the server in the
//! middle of the handler every time. Never set it in production.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use idemgate::transaction::TransactionSlot;
use idemgate::webhook::{Provider, Webhook, WebhookSecretError};
use idemgate::{Finality, ProblemDetails};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use uuid::Uuid;

use crate::orders::db::OrdersConn;
use crate::orders::failure::{database_failure, tx_failure};
use crate::orders::{OrderWrites, OrdersState};

/// The route.
pub const PATH: &str = "/webhooks/payments";

/// The variable of `--payment-webhook-secret`.
pub const SECRET_VARIABLE: &str = "IDEMGATE_PAYMENT_WEBHOOK_SECRET";

/// Tests only: `stall` makes the handler wait forever after its write.
pub const FAULT_VARIABLE: &str = "IDEMGATE_TEST_FAULT_IN_PAYMENT_WEBHOOK";

/// The event type that confirms a charge; others are acknowledged and ignored.
pub const PAYMENT_SUCCEEDED: &str = "payment.succeeded";

/// The endpoint's secret, `whsec_` + base64 as Standard Webhooks senders show
/// it; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(String);

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(..)")
    }
}

impl WebhookSecret {
    /// Checks a secret as the layer reads it.
    pub fn parse(secret: &str) -> Result<Self, WebhookSecretError> {
        Webhook::new(Provider::Standard, [secret])?;
        Ok(Self(secret.to_owned()))
    }

    /// The layer's receiver for it (Standard Webhooks, default tolerance).
    pub fn webhook(&self) -> Webhook {
        // Checked by `parse`.
        Webhook::new(Provider::Standard, [self.0.as_str()]).expect("a checked secret")
    }

    /// The HMAC key: the base64 after `whsec_`, padded or not.
    fn key(&self) -> Vec<u8> {
        let lenient = base64::engine::GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            base64::engine::GeneralPurposeConfig::new()
                .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
        );
        let encoded = self.0.strip_prefix("whsec_").unwrap_or(&self.0);
        // Checked by `parse`.
        lenient.decode(encoded).unwrap_or_default()
    }
}

/// A gateway's event, as delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentEvent {
    /// `payment.succeeded`, or another type (acknowledged, ignored).
    #[serde(rename = "type")]
    pub kind: String,
    /// What it is about.
    pub data: PaymentData,
}

/// The charge an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentData {
    /// The charge's `order_ref`: the operation id that created the order.
    pub order_ref: Uuid,
    /// The gateway's charge id.
    #[serde(default)]
    pub charge_id: Option<String>,
    /// Amount in minor units.
    pub amount: i64,
    /// ISO 4217 code.
    pub currency: String,
}

/// The test-only fault ([`FAULT_VARIABLE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookFault {
    /// Wait forever once the handler has written.
    Stall,
}

impl WebhookFault {
    /// From the environment: `None` unset, empty or `none`.
    pub fn from_env() -> Result<Option<Self>, String> {
        match std::env::var(FAULT_VARIABLE).as_deref() {
            Err(std::env::VarError::NotPresent) | Ok("" | "none") => Ok(None),
            Ok("stall") => Ok(Some(Self::Stall)),
            Ok(other) => Err(format!(
                "a test-only fault: expected stall or none, got {other:?}"
            )),
            Err(std::env::VarError::NotUnicode(_)) => Err("not UTF-8".to_owned()),
        }
    }
}

/// The receiving side, in the orders state.
#[derive(Debug, Clone)]
pub struct PaymentWebhook {
    /// What the layer verifies deliveries with.
    pub secret: WebhookSecret,
    /// Tests only.
    pub fault: Option<WebhookFault>,
}

/// `POST /webhooks/payments`, behind the layer's webhook receiver: marks the
/// order the event names as confirmed, in the layer's transaction.
pub(crate) async fn receive(
    State(app): State<Arc<OrdersState>>,
    slot: Option<Extension<TransactionSlot>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let event: PaymentEvent = match serde_json::from_slice(&body) {
        Ok(event) => event,
        Err(error) => {
            let problem = ProblemDetails::new(
                StatusCode::BAD_REQUEST,
                "invalid-payment-event",
                "Invalid payment event",
                format!("not a payment event: {error}"),
            );
            return (Finality::Rejected, problem).into_response();
        }
    };
    if event.kind != PAYMENT_SUCCEEDED {
        // Acknowledged, so the gateway stops redelivering it.
        return Json(serde_json::json!({ "ignored": event.kind })).into_response();
    }
    // Verified by the layer, which keyed the delivery by it.
    let Some(event_id) = headers
        .get("webhook-id")
        .and_then(|value| value.to_str().ok())
    else {
        return ProblemDetails::missing_key_at(&idemgate::key::KeySource::Header(
            axum::http::HeaderName::from_static("webhook-id"),
        ))
        .into_response();
    };
    let at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        });
    let order_ref = event.data.order_ref;
    let slot = slot.map(|Extension(slot)| slot);
    // The layer commits its transaction with the event's record.
    let confirmed = match (&app.writes, slot.as_ref()) {
        (OrderWrites::SqliteTransaction(store), Some(slot)) => {
            match idemgate_sqlite::Tx::begin(store, slot).await {
                Ok(mut tx) => {
                    let confirmed = OrdersConn::Sqlite(&mut tx)
                        .confirm_payment(order_ref, event_id, at_ms)
                        .await;
                    strike(&app, &confirmed).await;
                    confirmed
                }
                Err(error) => return tx_failure(&app, &error),
            }
        }
        (OrderWrites::PostgresTransaction(store), Some(slot)) => {
            match idemgate_postgres::Tx::begin(store, slot).await {
                Ok(mut tx) => {
                    let confirmed = OrdersConn::Postgres(&mut tx)
                        .confirm_payment(order_ref, event_id, at_ms)
                        .await;
                    strike(&app, &confirmed).await;
                    confirmed
                }
                Err(error) => return tx_failure(&app, &error),
            }
        }
        // `serve` mounts the route only with the records in the orders database.
        _ => {
            tracing::error!("the payment webhook runs only in the layer's transaction");
            let problem = ProblemDetails::store_unavailable(app.unavailable_retry_after);
            return (Finality::Retryable, problem).into_response();
        }
    };
    match confirmed {
        Ok(Some(order)) => Json(order.representation()).into_response(),
        // Not committed yet (the create is still completing), or unknown:
        // released, so the gateway's redelivery looks again.
        Ok(None) => {
            let problem = ProblemDetails::new(
                StatusCode::NOT_FOUND,
                "order-not-found",
                "Order not found",
                format!("no order was created by operation {order_ref}"),
            );
            (Finality::Retryable, problem).into_response()
        }
        Err(error) => (Finality::Retryable, database_failure(error)).into_response(),
    }
}

/// The test-only fault, once the handler has written.
async fn strike<T>(app: &OrdersState, written: &Result<Option<T>, sqlx::Error>) {
    let Some(webhook) = &app.payment_webhook else {
        return;
    };
    if let (Some(WebhookFault::Stall), Ok(Some(_))) = (webhook.fault, written) {
        tracing::warn!("{FAULT_VARIABLE}=stall: the payment webhook has written; stalling");
        loop {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    }
}

/// How many times the simulated gateway delivers one event at most.
const ATTEMPTS: u32 = 12;

/// The simulated gateway's sender: after an approved charge, a signed
/// `payment.succeeded` to the server's own `/webhooks/payments`, redelivered
/// on anything but a 2xx (backoff from 100 ms, doubling, at most 5 s apart).
#[derive(Clone)]
pub struct Confirmations {
    client: reqwest::Client,
    key: Arc<[u8]>,
    url: Arc<OnceLock<reqwest::Url>>,
}

impl std::fmt::Debug for Confirmations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Confirmations")
            .field("url", &self.url.get())
            .finish_non_exhaustive()
    }
}

impl Confirmations {
    /// Signs with `secret`; delivers nothing until [`Self::deliver_to`].
    pub fn new(secret: &WebhookSecret) -> Result<Self, reqwest::Error> {
        Ok(Self {
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
            key: secret.key().into(),
            url: Arc::new(OnceLock::new()),
        })
    }

    /// Where events go: the server's own endpoint, known once it listens.
    pub fn deliver_to(&self, url: reqwest::Url) {
        let _ = self.url.set(url);
    }

    /// Confirms an approved `charge`, in the background.
    pub fn confirm(&self, charge: PaymentData) {
        let Some(url) = self.url.get().cloned() else {
            tracing::warn!("the simulated gateway has nowhere to confirm charges yet");
            return;
        };
        // One id per charge, kept across redeliveries.
        let id = format!("msg_{}", charge.order_ref.simple());
        let event = PaymentEvent {
            kind: PAYMENT_SUCCEEDED.to_owned(),
            data: charge,
        };
        let payload = serde_json::to_string(&event).unwrap_or_default();
        let sender = self.clone();
        tokio::spawn(async move { sender.deliver(url, id, payload).await });
    }

    async fn deliver(self, url: reqwest::Url, id: String, payload: String) {
        let mut pause = Duration::from_millis(100);
        for attempt in 1..=ATTEMPTS {
            let timestamp = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_secs())
                .to_string();
            let sent = self
                .client
                .post(url.clone())
                .header("content-type", "application/json")
                .header("webhook-id", &id)
                .header("webhook-timestamp", &timestamp)
                .header(
                    "webhook-signature",
                    sign(&self.key, &id, &timestamp, &payload),
                )
                .body(payload.clone())
                .send()
                .await;
            match sent {
                Ok(answer) if answer.status().is_success() => return,
                Ok(answer) => {
                    tracing::debug!(status = %answer.status(), attempt, "payment confirmation not accepted; redelivering");
                }
                Err(error) => {
                    tracing::debug!(%error, attempt, "payment confirmation not delivered; redelivering");
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
        tracing::warn!(
            attempts = ATTEMPTS,
            "the simulated gateway gave up confirming a charge"
        );
    }
}

/// `webhook-signature`'s value: `v1,` + base64 of the HMAC-SHA256 of
/// `id.timestamp.payload`.
fn sign(key: &[u8], id: &str, timestamp: &str, payload: &str) -> String {
    // HMAC accepts keys of any length.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(payload.as_bytes());
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_it_signs_the_layer_verifies() {
        let secret = WebhookSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(format!("{secret:?}"), "WebhookSecret(..)");
        let now = SystemTime::now();
        let timestamp = now
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            .to_string();
        let payload = r#"{"type":"payment.succeeded"}"#;
        let mut headers = HeaderMap::new();
        headers.insert("webhook-id", "msg_1".parse().unwrap());
        headers.insert("webhook-timestamp", timestamp.parse().unwrap());
        headers.insert(
            "webhook-signature",
            sign(&secret.key(), "msg_1", &timestamp, payload)
                .parse()
                .unwrap(),
        );
        let webhook = secret.webhook();
        assert_eq!(webhook.verify(&headers, payload.as_bytes(), now), Ok(()));
        assert!(
            webhook
                .verify(&headers, b"{\"type\":\"other\"}", now)
                .is_err()
        );
        assert!(WebhookSecret::parse("whsec_!!!").is_err());
    }

    #[test]
    fn signs_the_specifications_example() {
        // The Standard Webhooks specification's example (its libraries' tests).
        let secret = WebhookSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            sign(
                &secret.key(),
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                "1614265330",
                r#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }
}
