//! Names the commit the binary was built from, for `idemgate --version`.
//!
//! Exports `IDEMGATE_COMMIT` (12 hex digits, or `unknown`) and `IDEMGATE_VERSION`
//! (`0.1.0 (commit 1a2b3c4d5e6f)`), which the clap `Cli` prints. The commit comes
//! from, in order:
//!
//! 1. `IDEMGATE_BUILD_COMMIT` in the build's environment: a Docker context has no
//!    `.git` (`.dockerignore` leaves it out), so `docker build --build-arg
//!    IDEMGATE_BUILD_COMMIT=$(git rev-parse HEAD)` hands it in;
//! 2. `.cargo_vcs_info.json` beside the manifest: `cargo package` writes the commit
//!    there, so a build from a crates tarball still knows it;
//! 3. `git rev-parse HEAD` in the source tree;
//! 4. otherwise `unknown` — a build never fails for want of git.
//!
//! With git, the script reruns when `HEAD` or the branch it points at moves, so a
//! new commit is a new version string without a clean build. It also reruns when
//! `migrations/` changes: `sqlx::migrate!` embeds that directory, and a proc
//! macro alone would not see a new migration file.

use std::path::{Path, PathBuf};
use std::process::Command;

/// How many hex digits of the commit the version shows (as `git log --abbrev=12`).
const SHORT: usize = 12;

fn main() {
    println!("cargo::rerun-if-env-changed=IDEMGATE_BUILD_COMMIT");
    // `sqlx::migrate!` embeds migrations/: a new migration file is a rebuild.
    println!("cargo::rerun-if-changed=migrations");
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let commit = from_env()
        .or_else(|| from_vcs_info(&manifest_dir))
        .or_else(|| from_git(&manifest_dir))
        .map(|full| full.chars().take(SHORT).collect::<String>())
        .unwrap_or_else(|| "unknown".to_owned());
    let version = std::env::var("CARGO_PKG_VERSION").expect("cargo sets it");
    println!("cargo::rustc-env=IDEMGATE_COMMIT={commit}");
    println!("cargo::rustc-env=IDEMGATE_VERSION={version} (commit {commit})");
}

/// A commit id: at least the short length, hex digits only.
fn checked(candidate: &str) -> Option<String> {
    let candidate = candidate.trim();
    (candidate.len() >= SHORT && candidate.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| candidate.to_ascii_lowercase())
}

fn from_env() -> Option<String> {
    checked(&std::env::var("IDEMGATE_BUILD_COMMIT").ok()?)
}

/// `{"git": {"sha1": "…"}, "path_in_vcs": "…"}`, written by `cargo package`.
fn from_vcs_info(manifest_dir: &Path) -> Option<String> {
    let path = manifest_dir.join(".cargo_vcs_info.json");
    let text = std::fs::read_to_string(&path).ok()?;
    rerun_if_changed(&path);
    let info: serde_json::Value = serde_json::from_str(&text).ok()?;
    checked(info.get("git")?.get("sha1")?.as_str()?)
}

fn from_git(manifest_dir: &Path) -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let output = Command::new("git")
            .args(args)
            .current_dir(manifest_dir)
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let commit = checked(&git(&["rev-parse", "HEAD"])?)?;
    // Rerun when HEAD moves: HEAD itself (a checkout), the branch it names (a
    // commit), and packed-refs (where `git gc` moves branches). In a worktree HEAD
    // lives in its own git dir and the branches in the common one.
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        rerun_if_changed(&Path::new(&git_dir).join("HEAD"));
    }
    if let Some(common) = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]) {
        let common = PathBuf::from(common);
        rerun_if_changed(&common.join("packed-refs"));
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            rerun_if_changed(&common.join(branch));
        }
    }
    Some(commit)
}

/// Only for files that exist: cargo reruns a script on every build while a
/// watched path is missing.
fn rerun_if_changed(path: &Path) {
    if path.exists() {
        println!("cargo::rerun-if-changed={}", path.display());
    }
}
