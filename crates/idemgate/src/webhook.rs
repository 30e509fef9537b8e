//! Webhook receivers: a provider's delivery verified before anything is claimed.
//!
//! Providers deliver at least once and redeliver on any timeout or non-2xx, so
//! a receiver must deduplicate — but a receiver that claims a delivery id
//! before checking the signature lets anyone who can reach it pre-claim a
//! future event id and have the real delivery answered "duplicate" and dropped.
//! A layer with [`crate::IdempotencyLayer::with_webhook`] therefore checks the
//! provider's signature first, with each provider's documented scheme and a
//! constant-time comparison ([`Mac::verify_slice`]):
//!
//! | provider | signature | signed content | timestamp | delivery id (the key) |
//! |---|---|---|---|---|
//! | [`Provider::Stripe`] | `Stripe-Signature: t=…,v1=<hex>[,v1=…]` | `t` `.` payload | `t` | the event's `id` (body) |
//! | [`Provider::Github`] | `X-Hub-Signature-256: sha256=<hex>` | payload | — | `X-GitHub-Delivery` |
//! | [`Provider::Shopify`] | `X-Shopify-Hmac-Sha256: <base64>` | payload | — | `X-Shopify-Event-Id`, else `X-Shopify-Webhook-Id` |
//! | [`Provider::Standard`] | `webhook-signature: v1,<base64>[ v1,…]` | id `.` timestamp `.` payload | `webhook-timestamp` | `webhook-id` |
//!
//! Every signature is HMAC-SHA256. A delivery is accepted when any signature
//! it carries matches any of the route's secrets (several during a rotation).
//! A signed timestamp further than the tolerance from now, either way, is
//! refused as stale: an old delivery replayed, however validly signed. Only
//! then is the delivery claimed, under its own id, scoped by the route and the
//! provider account, fingerprinted by its raw payload (the service's
//! `webhook_delivery`).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderName, StatusCode};
use sha2::Sha256;

use idemgate_core::key::KeySource;
use idemgate_core::scope::Principal;

use crate::problem::ProblemDetails;

/// The tolerance of signed timestamps when none is given: five minutes, the
/// default of Stripe's and the Standard Webhooks libraries.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// The `outcome` label values of `idemgate_webhooks_total`: a delivery
/// verified and forwarded (a new one, or a redelivery after a release); refused
/// for its signature (missing, malformed, or matching no secret); refused for a
/// signed timestamp outside the tolerance; answered from its record without
/// running (a replay of a completed delivery, or a `409` for one still running);
/// its id seen before with another payload (`422`). Each delivery counts once.
pub const WEBHOOK_OUTCOMES: [&str; 5] = [
    "verified",
    "bad_signature",
    "stale",
    "duplicate",
    "mismatch",
];

/// A sender whose signature scheme the layer verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Provider {
    /// Stripe: `Stripe-Signature`, the event id from the body.
    Stripe,
    /// GitHub: `X-Hub-Signature-256`, `X-GitHub-Delivery`.
    Github,
    /// Shopify: `X-Shopify-Hmac-Sha256`, `X-Shopify-Event-Id` or
    /// `X-Shopify-Webhook-Id`.
    Shopify,
    /// The Standard Webhooks specification (Svix, Resend, Clerk and others):
    /// `webhook-id`, `webhook-timestamp`, `webhook-signature`, `whsec_` secrets.
    Standard,
}

impl Provider {
    /// Every provider, in declaration order.
    pub const ALL: [Self; 4] = [Self::Stripe, Self::Github, Self::Shopify, Self::Standard];

    /// Its name: the `provider` label and the route file's spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Stripe => "stripe",
            Self::Github => "github",
            Self::Shopify => "shopify",
            Self::Standard => "standard",
        }
    }

    /// Whether its deliveries carry a signed timestamp (a tolerance applies).
    pub const fn signs_timestamps(self) -> bool {
        matches!(self, Self::Stripe | Self::Standard)
    }

    /// Where its deliveries carry their id, for the problem that says it is
    /// missing: a body field or a header.
    fn id_source(self) -> KeySource {
        match self {
            Self::Stripe => KeySource::Json(
                "/id"
                    .parse()
                    .expect("a constant JSON pointer parses (tested)"),
            ),
            Self::Github => KeySource::Header(GITHUB_DELIVERY),
            Self::Shopify => KeySource::Header(SHOPIFY_WEBHOOK_ID),
            Self::Standard => KeySource::Header(STANDARD_ID),
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Provider {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|provider| provider.as_str() == text)
            .ok_or_else(|| {
                format!("unknown webhook provider {text:?}: stripe, github, shopify or standard")
            })
    }
}

const STRIPE_SIGNATURE: HeaderName = HeaderName::from_static("stripe-signature");
const GITHUB_SIGNATURE: HeaderName = HeaderName::from_static("x-hub-signature-256");
const GITHUB_DELIVERY: HeaderName = HeaderName::from_static("x-github-delivery");
const SHOPIFY_HMAC: HeaderName = HeaderName::from_static("x-shopify-hmac-sha256");
const SHOPIFY_WEBHOOK_ID: HeaderName = HeaderName::from_static("x-shopify-webhook-id");
const SHOPIFY_EVENT_ID: HeaderName = HeaderName::from_static("x-shopify-event-id");
const SHOPIFY_SHOP: HeaderName = HeaderName::from_static("x-shopify-shop-domain");
const STANDARD_ID: HeaderName = HeaderName::from_static("webhook-id");
const STANDARD_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
const STANDARD_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");

/// A secret that cannot be used: a Standard Webhooks secret that is not base64
/// (after its `whsec_` prefix), an empty one, or none at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookSecretError {
    /// No secret was given.
    #[error("a webhook needs at least one secret")]
    NoSecret,
    /// An empty secret.
    #[error("a webhook secret is empty")]
    Empty,
    /// A Standard Webhooks secret that is not `whsec_` + base64.
    #[error("a Standard Webhooks secret is whsec_ followed by base64; this one is not base64")]
    NotBase64,
}

/// A provider's webhook as a route receives it: its signature scheme, the
/// secrets a delivery may be signed with, and the tolerance of signed
/// timestamps. Secrets are kept as HMAC keys and never printed.
///
/// ```
/// use idemgate::webhook::{Provider, Webhook};
///
/// // Two secrets while the provider rotates from the old to the new one.
/// let webhook = Webhook::new(Provider::Stripe, ["whsec_old", "whsec_new"])
///     .unwrap()
///     .with_tolerance(std::time::Duration::from_secs(300));
/// assert_eq!(webhook.provider(), Provider::Stripe);
/// ```
#[derive(Clone)]
pub struct Webhook {
    provider: Provider,
    keys: Vec<Vec<u8>>,
    tolerance: Duration,
}

impl fmt::Debug for Webhook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Webhook")
            .field("provider", &self.provider)
            .field("secrets", &self.keys.len())
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

impl Webhook {
    /// A webhook of `provider` signed with any of `secrets`, as the provider
    /// shows them (Stripe's `whsec_…` whole, Standard Webhooks' `whsec_` +
    /// base64, GitHub's and Shopify's as typed), with the default tolerance
    /// ([`DEFAULT_TOLERANCE`]).
    pub fn new<S: AsRef<str>>(
        provider: Provider,
        secrets: impl IntoIterator<Item = S>,
    ) -> Result<Self, WebhookSecretError> {
        let keys = secrets
            .into_iter()
            .map(|secret| key_of(provider, secret.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(WebhookSecretError::NoSecret);
        }
        Ok(Self {
            provider,
            keys,
            tolerance: DEFAULT_TOLERANCE,
        })
    }

    /// How far a signed timestamp may be from now, either way (default five
    /// minutes). Only Stripe and Standard Webhooks sign one.
    #[must_use]
    pub fn with_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The provider.
    pub fn provider(&self) -> Provider {
        self.provider
    }

    /// The tolerance of signed timestamps.
    pub fn tolerance(&self) -> Duration {
        self.tolerance
    }

    /// Whether `body`, with `headers`, is a delivery signed with one of the
    /// secrets, at a signed time within the tolerance of `now`. The signature
    /// is checked before the timestamp: a forged timestamp is a bad signature,
    /// a stale delivery one that was validly signed long ago.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), WebhookRefusal> {
        let signed_at = match self.provider {
            Provider::Stripe => {
                let header = one_header(headers, &STRIPE_SIGNATURE)?;
                let (timestamp, signatures) = stripe_header(header)?;
                let signed = |mac: &mut Hmac<Sha256>| {
                    mac.update(timestamp.as_bytes());
                    mac.update(b".");
                    mac.update(body);
                };
                self.check(signed, &signatures)?;
                Some(timestamp)
            }
            Provider::Github => {
                let header = one_header(headers, &GITHUB_SIGNATURE)?;
                let signature = header
                    .strip_prefix("sha256=")
                    .and_then(|hex| hex::decode(hex).ok())
                    .ok_or(WebhookRefusal::Malformed(GITHUB_SIGNATURE))?;
                self.check(|mac| mac.update(body), &[signature])?;
                None
            }
            Provider::Shopify => {
                let header = one_header(headers, &SHOPIFY_HMAC)?;
                let signature = BASE64
                    .decode(header.trim())
                    .map_err(|_| WebhookRefusal::Malformed(SHOPIFY_HMAC))?;
                self.check(|mac| mac.update(body), &[signature])?;
                None
            }
            Provider::Standard => {
                let id = one_header(headers, &STANDARD_ID)?;
                let timestamp = one_header(headers, &STANDARD_TIMESTAMP)?;
                let signatures: Vec<Vec<u8>> = one_header(headers, &STANDARD_SIGNATURE)?
                    .split(' ')
                    .filter_map(|entry| entry.strip_prefix("v1,"))
                    .filter_map(|signature| BASE64.decode(signature).ok())
                    .collect();
                if signatures.is_empty() {
                    return Err(WebhookRefusal::Malformed(STANDARD_SIGNATURE));
                }
                let signed = |mac: &mut Hmac<Sha256>| {
                    mac.update(id.as_bytes());
                    mac.update(b".");
                    mac.update(timestamp.as_bytes());
                    mac.update(b".");
                    mac.update(body);
                };
                self.check(signed, &signatures)?;
                Some(timestamp)
            }
        };
        let Some(signed_at) = signed_at else {
            return Ok(());
        };
        let signed_at: u64 = signed_at.trim().parse().map_err(|_| {
            WebhookRefusal::Malformed(match self.provider {
                Provider::Stripe => STRIPE_SIGNATURE,
                _ => STANDARD_TIMESTAMP,
            })
        })?;
        let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let skew = now.abs_diff(signed_at);
        if skew > self.tolerance.as_secs() {
            return Err(WebhookRefusal::Stale {
                skew_seconds: skew,
                tolerance_seconds: self.tolerance.as_secs(),
            });
        }
        Ok(())
    }

    /// Whether one of `signatures` is the HMAC of what `signed` feeds under one
    /// of the secrets, each compared in constant time.
    fn check(
        &self,
        signed: impl Fn(&mut Hmac<Sha256>),
        signatures: &[Vec<u8>],
    ) -> Result<(), WebhookRefusal> {
        for key in &self.keys {
            // HMAC accepts keys of any length, so this cannot fail.
            let mut mac =
                <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
            signed(&mut mac);
            for signature in signatures {
                if mac.clone().verify_slice(signature).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(WebhookRefusal::BadSignature)
    }

    /// The delivery's own id and provider account, read from a verified
    /// delivery.
    pub(crate) fn delivery(&self, headers: &HeaderMap, body: &[u8]) -> Delivery {
        let header = |name: &HeaderName| {
            let mut values = headers.get_all(name).iter();
            match (values.next(), values.next()) {
                (Some(value), None) => value.to_str().ok().map(str::to_owned),
                _ => None,
            }
        };
        let (id, account) = match self.provider {
            Provider::Stripe => {
                // A Connect event names the connected account it is about.
                #[derive(serde::Deserialize)]
                struct Event {
                    id: Option<String>,
                    account: Option<String>,
                }
                match serde_json::from_slice::<Event>(body) {
                    Ok(event) => (event.id, event.account),
                    Err(_) => (None, None),
                }
            }
            Provider::Github => (header(&GITHUB_DELIVERY), None),
            Provider::Shopify => (
                header(&SHOPIFY_EVENT_ID).or_else(|| header(&SHOPIFY_WEBHOOK_ID)),
                header(&SHOPIFY_SHOP),
            ),
            Provider::Standard => (header(&STANDARD_ID), None),
        };
        let principal = match account {
            Some(account) => format!("webhook:{}:{account}", self.provider),
            None => format!("webhook:{}", self.provider),
        };
        Delivery {
            id,
            principal: Principal::new(principal),
        }
    }

    /// The `400 missing-key` of a verified delivery without its id.
    pub(crate) fn missing_id(&self) -> ProblemDetails {
        ProblemDetails::missing_key_at(&self.provider.id_source())
    }
}

/// What a verified delivery is claimed as.
#[derive(Debug)]
pub(crate) struct Delivery {
    /// The provider's id of the delivery (its event); `None` when it carries none.
    pub(crate) id: Option<String>,
    /// The scope's principal: the provider and, where it names one, the account
    /// (a Stripe Connect account, a Shopify shop). Webhooks carry no user
    /// credentials.
    pub(crate) principal: Principal,
}

/// Why a delivery was refused before anything was claimed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookRefusal {
    /// The signature header (or another the signature needs) is missing.
    #[error("the delivery has no {0} header")]
    Missing(HeaderName),
    /// A header the signature needs came on several lines.
    #[error("the {0} header appears more than once")]
    Repeated(HeaderName),
    /// A header the signature needs cannot be read.
    #[error("the {0} header is malformed")]
    Malformed(HeaderName),
    /// No signature matches any of the secrets: forged, tampered with, or
    /// signed with another secret.
    #[error("no signature of the delivery matches the endpoint's secret")]
    BadSignature,
    /// Validly signed, at a time further than the tolerance from now.
    #[error(
        "the delivery was signed {skew_seconds} s away from now, past the tolerance of {tolerance_seconds} s"
    )]
    Stale {
        /// Seconds between the signed timestamp and now.
        skew_seconds: u64,
        /// The tolerance, in seconds.
        tolerance_seconds: u64,
    },
}

impl WebhookRefusal {
    /// Its `outcome` label of `idemgate_webhooks_total`: `stale` or
    /// `bad_signature`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Stale { .. } => "stale",
            _ => "bad_signature",
        }
    }

    /// The `401` it is answered with: `bad-webhook-signature` or `stale-webhook`
    /// (`docs/problems.md`).
    pub fn problem(&self) -> ProblemDetails {
        match self {
            Self::Stale { .. } => ProblemDetails::new(
                StatusCode::UNAUTHORIZED,
                "stale-webhook",
                "Webhook timestamp outside the tolerance",
                self.to_string(),
            ),
            _ => ProblemDetails::new(
                StatusCode::UNAUTHORIZED,
                "bad-webhook-signature",
                "Webhook signature not verified",
                self.to_string(),
            ),
        }
    }
}

/// The HMAC key of a secret as `provider` shows it.
fn key_of(provider: Provider, secret: &str) -> Result<Vec<u8>, WebhookSecretError> {
    if secret.is_empty() {
        return Err(WebhookSecretError::Empty);
    }
    if provider != Provider::Standard {
        return Ok(secret.as_bytes().to_vec());
    }
    // Padded or not, as the Standard Webhooks libraries read it.
    let lenient = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    match lenient.decode(encoded) {
        Ok(key) if !key.is_empty() => Ok(key),
        _ => Err(WebhookSecretError::NotBase64),
    }
}

/// The one value of a header the signature needs, as text.
fn one_header<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<&'a str, WebhookRefusal> {
    let mut values = headers.get_all(name).iter();
    let value = values
        .next()
        .ok_or_else(|| WebhookRefusal::Missing(name.clone()))?;
    if values.next().is_some() {
        return Err(WebhookRefusal::Repeated(name.clone()));
    }
    value
        .to_str()
        .map_err(|_| WebhookRefusal::Malformed(name.clone()))
}

/// `Stripe-Signature`'s `t` and its `v1` signatures (other schemes, such as the
/// test mode's `v0`, are not checked, as Stripe's libraries do not).
fn stripe_header(header: &str) -> Result<(&str, Vec<Vec<u8>>), WebhookRefusal> {
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for item in header.split(',') {
        match item.trim().split_once('=') {
            Some(("t", value)) => timestamp = Some(value),
            Some(("v1", value)) => {
                if let Ok(signature) = hex::decode(value) {
                    signatures.push(signature);
                }
            }
            _ => {}
        }
    }
    match timestamp {
        Some(timestamp) if !signatures.is_empty() => Ok((timestamp, signatures)),
        _ => Err(WebhookRefusal::Malformed(STRIPE_SIGNATURE)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| (name.parse().unwrap(), value.parse().unwrap()))
            .collect()
    }

    fn hmac(key: &[u8], message: &[u8]) -> Vec<u8> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap();
        mac.update(message);
        mac.finalize().into_bytes().to_vec()
    }

    #[test]
    fn github_documented_test_vector() {
        // https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries#testing-the-webhook-payload-validation
        let webhook = Webhook::new(Provider::Github, ["It's a Secret to Everybody"]).unwrap();
        let signed = headers(&[(
            "x-hub-signature-256",
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        )]);
        assert_eq!(webhook.verify(&signed, b"Hello, World!", at(0)), Ok(()));
        assert_eq!(
            webhook.verify(&signed, b"Hello, World?", at(0)),
            Err(WebhookRefusal::BadSignature)
        );
        assert_eq!(
            webhook.verify(&HeaderMap::new(), b"Hello, World!", at(0)),
            Err(WebhookRefusal::Missing(GITHUB_SIGNATURE))
        );
    }

    #[test]
    fn stripe_accepts_any_v1_under_any_secret_and_refuses_stale_ones() {
        let webhook = Webhook::new(Provider::Stripe, ["whsec_old", "whsec_new"]).unwrap();
        let body = br#"{"id":"evt_1","object":"event"}"#;
        let signature = |key: &str, t: u64| {
            hex::encode(hmac(
                key.as_bytes(),
                &[format!("{t}.").as_bytes(), body].concat(),
            ))
        };
        let header = format!(
            "t=1000,v1={},v1={},v0=ignored",
            hex::encode([0u8; 32]),
            signature("whsec_new", 1000)
        );
        let signed = headers(&[("stripe-signature", &header)]);
        assert_eq!(webhook.verify(&signed, body, at(1000 + 300)), Ok(()));
        assert_eq!(webhook.verify(&signed, body, at(1000 - 300)), Ok(()));
        let stale = webhook.verify(&signed, body, at(1000 + 301)).unwrap_err();
        assert_eq!(stale.outcome(), "stale");
        assert_eq!(stale.problem().status, 401);
        // A timestamp changed to look fresh breaks the signature.
        let forged = headers(&[(
            "stripe-signature",
            &format!("t=2000,v1={}", signature("whsec_new", 1000)),
        )]);
        assert_eq!(
            webhook.verify(&forged, body, at(2000)),
            Err(WebhookRefusal::BadSignature)
        );
        let no_v1 = headers(&[("stripe-signature", "t=1000")]);
        assert_eq!(
            webhook
                .verify(&no_v1, body, at(1000))
                .unwrap_err()
                .outcome(),
            "bad_signature"
        );
        let delivery = webhook.delivery(&signed, br#"{"id":"evt_1","account":"acct_9"}"#);
        assert_eq!(delivery.id.as_deref(), Some("evt_1"));
        assert_eq!(delivery.principal.as_str(), "webhook:stripe:acct_9");
        assert_eq!(webhook.delivery(&signed, b"not json").id, None);
    }

    #[test]
    fn shopify_is_base64_of_the_payload_hmac() {
        let webhook = Webhook::new(Provider::Shopify, ["hush"]).unwrap();
        let body = br#"{"id":820982911946154508}"#;
        let signature = BASE64.encode(hmac(b"hush", body));
        let signed = headers(&[
            ("x-shopify-hmac-sha256", &signature),
            (
                "x-shopify-webhook-id",
                "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
            ),
            ("x-shopify-shop-domain", "example.myshopify.com"),
        ]);
        assert_eq!(webhook.verify(&signed, body, at(0)), Ok(()));
        assert_eq!(
            webhook.verify(&signed, b"{}", at(0)),
            Err(WebhookRefusal::BadSignature)
        );
        let delivery = webhook.delivery(&signed, body);
        assert_eq!(
            delivery.id.as_deref(),
            Some("b54557e4-bdd9-4b37-8a5f-bf7d70bcd043")
        );
        assert_eq!(
            delivery.principal.as_str(),
            "webhook:shopify:example.myshopify.com"
        );
        let mut with_event = signed.clone();
        with_event.insert("x-shopify-event-id", "evt-7".parse().unwrap());
        assert_eq!(
            webhook.delivery(&with_event, body).id.as_deref(),
            Some("evt-7")
        );
    }

    #[test]
    fn standard_webhooks_signs_id_timestamp_and_payload() {
        let key = b"a standard webhooks key";
        let secret = format!("whsec_{}", BASE64.encode(key));
        let webhook = Webhook::new(Provider::Standard, [secret.as_str()]).unwrap();
        let body = br#"{"type":"user.created"}"#;
        let signature = BASE64.encode(hmac(key, &[b"msg_1.1000.".as_slice(), body].concat()));
        let signed = headers(&[
            ("webhook-id", "msg_1"),
            ("webhook-timestamp", "1000"),
            (
                "webhook-signature",
                &format!("v1,{} v1a,ignored v1,{signature}", BASE64.encode([1u8; 32])),
            ),
        ]);
        assert_eq!(webhook.verify(&signed, body, at(1000)), Ok(()));
        assert_eq!(
            webhook
                .verify(&signed, body, at(1000 + 301))
                .unwrap_err()
                .outcome(),
            "stale"
        );
        let mut other_id = signed.clone();
        other_id.insert("webhook-id", "msg_2".parse().unwrap());
        assert_eq!(
            webhook.verify(&other_id, body, at(1000)),
            Err(WebhookRefusal::BadSignature)
        );
        assert_eq!(webhook.delivery(&signed, body).id.as_deref(), Some("msg_1"));
        assert_eq!(
            Webhook::new(Provider::Standard, ["whsec_!!!"]).unwrap_err(),
            WebhookSecretError::NotBase64
        );
    }

    #[test]
    fn a_repeated_signature_header_is_refused() {
        let webhook = Webhook::new(Provider::Github, ["s"]).unwrap();
        let mut repeated = HeaderMap::new();
        repeated.append("x-hub-signature-256", "sha256=00".parse().unwrap());
        repeated.append("x-hub-signature-256", "sha256=01".parse().unwrap());
        assert_eq!(
            webhook.verify(&repeated, b"", at(0)),
            Err(WebhookRefusal::Repeated(GITHUB_SIGNATURE))
        );
        assert_eq!(
            Webhook::new(Provider::Github, Vec::<String>::new()).unwrap_err(),
            WebhookSecretError::NoSecret
        );
    }

    #[test]
    fn every_provider_names_where_its_id_is() {
        for provider in Provider::ALL {
            assert_eq!(provider.as_str().parse::<Provider>(), Ok(provider));
            let _ = provider.id_source();
        }
        assert!("paypal".parse::<Provider>().is_err());
    }
}
