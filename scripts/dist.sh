#!/usr/bin/env bash
# Builds the binary that ships: the `dist` profile of Cargo.toml (why it is what it
# is: docs/deploy.md, "The distribution build"), exactly the committed lock file.
# The Dockerfile runs this; `cargo install --locked --path crates/idemgate-server
# --profile dist` builds the same binary.
#   scripts/dist.sh            # -> target/dist/idemgate
#   scripts/dist.sh DIR        # and a copy in DIR/idemgate
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --locked --profile dist -p idemgate-server --bin idemgate
built="${CARGO_TARGET_DIR:-target}/dist/idemgate"
if [ $# -gt 0 ]; then
  install -D -m 0755 "$built" "$1/idemgate"
fi
"$built" --version
