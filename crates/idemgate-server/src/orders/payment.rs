//! The payment gateway client: `POST {gateway}/charges`, or a simulated gateway
//! in-process (which, with a payment webhook, also confirms each charge to
//! `POST /webhooks/payments`: [`webhook`](super::webhook)).

use std::time::Duration;

use serde::Serialize;
use uuid::Uuid;

use crate::orders::webhook::{Confirmations, PaymentData};

/// What the service asks the gateway to charge.
#[derive(Debug, Clone, Serialize)]
pub struct ChargeRequest {
    /// The operation id: the order's reference at the gateway.
    pub order_ref: Uuid,
    /// Amount in the currency's minor units.
    pub amount: i64,
    /// ISO 4217 code.
    pub currency: String,
}

/// How a charge went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeOutcome {
    /// Any 2xx: charged. Carries the gateway's charge id when it sent one.
    Approved {
        /// The gateway's `id` field, if its answer was JSON with one.
        charge_id: Option<String>,
    },
    /// 402: the payment was refused; final.
    Declined {
        /// The gateway's explanation, if any.
        reason: String,
    },
    /// 5xx, another 4xx, or no connection: nothing known to be charged; the
    /// propagated key makes a retry safe.
    Failed {
        /// What went wrong.
        reason: String,
    },
    /// No answer within the timeout: the charge may or may not have happened;
    /// the propagated key makes a retry safe.
    TimedOut,
}

/// The payment gateway the orders handler charges.
#[derive(Debug, Clone)]
pub enum PaymentGateway {
    /// A real HTTP gateway.
    Http {
        /// Shared connection pool.
        client: reqwest::Client,
        /// `{base}/charges`.
        charges_url: reqwest::Url,
    },
    /// Approves everything, in-process, after `delay`: the default run needs
    /// nothing else, and a delay lets a newcomer see a 409 by hand.
    Simulated {
        /// How long each charge takes.
        delay: Duration,
        /// With a payment webhook: confirms each approved charge to
        /// `POST /webhooks/payments`, as a real gateway would.
        confirmations: Option<Confirmations>,
    },
}

impl PaymentGateway {
    /// An HTTP gateway at `base` (charges go to `{base}/charges`).
    pub fn http(base: &reqwest::Url, timeout: Duration) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .build()?;
        let charges_url = format!("{}/charges", base.as_str().trim_end_matches('/'))
            .parse()
            .unwrap_or_else(|_| base.clone());
        Ok(Self::Http {
            client,
            charges_url,
        })
    }

    /// Charges once. `idempotency_key`, derived from the operation id, makes the
    /// gateway fold retries of one operation into one charge.
    pub async fn charge(
        &self,
        request: &ChargeRequest,
        idempotency_key: Option<&str>,
    ) -> ChargeOutcome {
        let (client, url) = match self {
            Self::Simulated {
                delay,
                confirmations,
            } => {
                if !delay.is_zero() {
                    tokio::time::sleep(*delay).await;
                }
                let charge_id = format!("sim_{}", request.order_ref.simple());
                if let Some(confirmations) = confirmations {
                    confirmations.confirm(PaymentData {
                        order_ref: request.order_ref,
                        charge_id: Some(charge_id.clone()),
                        amount: request.amount,
                        currency: request.currency.clone(),
                    });
                }
                return ChargeOutcome::Approved {
                    charge_id: Some(charge_id),
                };
            }
            Self::Http {
                client,
                charges_url,
            } => (client, charges_url),
        };
        let mut call = client.post(url.clone()).json(request);
        if let Some(key) = idempotency_key {
            call = call.header("Idempotency-Key", key);
        }
        let response = match call.send().await {
            Ok(response) => response,
            Err(error) if error.is_timeout() => return ChargeOutcome::TimedOut,
            Err(error) => {
                return ChargeOutcome::Failed {
                    reason: format!("gateway unreachable: {error}"),
                };
            }
        };
        let status = response.status();
        let body = match response.bytes().await {
            Ok(body) => body,
            Err(error) if error.is_timeout() => return ChargeOutcome::TimedOut,
            Err(error) => {
                return ChargeOutcome::Failed {
                    reason: format!("gateway answer unreadable: {error}"),
                };
            }
        };
        if status.is_success() {
            let charge_id = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|json| json.get("id").and_then(|id| id.as_str()).map(str::to_owned));
            ChargeOutcome::Approved { charge_id }
        } else if status == reqwest::StatusCode::PAYMENT_REQUIRED {
            ChargeOutcome::Declined {
                reason: String::from_utf8_lossy(&body).chars().take(200).collect(),
            }
        } else {
            ChargeOutcome::Failed {
                reason: format!("gateway answered {status}"),
            }
        }
    }
}
