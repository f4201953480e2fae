#!/usr/bin/env bash
# Builds inferq's container image (deploy/image/Containerfile) with Debian's podman, then runs
# `inferq --version` and the demo inside it. No image registry is reachable here, so the Debian
# base is made once with debootstrap and imported (kept as localhost/inferq-debian:bookworm).
#   scripts/image.sh                     # build inferq:latest and inferq-demo:latest, run the demo
#   scripts/image.sh --demo-args "--requests 2000"
# Installs podman, runc and debootstrap (Debian packages) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
demo_args="--requests 500"
if [ "${1:-}" = "--demo-args" ]; then demo_args="$2"; fi

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
missing=()
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian's ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# This kind of machine has a hybrid cgroup layout that crun refuses, and forbids raising
# rlimits: runc, cgroupfs and the host's own limits work. Elsewhere podman's defaults are fine.
mkdir -p target/image
cat > target/image/containers.conf <<'CONF'
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
export CONTAINERS_CONF="$PWD/target/image/containers.conf"

base=localhost/inferq-debian:bookworm
if ! podman image exists "$base"; then
  rootfs=target/image/rootfs
  if [ ! -x "$rootfs/usr/bin/apt-get" ]; then
    rm -rf "$rootfs"
    $SUDO /usr/sbin/debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian
  fi
  $SUDO rm -f "$rootfs"/var/cache/apt/archives/*.deb
  $SUDO tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$base"
fi

commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
started=$(date +%s)
for target in runtime demo; do
  name=inferq; [ "$target" = demo ] && name=inferq-demo
  podman build -f deploy/image/Containerfile --target "$target" \
    --build-arg "BASE=$base" --build-arg "INFERQ_COMMIT=$commit" \
    -t "localhost/$name:$commit" -t "localhost/$name:latest" .
done
echo "built in $(( $(date +%s) - started )) s"
podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'inferq(-demo)?:(latest|'"$commit"')'

# The image answers as the commit it was built from, runs as a non-root user, and the demo
# (redis-server, the simulator gateway and `inferq run`) passes inside it.
podman run --rm localhost/inferq:latest --version | tee /dev/stderr | grep -q "(commit $commit)"
test "$(podman run --rm --entrypoint /usr/bin/id localhost/inferq:latest -u)" = 65532
# shellcheck disable=SC2086
podman run --rm localhost/inferq-demo:latest demo $demo_args
