#!/usr/bin/env bash
# The one-command demo. Installs redis-server if it is missing (while the build runs), builds
# inferq and the demo's part of inferq-dev (without its default features `bench` and `chaos`:
# the benchmarks, the chaos harness and the plotting stack, which the demo does not run) with the
# `demo` profile (release at opt-level 1, no line tables: Cargo.toml) into target/demo/, and runs
# `inferq-dev demo`: a real redis-server (AOF, appendfsync everysec) in a temporary directory,
# the built-in simulator gateway with a few injected faults, and `inferq run` as a child process;
# N requests go through, and a summary ends with the no-loss line. Arguments are passed on:
#   scripts/demo.sh --requests 5000 --concurrency 128 --error-rate 0.05 --keep-data
# (`target/demo/inferq-dev demo --help` lists them all). Stops everything it started on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust (https://rustup.rs) and run this again" >&2
  exit 1
fi
target="${CARGO_TARGET_DIR:-target}"
# redis-server installs (when missing) while the build runs.
scripts/ensure-redis.sh &
redis_install=$!
if [ ! -x "$target/demo/inferq" ] || [ ! -x "$target/demo/inferq-dev" ]; then
  echo "demo: building inferq and the demo. A first build fetches the crates and compiles" \
    "them: about 3 minutes on 2 cores (docs/benchmarks.md, 'The first five minutes')." >&2
fi
started=$SECONDS
cargo build --profile demo -p inferq -p inferq-dev --no-default-features
if [ $((SECONDS - started)) -ge 10 ]; then
  echo "demo: built in $((SECONDS - started)) s; starting redis-server, the simulator and inferq" >&2
fi
wait "$redis_install" || { echo "demo: redis-server could not be installed (above)" >&2; exit 1; }
exec "$target/demo/inferq-dev" demo "$@"
