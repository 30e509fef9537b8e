//! Webhook receivers (`webhook = { provider, secret, tolerance }` on proxy
//! routes): the real binary in front of a counting upstream, on every store,
//! with deliveries signed by the providers' own libraries (the `stripe` and
//! `standardwebhooks` packages, driven by `tests/webhooks/sign.py` from the
//! pinned virtualenv `scripts/services.sh webhook-signers` installs) and GitHub's
//! documented test vector reproduced exactly. Every scenario asserts what the
//! upstream ran.

use std::sync::Arc;

use axum::http::StatusCode;
use base64::Engine as _;
use tokio::sync::Barrier;

use crate::support::client::Answer;
use crate::support::proxy::{Proxy, ProxyOptions, Upstream};
use crate::support::server::{TempDir, postgres_url, redis_url, sqlite_url};
use crate::support::webhooks::{Delivery, Signed, deliver, now, sign};

/// GitHub's documented test vector
/// (docs.github.com, "Validating webhook deliveries"): the GitHub route's secret.
const GITHUB_SECRET: &str = "It's a Secret to Everybody";
const GITHUB_PAYLOAD: &str = "Hello, World!";
const GITHUB_SIGNATURE: &str =
    "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

const ROUTES: &str = r#"
[[route]]
method = "POST"
path = "/hooks/stripe"
wait_ms = 10000
webhook = { provider = "stripe", secret = "env:WH_STRIPE", tolerance = "5m" }

[[route]]
method = "POST"
path = "/hooks/github"
wait_ms = 10000
webhook = { provider = "github", secret = "env:WH_GITHUB" }

[[route]]
method = "POST"
path = "/hooks/shopify"
wait_ms = 10000
webhook = { provider = "shopify", secret = "env:WH_SHOPIFY" }

[[route]]
method = "POST"
path = "/hooks/standard"
wait_ms = 10000
webhook = { provider = "standard", secret = "env:WH_STANDARD", tolerance = "5m" }

[[route]]
method = "POST"
path = "/hooks/rotating"
webhook = { provider = "stripe", secrets = ["env:WH_OLD", "env:WH_NEW"] }

[[route]]
method = "POST"
path = "/hooks/rotating-github"
webhook = { provider = "github", secrets = ["env:WH_OLD", "env:WH_NEW"] }

[[route]]
method = "POST"
path = "/hooks/rotating-shopify"
webhook = { provider = "shopify", secrets = ["env:WH_OLD", "env:WH_NEW"] }

[[route]]
method = "POST"
path = "/hooks/rotating-standard"
webhook = { provider = "standard", secrets = ["env:WH_OLD", "env:WH_NEW"] }
"#;

/// The routes' secrets, fresh per proxy.
struct Secrets {
    stripe: String,
    shopify: String,
    standard: String,
    old: String,
    new: String,
}

impl Secrets {
    fn new() -> Self {
        let random = || uuid::Uuid::new_v4().simple().to_string();
        Self {
            stripe: format!("whsec_{}", random()),
            shopify: random(),
            standard: format!(
                "whsec_{}",
                base64::engine::general_purpose::STANDARD.encode(uuid::Uuid::new_v4().as_bytes())
            ),
            old: format!("whsec_{}", random()),
            new: format!("whsec_{}", random()),
        }
    }

    fn of(&self, provider: &str) -> &str {
        match provider {
            "stripe" => &self.stripe,
            "github" => GITHUB_SECRET,
            "shopify" => &self.shopify,
            "standard" => &self.standard,
            other => panic!("no provider {other}"),
        }
    }
}

struct Receiver {
    upstream: Upstream,
    proxy: Proxy,
    secrets: Secrets,
    _dirs: Vec<TempDir>,
}

async fn receiver(store: &str) -> Receiver {
    let (store, sqlite_dir) = match store {
        "memory" => ("memory".to_owned(), None),
        "sqlite" => {
            let (url, dir) = sqlite_url();
            (url, Some(dir))
        }
        "postgres" => (postgres_url(), None),
        "redis" => (redis_url(), None),
        other => panic!("no store {other}"),
    };
    let upstream = Upstream::start().await;
    let dir = TempDir::new("idemgate-webhooks");
    let path = dir.path().join("routes.toml");
    std::fs::write(&path, ROUTES).unwrap();
    let secrets = Secrets::new();
    let options = ProxyOptions::new(upstream.url())
        .store(&store)
        .arg("--config", path.display())
        .env("WH_STRIPE", &secrets.stripe)
        .env("WH_GITHUB", GITHUB_SECRET)
        .env("WH_SHOPIFY", &secrets.shopify)
        .env("WH_STANDARD", &secrets.standard)
        .env("WH_OLD", &secrets.old)
        .env("WH_NEW", &secrets.new);
    let proxy = Proxy::start(options).await;
    Receiver {
        upstream,
        proxy,
        secrets,
        _dirs: [Some(dir), sqlite_dir].into_iter().flatten().collect(),
    }
}

/// The upstream's executions with exactly this body.
fn forwarded(upstream: &Upstream, body: &str) -> usize {
    upstream
        .seen()
        .iter()
        .filter(|seen| seen.body == body.as_bytes())
        .count()
}

fn assert_refused(answer: &Answer, slug: &str) {
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{answer:?}");
    assert_eq!(
        answer.json()["type"],
        format!("/problems/{slug}"),
        "{answer:?}"
    );
}

/// Every scenario of the issue for one provider on one receiver.
async fn scenarios(receiver: &Receiver, provider: &'static str) {
    let (upstream, proxy, secrets) = (&receiver.upstream, &receiver.proxy, &receiver.secrets);
    let first = Delivery::new(provider, secrets.of(provider));
    let concurrent = Delivery::new(provider, secrets.of(provider));
    // Another secret, in the provider's own form (Standard Webhooks': base64).
    let other_secret = match provider {
        "standard" => "whsec_bm90IHRoZSBlbmRwb2ludCdzIHNlY3JldA==",
        _ => "not the endpoint's secret",
    };
    let forged = Delivery::new(provider, secrets.of(provider)).with_secret(other_secret);
    let tampered = Delivery::new(provider, secrets.of(provider));
    let stale = Delivery::new(provider, secrets.of(provider)).at(now() - 3600);
    let preclaimed = Delivery::new(provider, secrets.of(provider));
    let failing = Delivery::new(provider, secrets.of(provider));
    let reused = Delivery::new(provider, secrets.of(provider));
    let changed = reused.clone().with_other_payload();
    let signed = sign(&[
        first.clone(),
        concurrent.clone(),
        forged.clone(),
        tampered.clone(),
        stale.clone(),
        preclaimed.clone(),
        failing.clone(),
        reused.clone(),
        changed.clone(),
    ])
    .await;
    let [
        first_s,
        concurrent_s,
        forged_s,
        tampered_s,
        stale_s,
        preclaimed_s,
        failing_s,
        reused_s,
        changed_s,
    ]: [Signed; 9] = signed.try_into().unwrap();

    // A verified delivery: forwarded once, byte for byte; its redelivery is
    // answered with the stored 2xx, not forwarded.
    let answer = deliver(proxy, &first_s).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{provider}: {answer:?}");
    let again = deliver(proxy, &first_s).await;
    assert_eq!(again.status, StatusCode::CREATED, "{provider}: {again:?}");
    assert_eq!(again.body, answer.body, "{provider}: the stored answer");
    assert_eq!(forwarded(upstream, &first.payload), 1, "{provider}");

    // The same delivery five times at once: forwarded once, every answer 2xx.
    let barrier = Arc::new(Barrier::new(5));
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let (barrier, signed, url) =
                (Arc::clone(&barrier), concurrent_s.clone(), proxy.url(""));
            tokio::spawn(async move {
                barrier.wait().await;
                let mut request = reqwest::Client::new()
                    .post(format!("{url}{}", signed.path))
                    .body(signed.body.clone());
                for (name, value) in &signed.headers {
                    request = request.header(name, value);
                }
                request.send().await.expect("deliver").status()
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), StatusCode::CREATED, "{provider}");
    }
    assert_eq!(forwarded(upstream, &concurrent.payload), 1, "{provider}");

    // Refused before anything is claimed: another secret, a tampered body, a
    // stale timestamp (where the provider signs one).
    assert_refused(&deliver(proxy, &forged_s).await, "bad-webhook-signature");
    assert_eq!(forwarded(upstream, &forged.payload), 0, "{provider}");
    let tampered_body = tampered
        .payload
        .replace("1500", "1")
        .replace("order.paid", "order.free");
    assert_refused(
        &deliver(proxy, &tampered_s.clone().with_body(&tampered_body)).await,
        "bad-webhook-signature",
    );
    assert_eq!(forwarded(upstream, &tampered_body), 0, "{provider}");
    let stale_answer = deliver(proxy, &stale_s).await;
    if matches!(provider, "stripe" | "standard") {
        assert_refused(&stale_answer, "stale-webhook");
        assert_eq!(forwarded(upstream, &stale.payload), 0, "{provider}");
    } else {
        // GitHub and Shopify sign no timestamp: nothing to be stale.
        assert_eq!(stale_answer.status, StatusCode::CREATED, "{provider}");
    }
    // The tampered delivery, as the provider sent it, was never claimed.
    assert_eq!(
        deliver(proxy, &tampered_s).await.status,
        StatusCode::CREATED,
        "{provider}"
    );
    assert_eq!(forwarded(upstream, &tampered.payload), 1, "{provider}");

    // An attacker pre-claims a future delivery's id, unsigned (and with another
    // payload): refused, nothing claimed; the real delivery is forwarded once.
    let attack = preclaimed_s
        .clone()
        .unsigned()
        .with_body(&preclaimed.payload.replace('}', r#","attacker":1}"#));
    assert_refused(&deliver(proxy, &attack).await, "bad-webhook-signature");
    let real = deliver(proxy, &preclaimed_s).await;
    assert_eq!(real.status, StatusCode::CREATED, "{provider}: {real:?}");
    assert!(
        !real.headers.contains_key("idempotent-replayed"),
        "{provider}: the real delivery ran: {real:?}"
    );
    assert_eq!(forwarded(upstream, &preclaimed.payload), 1, "{provider}");
    assert_eq!(
        upstream
            .seen()
            .iter()
            .filter(|s| s.body.windows(8).any(|w| w == b"attacker"))
            .count(),
        0
    );

    // An upstream 5xx releases: the provider's redelivery is forwarded again,
    // then deduplicated.
    upstream.answer_next(500);
    let failed = deliver(proxy, &failing_s).await;
    assert_eq!(
        failed.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{provider}"
    );
    let redelivered = deliver(proxy, &failing_s).await;
    assert_eq!(
        redelivered.status,
        StatusCode::CREATED,
        "{provider}: {redelivered:?}"
    );
    let deduplicated = deliver(proxy, &failing_s).await;
    assert_eq!(deduplicated.status, StatusCode::CREATED, "{provider}");
    assert_eq!(deduplicated.body, redelivered.body, "{provider}");
    assert_eq!(forwarded(upstream, &failing.payload), 2, "{provider}");

    // The same id with another (validly signed) payload: 422, not forwarded.
    assert_eq!(deliver(proxy, &reused_s).await.status, StatusCode::CREATED);
    let mismatch = deliver(proxy, &changed_s).await;
    assert_eq!(
        mismatch.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{provider}: {mismatch:?}"
    );
    assert_eq!(forwarded(upstream, &changed.payload), 0, "{provider}");
}

async fn every_provider_on(store: &str) {
    let receiver = receiver(store).await;
    for provider in ["stripe", "github", "shopify", "standard"] {
        scenarios(&receiver, provider).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhook_deliveries_on_memory() {
    every_provider_on("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhook_deliveries_on_sqlite() {
    every_provider_on("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhook_deliveries_on_postgres() {
    every_provider_on("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhook_deliveries_on_redis() {
    every_provider_on("redis").await;
}

/// GitHub's documented test vector, as GitHub would deliver it, through the
/// binary: verified and forwarded once; one byte changed, refused.
#[tokio::test]
async fn github_documented_vector_through_the_proxy() {
    let receiver = receiver("memory").await;
    let delivery = uuid::Uuid::new_v4().to_string();
    let signed = Signed {
        path: "/hooks/github".into(),
        headers: vec![
            ("X-Hub-Signature-256".into(), GITHUB_SIGNATURE.into()),
            ("X-GitHub-Delivery".into(), delivery),
        ],
        body: GITHUB_PAYLOAD.into(),
    };
    assert_eq!(
        deliver(&receiver.proxy, &signed).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        deliver(&receiver.proxy, &signed).await.status,
        StatusCode::CREATED
    );
    assert_eq!(forwarded(&receiver.upstream, GITHUB_PAYLOAD), 1);
    assert_refused(
        &deliver(&receiver.proxy, &signed.clone().with_body("Hello, World?")).await,
        "bad-webhook-signature",
    );
    assert_eq!(receiver.upstream.executions(), 1);
}

/// Two secrets during a rotation: a delivery signed with either is verified,
/// and so is Stripe's rotation header with one `v1` per secret; a third secret
/// is refused. Each delivery counted in `idemgate_webhooks_total`.
#[tokio::test]
async fn secret_rotation_with_two_secrets() {
    let receiver = receiver("memory").await;
    let secrets = &receiver.secrets;
    let old = Delivery::new("stripe", &secrets.stripe).with_secret(&secrets.old);
    let new = Delivery::new("stripe", &secrets.stripe).with_secret(&secrets.new);
    let both_old = Delivery::new("stripe", &secrets.stripe).with_secret(&secrets.old);
    let both_new = Delivery {
        secret: secrets.new.clone(),
        ..both_old.clone()
    };
    let other = Delivery::new("stripe", &secrets.stripe).with_secret("whsec_someone_else");
    let signed = sign(&[
        old.clone(),
        new.clone(),
        both_old.clone(),
        both_new,
        other.clone(),
    ])
    .await;
    let route = |mut signed: Signed| {
        signed.path = "/hooks/rotating".into();
        signed
    };
    for delivery in [&signed[0], &signed[1]] {
        let answer = deliver(&receiver.proxy, &route(delivery.clone())).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    }
    // Stripe signs with every secret of the endpoint during a rotation:
    // t=…,v1=<old>,v1=<new>.
    let header = |signed: &Signed| {
        signed
            .headers
            .iter()
            .find(|(name, _)| name == "Stripe-Signature")
            .unwrap()
            .1
            .clone()
    };
    let new_v1 = header(&signed[3]).split_once(",v1=").unwrap().1.to_owned();
    let mut rotation = route(signed[2].clone());
    for (name, value) in &mut rotation.headers {
        if name == "Stripe-Signature" {
            *value = format!("{value},v1={new_v1}");
        }
    }
    assert_eq!(
        deliver(&receiver.proxy, &rotation).await.status,
        StatusCode::CREATED
    );
    assert_refused(
        &deliver(&receiver.proxy, &route(signed[4].clone())).await,
        "bad-webhook-signature",
    );
    for (payload, runs) in [
        (&old.payload, 1),
        (&new.payload, 1),
        (&both_old.payload, 1),
        (&other.payload, 0),
    ] {
        assert_eq!(forwarded(&receiver.upstream, payload), runs);
    }
    let metrics = reqwest::get(receiver.proxy.admin_url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |outcome: &str| -> f64 {
        metrics
            .lines()
            .find(|line| {
                line.starts_with("idemgate_webhooks_total{")
                    && line.contains(r#"provider="stripe""#)
                    && line.contains(&format!(r#"outcome="{outcome}""#))
            })
            .unwrap_or_else(|| panic!("no {outcome} series in /metrics:\n{metrics}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(count("verified"), 3.0);
    assert_eq!(count("bad_signature"), 1.0);
    assert_eq!(count("mismatch"), 0.0);
}

/// A rotation on the other providers' routes: a delivery signed with the old
/// or the new secret is forwarded once, one signed with a third is refused
/// before anything is claimed. (The secrets are `whsec_` and 32 hex digits:
/// valid base64 for Standard Webhooks, plain bytes for GitHub and Shopify.)
#[tokio::test]
async fn every_provider_takes_either_secret_during_a_rotation() {
    let receiver = receiver("memory").await;
    let secrets = &receiver.secrets;
    for provider in ["github", "shopify", "standard"] {
        let old = Delivery::new(provider, &secrets.old);
        let new = Delivery::new(provider, &secrets.new);
        let other = Delivery::new(provider, &secrets.old)
            .with_secret("whsec_bm90IHRoZSBlbmRwb2ludCdzIHNlY3JldA==");
        let signed = sign(&[old.clone(), new.clone(), other.clone()]).await;
        let path = format!("/hooks/rotating-{provider}");
        let at_route = |mut signed: Signed| {
            signed.path.clone_from(&path);
            signed
        };
        for delivery in &signed[..2] {
            let answer = deliver(&receiver.proxy, &at_route(delivery.clone())).await;
            assert_eq!(answer.status, StatusCode::CREATED, "{provider}: {answer:?}");
        }
        assert_refused(
            &deliver(&receiver.proxy, &at_route(signed[2].clone())).await,
            "bad-webhook-signature",
        );
        for (payload, runs) in [(&old.payload, 1), (&new.payload, 1), (&other.payload, 0)] {
            assert_eq!(forwarded(&receiver.upstream, payload), runs, "{provider}");
        }
    }
}

/// A secret's variable that is not set stops the load, naming it.
#[test]
fn a_missing_secret_variable_is_a_load_error_naming_it() {
    let dir = TempDir::new("idemgate-webhooks-check");
    let path = dir.path().join("routes.toml");
    std::fs::write(
        &path,
        "[[route]]\nmethod = \"POST\"\npath = \"/hooks\"\nwebhook = { provider = \"github\", secret = \"env:WH_E2E_UNSET_SECRET\" }\n",
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["proxy", "--check-config"])
        .arg(&path)
        .env_remove("WH_E2E_UNSET_SECRET")
        .env_remove("IDEMGATE_UPSTREAM")
        .env_remove("IDEMGATE_CONFIG")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("4:11")
            && stderr.contains("WH_E2E_UNSET_SECRET")
            && stderr.contains("is not set"),
        "{stderr}"
    );
}
