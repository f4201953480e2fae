#!/usr/bin/env bash
# What Go's redis-pubsub transport costs in inferq: a drain of N requests PUBLISHed on a channel
# (redis-benchmark as Go's producer, one subscribed instance admitting them into its durable
# queue) against the same N submitted into a sorted set and drained, one after the other on the
# same Redis (AOF everysec) and simulator gateway, concurrency 64, batch 256. Both are timed from
# the first request in to the last result out (the pub/sub drain runs while publishing; the
# sorted set is drained after submission, also timed alone). Prints the rates and their ratio. Needs redis-server and redis-benchmark (Debian's redis-server and
# redis-tools), curl and python3.
#   scripts/bench-pubsub.sh            # N = 100000
#   N=20000 scripts/bench-pubsub.sh
# Publishing runs with 16 pipelined commands on 2 connections, faster than the drain, so the
# drain is what is measured; a message whose random id repeats is an identical message, which
# the admit counts once ("duplicates").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/ensure-redis.sh
for tool in redis-benchmark curl python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$tool not found" >&2; exit 1; }
done
cargo build --release --quiet -p inferq -p inferq-dev
B="$PWD/target/release/inferq"
N="${N:-100000}"
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "${P:-}" ] && redis-cli -p "$P" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
read -r P G H M < <(python3 -c "
import socket
ss=[socket.socket() for _ in range(4)]
[s.bind(('127.0.0.1',0)) for s in ss]
print(*[s.getsockname()[1] for s in ss])")
redis-server --port "$P" --appendonly yes --appendfsync everysec --dir "$work" --save "" \
  --daemonize yes --logfile "$work/redis.log"
"$B-dev" sim --listen "127.0.0.1:$G" --ttft-ms 0 --per-token-ms 0 >"$work/sim.log" 2>&1 &
pids+=($!)
until redis-cli -p "$P" ping >/dev/null 2>&1; do sleep 0.1; done
now() { date +%s.%N; }
metric() {
  curl -s "http://127.0.0.1:$M/metrics" \
    | awk -v o="outcome=\"$1\"" 'index($0, "inferq_pubsub_messages_total") == 1 && index($0, o) {print $2}'
}

config() {
  echo '{"url":"redis://127.0.0.1:'"$P"'/","poll_interval_ms":50,"batch_size":256,"queues":[{"queue_name":"'"$1"'","igw_base_url":"http://127.0.0.1:'"$G"'","request_path_url":"/v1/chat/completions"}]}'
}

# 1. redis-pubsub: publish while one instance admits and serves.
"$B" run --transport redis-pubsub --transport-config "$(config request-queue)" \
  --health-port "$H" --metrics-port "$M" --concurrency 64 >"$work/pubsub.log" 2>&1 &
run=$!
pids+=($run)
until curl -sf "http://127.0.0.1:$H/readyz" >/dev/null; do sleep 0.1; done
t=$(date +%s)
msg='{"internal":{},"request_kind":"redis","data":{"id":"p-__rand_int__","created":'$t',"deadline":'$((t + 3600))',"payload":{"model":"m","messages":[{"role":"user","content":"Summarise the quarterly report in three bullet points."}],"max_tokens":16}}}'
pub_start=$(now)
redis-benchmark -p "$P" -P 16 -c 2 -n "$N" -r 100000000000 -q PUBLISH request-queue "$msg" >/dev/null
published=$(now)
while :; do
  admitted=$(metric admitted); duplicates=$(metric duplicate)
  served=$(redis-cli -p "$P" llen result-queue)
  total=$(python3 -c "print(int(float('${admitted:-0}')) + int(float('${duplicates:-0}')))")
  if [ "$total" -ge "$N" ] && [ "$served" -ge "${admitted%.*}" ]; then break; fi
  sleep 0.05
done
end=$(now)
pubsub_rate=$(python3 -c "print(round($served / ($end - $pub_start)))")
publish_s=$(python3 -c "print(round($published - $pub_start, 2))")
lost=$(grep -c "subscription to the request channels was lost" "$work/pubsub.log" || true)
kill -TERM "$run"; wait "$run" || true
redis-cli -p "$P" flushall >/dev/null

# 2. redis-sortedset: the same N submitted first, then drained.
submit_start=$(now)
"$B" submit --redis-url "redis://127.0.0.1:$P/" --queue request-sortedset < <(
  python3 -c "
import json
for i in range($N):
    print(json.dumps({'id': f's-{i}', 'timeout_s': 3600, 'payload': {'model': 'm', 'messages': [{'role': 'user', 'content': 'Summarise the quarterly report in three bullet points.'}], 'max_tokens': 16}}))
") >/dev/null
start=$(now)
"$B" run --transport redis-sortedset --transport-config "$(config request-sortedset)" \
  --health-port "$H" --metrics-port "$M" --concurrency 64 >"$work/sortedset.log" 2>&1 &
run=$!
pids+=($run)
while [ "$(redis-cli -p "$P" llen result-list)" -lt "$N" ]; do sleep 0.05; done
end=$(now)
sorted_rate=$(python3 -c "print(round($N / ($end - $start)))")
sorted_both=$(python3 -c "print(round($N / ($end - $submit_start)))")
kill -TERM "$run"; wait "$run" || true

echo "redis-pubsub:    $N published in $publish_s s while draining; admitted ${admitted%.*}, duplicates ${duplicates%.*}, served $served; subscription lost $lost times: $pubsub_rate req/s from the first publish to the last result"
echo "redis-sortedset: $N submitted, then drained: $sorted_both req/s from the first submit to the last result ($sorted_rate req/s for the drain alone)"
echo "ratio pubsub/sortedset, first request in to last result out: $(python3 -c "print(round($pubsub_rate / $sorted_both, 2))")"
