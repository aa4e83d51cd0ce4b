#!/usr/bin/env bash
# What one decision through `tollgate serve` costs Redis, next to what the services
# tollgate replaces send to the same Redis for the same rule:
#
# - redis-server pinned to core 0, `tollgate serve --store redis://...` to core 1;
#   Envoy's gRPC `ShouldRateLimit` from `tollgate bench grpc` (64 callers, 100k keys,
#   one descriptor a call, also on core 1); Redis's own CPU (`INFO cpu`, user + sys)
#   over the run divided by the decisions;
# - beside it, on the same Redis, the anchors: envoyproxy/ratelimit's two commands for
#   one descriptor of a `unit: second` rule, keyed as it keys them (`INCRBY
#   <domain>_<key>_<value>_<second> 1` and `EXPIRE` of it by 1 s: new keys every
#   second, the old ones expiring) by `tollgate bench ratelimit-redis` (50
#   connections, 8 requests a write, the anchor in its favour) and as envoyproxy/ratelimit
#   sends them at its defaults (no implicit pipelining: one write a request, its pool
#   of 10 connections); the same two commands on keys that never change
#   by redis-benchmark (-c 50 -P 16, 100k keys; both runs' CPU over one run's count:
#   no key is ever made or expired, so cheaper than envoyproxy/ratelimit's real
#   traffic); and a minimal GCRA script in the shape of go-redis/redis_rate's
#   (scripts/lua/gcra-reference.lua: TIME, GET, arithmetic, SET PX) by EVALSHA;
# - tollgate four times on that Redis, which has loaded the tollgate module: `serve`
#   as it comes (`counters`: the Envoy rule kept as window counters, plain `INCRBY` and
#   `PEXPIRE`, every check queued for the next batched call), the same with lone
#   checks sent at once as calls of their own (`direct_calls: 8`, the library's
#   default), then with the Envoy rule kept by the decision code: one `serve` deciding
#   with the Functions library (`calls: functions`) and one with the module (`calls:
#   module`); each with keys of its own; beside Redis's CPU, the callers' p50 and p99;
# - envoyproxy/ratelimit's traffic again, both ways, paced at the rate each
#   window-counter serve just decided at (a Redis that idles between writes pays for
#   waking up, which a saturated one does not: the like-for-like anchor for a serve on
#   one core);
# - Redis saturated from the library, no service in between: `tollgate bench redis
#   --count` (Envoy's counting, 256 callers, 100k keys) with window counters, with
#   Functions and with the module, beside envoyproxy/ratelimit's traffic at full speed;
#   then a `unit: minute` rule over 1,000 keys (each key counted many times in its
#   window: a window counter sends its PEXPIRE once a window, envoyproxy/ratelimit
#   its EXPIRE every time), window counters beside envoyproxy/ratelimit's traffic;
# - all alternate, ROUNDS times; medians, and the ratios tollgate / anchor.
#
# Both rules are generous (every decision admits and writes, as INCRBY always does).
#
# With ALGORITHMS=all, then the sizing table: every algorithm the service decides
# (a generous policy of each, 100k keys), through a `serve` deciding with Functions
# batched (the default), one with Functions one check per call (`batch: 1`) and one
# with the module; Redis CPU per decision, medians of the same rounds, and what one
# Redis core decides a second at that cost (docs/redis.md, "Sizing Redis").
# Usage: [ALGORITHMS=all] scripts/bench-redis-serve.sh [seconds] [rounds]
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
# The sizing table's rules: descriptor key and policy (generous: every decision admits).
algos=(envoy gcra token_bucket leaky_bucket fixed_window sliding_window weighted_window
    sliding_log smooth_bursty smooth_warmup limit_req)
declare -A spec=(
    [envoy]="Envoy rule, unit: second" [gcra]="gcra:rate=1000000/s,burst=1000"
    [token_bucket]="token-bucket:rate=1000000/s,capacity=1000"
    [leaky_bucket]="leaky-bucket:rate=1000000/s,capacity=1000"
    [fixed_window]="fixed-window:limit=1000000,window=1s"
    [sliding_window]="sliding-window:limit=1000000,window=1s,buckets=10"
    [weighted_window]="sliding-window:limit=1000000,window=1s"
    [sliding_log]="sliding-log:limit=1000000,window=1s"
    [smooth_bursty]="smooth-bursty:rate=1000000/s"
    [smooth_warmup]="smooth-warmup:rate=1000000/s,warmup=1s"
    [limit_req]="limit-req:rate=1000000/s,burst=1000,nodelay"
)
for key in "${algos[@]:2}"; do
    printf '  - {key: %s, policies: ["%s"]}\n' "$key" "${spec[$key]}" >>"$dir/rules.yaml"
done
declare -A grpc
# `counters`: serve as it comes (the Envoy rule kept as window counters, plain INCRBY
# and PEXPIRE; gcra by Functions); the others keep the Envoy rule by the decision code.
declare -A store=(
    [counters]="calls: functions"
    [counters_direct]="calls: functions, direct_calls: 8"
    [functions]="calls: functions, window_counters: false"
    [module]="calls: module, window_counters: false"
    [single]="calls: functions, batch: 1, window_counters: false"
)
modes=(counters counters_direct functions module)
[ "${ALGORITHMS:-}" = all ] && modes+=(single)
for calls in "${modes[@]}"; do
    grpc[$calls]=$(free_port)
    printf '%s\n' "listen: {http: 127.0.0.1:0, grpc: 127.0.0.1:${grpc[$calls]}}" \
        "rules: [$dir/rules.yaml]" \
        "store: {kind: redis, url: \"redis://127.0.0.1:$port/\", ${store[$calls]}, prefix: $calls}" \
        >"$dir/$calls.yaml"
    taskset -c 1 "$bin" serve --config "$dir/$calls.yaml" >"$dir/$calls.log" 2>&1 &
    pids+=($!)
    until grep -qs "tollgate serve" "$dir/$calls.log"; do sleep 0.1; done
done
grep -q "decided by the tollgate module" "$dir/module.log" || { cat "$dir/module.log" >&2; exit 1; }
cpu() { redis-cli -p "$port" info cpu | awk -F: '/used_cpu_(sys|user):/{s+=$2} END{printf "%.6f", s}'; }
us_per() { echo "($2 - $1) * 1000000 / $3" | bc -l | xargs printf '%.2f'; }

# The p50 and p99 (us) of a load generator's answer OUT, appended to FILE.
keep_latency() { # out file
    awk '/p50_us:/{for (i = 1; i < NF; i++) if ($i ~ /^p(50|99)_us:$/) printf "%s ", $(i + 1); print ""}' \
        <<<"$1" >>"$2"
}

# Redis CPU (us) per decision of the `serve` deciding with CALLS, for descriptor KEY;
# the callers' p50 and p99 (us) appended to $dir/latency.CALLS.KEY.
through_serve() {
    local calls=$1 key=$2 c0 c1 out
    c0=$(cpu)
    out=$(taskset -c 1 "$bin" bench grpc --target "127.0.0.1:${grpc[$calls]}" --domain bench --key "$key" \
        --keys "$keys" --concurrency 64 --duration "${secs}s" 2>&1)
    c1=$(cpu)
    keep_latency "$out" "$dir/latency.$calls.$key"
    awk '/req\/s:/{print $2}' <<<"$out" >"$dir/rate"
    us_per "$c0" "$c1" "$(awk '/requests in/{print $1}' <<<"$out")"
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

# Redis CPU (us) per request of envoyproxy/ratelimit's traffic as it really keys it:
# INCRBY + EXPIRE on a key naming its second (new keys every second, the old ones
# expiring), 50 connections, 8 requests (16 commands) per write unless the flags say
# otherwise.
anchor_windows() { # [requests a second] [flags...]
    local c0 c1 out rate=${1:-}
    shift || true
    c0=$(cpu)
    out=$(taskset -c 1 "$bin" bench ratelimit-redis --redis-url "redis://127.0.0.1:$port/" \
        --keys "${sat_keys:-$keys}" --duration "${secs}s" ${rate:+--rate "$rate"} "$@" 2>&1)
    c1=$(cpu)
    us_per "$c0" "$c1" "$(awk '/requests\/s:/{print $4}' <<<"$out")"
}

# Redis CPU (us) per decision of `tollgate bench redis` with the flags given (256
# callers, as fast as Redis answers: Redis saturated, as the anchors are; over
# $sat_keys keys if set, else $keys); the callers' p50 and p99 (us) appended to
# $dir/latency.TAG.
saturated() { # tag flags...
    local tag=$1 c0 c1 out
    shift
    c0=$(cpu)
    out=$(taskset -c 1 "$bin" bench redis --redis-url "redis://127.0.0.1:$port/" "$@" \
        --keys "${sat_keys:-$keys}" --concurrency 256 --duration "${secs}s" 2>&1)
    c1=$(cpu)
    keep_latency "$out" "$dir/latency.$tag"
    us_per "$c0" "$c1" "$(awk '/checks\/s:/{printf "%d", $2 * '"$secs"'}' <<<"$out")"
}

ref=$(redis-cli -p "$port" script load "$(cat scripts/lua/gcra-reference.lua)")
n=$((secs * 60000))
# Warm: the decision code loaded, the keys made.
for calls in functions module; do
    through_serve "$calls" envoy >/dev/null
    through_serve "$calls" gcra >/dev/null
done
for calls in counters counters_direct; do through_serve "$calls" envoy >/dev/null; done
rm -f "$dir"/latency.*
declare -A us=()
for r in $(seq "$rounds"); do
    for key in envoy gcra; do
        for calls in functions module; do
            us[$calls.$key]+="$(through_serve "$calls" "$key") "
            if [ "$key" = gcra ] && [ "$calls" = functions ]; then
                # The minimal GCRA script at the rate this serve decided at.
                us[paced_functions.gcra]+="$(anchor_windows "$(cat "$dir/rate")" --gcra-sha "$ref") "
            fi
        done
        if [ "$key" = envoy ]; then
            for calls in counters counters_direct; do
                us[$calls.envoy]+="$(through_serve "$calls" envoy) "
                # envoyproxy/ratelimit's traffic at the rate this serve decided at:
                # pipelined 8 requests a write, and as it sends it by default.
                us[paced_$calls.envoy]+="$(anchor_windows "$(cat "$dir/rate")") "
                us[shipped_$calls.envoy]+="$(anchor_windows "$(cat "$dir/rate")" --pipeline 1 --connections 10) "
            done
        fi
    done
    us[anchor.envoy]+="$(anchor "$n" INCRBY "ratelimit_bench_envoy_k__rand_int___1" 1 -- EXPIRE "ratelimit_bench_envoy_k__rand_int___1" 1) "
    us[windows.envoy]+="$(anchor_windows) "
    # Envoy's counting on a `unit: second` rule, and GCRA tries.
    envoy=(--count --policy "fixed-window:limit=1000000,window=1s,debt=forgive")
    us[lib_counters.envoy]+="$(saturated lib.counters "${envoy[@]}" --window-counters) "
    us[lib_functions.envoy]+="$(saturated lib.functions "${envoy[@]}" --calls functions) "
    us[lib_module.envoy]+="$(saturated lib.module "${envoy[@]}" --calls module) "
    # Hot keys: a `unit: minute` rule over 1,000 keys.
    minute=(--count --policy "fixed-window:limit=1000000000,window=1m,debt=forgive" --window-counters)
    us[lib_counters.minute]+="$(sat_keys=1000 saturated lib.minute "${minute[@]}") "
    us[windows.minute]+="$(sat_keys=1000 anchor_windows "" --unit 60) "
    for calls in functions module; do
        us[lib_$calls.gcra]+="$(saturated "libgcra.$calls" --policy "${spec[gcra]}" --calls "$calls") "
    done
    us[anchor.gcra]+="$(anchor "$n" EVALSHA "$ref" 1 "gcra_ref_k__rand_int__" 1000 1000000 1 1) "
    echo "round $r: $(for k in "${!us[@]}"; do printf '%s %s; ' "$k" "$(awk '{print $NF}' <<<"${us[$k]}")"; done)" >&2
done
ratio() { echo "$1 / $2" | bc -l | xargs printf '%.2f'; }
# The median of column COL (1: p50, 2: p99) of a latency file, in ms.
ms() { median $(cut -d' ' -f"$2" "$1") | awk '{printf "%.2f", $1 / 1000}'; }
label() {
    case $1 in
    counters) echo "serve as it comes (window counters: INCRBY + PEXPIRE)" ;;
    counters_direct) echo "the same, lone checks sent at once (direct_calls: 8)" ;;
    functions) echo "Functions (calls: functions, window_counters: false)" ;;
    module) echo "the module (calls: module)" ;;
    esac
}
row() { # title key calls anchor...
    local m a
    m=$(median ${us[$3.$2]})
    printf '| %s | %s | %s us |' "$1" "$(label "$3")" "$m"
    for a in "${@:4}"; do printf ' %s |' "$(ratio "$m" "$(median ${us[$a.$2]})")"; done
    printf ' %s / %s ms |\n' "$(ms "$dir/latency.$3.$2" 1)" "$(ms "$dir/latency.$3.$2" 2)"
}
windows=$(median ${us[windows.envoy]})
echo "Anchors: envoyproxy/ratelimit's INCRBY + EXPIRE keyed as it keys them (a key per second), Redis saturated: $windows us;"
echo "at the rate serve decided at: $(median ${us[paced_counters.envoy]}) us (beside direct_calls: 8: $(median ${us[paced_counters_direct.envoy]}) us);"
echo "as envoyproxy/ratelimit sends them by default (one write a request, 10 connections), at that rate: $(median ${us[shipped_counters.envoy]}) us;"
echo "on keys that never change (redis-benchmark -P 16): $(median ${us[anchor.envoy]}) us; minimal GCRA script: $(median ${us[anchor.gcra]}) us"
echo
echo "Redis saturated, \`tollgate bench redis --count\` (256 callers, 100k keys) beside envoyproxy/ratelimit's traffic:"
echo
echo "| rule | how tollgate calls Redis | Redis CPU per decision | vs ratelimit, saturated | p50 / p99 |"
echo "|---|---|---|---|---|"
for mode in counters functions module; do
    m=$(median ${us[lib_$mode.envoy]})
    case $mode in
    counters) l="window counters (INCRBY + PEXPIRE)" ;;
    functions) l="Functions (window counters off)" ;;
    module) l="the module (window counters off)" ;;
    esac
    printf '| Envoy rule `unit: second` | %s | %s us | %s | %s / %s ms |\n' "$l" "$m" "$(ratio "$m" "$windows")" \
        "$(ms "$dir/latency.lib.$mode" 1)" "$(ms "$dir/latency.lib.$mode" 2)"
done
m=$(median ${us[lib_counters.minute]})
printf '| Envoy rule `unit: minute`, 1,000 keys | window counters (PEXPIRE once a window) | %s us | %s (ratelimit: %s us) | %s / %s ms |\n' \
    "$m" "$(ratio "$m" "$(median ${us[windows.minute]})")" "$(median ${us[windows.minute]})" \
    "$(ms "$dir/latency.lib.minute" 1)" "$(ms "$dir/latency.lib.minute" 2)"
echo
echo "Through serve (64 gRPC callers on one core; Redis far from saturated):"
echo
echo "| rule | how tollgate calls Redis | Redis CPU per decision | vs ratelimit at the same rate | vs ratelimit as shipped, same rate | vs ratelimit, saturated | vs fixed keys | p50 / p99 |"
echo "|---|---|---|---|---|---|---|---|"
for calls in counters counters_direct functions module; do
    case $calls in
    counters_direct) paced=(paced_$calls shipped_$calls) ;;
    *) paced=(paced_counters shipped_counters) ;;
    esac
    row "Envoy rule \`unit: second\`" envoy "$calls" "${paced[@]}" windows anchor
done
echo
echo "GCRA through serve (the minimal script at the rate serve decided at: $(median ${us[paced_functions.gcra]}) us):"
echo
echo "| rule | how tollgate calls Redis | Redis CPU per decision | vs minimal GCRA script at the same rate | vs minimal GCRA script, saturated | p50 / p99 |"
echo "|---|---|---|---|---|---|"
for calls in functions module; do
    row "\`gcra:\` policy" gcra "$calls" paced_functions anchor
done
echo
echo "GCRA with Redis saturated, \`tollgate bench redis\` (256 callers, 100k keys, tries):"
echo
echo "| rule | how tollgate calls Redis | Redis CPU per decision | vs minimal GCRA script, saturated | p50 / p99 |"
echo "|---|---|---|---|---|"
for mode in functions module; do
    m=$(median ${us[lib_$mode.gcra]})
    printf '| `gcra:` policy | %s | %s us | %s | %s / %s ms |\n' "$mode" "$m" "$(ratio "$m" "$(median ${us[anchor.gcra]})")" \
        "$(ms "$dir/latency.libgcra.$mode" 1)" "$(ms "$dir/latency.libgcra.$mode" 2)"
done
echo "(Redis CPU per decision through serve; medians of $rounds alternating rounds; $secs s of serve per round, $n commands per anchor run; p50 / p99 of the 64 gRPC callers)"

[ "${ALGORITHMS:-}" = all ] || exit 0
for key in "${algos[@]}"; do
    for calls in functions single module; do through_serve "$calls" "$key" >/dev/null; done
done
declare -A all=()
for r in $(seq "$rounds"); do
    for key in "${algos[@]}"; do
        for calls in functions single module; do
            all[$calls.$key]+="$(through_serve "$calls" "$key") "
        done
    done
    echo "sizing round $r done" >&2
done
# Decisions a second one Redis core gives at US microseconds of its CPU each.
per_core() { echo "1000000 / $1" | bc -l | xargs printf '%.0f'; }
echo
echo "| rule | Functions, batched | Functions, one check a call | module | decisions per Redis core (Functions batched / module) |"
echo "|---|---|---|---|---|"
for key in "${algos[@]}"; do
    f=$(median ${all[functions.$key]})
    s1=$(median ${all[single.$key]})
    m=$(median ${all[module.$key]})
    printf '| `%s` | %s us | %s us | %s us | %s / %s |\n' "${spec[$key]}" \
        "$f" "$s1" "$m" "$(per_core "$f")" "$(per_core "$m")"
done
echo "(Redis CPU per decision through serve, medians of $rounds alternating rounds of $secs s; sliding-log is decided by Functions on every path)"
