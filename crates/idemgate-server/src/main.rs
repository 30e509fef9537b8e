//! `idemgate serve`, `idemgate proxy` and `idemgate keys`: see `idemgate <command> --help`.

use std::process::ExitCode;

use clap::Parser;
use idemgate_server::cli::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve(args) => match args.settings() {
            Ok(settings) => {
                with_telemetry(settings.telemetry, idemgate_server::server::run(settings)).await
            }
            Err(error) => config_error(&error),
        },
        Command::Proxy(args) => match args.settings() {
            Ok(settings) => {
                with_telemetry(settings.telemetry, idemgate_server::proxy::run(settings)).await
            }
            Err(error) => config_error(&error),
        },
        Command::Keys(args) => idemgate_server::keys_cli::run(args).await,
    }
}

/// Starts logging (and OTLP export, if asked), runs `service` (a future does
/// nothing until awaited, so it starts after), then flushes the exporter.
async fn with_telemetry(
    telemetry: idemgate_server::telemetry::TelemetrySettings,
    service: impl std::future::Future<Output = Result<(), idemgate_server::server::StartupError>>,
) -> ExitCode {
    let telemetry = match idemgate_server::telemetry::init(telemetry) {
        Ok(telemetry) => telemetry,
        Err(error) => return startup_error(&error),
    };
    let result = service.await;
    telemetry.shutdown();
    stopped(result)
}

fn config_error(error: &idemgate_server::cli::ConfigError) -> ExitCode {
    eprintln!("idemgate: {error}");
    ExitCode::from(2)
}

fn startup_error(error: &idemgate_server::telemetry::TelemetryError) -> ExitCode {
    eprintln!("idemgate: {error}");
    ExitCode::FAILURE
}

fn stopped(result: Result<(), idemgate_server::server::StartupError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "idemgate stopped");
            eprintln!("idemgate: {error}");
            ExitCode::FAILURE
        }
    }
}
