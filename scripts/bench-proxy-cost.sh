#!/usr/bin/env bash
# What `cost:` costs on the proxy: one `tollgate proxy` with two routes to the same
# upstream (`tollgate bench upstream` answering `{"usage":{"total_tokens":10}}` at
# once, or OpenAI's server-sent events to a streaming chat completion), the same limit
# on both (never reached), one of them charging the usage read from the JSON body.
# wrk drives each in turn, ROUNDS times (default 3), alternating: a GET on each
# route, then a streaming chat completion that does not ask for its usage on each
# (the cost route asks the upstream for it and takes it out of what wrk receives:
# `cost.ask_usage`); the last lines are the medians and the ratios cost / plain.
# Usage: [ROUNDS=3] scripts/bench-proxy-cost.sh [seconds] [connections]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
conns=${2:-32}
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
cargo build --release -q -p tollgate-server
bin=target/release/tollgate
. scripts/lib/bench.sh
up=$(free_port); px=$(free_port)
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
"$bin" bench upstream --listen "127.0.0.1:$up" --capacity 1000000 --service 0ms --usage 10 >/dev/null 2>&1 & pids+=($!)
cat > "$work/proxy.yaml" <<YAML
proxy:
  listen: 127.0.0.1:$px
  routes:
    - name: plain
      match: { path_prefix: /plain/ }
      upstream: http://127.0.0.1:$up
      key: header:X-Api-Key
      policies: ["gcra:rate=100000000/s,burst=100000000"]
    - name: cost
      match: { path_prefix: /cost/ }
      upstream: http://127.0.0.1:$up
      key: header:X-Api-Key
      policies: ["gcra:rate=100000000/s,burst=100000000"]
      cost:
        from: [json:usage.total_tokens]
        estimate: 1
YAML
"$bin" proxy --config "$work/proxy.yaml" >/dev/null 2>&1 & pids+=($!)
sleep 1
cat > "$work/stream.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
LUA
# The cost route's stream is the plain route's, byte for byte.
stream() { curl -sf -H 'X-Api-Key: k0' -H 'Content-Type: application/json' \
    -d '{"model":"m","stream":true,"messages":[]}' "http://127.0.0.1:$px/$1/v1/chat/completions"; }
[ "$(stream plain)" = "$(stream cost)" ] || { echo "the streams differ" >&2; exit 1; }
for round in $(seq "${ROUNDS:-3}"); do
  for route in plain cost plain-stream cost-stream; do
    case $route in
      *-stream) args=(-s "$work/stream.lua" "http://127.0.0.1:$px/${route%-stream}/v1/chat/completions") ;;
      *) args=("http://127.0.0.1:$px/$route/v1") ;;
    esac
    out=$(wrk -t2 -c"$conns" -d"${secs}s" --latency -H 'X-Api-Key: k1' "${args[@]}")
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    p99=$(echo "$out" | awk '$1=="99%" {print $2}')
    errors=$(echo "$out" | awk '/Non-2xx|Socket errors/ {print}' | tr '\n' ' ')
    echo "round $round $route: req/s $rps p99 $p99 ${errors}"
    echo "$route $rps" >> "$work/results"
  done
done
python3 - "$work/results" <<'PY'
import sys, statistics
runs = {}
for line in open(sys.argv[1]):
    route, rps = line.split()
    runs.setdefault(route, []).append(float(rps))
plain, cost = statistics.median(runs["plain"]), statistics.median(runs["cost"])
print(f"medians: plain {plain:.0f} req/s, cost {cost:.0f} req/s, cost / plain {cost / plain:.2f}")
plain, cost = statistics.median(runs["plain-stream"]), statistics.median(runs["cost-stream"])
print(f"medians, streams: plain {plain:.0f} req/s, cost asking for usage {cost:.0f} req/s, "
      f"cost / plain {cost / plain:.2f}")
PY
