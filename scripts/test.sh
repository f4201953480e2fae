#!/usr/bin/env bash
# Runs every test: unit tests next to the code, the model check and the end-to-end tests, each
# against real redis-server processes the tests start on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-redis.sh
cargo test --release --all-targets "$@"
