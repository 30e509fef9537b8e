#!/usr/bin/env bash
# The client packages' suites — clients/js (`npm ci && npm test`, the checkout page
# in headless Chromium included) and clients/python (a venv, `pip install -e
# '.[test]'` under constraints.txt, `pytest`) — against a built idemgate binary and
# the idemgate-relay of idemgate-testkit. scripts/test.sh runs it after the cargo
# tests with the binaries those built (target/debug); on its own:
#   IDEMGATE_BIN=target/debug/idemgate scripts/clients.sh   # or unset: target/release, built
#   scripts/clients.sh js | python                          # one suite
# Installs what the suites need (Debian's chromium and chromium-driver through
# services.sh, the npm packages from package-lock.json, the pinned Python packages)
# and fails loudly when it cannot. A dependency install is skipped when its lock
# file has not changed since the last one in this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

log() { printf '[clients] %s\n' "$*" >&2; }
die() { printf '[clients] ERROR: %s\n' "$*" >&2; exit 1; }

scripts/services.sh clients

if [ -n "${IDEMGATE_BIN:-}" ]; then
  IDEMGATE_BIN=$(realpath "$IDEMGATE_BIN")
  [ -x "$IDEMGATE_BIN" ] || die "IDEMGATE_BIN=$IDEMGATE_BIN is not an executable"
  relay="${IDEMGATE_RELAY_BIN:-$(dirname "$IDEMGATE_BIN")/idemgate-relay}"
  [ -x "$relay" ] || die "$relay is missing: cargo test -p idemgate-testkit (or cargo build -p idemgate-testkit --bin idemgate-relay) builds it beside $IDEMGATE_BIN"
  export IDEMGATE_BIN
fi

# Runs "$@" unless the hash of the files before `--` matches the one recorded in
# the marker after them; records it after a successful run.
installed_from() {
  local marker=$1; shift
  local files=()
  while [ "$1" != -- ]; do files+=("$1"); shift; done
  shift
  local hash
  hash=$(cat "${files[@]}" | sha256sum | cut -d' ' -f1)
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$hash" ]; then
    return 0
  fi
  "$@"
  echo "$hash" > "$marker"
}

run_js() {
  log "clients/js: npm ci, npm test"
  cd "$root/clients/js"
  installed_from node_modules/.idemgate-installed package-lock.json -- \
    npm ci --no-audit --no-fund --loglevel=error || die "npm ci failed in clients/js"
  npm test || die "the JavaScript client suite failed"
}

run_python() {
  log "clients/python: venv, pip install -e '.[test]' (constraints.txt), pytest"
  cd "$root/clients/python"
  [ -x .venv/bin/python ] || python3 -m venv .venv || die "python3 -m venv failed in clients/python"
  installed_from .venv/.idemgate-installed pyproject.toml constraints.txt -- \
    env PIP_CONSTRAINT="$PWD/constraints.txt" .venv/bin/pip install -q --disable-pip-version-check -e '.[test]' \
    || die "pip could not install clients/python with its test dependencies"
  .venv/bin/pytest || die "the Python client suite failed"
}

case "${1:-all}" in
  js) run_js ;;
  python) run_python ;;
  all) (run_js); (run_python) ;;
  *) die "usage: $0 [js|python|all]" ;;
esac
