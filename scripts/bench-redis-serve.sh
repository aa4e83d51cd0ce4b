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
# - tollgate twice on that Redis, which has loaded the tollgate module: one `serve`
#   deciding with the Functions library (`calls: functions`), one with the module
#   (`calls: module`), each with keys of its own;
# - all alternate, ROUNDS times; medians, and the ratios tollgate / anchor.
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
cargo build --release -q -p tollgate-server -p tollgate-redis-module
bin=$PWD/target/release/tollgate
module=$PWD/target/release/libtollgate_redis_module.so
dir=$(mktemp -d)
port=$(free_port)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$dir"' EXIT
(cd "$dir" && exec taskset -c 0 redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --loadmodule "$module" >/dev/null 2>&1) &
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
declare -A grpc
for calls in functions module; do
    grpc[$calls]=$(free_port)
    printf '%s\n' "listen: {http: 127.0.0.1:0, grpc: 127.0.0.1:${grpc[$calls]}}" \
        "rules: [$dir/rules.yaml]" \
        "store: {kind: redis, url: \"redis://127.0.0.1:$port/\", calls: $calls, prefix: $calls}" \
        >"$dir/$calls.yaml"
    taskset -c 1 "$bin" serve --config "$dir/$calls.yaml" >"$dir/$calls.log" 2>&1 &
    pids+=($!)
    until grep -q "tollgate serve" "$dir/$calls.log"; do sleep 0.1; done
done
grep -q "decided by the tollgate module" "$dir/module.log" || { cat "$dir/module.log" >&2; exit 1; }
cpu() { redis-cli -p "$port" info cpu | awk -F: '/used_cpu_(sys|user):/{s+=$2} END{printf "%.6f", s}'; }
us_per() { echo "($2 - $1) * 1000000 / $3" | bc -l | xargs printf '%.2f'; }

# Redis CPU (us) per decision of the `serve` deciding with CALLS, for descriptor KEY.
through_serve() {
    local calls=$1 key=$2 c0 c1 n
    c0=$(cpu)
    n=$(taskset -c 1 "$bin" bench grpc --target "127.0.0.1:${grpc[$calls]}" --domain bench --key "$key" \
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
for calls in functions module; do
    through_serve "$calls" envoy >/dev/null
    through_serve "$calls" gcra >/dev/null
done
fw=() fwm=() incr=() gcra=() gcram=() script=()
for r in $(seq "$rounds"); do
    fw+=("$(through_serve functions envoy)")
    fwm+=("$(through_serve module envoy)")
    incr+=("$(anchor "$n" INCRBY "ratelimit_bench_envoy_k__rand_int___1" 1 -- EXPIRE "ratelimit_bench_envoy_k__rand_int___1" 1)")
    gcra+=("$(through_serve functions gcra)")
    gcram+=("$(through_serve module gcra)")
    script+=("$(anchor "$n" EVALSHA "$ref" 1 "gcra_ref_k__rand_int__" 1000 1000000 1 1)")
    echo "round $r: fixed window ${fw[-1]} / module ${fwm[-1]} us vs INCRBY+EXPIRE ${incr[-1]} us; gcra ${gcra[-1]} / module ${gcram[-1]} us vs script ${script[-1]} us" >&2
done
ratio() { echo "$1 / $2" | bc -l | xargs printf '%.2f'; }
m_fw=$(median "${fw[@]}") m_fwm=$(median "${fwm[@]}") m_incr=$(median "${incr[@]}")
m_gcra=$(median "${gcra[@]}") m_gcram=$(median "${gcram[@]}") m_script=$(median "${script[@]}")
echo "| rule | anchor, same Redis | through serve, Functions | ratio | through serve, module | ratio |"
echo "|---|---|---|---|---|---|"
echo "| Envoy rule \`unit: second\` | envoyproxy/ratelimit's INCRBY + EXPIRE: $m_incr us | $m_fw us | $(ratio "$m_fw" "$m_incr") | $m_fwm us | $(ratio "$m_fwm" "$m_incr") |"
echo "| \`gcra:\` policy | minimal GCRA script (EVALSHA): $m_script us | $m_gcra us | $(ratio "$m_gcra" "$m_script") | $m_gcram us | $(ratio "$m_gcram" "$m_script") |"
echo "(Redis CPU per decision; medians of $rounds alternating rounds; $secs s of serve per round, $n commands per anchor run)"
