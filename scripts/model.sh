#!/usr/bin/env bash
# The models at larger bounds (crates/idemgate-model): the protocol with every
# fault at once with 2 and 3 attempts, exhaustively, then random walks of 3
# clients × 3 instances for two minutes; the conditional writes and transfers
# with every fault at once, in each mode. `scripts/test.sh` runs the small bounds.
#   scripts/model.sh                        # seed 1
#   IDEMGATE_MODEL_SEED=7 scripts/model.sh  # other walks
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -p idemgate-model -- --ignored --nocapture "$@"
