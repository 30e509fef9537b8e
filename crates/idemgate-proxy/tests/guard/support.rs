//! The proxy router served on a real socket in front of a test upstream, and the
//! requests the suites send through it.

use std::net::SocketAddr;
use std::time::Duration;

use idemgate::{IdempotencyLayer, MemoryStore};
use idemgate_proxy::{Policy, PrincipalSource, ProxyConfig, Routes};
use idemgate_testkit::guard_cases;
use idemgate_testkit::raw_client::{RawClient, RawRequest, RawResponse};
use idemgate_testkit::upstreams::{Seen, TestUpstream, UpstreamKind};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The principal header every suite authenticates with.
pub(crate) const USER: &str = "x-user";

/// A proxy in front of its own upstream; both stop when dropped.
pub(crate) struct Proxy {
    pub(crate) addr: SocketAddr,
    pub(crate) upstream: TestUpstream,
    serve: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.serve.abort();
    }
}

/// The guard suites' shared routes (`guard_cases::ROUTES`: payments and
/// profiles require a key, webhooks are disabled), `extra` before them.
pub(crate) fn routes(extra: &str) -> Routes {
    let text = format!("{extra}\n{}", guard_cases::ROUTES);
    Routes::from_toml("routes.toml".as_ref(), &text, &Policy::default()).expect("routes parse")
}

/// The proxy in front of a new upstream of `kind`, configured by `configure`
/// (which gets the config with the shared routes and the `x-user` principal header set).
pub(crate) async fn proxy(
    kind: UpstreamKind,
    configure: impl FnOnce(ProxyConfig) -> ProxyConfig,
) -> Proxy {
    proxy_with(kind, configure, |layer| layer).await
}

/// [`proxy`], with the layer changed by `layer` too.
pub(crate) async fn proxy_with(
    kind: UpstreamKind,
    configure: impl FnOnce(ProxyConfig) -> ProxyConfig,
    layer: impl FnOnce(IdempotencyLayer) -> IdempotencyLayer,
) -> Proxy {
    let upstream = TestUpstream::start(kind).await;
    let config = ProxyConfig::new(upstream.url().parse().expect("upstream URL"))
        .with_upstream_timeout(Duration::from_secs(5))
        .with_principal(PrincipalSource::Header(http::HeaderName::from_static(USER)))
        .with_routes(routes(""));
    let layer = layer(IdempotencyLayer::new(MemoryStore::new()));
    let app = idemgate_proxy::app(configure(config), layer);
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the proxy");
    let addr = listener.local_addr().expect("proxy address");
    let serve = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve the proxy");
    });
    Proxy {
        addr,
        upstream,
        serve,
    }
}

impl Proxy {
    /// Sends `request` on a connection of its own and reads the answer.
    pub(crate) async fn send(&self, request: &RawRequest) -> RawResponse {
        RawClient::exchange(self.addr, request)
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "no answer to {:?}: {error}",
                    String::from_utf8_lossy(&request.bytes())
                )
            })
    }

    /// The requests the upstream ran as `method` on `path` (as it reads them).
    pub(crate) fn ran(&self, method: &str, path: &str) -> Vec<Seen> {
        self.upstream
            .seen()
            .into_iter()
            .filter(|seen| seen.is(method, path))
            .collect()
    }
}

/// A fresh key.
pub(crate) fn key() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A `POST` from user `alice` with a small JSON body, keyed when `key` is given.
pub(crate) fn post(target: &str, key: Option<&str>) -> RawRequest {
    let request = RawRequest::new("POST", target)
        .header(USER, "alice")
        .header("Content-Type", "application/json");
    let request = match key {
        Some(key) => request.header("Idempotency-Key", key),
        None => request,
    };
    request.body(br#"{"amount":1500}"#)
}

/// Asserts that every request the upstream ran as `POST /payments` carried an
/// `Idempotency-Key` (the derived one: a keyless request has none), naming the
/// spellings sent when one did not.
pub(crate) fn assert_no_keyless_payment(proxy: &Proxy, sent: &[String]) {
    let keyless: Vec<Seen> = proxy
        .ran("POST", "/payments")
        .into_iter()
        .filter(|seen| seen.headers_named("idempotency-key").is_empty())
        .collect();
    assert!(
        keyless.is_empty(),
        "the {:?} upstream ran {} keyless POST /payments: {:?} (spellings sent: {sent:?})",
        proxy.upstream.kind(),
        keyless.len(),
        keyless.iter().map(|s| &s.target).collect::<Vec<_>>()
    );
}
