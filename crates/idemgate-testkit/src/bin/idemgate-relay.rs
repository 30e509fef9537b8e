//! `idemgate-relay UPSTREAM`: the fault relay of [`idemgate_testkit::relay`] as a
//! process, for the client suites written in other languages (`clients/js`,
//! `clients/python`).
//!
//! It listens on a free loopback port in front of `UPSTREAM` (`host:port`), prints
//! `{"listening":"127.0.0.1:PORT"}` as its first line, then reads one command a
//! line on its standard input and answers each with one JSON line:
//!
//! | command | answer |
//! |---|---|
//! | `connection FAULT` | `{"ok":true}`: the next new connection gets `FAULT` |
//! | `request FAULT [METHOD]` | `{"ok":true}`: the next request (of `METHOD`, if given), on any connection, gets `FAULT` |
//! | `stats` | `{"connections":N,"forwarded":N,"requests":N,"open":N}` |
//!
//! `FAULT` is `pass`, `lose-response`, `reset`, `delay MILLISECONDS`,
//! `trickle MILLISECONDS` (the answer one byte per interval), `cut-body` (the
//! answer's head and one byte of its body, then the connection closes; an answer
//! without a body passes whole and spends it) or `cut-after BYTES` (as
//! `cut-body`, with that many bytes of the body passed as they come); see
//! [`Fault`]. A line it cannot read is answered `{"error":"…"}`. It exits when its
//! standard input closes, so it never outlives the test that started it.

use std::net::SocketAddr;
use std::process::ExitCode;

use idemgate_testkit::relay::{Fault, Relay};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let upstream = std::env::args()
        .nth(1)
        .and_then(|arg| arg.parse::<SocketAddr>().ok());
    let Some(upstream) = upstream else {
        eprintln!("usage: idemgate-relay UPSTREAM_ADDRESS (e.g. 127.0.0.1:8080)");
        return ExitCode::from(2);
    };
    let relay = Relay::start(upstream).await;
    let mut out = tokio::io::stdout();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut answer = format!("{{\"listening\":\"{}\"}}", relay.addr());
    loop {
        answer.push('\n');
        if out.write_all(answer.as_bytes()).await.is_err() || out.flush().await.is_err() {
            return ExitCode::FAILURE;
        }
        let Ok(Some(line)) = lines.next_line().await else {
            return ExitCode::SUCCESS; // the test is done with us
        };
        answer = match Command::parse(&line) {
            Ok(command) => command.run(&relay),
            Err(error) => format!("{{\"error\":\"{error}\"}}"),
        };
    }
}

/// One line of the control channel.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    Connection(Fault),
    Request(Fault, Option<String>),
    Stats,
}

impl Command {
    /// Reads a line. The errors are fixed texts, safe inside a JSON string.
    fn parse(line: &str) -> Result<Self, &'static str> {
        let mut words = line.split_whitespace();
        let command = match words.next() {
            Some("stats") => Self::Stats,
            Some("connection") => Self::Connection(Fault::from_words(&mut words)?),
            Some("request") => {
                let fault = Fault::from_words(&mut words)?;
                Self::Request(fault, words.next().map(str::to_ascii_uppercase))
            }
            _ => return Err("expected: connection FAULT | request FAULT [METHOD] | stats"),
        };
        match words.next() {
            Some(_) => Err("unexpected words after the command"),
            None => Ok(command),
        }
    }

    fn run(self, relay: &Relay) -> String {
        match self {
            Self::Connection(fault) => relay.inject(fault),
            Self::Request(fault, method) => relay.inject_request(fault, method.as_deref()),
            Self::Stats => {
                return format!(
                    "{{\"connections\":{},\"forwarded\":{},\"requests\":{},\"open\":{}}}",
                    relay.connections(),
                    relay.forwarded(),
                    relay.requests(),
                    relay.open_connections(),
                );
            }
        }
        "{\"ok\":true}".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn commands_parse_and_junk_is_refused() {
        assert_eq!(Command::parse("stats"), Ok(Command::Stats));
        assert_eq!(
            Command::parse("connection reset"),
            Ok(Command::Connection(Fault::Reset))
        );
        assert_eq!(
            Command::parse("request lose-response post"),
            Ok(Command::Request(
                Fault::LoseResponse,
                Some("POST".to_owned())
            ))
        );
        assert_eq!(
            Command::parse(" request delay 250 "),
            Ok(Command::Request(
                Fault::DelayResponse(Duration::from_millis(250)),
                None
            ))
        );
        assert_eq!(
            Command::parse("connection trickle 100"),
            Ok(Command::Connection(Fault::Trickle(Duration::from_millis(
                100
            ))))
        );
        assert_eq!(
            Command::parse("request cut-body POST"),
            Ok(Command::Request(Fault::CutBody, Some("POST".to_owned())))
        );
        for junk in [
            "request trickle",
            "request trickle 0",
            "request trickle fast",
            "",
            "status",
            "request",
            "request delay",
            "request delay x",
            "stats now",
            "request pass GET extra",
        ] {
            assert!(Command::parse(junk).is_err(), "{junk:?}");
        }
    }
}
