#!/usr/bin/env bash
# The cluster section of `inferq-dev bench` on its own: N requests drained through one `inferq run`
# on a standalone Redis and on a 3-master Redis Cluster (result lists in their queue's slot, then
# in another slot), with Redis CPU per request on every master, commands and cross-slot commands
# per request, the capacity projection, and the cost of `submit --replica-wait 1` against a
# primary with one replica. Every server is started on free ports and stopped at the end; the
# table goes to standard output and cluster.json to --out (default bench-out).
#
#   scripts/bench-cluster.sh [N] [more inferq-dev bench flags]     (default N = 20000)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${1:-20000}
shift || true
scripts/ensure-redis.sh
cargo build --release --quiet -p inferq -p inferq-dev
exec "${CARGO_TARGET_DIR:-target}/release/inferq-dev" bench --cluster-only --cluster-n "$N" "$@"
