//! Log output.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Installs the global tracing subscriber: `RUST_LOG` filters (default `info`),
/// `format` picks human or JSON lines. Logs go to stderr.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
