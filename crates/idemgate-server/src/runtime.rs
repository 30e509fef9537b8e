//! What every long-running subcommand (`serve`, `proxy`) does the same way: the
//! metrics recorder, the idempotency layer's timing, and serving listeners until
//! SIGINT/SIGTERM followed by a graceful drain.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use idemgate::cache::{ReplayCache, ReplayCacheConfig};
use idemgate::telemetry::LATENCY_BUCKETS;
use idemgate::{DetachedTasks, IdempotencyLayer, Store};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::cli::LayerTiming;
use crate::listener::Listener;

/// The `Retry-After` of every 503 for a store that failed: the idempotency
/// layer's, and the orders handler's when its order could not be stored.
pub(crate) const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Installs the process-wide Prometheus recorder; `None` (logged) when one is
/// already installed, and `/metrics` answers 404.
///
/// Latencies render as Prometheus histograms with [`LATENCY_BUCKETS`], not as
/// summaries: per-process quantiles cannot be aggregated across a fleet, bucket
/// counts can (`histogram_quantile(0.99, sum by (le) (rate(…_bucket[5m])))`).
pub(crate) fn install_metrics() -> Option<PrometheusHandle> {
    let installed = PrometheusBuilder::new()
        .set_buckets(LATENCY_BUCKETS)
        .and_then(PrometheusBuilder::install_recorder);
    match installed {
        Ok(handle) => {
            idemgate::telemetry::describe();
            metrics::describe_gauge!(
                "idemgate_lease_seconds",
                metrics::Unit::Seconds,
                "The configured lease: an in-flight operation older than this is being renewed (or is stuck)."
            );
            Some(handle)
        }
        Err(error) => {
            tracing::warn!(%error, "metrics recorder not installed; /metrics answers 404");
            None
        }
    }
}

/// `/metrics`: the Prometheus text, or 404 without a recorder.
pub(crate) fn metrics_response(metrics: Option<&PrometheusHandle>) -> Response {
    match metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `store` behind the replay cache, when one is configured. The layer and the
/// admin key API share the result, so a local eviction drops the cached record.
pub(crate) fn with_replay_cache(
    store: Arc<dyn Store>,
    config: Option<ReplayCacheConfig>,
) -> Arc<dyn Store> {
    match config {
        Some(config) => Arc::new(ReplayCache::new(store, config)),
        None => store,
    }
}

/// The idempotency layer over `store` with the flags' timing. Publishes the
/// lease as `idemgate_lease_seconds`, so an alert compares the oldest in-flight
/// age with the lease this instance really runs with.
pub(crate) fn idempotency_layer(store: Arc<dyn Store>, timing: LayerTiming) -> IdempotencyLayer {
    metrics::gauge!("idemgate_lease_seconds").set(timing.lease.as_secs_f64());
    let layer = IdempotencyLayer::from_arc(store)
        .with_ttl(timing.ttl)
        .with_lease(timing.lease)
        .with_store_timeout(timing.store_timeout)
        .with_unavailable_retry_after(UNAVAILABLE_RETRY_AFTER);
    match timing.wait {
        Some(wait) => layer.with_wait(wait),
        None => layer,
    }
}

/// Serves every `(listener, router)` until SIGINT or SIGTERM, then shuts down
/// gracefully: stop accepting, let open requests finish, wait for detached
/// handlers to store their results, all within `shutdown_timeout`.
pub(crate) async fn serve_until_signal(
    servers: Vec<(Listener, Router)>,
    tasks: DetachedTasks,
    shutdown_timeout: Duration,
) {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let servers: Vec<_> = servers
        .into_iter()
        .map(|(listener, router)| {
            let mut stop_rx = stop_rx.clone();
            tokio::spawn(async move {
                listener
                    .serve(router, async move {
                        let _ = stop_rx.wait_for(|stop| *stop).await;
                    })
                    .await;
            })
        })
        .collect();
    shutdown_signal().await;
    tracing::info!(deadline = ?shutdown_timeout, "shutting down: no new connections; finishing in-flight requests");
    let _ = stop_tx.send(true);
    let deadline = tokio::time::Instant::now() + shutdown_timeout;
    for server in servers {
        match tokio::time::timeout_at(deadline, server).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::error!(%error, "server task failed"),
            Err(_) => tracing::warn!("open connections did not finish before the deadline"),
        }
    }
    let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
    if tasks.shutdown(remaining).await {
        tracing::info!("all in-flight requests finished and stored their results");
    } else {
        tracing::warn!(
            running = tasks.running(),
            "shutdown deadline passed with handlers still running; their records stay PROCESSING and are taken over after the lease"
        );
    }
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM; only SIGINT stops the server");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}
