#!/usr/bin/env bash
# Measures the Redis store against its ceiling in one run, on loopback: tollgate's
# checks (`tollgate bench redis`: N callers over C pipelined connections) beside
# redis-benchmark driving the same script call (EVALSHA, same keys) with the same
# connection count and pipeline depth N/C. 3 alternating rounds; medians.
# Usage: scripts/bench-redis.sh [callers] [connections] [seconds] [policy]
set -euo pipefail
cd "$(dirname "$0")/.."
callers=${1:-64}
conns=${2:-2}
secs=${3:-8}
policy=${4:-gcra:rate=100/s,burst=10}
keys=10000
command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server redis-tools >/dev/null; }
cargo build --release -q -p tollgate-server
bin=target/release/tollgate
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 & redis_pid=$!
trap 'kill $redis_pid 2>/dev/null || true' EXIT
sleep 0.5
# Load the script (the SHA1 is what tollgate's EVALSHA uses).
"$bin" bench redis --redis-url "redis://127.0.0.1:$port/" --policy "$policy" --duration 1s --concurrency 1 --connections 1 >/dev/null 2>&1
call=$("$bin" bench redis-call --policy "$policy")
depth=$(( callers / conns ))
field() { echo "$1" | sed -E "s#.*$2: ([0-9.]+).*#\1#"; }
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
t_rps=(); r_rps=(); t_p99=()
for round in 1 2 3; do
  t=$("$bin" bench redis --redis-url "redis://127.0.0.1:$port/" --policy "$policy" \
      --concurrency "$callers" --connections "$conns" --keys "$keys" --duration "${secs}s" 2>/dev/null | tail -1)
  t_rps+=("$(field "$t" 'checks/s')"); t_p99+=("$(field "$t" 'p99_us')")
  # As many calls as tollgate made in the same time, roughly: redis-benchmark runs a count.
  n=$(python3 -c "print(int(float('${t_rps[-1]}') * $secs))")
  r=$(eval "redis-benchmark -p $port -c $conns -P $depth -r $keys -n $n -q --csv $call" | tail -1)
  rps=$(echo "$r" | awk -F'","' '{print $2}' | tr -d '"')
  r_rps+=("$rps")
  echo "round $round: tollgate [$t] | redis-benchmark EVALSHA [$r]" >&2
done
tm=$(median "${t_rps[@]}"); rm=$(median "${r_rps[@]}"); tp=$(median "${t_p99[@]}")
echo "redis-benchmark (same script, -c $conns -P $depth): $rm calls/s"
echo "tollgate bench redis ($callers callers, $conns connections): $tm checks/s, p99 ${tp}us"
python3 -c "print('ratio tollgate / ceiling: %.2f' % ($tm / $rm))"
