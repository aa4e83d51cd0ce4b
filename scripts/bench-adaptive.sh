#!/usr/bin/env bash
# The adaptive concurrency limit end to end, as real processes: `tollgate bench
# upstream` (capacity C = 8 at 20 ms; past C every request slows down), `tollgate
# proxy` in front of it, and `tollgate bench closed-loop` clients (each sends, waits
# for its answer, sends again; 1 ms pause after a 429/503). One run, one scenario at a
# time, each over the same upstream:
#   1. 4x C clients: no limit, static limits at 4x C and C/2 (limit_conn), adaptive;
#   2. C halves at 1/3 of the run and recovers at 2/3 (adaptive, per-second lines);
#   3. 0.8x C clients (adaptive): nothing may be shed;
#   4. 3x C: 4 critical clients beside 20 sheddable ones;
#   5. fair shares: one caller with 20 clients beside three with 2 each (10x);
#   6. an upstream whose service times jitter +-20 %: 8 critical clients (demand = C)
#      beside 16 sheddable ones, then 32 clients through a static limit of exactly C
#      and through the adaptive limit, alternating, three rounds (medians);
#   7. the same in front of an upstream written in Python asyncio
#      (scripts/lib/asyncio-upstream.py: processor sharing, capacity 8 at 20 ms, its
#      service times jittering with the interpreter, noise the project did not write).
# Usage: [SCENARIOS="6 7"] scripts/bench-adaptive.sh [seconds per scenario]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
cargo build --release -q -p tollgate-server
bin=target/release/tollgate
. scripts/lib/bench.sh
up=$(free_port); px=$(free_port); mx=$(free_port)
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

start_upstream() { # $@ = extra arguments
  [ -n "${uppid:-}" ] && kill "$uppid" 2>/dev/null && wait "$uppid" 2>/dev/null || true
  "$bin" bench upstream --listen "127.0.0.1:$up" --capacity 8 --service 20ms "$@" >/dev/null 2>&1 &
  uppid=$!; pids+=($uppid)
  sleep 0.3
}

cat > "$work/proxy.yaml" <<YAML
proxy:
  listen: 127.0.0.1:$px
  metrics: 127.0.0.1:$mx
  routes:
    - { name: none, match: { path_prefix: /none/ }, upstream: "http://127.0.0.1:$up" }
    - { name: static32, match: { path_prefix: /static32/ }, upstream: "http://127.0.0.1:$up", key: client_ip, limit_conn: 32 }
    - { name: static4, match: { path_prefix: /static4/ }, upstream: "http://127.0.0.1:$up", key: client_ip, limit_conn: 4 }
    - { name: static8, match: { path_prefix: /static8/ }, upstream: "http://127.0.0.1:$up", key: client_ip, limit_conn: 8 }
    - { name: adaptive, match: { path_prefix: /adaptive/ }, upstream: "http://127.0.0.1:$up", adaptive: gradient }
    - name: classes
      match: { path_prefix: /classes/ }
      upstream: "http://127.0.0.1:$up"
      adaptive: gradient
      key: header:x-api-key
      priority: sheddable
      tiers: [ { name: checkout, values: [checkout], priority: critical } ]
    - { name: fair, match: { path_prefix: /fair/ }, upstream: "http://127.0.0.1:$up", adaptive: gradient, key: "header:x-api-key", fair_share: true }
YAML
start_upstream
"$bin" proxy --config "$work/proxy.yaml" >/dev/null 2>&1 & pids+=($!)
sleep 0.5

load() { # $1 = path, $2 = clients, then closed-loop arguments (the first 2 s, the
  # limit's ramp, are left out of the totals unless --settle says otherwise)
  local path=$1 clients=$2; shift 2
  local settle=(--settle 2s)
  [[ " $* " == *" --settle "* ]] && settle=()
  "$bin" bench closed-loop --target "http://127.0.0.1:$px$path" --clients "$clients" \
    --duration "${secs}s" "${settle[@]}" "$@"
}
limit() { curl -s "http://127.0.0.1:$mx/metrics" | awk -v r="route=\"$1\"" '$0 ~ "adaptive_limit{" r {print $2}'; }

echo "unloaded latency through the proxy:"
load /none/ 1 | tail -1
echo
# Critical work at the capacity beside sheddable work, then 4x C through a static limit
# of exactly C and through the adaptive limit, alternating (the upstream started).
at_capacity() {
  echo "unloaded latency through the proxy: $(load /none/ 1 | tail -1)"
  echo "8 critical clients (demand = C) beside 16 sheddable ones:"
  load /classes/ 8 --header "x-api-key: checkout" | tail -1 > "$work/critical" &
  crit=$!
  sheddable=$(load /classes/ 16 --header "x-api-key: batch" | tail -1)
  wait $crit
  echo "critical  $(cat "$work/critical")"
  echo "sheddable $sheddable"
  echo "32 clients (4x C), static limit of C against adaptive, alternating:"
  for round in 1 2 3; do
    for route in static8 adaptive; do
      printf '%-9s %s\n' "$route" "$(load /$route/ 32 | tail -1)"
    done
  done
}
for scenario in ${SCENARIOS:-1 2 3 4 5 6 7}; do
  case $scenario in
  1)
    echo "1. 32 clients (4x C = 8), C / 20 ms = 400 req/s"
    for route in none static32 static4 adaptive; do
      printf '%-9s %s\n' "$route" "$(load /$route/ 32 | tail -1)"
    done
    echo "adaptive limit at the end: $(limit adaptive)"
    ;;
  2)
    echo "2. capacity 8 -> 4 at $((secs / 3))s -> 8 at $((2 * secs / 3))s (adaptive, 32 clients)"
    start_upstream --schedule "$((secs / 3))s=4,$((2 * secs / 3))s=8"
    (for _ in $(seq "$secs"); do sleep 1; printf '%s ' "$(limit adaptive)"; done; echo) > "$work/limits" &
    sampler=$!
    load /adaptive/ 32 --interval 1s --settle 0s
    wait "$sampler"
    echo "limit each second: $(cat "$work/limits")"
    start_upstream
    ;;
  3)
    echo "3. 6 clients (0.8x C), adaptive"
    load /adaptive/ 6 | tail -1
    ;;
  4)
    echo "4. 3x C: 4 critical clients beside 20 sheddable ones"
    load /classes/ 4 --header "x-api-key: checkout" | tail -1 > "$work/critical" &
    crit=$!
    sheddable=$(load /classes/ 20 --header "x-api-key: batch" | tail -1)
    wait $crit
    echo "critical  $(cat "$work/critical")"
    echo "sheddable $sheddable"
    ;;
  5)
    echo "5. fair shares: one caller with 20 clients, three with 2 each"
    quiet=()
    for caller in a b c; do
      load /fair/ 2 --header "x-api-key: $caller" | tail -1 > "$work/quiet-$caller" & quiet+=($!)
    done
    greedy=$(load /fair/ 20 --header "x-api-key: greedy" | tail -1)
    wait "${quiet[@]}"
    echo "greedy    $greedy"
    for caller in a b c; do echo "quiet $caller   $(cat "$work/quiet-$caller")"; done
    ;;
  6)
    echo "6. service times jitter +-20 %"
    start_upstream --jitter 0.2
    at_capacity
    ;;
  7)
    echo "7. an upstream written in Python asyncio (processor sharing, capacity 8 at 20 ms;"
    echo "   its times jitter with the interpreter)"
    kill "$uppid" 2>/dev/null && wait "$uppid" 2>/dev/null || true
    python3 scripts/lib/asyncio-upstream.py "$up" 8 0.020 >/dev/null 2>&1 &
    uppid=$!; pids+=($uppid)
    for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$up/" && break; sleep 0.1; done
    at_capacity
    ;;
  esac
  echo
done
