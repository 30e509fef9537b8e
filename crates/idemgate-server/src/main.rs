//! `idemgate serve`, `idemgate proxy` and `idemgate keys`: see `idemgate <command> --help`.

use std::process::ExitCode;

use clap::Parser;
use idemgate_server::cli::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve(args) => {
            let settings = match args.settings() {
                Ok(settings) => settings,
                Err(error) => return config_error(&error),
            };
            let telemetry = match idemgate_server::telemetry::init(settings.telemetry) {
                Ok(telemetry) => telemetry,
                Err(error) => return startup_error(&error),
            };
            let result = idemgate_server::server::run(settings).await;
            telemetry.shutdown();
            stopped(result)
        }
        Command::Proxy(args) => {
            let settings = match args.settings() {
                Ok(settings) => settings,
                Err(error) => return config_error(&error),
            };
            let telemetry = match idemgate_server::telemetry::init(settings.telemetry) {
                Ok(telemetry) => telemetry,
                Err(error) => return startup_error(&error),
            };
            let result = idemgate_server::proxy::run(settings).await;
            telemetry.shutdown();
            stopped(result)
        }
        Command::Keys(args) => idemgate_server::keys_cli::run(args).await,
    }
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
