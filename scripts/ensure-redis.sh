#!/usr/bin/env bash
# Installs redis-server from Debian's packages when it is missing (and redis-cli, which the
# cluster fixture creates clusters with: Debian's redis-tools, a dependency of redis-server).
# Never starts the system service: tests and the demo start their own servers on free ports.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
  exit 0
fi
echo "redis-server or redis-cli not found: installing Debian's redis-server and redis-tools" >&2
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# policy-rc.d keeps the package from starting a system redis on the standard port.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
command -v redis-server >/dev/null
command -v redis-cli >/dev/null
redis-server --version
