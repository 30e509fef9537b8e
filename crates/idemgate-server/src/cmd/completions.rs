//! `idemgate completions SHELL`: a completion script generated from the clap
//! definitions of [`Cli`], so it always knows every subcommand and flag this
//! binary has.

use std::io::Write;
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::{Shell, generate};

use crate::cli::{Cli, CompletionShell, CompletionsArgs};

/// The script for `args.shell`. Generated into memory: clap_complete panics
/// when its writer fails, and a closed stdout (`| head`) must not panic.
pub fn script(args: CompletionsArgs) -> Vec<u8> {
    let shell = match args.shell {
        CompletionShell::Bash => Shell::Bash,
        CompletionShell::Zsh => Shell::Zsh,
        CompletionShell::Fish => Shell::Fish,
    };
    let mut script = Vec::new();
    generate(shell, &mut Cli::command(), "idemgate", &mut script);
    script
}

/// Prints the script to stdout.
pub fn main(args: CompletionsArgs) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(&script(args))
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("idemgate: cannot write the completion script: {error}");
            ExitCode::FAILURE
        }
    }
}
