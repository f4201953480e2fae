#!/usr/bin/env bash
# Runs every test: unit tests next to the code, the model check and the end-to-end tests, each
# against real redis-server processes the tests start on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-redis.sh
# The cluster and sentinel fixtures' Valkey tests need a valkey-server (they fail in CI without).
INFERQ_VALKEY_SERVER="$(scripts/ensure-valkey.sh)"
export INFERQ_VALKEY_SERVER
# The real-Prometheus tests (the prometheus-* gates against a router stand-in, deploy/'s alert
# rules against a live processor) start the prometheus this names (crates/testkit: PrometheusServer).
INFERQ_PROMETHEUS="$(scripts/ensure-prometheus.sh)"
export INFERQ_PROMETHEUS
# The Batch API's tests drive it with the official openai Python SDK (crates/batch/tests/api/sdk.rs).
INFERQ_PYTHON="$(scripts/ensure-openai.sh)"
export INFERQ_PYTHON
# The chart, dashboard and alert rules of deploy/, checked offline (Helm renders, Kubernetes
# schemas, PromQL, promtool's rule tests); the names of the metrics they use go to the
# end-to-end test that finds each on a live processor's or Batch API's page (tests/e2e/deploy.rs).
scripts/check-deploy.sh --metric-names-out target/deploy-metric-names.txt
INFERQ_DEPLOY_METRIC_NAMES="$PWD/target/deploy-metric-names.txt"
export INFERQ_DEPLOY_METRIC_NAMES
# tests/e2e/security.rs makes its TLS certificates with the openssl command line.
if ! command -v openssl >/dev/null 2>&1; then
  echo "openssl not found: installing Debian's openssl package" >&2
  SUDO=""
  if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openssl >/dev/null
fi
cargo test --release --all-targets "$@"
# The client's documented examples (its crate root, NewRequest) compile and run: `--all-targets`
# leaves doc tests out.
cargo test --release --doc -p inferq-client "$@"
