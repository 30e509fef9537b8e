//! Keys are never dropped (issue 36 item 3), through the real `idemgate proxy`
//! with its default route: a keyed `PUT` is covered like a `POST`; a request the
//! proxy does not cover keeps its `Idempotency-Key` as sent; an upstream that
//! echoes the forwarded (derived) key shows the client its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use idemgate_testkit::relay::{Fault, Relay};

use crate::support::client::{Client, ORDER, new_key};
use crate::support::proxy::{Proxy, ProxyOptions, Upstream, derived_key};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_put_through_the_default_route_runs_once_after_a_lost_response() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(ProxyOptions::new(upstream.url())).await;
    let relay = Relay::start(proxy.addr).await;
    relay.inject_request(Fault::LoseResponse, Some("PUT"));
    let client = Client::new();
    let key = new_key();
    let url = relay.url("/accounts/a_1");
    let lost = client
        .try_send(
            reqwest::Method::PUT,
            &url,
            Some(&key),
            &[("content-type", "application/json")],
            Some(ORDER),
        )
        .await;
    assert!(lost.is_err(), "the relay lost the first answer: {lost:?}");
    let retry = client
        .send(
            reqwest::Method::PUT,
            &url,
            Some(&key),
            &[("content-type", "application/json")],
            Some(ORDER),
        )
        .await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(
        retry.replayed(),
        "the lost run's answer, replayed: {retry:?}"
    );
    assert_eq!(
        upstream.executions(),
        1,
        "a keyed PUT is covered by default: the retry did not run again"
    );
    let seen = upstream.seen();
    assert_eq!(seen[0].method, "PUT");
    assert_ne!(
        derived_key(&seen[0]),
        key,
        "covered: the derived key upstream, never the client's raw key"
    );
    // DELETE too: a keyed DELETE's retry is a replay.
    let url = proxy.url("/accounts/a_1");
    let key = new_key();
    for _ in 0..2 {
        let deleted = client
            .send(reqwest::Method::DELETE, &url, Some(&key), &[], None)
            .await;
        assert_eq!(deleted.status, StatusCode::CREATED, "{deleted:?}");
    }
    assert_eq!(upstream.executions(), 2, "one DELETE run for two attempts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_proxy_does_not_cover_keeps_its_key_as_sent() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(ProxyOptions::new(upstream.url())).await;
    let client = Client::new();
    // A bare key and an sf-string one: each reaches the upstream byte for byte.
    let key = new_key();
    let quoted = format!("\"{}\"", new_key());
    for (method, key) in [("GET", &key), ("OPTIONS", &quoted)] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let answer = client
            .send(method, &proxy.url("/orders/7"), Some(key), &[], None)
            .await;
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
        assert!(!answer.replayed());
    }
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2, "uncovered: every request runs");
    assert_eq!(seen[0].headers["idempotency-key"], key.as_str());
    assert_eq!(seen[1].headers["idempotency-key"], quoted.as_str());
}

/// An upstream that echoes the `Idempotency-Key` it received, under that name and
/// its own, as Stripe-like APIs do; every request is one execution.
async fn echoing_upstream() -> (String, Arc<AtomicUsize>) {
    async fn echo(State(runs): State<Arc<AtomicUsize>>, request: Request) -> Response {
        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
        let key = request.headers().get("idempotency-key").cloned();
        let mut response = (
            StatusCode::CREATED,
            [("content-type", "application/json")],
            format!(r#"{{"id":"obj_{run}"}}"#),
        )
            .into_response();
        if let Some(key) = key {
            response
                .headers_mut()
                .insert("idempotency-key", key.clone());
            response.headers_mut().insert("x-echoed-key", key);
        }
        response
            .headers_mut()
            .insert("x-run", HeaderValue::from(run));
        response
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = Router::new().fallback(echo).with_state(Arc::clone(&runs));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, runs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_echoing_the_forwarded_key_shows_the_client_its_own() {
    let (upstream, runs) = echoing_upstream().await;
    // The echoes listed for replay, so the replay shows what the first answer did.
    let proxy = Proxy::start(
        ProxyOptions::new(upstream)
            .arg("--replay-header", "Idempotency-Key")
            .arg("--replay-header", "X-Echoed-Key"),
    )
    .await;
    let client = Client::new();
    let key = new_key();
    let url = proxy.url("/v1/charges");
    let first = client.post(&url, Some(&key), ORDER).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let replay = client.post(&url, Some(&key), ORDER).await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    for (answer, which) in [(&first, "live"), (&replay, "replay")] {
        for name in ["idempotency-key", "x-echoed-key"] {
            assert_eq!(
                answer.headers.get(name).map(|v| v.to_str().unwrap()),
                Some(key.as_str()),
                "{which}: {name} shows the client's own key, never the derived one"
            );
        }
    }
}
