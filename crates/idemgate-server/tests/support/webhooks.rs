//! Webhook deliveries as providers send them, for the webhook tests: signed by
//! the providers' own libraries (the `stripe` and `standardwebhooks` packages)
//! through `tests/webhooks/sign.py`, run from the pinned virtualenv
//! `scripts/services.sh webhook-signers` installs (a missing one fails the test
//! saying so).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{SystemTime, UNIX_EPOCH};

use super::client::Answer;
use super::proxy::Proxy;

/// Now, in Unix seconds: the time a delivery is signed at.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// One delivery as a provider sends it: its payload, id and signed time, signed
/// with `secret`.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub provider: &'static str,
    pub secret: String,
    pub payload: String,
    pub id: String,
    pub timestamp: u64,
}

impl Delivery {
    /// A fresh delivery of `provider`, signed now with `secret`.
    pub fn new(provider: &'static str, secret: &str) -> Self {
        let id = match provider {
            "stripe" => format!("evt_{}", uuid::Uuid::new_v4().simple()),
            "standard" => format!("msg_{}", uuid::Uuid::new_v4().simple()),
            _ => uuid::Uuid::new_v4().to_string(),
        };
        let payload = match provider {
            // The id is in Stripe's body; the others carry it in a header.
            "stripe" => format!(
                r#"{{"id":"{id}","object":"event","type":"payment_intent.succeeded","data":{{"object":{{"amount":1500}}}}}}"#
            ),
            _ => format!(
                r#"{{"event":"order.paid","order":"{}"}}"#,
                uuid::Uuid::new_v4()
            ),
        };
        Self {
            provider,
            secret: secret.to_owned(),
            payload,
            id,
            timestamp: now(),
        }
    }

    pub fn with_secret(mut self, secret: &str) -> Self {
        self.secret = secret.to_owned();
        self
    }

    pub fn at(mut self, timestamp: u64) -> Self {
        self.timestamp = timestamp;
        self
    }

    /// The same id (Stripe's in the body) with another payload.
    pub fn with_other_payload(mut self) -> Self {
        self.payload = self.payload.replace('}', r#","changed":true}"#);
        self
    }
}

/// A delivery signed by `sign.py`: the headers and body to send.
#[derive(Clone, Debug)]
pub struct Signed {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Signed {
    pub fn with_body(mut self, body: &str) -> Self {
        self.body = body.to_owned();
        self
    }

    /// Without its signature headers: what an attacker without the secret sends.
    pub fn unsigned(mut self) -> Self {
        self.headers.retain(|(name, _)| {
            let name = name.to_ascii_lowercase();
            !(name.contains("signature") || name.contains("hmac"))
        });
        self
    }
}

/// The signers' Python (`scripts/services.sh webhook-signers`); missing, the
/// test fails saying how to install it.
pub fn signer_python() -> PathBuf {
    let dir = std::env::var_os("IDEMGATE_WEBHOOK_SIGNERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/webhook-signers")
        });
    let python = dir.join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/services.sh webhook-signers (scripts/test.sh does)",
        python.display()
    );
    python
}

/// Signs `deliveries` with the providers' own libraries, in one run of sign.py.
pub async fn sign(deliveries: &[Delivery]) -> Vec<Signed> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/webhooks/sign.py");
    let input = serde_json::Value::Array(
        deliveries
            .iter()
            .map(|d| {
                serde_json::json!({
                    "provider": d.provider, "secret": d.secret, "payload": d.payload,
                    "timestamp": d.timestamp, "id": d.id,
                })
            })
            .collect(),
    );
    let python = signer_python();
    let output = tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        let mut child = std::process::Command::new(python)
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run sign.py");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.to_string().as_bytes()).unwrap();
        drop(stdin);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert!(output.status.success(), "sign.py failed: {output:?}");
    let signed: Vec<serde_json::Map<String, serde_json::Value>> =
        serde_json::from_slice(&output.stdout).expect("sign.py's JSON");
    deliveries
        .iter()
        .zip(signed)
        .map(|(delivery, headers)| {
            let mut headers: Vec<(String, String)> = headers
                .into_iter()
                .map(|(name, value)| (name, value.as_str().unwrap().to_owned()))
                .collect();
            match delivery.provider {
                "github" => headers.push(("X-GitHub-Delivery".into(), delivery.id.clone())),
                "shopify" => {
                    headers.push(("X-Shopify-Webhook-Id".into(), delivery.id.clone()));
                    headers.push(("X-Shopify-Shop-Domain".into(), "e2e.myshopify.com".into()));
                }
                _ => {}
            }
            headers.push(("Content-Type".into(), "application/json".into()));
            Signed {
                path: format!("/hooks/{}", delivery.provider),
                headers,
                body: delivery.payload.clone(),
            }
        })
        .collect()
}

pub async fn deliver(proxy: &Proxy, signed: &Signed) -> Answer {
    let mut request = reqwest::Client::new()
        .post(proxy.url(&signed.path))
        .timeout(std::time::Duration::from_secs(30))
        .body(signed.body.clone());
    for (name, value) in &signed.headers {
        request = request.header(name, value);
    }
    let response = request.send().await.expect("deliver");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await.unwrap();
    Answer {
        status,
        headers,
        body,
    }
}
