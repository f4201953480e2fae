#!/usr/bin/env bash
# Prints the path of a `prometheus` binary for the tests that run a real Prometheus
# (crates/testkit's PrometheusServer: INFERQ_PROMETHEUS): the metric gates against a router
# stand-in, and deploy/'s alert rules against a live processor.
# Order: $INFERQ_PROMETHEUS if it names a file, a prometheus on PATH, else Debian's prometheus
# package *unpacked* (apt-get download + dpkg-deb -x, as scripts/check-deploy.sh does for
# promtool) under target/prometheus-deb: installing the package would also set up and start a
# Prometheus service, which the tests neither need nor may touch.
# Everything but the path goes to stderr, so callers can `export INFERQ_PROMETHEUS="$(…)"`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${INFERQ_PROMETHEUS:-}" ] && [ -f "$INFERQ_PROMETHEUS" ]; then
  echo "$INFERQ_PROMETHEUS"
  exit 0
fi
if command -v prometheus >/dev/null 2>&1; then
  command -v prometheus
  exit 0
fi
dir=target/prometheus-deb
binary="$PWD/$dir/usr/bin/prometheus"
if [ ! -x "$binary" ]; then
  for tool in apt-get dpkg-deb; do
    command -v "$tool" >/dev/null 2>&1 || {
      echo "prometheus not found, and no $tool to unpack Debian's package: install Prometheus or set INFERQ_PROMETHEUS" >&2
      exit 1
    }
  done
  echo "prometheus not found: unpacking Debian's prometheus package into $dir" >&2
  debs="$(mktemp -d)"
  trap 'rm -rf "$debs"' EXIT
  download() { (cd "$debs" && apt-get download prometheus >&2); }
  if ! download; then
    # A fresh machine has no package lists yet.
    echo "apt-get download failed: running apt-get update first" >&2
    SUDO=""
    if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq >&2
    download
  fi
  deb="$(ls "$debs"/prometheus_*.deb | head -1)"
  mkdir -p "$dir"
  dpkg-deb -x "$deb" "$dir"
fi
"$binary" --version 2>&1 | head -1 >&2
echo "$binary"
