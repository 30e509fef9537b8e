#!/usr/bin/env bash
# The test command: starts what the tests need, then runs every test of the workspace,
# then the JavaScript and Python client suites against the binaries the cargo tests
# built (scripts/clients.sh).
#   scripts/test.sh            # all tests
#   scripts/test.sh -p idemgate # only these crates (no client suites); extra arguments go to `cargo test`
set -euo pipefail
cd "$(dirname "$0")/.."

# The deployment validators' virtualenv (services.sh installs it, the packaging
# test runs from it).
export IDEMGATE_DEPLOY_TOOLS="${IDEMGATE_DEPLOY_TOOLS:-$PWD/target/deploy-tools}"
# The webhook providers' signing libraries (services.sh installs them, the
# webhook e2e tests run tests/webhooks/sign.py from there).
export IDEMGATE_WEBHOOK_SIGNERS="${IDEMGATE_WEBHOOK_SIGNERS:-$PWD/target/webhook-signers}"
# The cargo tests' services; Chromium, node and the Python venv only when the
# client suites run (scripts/clients.sh ensures them).
scripts/services.sh cargo-tests

export IDEMGATE_TEST_POSTGRES_URL="${IDEMGATE_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
export IDEMGATE_TEST_REDIS_URL="${IDEMGATE_TEST_REDIS_URL:-redis://127.0.0.1:6379}"

trap 'scripts/redis-cluster.sh stop' EXIT
IDEMGATE_TEST_REDIS_CLUSTER_URLS="$(scripts/redis-cluster.sh start)"
export IDEMGATE_TEST_REDIS_CLUSTER_URLS

# `-p CRATE` narrows the run to those crates; without it, the whole workspace.
scope=(--workspace)
for arg in "$@"; do
    case "$arg" in -p | --package | -p* | --package=*) scope=() ;; esac
done
cargo test "${scope[@]}" --all-targets "$@"
cargo test "${scope[@]}" --doc "$@"

# The client packages, against the binaries the cargo tests just built (the
# server's integration tests build <target>/debug/idemgate, idemgate-testkit's
# <target>/debug/idemgate-relay, where <target> is CARGO_TARGET_DIR or target/),
# so CI needs no release build.
if [ "${#scope[@]}" -gt 0 ]; then
    target_dir="$(realpath -m "${CARGO_TARGET_DIR:-$PWD/target}")"
    IDEMGATE_BIN="$target_dir/debug/idemgate" IDEMGATE_RELAY_BIN="$target_dir/debug/idemgate-relay" scripts/clients.sh
fi
