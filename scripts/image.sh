#!/usr/bin/env bash
# Builds inferq's container image (deploy/image/Containerfile) with Debian's podman, then runs
# `inferq --version`, the processor as the Helm chart runs it, and the demo inside it. No image registry is reachable here, so the Debian
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

# The machine's local CAs (a TLS-inspecting egress proxy's, say) for the build stage's
# downloads, passed as a build secret; empty when there are none.
cat /usr/local/share/ca-certificates/*.crt > target/image/local-ca.crt 2>/dev/null || : > target/image/local-ca.crt

commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
started=$(date +%s)
for target in runtime demo; do
  name=inferq; [ "$target" = demo ] && name=inferq-demo
  podman build -f deploy/image/Containerfile --target "$target" \
    --build-arg "BASE=$base" --build-arg "INFERQ_COMMIT=$commit" \
    --secret id=local-ca,src=target/image/local-ca.crt \
    -t "localhost/$name:$commit" -t "localhost/$name:latest" .
done
echo "built in $(( $(date +%s) - started )) s"
podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'inferq(-demo)?:(latest|'"$commit"')'

# The image answers as the commit it was built from, runs as a non-root user, and the demo
# (redis-server, the simulator gateway and `inferq run`) passes inside it.
podman run --rm localhost/inferq:latest --version | tee /dev/stderr | grep -q "(commit $commit)"
test "$(podman image inspect -f '{{.Config.User}}' localhost/inferq:latest)" = 65532:65532

# The runtime image as the chart runs it: `inferq run` with the chart's flags, a read-only root
# file system, the config mounted at /etc/inferq and REDIS_URL from the environment, against a
# redis-server started here on a free port. /readyz must say 200 and /metrics must answer.
work=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
redis_port=$(free_port); health_port=$(free_port); metrics_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$work" --save '' --daemonize yes \
  --pidfile "$work/redis.pid" --logfile "$work/redis.log"
container=""
cleanup() {
  if [ -n "$container" ]; then podman rm -f "$container" >/dev/null 2>&1 || true; fi
  kill "$(cat "$work/redis.pid" 2>/dev/null)" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir "$work/etc"
echo '{"queues":[{"queue_name":"request-sortedset","igw_base_url":"http://127.0.0.1:9"}]}' > "$work/etc/transport.json"
chmod -R a+rX "$work/etc"
container=$(podman run -d --network=host --read-only --tmpfs /tmp \
  -v "$work/etc:/etc/inferq:ro" -e "REDIS_URL=redis://127.0.0.1:$redis_port/0" \
  localhost/inferq:latest run --transport=redis-sortedset \
  --transport-config-file=/etc/inferq/transport.json --transport-config-watch-interval=0s \
  --health-port="$health_port" --metrics-port="$metrics_port" --metrics-endpoint-auth=false \
  --drain-timeout=2m --zap-devel=false)
ready=""
for _ in $(seq 1 100); do
  if curl -fsS "http://127.0.0.1:$health_port/readyz" >/dev/null 2>&1; then ready=yes; break; fi
  sleep 0.1
done
if [ -z "$ready" ]; then podman logs "$container" >&2; echo "the image's processor never became ready" >&2; exit 1; fi
curl -fsS "http://127.0.0.1:$metrics_port/metrics" | grep -q '^llm_d_async_async_pool_worker_limit'
podman top "$container" user | tail -n +2 | grep -qxE ' *(inferq|65532) *'
podman stop -t 30 "$container" >/dev/null
test "$(podman inspect -f '{{.State.ExitCode}}' "$container")" = 0
echo "the runtime image served /readyz 200 and /metrics under the chart's flags, and drained on SIGTERM"

# shellcheck disable=SC2086
podman run --rm localhost/inferq-demo:latest demo $demo_args
