//! Log output, and (with `--otlp`) the tracing spans exported over OpenTelemetry.
//!
//! The layer's `idempotency` span (fields `key`: a digest prefix, never the key;
//! `operation_id`; `outcome`) becomes an OTLP span with those attributes. Without
//! `--otlp` no OpenTelemetry layer is installed at all: spans cost what they cost
//! without it.

use std::io::IsTerminal as _;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{ExporterBuildError, Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

use crate::config::{LogFormat, TelemetrySettings};

/// The OTLP exporter could not be built (for instance a malformed
/// `OTEL_EXPORTER_OTLP_ENDPOINT`).
#[derive(Debug, thiserror::Error)]
#[error("--otlp: cannot build the OTLP exporter: {0}")]
pub struct TelemetryError(#[from] ExporterBuildError);

/// Flushes exported spans on [`Telemetry::shutdown`]; holds nothing without `--otlp`.
#[derive(Debug)]
#[must_use = "call shutdown() before exiting, or the last spans are lost"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still buffered and stops the exporter's thread. Blocks
    /// for at most the exporter's timeout.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(error) = provider.shutdown()
        {
            tracing::warn!(%error, "OTLP exporter did not flush its last spans");
        }
    }
}

/// Installs the global tracing subscriber: `RUST_LOG` filters (default `info`),
/// `log_format` picks human or JSON lines on stderr (human lines colored only
/// on a terminal, and never with `NO_COLOR` set), and `otlp` adds the
/// OpenTelemetry layer. The OTLP endpoint, headers and timeout come from the
/// standard `OTEL_EXPORTER_OTLP_*` variables (default endpoint
/// `http://localhost:4318`, `/v1/traces` appended); the service name from
/// `OTEL_SERVICE_NAME`, else `idemgate`.
pub fn init(settings: TelemetrySettings) -> Result<Telemetry, TelemetryError> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colored(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ));
    let fmt = match settings.log_format {
        LogFormat::Pretty => fmt.boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
    };
    let provider = settings.otlp.then(otlp_provider).transpose()?;
    let otel = provider
        .as_ref()
        .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer("idemgate")));
    // A subscriber set earlier (a test harness) wins; ours is then not needed.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init();
    Ok(Telemetry { provider })
}

/// Whether human log lines carry ANSI colors: on a terminal, unless
/// `NO_COLOR` is set to anything but the empty string (no-color.org). A log
/// file or a collector reading a pipe gets plain text, and no request pays
/// for coloring its span's fields (the `idempotency` span's are formatted
/// when it opens, whether or not a line is ever logged in it).
fn colored(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
}

/// A tracer provider exporting batches over OTLP/HTTP (protobuf) from the SDK's
/// own thread, so a slow or absent collector never delays a request.
fn otlp_provider() -> Result<SdkTracerProvider, ExporterBuildError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .build()?;
    let service_name = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "idemgate".into());
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service_name).build())
        .build())
}

#[cfg(test)]
mod tests {
    use super::colored;

    #[test]
    fn lines_are_colored_only_on_a_terminal_without_no_color() {
        assert!(colored(true, None));
        assert!(colored(true, Some("".into())), "an empty NO_COLOR is unset");
        assert!(!colored(true, Some("1".into())));
        assert!(!colored(false, None), "a file or a pipe gets plain text");
        assert!(!colored(false, Some("1".into())));
    }
}
