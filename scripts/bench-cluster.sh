#!/usr/bin/env bash
# Drains N requests through one `inferq run` on a standalone Redis and then on a 3-master Redis
# Cluster (result lists in the queue's slot and in another slot), all in this run, and prints for
# each: requests/s, Redis CPU per request on every master, and top-level commands per request
# (INFO commandstats); with --replica-wait, also the cost of submit --replica-wait 1 against a
# primary with one replica. Every server is started here on free ports and stopped at the end.
#
#   scripts/bench-cluster.sh [N]          (default N = 20000)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20000}
scripts/ensure-redis.sh
cargo build --release --quiet --bin inferq
BIN=target/release/inferq
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
port() { python3 -c 'import random,socket
while True:
    p=random.randint(20000,30000); ok=True
    for q in (p,p+10000):
        s=socket.socket()
        try: s.bind(("127.0.0.1",q))
        except OSError: ok=False
        s.close()
    if ok: print(p); break'; }
server() { # port dir [args...]
  local p=$1 d=$2; shift 2; mkdir -p "$d"
  redis-server --port "$p" --dir "$d" --save '' --appendonly yes --appendfsync everysec \
    --daemonize no "$@" >"$d/log" 2>&1 & PIDS+=($!)
  for _ in $(seq 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && return; sleep 0.05; done
  echo "redis on $p did not start" >&2; exit 1
}
cpu() { redis-cli -p "$1" info cpu | awk -F: '/used_cpu_(sys|user):/ {s+=$2} END {printf "%.3f", s}'; }
calls() { redis-cli -p "$1" info commandstats | awk -F'[=,:]' '/^cmdstat_/ && !/cmdstat_(info|config|ping|cluster|client|hello)/ {s+=$3} END {print s+0}'; }
lines() { python3 - "$1" "$2" <<'PY'
import sys
n, prefix = int(sys.argv[1]), sys.argv[2]
for i in range(n):
    print('{"id":"%s-%d","timeout_s":3600,"payload":{"prompt":"hi","max_tokens":4}}' % (prefix, i))
PY
}
SIMP=$(port); $BIN sim --listen 127.0.0.1:$SIMP --ttft-ms 0 --per-token-ms 0 >"$WORK/sim.log" 2>&1 & PIDS+=($!)
sleep 0.5

drain() { # label url mode-fields result-list redis-flags... ; masters in $MASTERS
  local label=$1 url=$2 fields=$3 list=$4; shift 4
  local cfg="{\"url\":\"$url\"$fields,\"batch_size\":256,\"poll_interval_ms\":50,\"queues\":[{\"queue_name\":\"request-sortedset\",\"result_queue_name\":\"$list\",\"igw_base_url\":\"http://127.0.0.1:$SIMP\"}]}"
  lines "$N" "$label" | $BIN submit --redis-url "$url" "$@" --result-queue "$list" >/dev/null 2>&1
  local before=() c0=0
  for m in $MASTERS; do before+=("$(cpu "$m")"); redis-cli -p "$m" config resetstat >/dev/null; done
  local hp mp; hp=$(port); mp=$(port)
  local t0; t0=$(date +%s.%N)
  $BIN run --transport redis-sortedset --transport-config "$cfg" --concurrency 64 \
    --health-port "$hp" --metrics-port "$mp" >"$WORK/run-$label.log" 2>&1 & local rp=$!; PIDS+=($rp)
  while :; do
    local have first=${MASTERS%% *}
    have=$(redis-cli -c -p "$first" llen "$list" 2>/dev/null || echo 0)
    [ "${have:-0}" -ge "$N" ] 2>/dev/null && break
    sleep 0.05
  done
  local t1; t1=$(date +%s.%N)
  local i=0 per=() total_calls=0
  for m in $MASTERS; do
    per+=("$(python3 -c "print(f'{($(cpu "$m")-${before[$i]})/$N*1e6:.1f}')")")
    total_calls=$((total_calls + $(calls "$m"))); i=$((i+1))
  done
  kill "$rp"; wait "$rp" 2>/dev/null || true
  printf '%-28s %8.0f req/s   redis µs/req per master: %-22s commands/req: %.2f\n' "$label" \
    "$(python3 -c "print($N/($t1-$t0))")" "${per[*]}" "$(python3 -c "print($total_calls/$N)")"
  for m in $MASTERS; do redis-cli -p "$m" flushall >/dev/null 2>&1 || true; done
}

# Standalone.
SP=$(port); server "$SP" "$WORK/standalone"
MASTERS=$SP drain standalone "redis://127.0.0.1:$SP/" "" result-list

# A cluster of 3 masters (no replicas: the CPU of the masters is what is measured).
CP=(); for i in 1 2 3; do p=$(port); CP+=("$p"); server "$p" "$WORK/c$p" --cluster-enabled yes --cluster-config-file nodes.conf; done
redis-cli --cluster create "${CP[@]/#/127.0.0.1:}" --cluster-yes >/dev/null
for _ in $(seq 100); do redis-cli -p "${CP[0]}" cluster info | grep -q cluster_state:ok && break; sleep 0.1; done
sleep 1
ADDRS="\"127.0.0.1:${CP[1]}\",\"127.0.0.1:${CP[2]}\""
MASTERS="${CP[*]}" drain "cluster, list beside" "redis://127.0.0.1:${CP[0]}/" ",\"mode\":\"cluster\",\"addrs\":[$ADDRS]" "{request-sortedset}:results" --redis-mode cluster --redis-addrs "127.0.0.1:${CP[1]},127.0.0.1:${CP[2]}"
MASTERS="${CP[*]}" drain "cluster, list apart" "redis://127.0.0.1:${CP[0]}/" ",\"mode\":\"cluster\",\"addrs\":[$ADDRS]" "result-list" --redis-mode cluster --redis-addrs "127.0.0.1:${CP[1]},127.0.0.1:${CP[2]}"

# The cost of a replica wait on submissions: a primary and one replica.
PP=$(port); RP=$(port); server "$PP" "$WORK/primary" --repl-diskless-sync-delay 0
server "$RP" "$WORK/replica" --replicaof 127.0.0.1 "$PP"
for _ in $(seq 100); do redis-cli -p "$RP" info replication | grep -q master_link_status:up && break; sleep 0.1; done
for wait in 0 1; do
  t0=$(date +%s.%N)
  lines "$N" "w$wait" | $BIN submit --redis-url "redis://127.0.0.1:$PP/" --replica-wait "$wait" >/dev/null 2>&1
  t1=$(date +%s.%N)
  printf 'submit --replica-wait %s        %8.0f req/s\n' "$wait" "$(python3 -c "print($N/($t1-$t0))")"
  redis-cli -p "$PP" flushall >/dev/null
done
