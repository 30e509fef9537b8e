//! Metrics for Prometheus: the process-wide recorder and the `/metrics` answer the
//! orders service and the admin listener give.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use idemgate::telemetry::LATENCY_BUCKETS;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Installs the process-wide Prometheus recorder; `None` (logged) when one is
/// already installed, and `/metrics` answers 404.
///
/// Latencies render as Prometheus histograms with [`LATENCY_BUCKETS`], not as
/// summaries: per-process quantiles cannot be aggregated across a fleet, bucket
/// counts can (`histogram_quantile(0.99, sum by (le) (rate(…_bucket[5m])))`).
pub fn install_metrics() -> Option<PrometheusHandle> {
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
pub fn metrics_response(metrics: Option<&PrometheusHandle>) -> Response {
    match metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
