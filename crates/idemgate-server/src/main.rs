//! `idemgate serve`, `idemgate proxy`, `idemgate keys`, `idemgate completions`
//! and `idemgate man`: see `idemgate <command> --help`.

use std::process::ExitCode;

use clap::Parser;
use idemgate_server::cli::{Cli, Command};
use idemgate_server::cmd;

/// mimalloc, not glibc's malloc: a request allocates many small, short-lived
/// buffers (headers, JSON, journal entries) on one thread and frees some on
/// another; under glibc, malloc's own work (`malloc_consolidate`,
/// `unlink_chunk`, …) was ~4 µs more server CPU per replay with the journal on
/// than off, and mimalloc made replays ~10 % faster either way
/// (docs/benchmarks.md, "The journal's cost").
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
