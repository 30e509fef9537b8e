#!/usr/bin/env bash
# The fault suite (crates/idemgate-server/tests/faults) with its figures printed:
# kill -9 mid-charge, a holder frozen past its lease, a PostgreSQL / Redis of its own
# killed and frozen under load. The full counts by default (docs/reliability.md);
# scripts/test.sh runs the same tests with small counts.
#   scripts/faults.sh                          # full variant, debug build
#   scripts/faults.sh --release                # full variant, release build
#   IDEMGATE_FAULTS_FULL=0 scripts/faults.sh   # the small counts of scripts/test.sh
#   IDEMGATE_FAULTS_SEED=42 scripts/faults.sh crash::   # replay a seed; arguments
#                                              # after the options filter tests
# Needs PostgreSQL's binaries (/usr/lib/postgresql/*/bin) and redis-server; as root it
# runs its own PostgreSQL as the `postgres` user. It never stops or freezes the shared
# servers on 5432 and 6379.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo_args=()
while [ "${1:-}" = --release ]; do cargo_args+=(--release); shift; done

scripts/services.sh all

export IDEMGATE_TEST_POSTGRES_URL="${IDEMGATE_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
export IDEMGATE_TEST_REDIS_URL="${IDEMGATE_TEST_REDIS_URL:-redis://127.0.0.1:6379}"
export IDEMGATE_FAULTS_FULL="${IDEMGATE_FAULTS_FULL:-1}"

cargo test "${cargo_args[@]}" -p idemgate-server --test faults -- --nocapture "$@" 2>&1 \
  | grep --line-buffered -v '^\[server'
