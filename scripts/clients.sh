#!/usr/bin/env bash
# The suites that run outside cargo, against a built idemgate binary and the
# idemgate-relay of idemgate-testkit: the client packages — clients/js (`npm ci &&
# npm test`) and clients/python (a venv, `pip install -e '.[test]'` under
# constraints.txt, `mypy`, `pytest`) — and the server's checkout page in headless
# Chromium (crates/idemgate-server/tests/browser: `npm ci && npm test`).
# scripts/test.sh runs it after the cargo tests with the binaries those built
# (target/debug); on its own:
#   IDEMGATE_BIN=target/debug/idemgate scripts/clients.sh   # or unset: target/release, built
#   scripts/clients.sh js | python | browser                # one suite
# Installs what the suites need (Debian's chromium and chromium-driver through
# services.sh, the npm packages from package-lock.json, the pinned Python packages)
# and fails loudly when it cannot. A dependency install is skipped when its lock
# file has not changed since the last one in this checkout.
set -euo pipefail
# Relative IDEMGATE_BIN / IDEMGATE_RELAY_BIN are the caller's: resolved against
# the directory the script was started from, before it moves to the checkout.
caller=$PWD
cd "$(dirname "$0")/.."
root=$PWD

log() { printf '[clients] %s\n' "$*" >&2; }
die() { printf '[clients] ERROR: %s\n' "$*" >&2; exit 1; }
# An absolute path for a path the caller gave: the suites run from clients/js and
# clients/python, where a relative one would name something else.
from_caller() {
  case $1 in
    /*) realpath -m -- "$1" ;;
    *) realpath -m -- "$caller/$1" ;;
  esac
}

scripts/services.sh clients

if [ -n "${IDEMGATE_BIN:-}" ]; then
  IDEMGATE_BIN=$(from_caller "$IDEMGATE_BIN")
  [ -x "$IDEMGATE_BIN" ] || die "IDEMGATE_BIN=$IDEMGATE_BIN is not an executable"
  if [ -n "${IDEMGATE_RELAY_BIN:-}" ]; then
    relay=$(from_caller "$IDEMGATE_RELAY_BIN")
  else
    relay="$(dirname "$IDEMGATE_BIN")/idemgate-relay"
  fi
  [ -x "$relay" ] || die "$relay is missing: cargo test -p idemgate-testkit (or cargo build -p idemgate-testkit --bin idemgate-relay) builds it beside $IDEMGATE_BIN"
  export IDEMGATE_BIN IDEMGATE_RELAY_BIN="$relay"
else
  # No binaries given: the release builds, made here, before any suite starts
  # (a test never builds: a cargo build inside a test's timeout is a flaky test).
  # A relative CARGO_TARGET_DIR is cargo's: relative to the checkout, where cargo
  # runs here (as scripts/test.sh reads it); made absolute for the suites.
  if [ -n "${CARGO_TARGET_DIR:-}" ]; then
    CARGO_TARGET_DIR=$(realpath -m -- "$CARGO_TARGET_DIR")
    export CARGO_TARGET_DIR
  fi
  release="${CARGO_TARGET_DIR:-$root/target}/release"
  log "IDEMGATE_BIN unset: cargo build --release of idemgate and idemgate-relay into $release"
  cargo build --release -p idemgate-server --bin idemgate || die "cargo could not build the idemgate binary"
  cargo build --release -p idemgate-testkit --bin idemgate-relay || die "cargo could not build the idemgate-relay binary"
  export IDEMGATE_BIN="$release/idemgate" IDEMGATE_RELAY_BIN="$release/idemgate-relay"
fi

# The JavaScript suite runs on Node.js >= 20, and only there: that is what this
# script tests (Debian 12's own nodejs is 18, which is refused rather than run
# half-supported). The package's sources use only what Node 18 already has
# (fetch, AbortController, Web Crypto), but 18 is untested.
node_major() { node -e 'console.log(process.versions.node.split(".")[0])'; }

# Runs "$@" unless the hash of the salt (a string: the tool versions the install
# depends on) and of the files before `--` matches the one recorded in the marker
# after them; records it after a successful run. Every step returns its failure
# explicitly: the callers run it as `installed_from … || die …`, and in an `||`
# context bash runs the whole function with `set -e` off.
installed_from() {
  local marker=$1 salt=$2; shift 2
  local files=()
  while [ "$1" != -- ]; do files+=("$1"); shift; done
  shift
  local hash
  hash=$({ printf '%s\n' "$salt" && cat "${files[@]}"; } | sha256sum | cut -d' ' -f1) || return 1
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$hash" ]; then
    return 0
  fi
  rm -f "$marker" || return 1
  "$@" || return 1
  echo "$hash" > "$marker" || return 1
}

run_js() {
  log "clients/js: npm ci, npm test"
  local major
  major=$(node_major) || die "node does not run"
  [ "$major" -ge 20 ] || die "Node.js $(node --version) is too old for the clients/js suite: it is tested on Node >= 20 (Debian 12's nodejs is 18; install Node 20 or newer, e.g. Debian 13's or NodeSource's)"
  cd "$root/clients/js"
  installed_from node_modules/.idemgate-installed "node $(node --version)" package-lock.json -- \
    npm ci --no-audit --no-fund --loglevel=error || die "npm ci failed in clients/js"
  npm test || die "the JavaScript client suite failed"
}

# The checkout page `idemgate serve` embeds, in Debian's headless Chromium (installed
# by services.sh above): the server's own tests, with their own package.json.
run_browser() {
  log "crates/idemgate-server/tests/browser: npm ci, npm test (headless Chromium)"
  local major
  major=$(node_major) || die "node does not run"
  [ "$major" -ge 20 ] || die "Node.js $(node --version) is too old for the browser suite: it is tested on Node >= 20"
  cd "$root/crates/idemgate-server/tests/browser"
  installed_from node_modules/.idemgate-installed "node $(node --version)" package-lock.json -- \
    npm ci --no-audit --no-fund --loglevel=error || die "npm ci failed in crates/idemgate-server/tests/browser"
  npm test || die "the checkout page's browser suite failed"
}

run_python() {
  log "clients/python: venv, pip install -e '.[test]' (constraints.txt), mypy --strict, pytest"
  cd "$root/clients/python"
  [ -x .venv/bin/python ] || python3 -m venv .venv || die "python3 -m venv failed in clients/python"
  installed_from .venv/.idemgate-installed "$(.venv/bin/python --version 2>&1)" pyproject.toml constraints.txt -- \
    env PIP_CONSTRAINT="$PWD/constraints.txt" .venv/bin/pip install -q --disable-pip-version-check -e '.[test]' \
    || die "pip could not install clients/python with its test dependencies"
  # The package declares itself typed (py.typed): its annotations are checked
  # (pyproject.toml's [tool.mypy]: --strict, on src/) before the suite runs.
  .venv/bin/mypy || die "mypy --strict found type errors in clients/python"
  .venv/bin/pytest || die "the Python client suite failed"
}

case "${1:-all}" in
  js) run_js ;;
  python) run_python ;;
  browser) run_browser ;;
  all) (run_js); (run_python); (run_browser) ;;
  *) die "usage: $0 [js|python|browser|all]" ;;
esac
