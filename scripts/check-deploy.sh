#!/usr/bin/env bash
# Checks deploy/ (the Helm chart, the Grafana dashboard, the Prometheus alert rules) offline:
# makes the Python venv target/deploy-venv with the pinned packages of deploy/requirements.txt
# when it is missing or they changed, then runs deploy/check.py, passing on its arguments
# (e.g. --metric-names-out target/deploy-metric-names.txt).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=target/deploy-venv
requirements=deploy/requirements.txt
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"

python=python3
if ! command -v "$python" >/dev/null; then
  echo "check-deploy: python3 (3.10 or newer) is needed" >&2
  exit 1
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "check-deploy: python3 is $("$python" --version 2>&1); 3.10 or newer is needed" >&2
  exit 1
fi

if [[ ! -x "$venv/bin/python" || "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]]; then
  echo "check-deploy: installing $requirements into $venv"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    -r "$requirements"
  "$venv/bin/pip" check --disable-pip-version-check >/dev/null
  echo "$want" > "$stamp"
fi

# promtool (the alert rules' unit tests) from Debian's prometheus package, unpacked beside the
# venv rather than installed: the package would also set up a Prometheus service.
if [[ -z "${PROMTOOL:-}" ]] && ! command -v promtool >/dev/null; then
  promtool="$venv/prometheus/usr/bin/promtool"
  if [[ ! -x "$promtool" ]] && command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
    echo "check-deploy: unpacking promtool from Debian's prometheus package into $venv/prometheus"
    debs="$(mktemp -d)"
    (cd "$debs" && apt-get download prometheus >/dev/null 2>&1) || true
    deb="$(ls "$debs"/prometheus_*.deb 2>/dev/null | head -1 || true)"
    if [[ -n "$deb" ]]; then dpkg-deb -x "$deb" "$venv/prometheus"; fi
    rm -rf "$debs"
  fi
  if [[ -x "$promtool" ]]; then export PROMTOOL="$PWD/$promtool"; fi
fi

exec "$venv/bin/python" deploy/check.py "$@"
