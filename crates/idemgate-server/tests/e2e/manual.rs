//! `idemgate completions bash|zsh|fish` and `idemgate man`: generated from the
//! clap definitions, so they name every subcommand and the flags `--help` names.

use std::process::{Command, Stdio};

fn idemgate(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(args)
        .output()
        .expect("run idemgate");
    assert!(output.status.success(), "idemgate {args:?}: {output:?}");
    assert!(output.stderr.is_empty(), "{output:?}");
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// What every generated document must know of: the subcommands and a sample of
/// flags, the newest among them.
const NAMES: [&str; 9] = [
    "serve",
    "proxy",
    "keys",
    "completions",
    "upstream",
    "check-config",
    "admin-listen",
    "idempotency-store",
    "evict",
];

#[test]
fn completions_name_every_subcommand_and_flag_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let script = idemgate(&["completions", shell]);
        for name in NAMES {
            assert!(script.contains(name), "{shell} completion lacks {name}");
        }
    }
    assert!(idemgate(&["completions", "zsh"]).starts_with("#compdef idemgate"));
    assert!(idemgate(&["completions", "fish"]).contains("complete -c idemgate"));
    let refused = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(
        refused.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

#[test]
fn the_bash_completion_parses() {
    let script = idemgate(&["completions", "bash"]);
    let mut bash = Command::new("bash")
        .arg("-n")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash is installed");
    use std::io::Write;
    bash.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let output = bash.wait_with_output().unwrap();
    assert!(output.status.success(), "bash -n: {output:?}");
    assert!(script.contains("complete -F _idemgate"), "registers itself");
}

#[test]
fn the_man_page_documents_each_subcommand_with_its_flags_and_variables() {
    let page = idemgate(&["man"]);
    for title in [
        ".TH idemgate 1",
        ".TH idemgate-serve 1",
        ".TH idemgate-proxy 1",
        ".TH idemgate-keys-evict 1",
        ".TH idemgate-completions 1",
        ".TH idemgate-man 1",
    ] {
        assert!(page.contains(title), "no {title}");
    }
    assert!(
        !page.contains(".TH idemgate-help"),
        "clap's help is no page"
    );
    // roff escapes '-' as '\-'.
    for needle in [
        r"\-\-check\-config",
        "IDEMGATE_CHECK_CONFIG",
        r"\-\-upstream",
        "IDEMGATE_UPSTREAM",
        "SIGHUP",
    ] {
        assert!(page.contains(needle), "the man page lacks {needle}");
    }
    assert!(
        page.contains(env!("CARGO_PKG_VERSION")),
        "names the version"
    );
}
