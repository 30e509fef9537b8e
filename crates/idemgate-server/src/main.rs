//! `idemgate serve`: see `idemgate serve --help`.

use std::process::ExitCode;

use clap::Parser;
use idemgate_server::cli::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    let Cli {
        command: Command::Serve(args),
    } = Cli::parse();
    let settings = match args.settings() {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("idemgate: {error}");
            return ExitCode::from(2);
        }
    };
    idemgate_server::telemetry::init(settings.log_format);
    match idemgate_server::server::run(settings).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "idemgate stopped");
            eprintln!("idemgate: {error}");
            ExitCode::FAILURE
        }
    }
}
