#!/usr/bin/env bash
# What one decision through `tollgate serve` costs Redis, next to what the services
# tollgate replaces send to the same Redis for the same rule:
#
# - redis-server pinned to core 0, `tollgate serve --store redis://...` to core 1;
#   Envoy's gRPC `ShouldRateLimit` from `tollgate bench grpc` (64 callers, 100k keys,
#   one descriptor a call, also on core 1); Redis's own CPU (`INFO cpu`, user + sys)
#   over the run divided by the decisions;
# - beside it, on the same Redis, the anchors by redis-benchmark (-c 50 -P 16, 100k
#   keys): envoyproxy/ratelimit's two commands for one descriptor of a `unit: second`
#   rule (`INCRBY key 1`, then `EXPIRE key 1`; both runs' CPU over one run's count),
#   and a minimal GCRA script in the shape of go-redis/redis_rate's
#   (scripts/lua/gcra-reference.lua: TIME, GET, arithmetic, SET PX) by EVALSHA;
# - the four alternate, ROUNDS times; medians, and the ratios tollgate / anchor.
#
# Both rules are generous (every decision admits and writes, as INCRBY always does).
# Usage: scripts/bench-redis-serve.sh [seconds] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
rounds=${2:-3}
keys=100000
. scripts/lib/bench.sh
need_redis
cargo build --release -q -p tollgate-server
bin=$PWD/target/release/tollgate
dir=$(mktemp -d)
port=$(free_port)
grpc=$(free_port)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$dir"' EXIT
(cd "$dir" && exec taskset -c 0 redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1) &
pids+=($!)
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
cat >"$dir/rules.yaml" <<'EOF'
domain: bench
descriptors:
  - key: envoy
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: gcra
    policies: ["gcra:rate=1000000/s,burst=1000"]
EOF
taskset -c 1 "$bin" serve --rules "$dir/rules.yaml" --store "redis://127.0.0.1:$port/" \
    --http 127.0.0.1:0 --grpc "127.0.0.1:$grpc" >"$dir/serve.log" 2>&1 &
pids+=($!)
until grep -q "tollgate serve" "$dir/serve.log"; do sleep 0.1; done
cpu() { redis-cli -p "$port" info cpu | awk -F: '/used_cpu_(sys|user):/{s+=$2} END{printf "%.6f", s}'; }
us_per() { echo "($2 - $1) * 1000000 / $3" | bc -l | xargs printf '%.2f'; }

# Redis CPU (us) per decision of `serve` deciding descriptor KEY.
through_serve() {
    local key=$1 c0 c1 n
    c0=$(cpu)
    n=$(taskset -c 1 "$bin" bench grpc --target "127.0.0.1:$grpc" --domain bench --key "$key" \
        --keys "$keys" --concurrency 64 --duration "${secs}s" 2>&1 | awk '/requests in/{print $1}')
    c1=$(cpu)
    us_per "$c0" "$c1" "$n"
}

# Redis CPU (us) per run of redis-benchmark's command(s), N each.
anchor() { # n command... [-- command...]
    local n=$1 c0 c1 cmd=()
    shift
    c0=$(cpu)
    for word in "$@" --; do
        if [ "$word" = -- ]; then
            redis-benchmark -p "$port" -c 50 -P 16 -r "$keys" -n "$n" -q "${cmd[@]}" >/dev/null 2>&1
            cmd=()
        else
            cmd+=("$word")
        fi
    done
    c1=$(cpu)
    us_per "$c0" "$c1" "$n"
}

ref=$(redis-cli -p "$port" script load "$(cat scripts/lua/gcra-reference.lua)")
n=$((secs * 60000))
# Warm: the decision code loaded, the keys made.
through_serve envoy >/dev/null
through_serve gcra >/dev/null
fw=() incr=() gcra=() script=()
for r in $(seq "$rounds"); do
    fw+=("$(through_serve envoy)")
    incr+=("$(anchor "$n" INCRBY "ratelimit_bench_envoy_k__rand_int___1" 1 -- EXPIRE "ratelimit_bench_envoy_k__rand_int___1" 1)")
    gcra+=("$(through_serve gcra)")
    script+=("$(anchor "$n" EVALSHA "$ref" 1 "gcra_ref_k__rand_int__" 1000 1000000 1 1)")
    echo "round $r: fixed window ${fw[-1]} us vs INCRBY+EXPIRE ${incr[-1]} us; gcra ${gcra[-1]} us vs script ${script[-1]} us" >&2
done
ratio() { echo "$1 / $2" | bc -l | xargs printf '%.2f'; }
m_fw=$(median "${fw[@]}") m_incr=$(median "${incr[@]}") m_gcra=$(median "${gcra[@]}") m_script=$(median "${script[@]}")
echo "| rule | tollgate through serve (Redis CPU/decision) | anchor, same Redis | ratio |"
echo "|---|---|---|---|"
echo "| Envoy rule \`unit: second\` | $m_fw us | envoyproxy/ratelimit's INCRBY + EXPIRE: $m_incr us | $(ratio "$m_fw" "$m_incr") |"
echo "| \`gcra:\` policy | $m_gcra us | minimal GCRA script (EVALSHA): $m_script us | $(ratio "$m_gcra" "$m_script") |"
echo "(medians of $rounds alternating rounds; $secs s of serve per round, $n commands per anchor run)"
