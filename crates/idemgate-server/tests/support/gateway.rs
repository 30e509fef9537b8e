//! A counting mock payment gateway on a loopback port: delay and failure injection,
//! a signal when a charge arrives, dedup by Idempotency-Key.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};

/// What the next call gets instead of a normal approval.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Charge, then answer this status anyway (the worst case: money moved, the
    /// service was told it failed).
    FailAfterCharging(u16),
    /// Answer this status without charging.
    FailWithoutCharging(u16),
    /// 402: the payment is declined; nothing charged.
    Decline,
}

/// One call as the gateway saw it.
#[derive(Debug, Clone)]
pub struct Call {
    pub idempotency_key: Option<String>,
    pub body: serde_json::Value,
}

#[derive(Default)]
struct Inner {
    calls: Mutex<Vec<Call>>,
    /// Charges by dedup key (the Idempotency-Key, or a fresh id without one).
    charges: Mutex<HashMap<String, String>>,
    faults: Mutex<VecDeque<Fault>>,
    delay_ms: AtomicU64,
    arrivals: tokio::sync::Notify,
    next_charge: AtomicUsize,
}

/// The mock gateway; cloning shares it.
#[derive(Clone)]
pub struct MockGateway {
    inner: Arc<Inner>,
    pub addr: SocketAddr,
}

impl MockGateway {
    pub async fn start() -> Self {
        let inner = Arc::new(Inner::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .route("/charges", post(charge))
            .with_state(Arc::clone(&inner));
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { inner, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every call waits this long after charging, before answering.
    pub fn set_delay(&self, delay: Duration) {
        self.inner
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// The next call gets `fault`.
    pub fn inject(&self, fault: Fault) {
        self.inner.faults.lock().unwrap().push_back(fault);
    }

    /// Calls received.
    pub fn calls(&self) -> Vec<Call> {
        self.inner.calls.lock().unwrap().clone()
    }

    /// Distinct charges made (calls with one Idempotency-Key count once).
    pub fn distinct_charges(&self) -> usize {
        self.inner.charges.lock().unwrap().len()
    }

    /// Resolves when the next call arrives.
    pub fn next_arrival(&self) -> impl Future<Output = ()> + '_ {
        self.inner.arrivals.notified()
    }
}

async fn charge(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    inner.calls.lock().unwrap().push(Call {
        idempotency_key: key.clone(),
        body,
    });
    let fault = inner.faults.lock().unwrap().pop_front();
    let charges = !matches!(fault, Some(Fault::Decline | Fault::FailWithoutCharging(_)));
    let charge_id = if charges {
        let dedup = key.unwrap_or_else(|| {
            format!(
                "no-key-{}",
                inner.next_charge.fetch_add(1, Ordering::SeqCst)
            )
        });
        let mut all = inner.charges.lock().unwrap();
        let next = all.len() + 1;
        Some(
            all.entry(dedup)
                .or_insert_with(|| format!("ch_{next}"))
                .clone(),
        )
    } else {
        None
    };
    inner.arrivals.notify_waiters();
    let delay = inner.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    match fault {
        Some(Fault::FailAfterCharging(status) | Fault::FailWithoutCharging(status)) => {
            (StatusCode::from_u16(status).unwrap(), "gateway trouble").into_response()
        }
        Some(Fault::Decline) => {
            (StatusCode::PAYMENT_REQUIRED, "insufficient funds").into_response()
        }
        None => Json(serde_json::json!({ "id": charge_id, "status": "succeeded" })).into_response(),
    }
}
