#!/usr/bin/env bash
# Measures the Redis store against its ceiling in one run, on loopback: tollgate's
# checks (`tollgate bench redis`: N callers over C pipelined connections) beside
# redis-benchmark driving the same script call (EVALSHA, same keys) with the same
# connection count and pipeline depth N/C. 3 alternating rounds; medians.
# With `cluster`: a 3-master Redis Cluster; C connections per master on both sides
# (redis-benchmark --cluster, the key's hash tag one per master), depth N/(3C).
# Usage: scripts/bench-redis.sh [callers] [connections] [seconds] [policy] [single|cluster]
set -euo pipefail
cd "$(dirname "$0")/.."
callers=${1:-64}
conns=${2:-2}
secs=${3:-8}
policy=${4:-gcra:rate=100/s,burst=10}
mode=${5:-single}
keys=10000
command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server redis-tools >/dev/null; }
cargo build --release -q -p tollgate-server
bin=target/release/tollgate
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
dir=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$dir"' EXIT
start_redis() { # port [cluster args...]
  local p=$1; shift
  (cd "$dir" && exec redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no "$@" >/dev/null 2>&1) & pids+=($!)
}
if [ "$mode" = cluster ]; then
  ports=($(free_port) $(free_port) $(free_port))
  for p in "${ports[@]}"; do start_redis "$p" --cluster-enabled yes --cluster-config-file "nodes-$p.conf"; done
  sleep 0.5
  redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") --cluster-replicas 0 --cluster-yes >/dev/null
  until redis-cli -p "${ports[0]}" cluster info | grep -q cluster_state:ok; do sleep 0.1; done
  sleep 1
  port=${ports[0]}
  url="redis+cluster://$(printf '127.0.0.1:%s,' "${ports[@]}" | sed 's/,$//')"
  depth=$(( callers / (conns * 3) )); [ "$depth" -ge 1 ] || depth=1
  bench_args="--cluster -c $(( conns * 3 ))"
else
  port=$(free_port)
  start_redis "$port"
  sleep 0.5
  url="redis://127.0.0.1:$port/"
  depth=$(( callers / conns ))
  bench_args="-c $conns"
fi
# Load the script (the SHA1 is what tollgate's EVALSHA uses).
"$bin" bench redis --redis-url "$url" --policy "$policy" --duration 1s --concurrency 1 --connections 1 >/dev/null 2>&1
call=$("$bin" bench redis-call --policy "$policy")
# In a cluster redis-benchmark routes by a "{tag}" it picks per master.
[ "$mode" = cluster ] && call=$(echo "$call" | sed -E 's/\{k__rand_int__\}/{tag}k__rand_int__/')
field() { echo "$1" | sed -E "s#.*$2: ([0-9.]+).*#\1#"; }
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
t_rps=(); r_rps=(); t_p99=()
for round in 1 2 3; do
  t=$("$bin" bench redis --redis-url "$url" --policy "$policy" \
      --concurrency "$callers" --connections "$conns" --keys "$keys" --duration "${secs}s" 2>/dev/null | tail -1)
  t_rps+=("$(field "$t" 'checks/s')"); t_p99+=("$(field "$t" 'p99_us')")
  # As many calls as tollgate made in the same time, roughly: redis-benchmark runs a count.
  n=$(python3 -c "print(int(float('${t_rps[-1]}') * $secs))")
  r=$(eval "redis-benchmark -p $port $bench_args -P $depth -r $keys -n $n -q --csv $call" | tail -1)
  rps=$(echo "$r" | awk -F'","' '{print $2}' | tr -d '"')
  r_rps+=("$rps")
  echo "round $round: tollgate [$t] | redis-benchmark EVALSHA [$r]" >&2
done
tm=$(median "${t_rps[@]}"); rm=$(median "${r_rps[@]}"); tp=$(median "${t_p99[@]}")
echo "redis-benchmark ($mode, same script, $bench_args -P $depth): $rm calls/s"
echo "tollgate bench redis ($mode, $callers callers, $conns connections): $tm checks/s, p99 ${tp}us"
python3 -c "print('ratio tollgate / ceiling: %.2f' % ($tm / $rm))"
