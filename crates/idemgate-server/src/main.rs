//! `idemgate serve`, `idemgate proxy`, `idemgate keys`, `idemgate completions`
//! and `idemgate man`: see `idemgate <command> --help`.

use std::process::ExitCode;

use clap::Parser;
use idemgate_server::cli::{Cli, Command};
use idemgate_server::cmd;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve(args) => cmd::serve::main(&args).await,
        Command::Proxy(args) => cmd::proxy::main(&args).await,
        Command::Keys(args) => cmd::keys::main(args).await,
        Command::Audit(args) => cmd::audit::main(args).await,
        Command::Completions(args) => cmd::completions::main(args),
        Command::Man => cmd::man::main(),
    }
}
