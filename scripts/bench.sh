#!/usr/bin/env bash
# The one-command benchmark of issue 5. Installs what is missing — redis-server from Debian's
# packages (scripts/ensure-redis.sh) and, when node and npm are installed, BullMQ 5 into a
# cache folder outside the repo (~/.cache/inferq-bench/bullmq, or $BULLMQ_DIR) — builds inferq
# in release mode and runs `inferq-dev bench`. Arguments are passed on:
#   scripts/bench.sh                 # the full run (about 4 minutes on 2 cores)
#   scripts/bench.sh --quick         # small sizes, under a minute
#   scripts/bench.sh --out docs/bench
# (`target/release/inferq-dev bench --help` lists every flag.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust (https://rustup.rs) and run this again" >&2
  exit 1
fi
scripts/ensure-redis.sh
BULLMQ_DIR="${BULLMQ_DIR:-$HOME/.cache/inferq-bench/bullmq}"
export BULLMQ_DIR
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  if [ ! -f "$BULLMQ_DIR/node_modules/bullmq/package.json" ]; then
    echo "installing BullMQ 5 into $BULLMQ_DIR (npm)" >&2
    mkdir -p "$BULLMQ_DIR"
    (cd "$BULLMQ_DIR" && { [ -f package.json ] || npm init -y >/dev/null; } \
      && npm install --no-audit --no-fund --silent bullmq@5 >/dev/null) \
      || echo "BullMQ could not be installed: the BullMQ comparison will be skipped" >&2
  fi
else
  echo "node/npm not found: the node gateway and the BullMQ comparison will be skipped" >&2
fi
cargo build --release -p inferq -p inferq-dev
exec "${CARGO_TARGET_DIR:-target}/release/inferq-dev" bench "$@"
