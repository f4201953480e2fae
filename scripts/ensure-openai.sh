#!/usr/bin/env bash
# Prints the path of a python that has the official `openai` SDK, for the Batch API's SDK tests
# (crates/batch/tests/api/sdk.rs: INFERQ_PYTHON), and moto's S3 server beside it (moto_server, for
# crates/batch/tests/api/s3.rs), installing both from PyPI into a venv of our own,
# target/openai-venv, when they are missing. Everything but the path goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${INFERQ_PYTHON:-}" ] && "$INFERQ_PYTHON" -c 'import openai, moto' 2>/dev/null; then
  echo "$INFERQ_PYTHON"
  exit 0
fi
venv=target/openai-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import openai, moto' 2>/dev/null; then
  echo "the openai SDK or moto not found: installing them from PyPI into $venv" >&2
  mkdir -p target
  if ! python3 -m venv "$venv" >&2; then
    echo "python3 -m venv failed: installing Debian's python3-venv" >&2
    SUDO=""
    if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check 'openai>=1.50' 'moto[server]>=5' >&2
fi
"$venv/bin/python" -c 'import openai, sys; print("openai", openai.__version__, file=sys.stderr)'
echo "$(pwd)/$venv/bin/python"
