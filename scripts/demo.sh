#!/usr/bin/env bash
# The one-command demo. Installs redis-server if it is missing, builds inferq and inferq-dev in release mode and
# runs `inferq-dev demo`: a real redis-server (AOF, appendfsync everysec) in a temporary directory,
# the built-in simulator gateway with a few injected faults, and `inferq run` as a child process;
# N requests go through, and a summary ends with the no-loss line. Arguments are passed on:
#   scripts/demo.sh --requests 5000 --concurrency 128 --error-rate 0.05 --keep-data
# (`target/release/inferq-dev demo --help` lists them all). Stops everything it started on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust (https://rustup.rs) and run this again" >&2
  exit 1
fi
scripts/ensure-redis.sh
cargo build --release -p inferq -p inferq-dev
exec "${CARGO_TARGET_DIR:-target}/release/inferq-dev" demo "$@"
