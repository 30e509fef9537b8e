//! `idemgate man`: the man page (roff), generated from the clap definitions of
//! [`Cli`]: `idemgate(1)` with every subcommand's page appended, so one file
//! documents every flag and its environment variable as `--help` does.

use std::io::Write;
use std::process::ExitCode;

use clap::CommandFactory;
use clap_mangen::Man;

use crate::cli::Cli;

/// Writes the page to `out`: the top command, then each subcommand (and each
/// of theirs) as a page of its own, `idemgate-proxy(1)` and so on (clap's
/// `help` subcommands left out: they document nothing).
pub fn write(out: &mut dyn Write) -> std::io::Result<()> {
    let mut command = Cli::command();
    command.build();
    Man::new(command.clone()).render(out)?;
    for sub in command.get_subcommands().filter(|sub| documented(sub)) {
        render_subcommand(sub, "idemgate", out)?;
    }
    Ok(())
}

fn render_subcommand(
    sub: &clap::Command,
    parent: &str,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let name = format!("{parent}-{}", sub.get_name());
    let page = sub.clone().name(name.clone());
    Man::new(page).render(out)?;
    for nested in sub.get_subcommands().filter(|nested| documented(nested)) {
        render_subcommand(nested, &name, out)?;
    }
    Ok(())
}

fn documented(sub: &clap::Command) -> bool {
    !sub.is_hide_set() && sub.get_name() != "help"
}

/// Prints the page to stdout.
pub fn main() -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match write(&mut stdout).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("idemgate: cannot write the man page: {error}");
            ExitCode::FAILURE
        }
    }
}
