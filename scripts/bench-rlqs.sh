#!/usr/bin/env bash
# Measures Envoy's rate limit quota service (RLQS) against the per-request rate limit
# service (RLS) on one `tollgate serve`, side by side in one run: the same budget of
# BUDGET requests/s (default 50,000), asked by a fleet that wants twice that.
#   RLQS: `tollgate bench rlqs`, ENVOYS simulated Envoys (streams) each offering
#         2*BUDGET/ENVOYS requests/s on one quota bucket, reporting every second and
#         admitting by their assignments (no call per request).
#   RLS:  `tollgate bench grpc`, ENVOYS concurrent callers of ShouldRateLimit as fast
#         as they can (one call per request) on a rule of BUDGET per second (its
#         calls/s, at most BUDGET, count as admitted).
# Reported per mode: requests admitted per second and serve's CPU time (user + system,
# from /proc/PID/stat) per admitted request; 3 alternating rounds, medians.
# With `redis` as the first argument, serve keeps its counters and quota buckets in a
# redis-server started here (its CPU is reported too).
# With `scale` as the first argument instead: one serve, STREAMS streams each
# reporting on BUCKETS buckets every second (each bucket offered 10 requests/s per
# stream); serve's CPU share and resident memory, per stream and per bucket report,
# for STREAMS in 100 1000 4000 (override with STREAMS="..."), BUCKETS=10; with
# REDIS=1, the buckets are kept in a redis-server started here (its CPU reported too).
# Usage: scripts/bench-rlqs.sh [memory|redis|scale] [seconds] [envoys]
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-memory}
secs=${2:-10}
envoys=${3:-50}
cargo build --release -q -p tollgate-server
bin=${CARGO_TARGET_DIR:-target}/release/tollgate
. scripts/lib/bench.sh
# CPU seconds (user + system) of PID so far.
cpu() { awk '{ printf "%.2f", ($14 + $15) / 100 }' "/proc/$1/stat"; }
rss_kib() { awk '/VmRSS/ { print $2 }' "/proc/$1/status"; }
field() { echo "$1" | sed -E "s#.*$2: ([0-9.]+).*#\1#"; }
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
dir=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$dir"' EXIT
budget=${BUDGET:-50000}
cat > "$dir/rules.yaml" <<YAML
domain: envoy
descriptors:
  - key: name
    rate_limit: { unit: second, requests_per_unit: $budget }
quota_buckets:
  - bucket: { name: "*" }
    policy: "token-bucket:rate=$budget/s"
YAML
store=()
redis_pid=
if [ "$mode" = redis ] || [ "${REDIS:-}" = 1 ]; then
  need_redis
  rp=$(free_port)
  redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 & redis_pid=$!; pids+=($redis_pid)
  sleep 0.5
  store=(--store "redis://127.0.0.1:$rp/")
fi
http=$(free_port); grpc=$(free_port)
"$bin" serve --rules "$dir/rules.yaml" --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc" "${store[@]}" >/dev/null 2>&1 & serve=$!; pids+=($serve)
sleep 1

if [ "$mode" = scale ]; then
  for streams in ${STREAMS:-100 1000 4000}; do
    buckets=${BUCKETS:-10}
    rss0=$(rss_kib "$serve")
    "$bin" bench rlqs --target "127.0.0.1:$grpc" --envoys "$streams" --buckets "$buckets" \
      --rate 10 --warmup 2s --duration "${secs}s" >"$dir/out" 2>&1 & fleet=$!
    # Count serve's CPU over the fleet's steady part (after connecting and warming up).
    while ! grep -q . "$dir/out" 2>/dev/null && [ "$(awk '{print $4}' /proc/$serve/stat)" ] ; do
      conns=$(ss -Htn state established "( sport = :$grpc )" | wc -l)
      [ "$conns" -ge "$streams" ] && break
      sleep 0.2
    done
    sleep 2
    c0=$(cpu "$serve"); r0=${redis_pid:+$(cpu "$redis_pid")}
    sleep "$secs"
    c1=$(cpu "$serve"); r1=${redis_pid:+$(cpu "$redis_pid")}
    rss1=$(rss_kib "$serve")
    wait "$fleet" || true
    out=$(tail -1 "$dir/out")
    python3 - "$streams" "$buckets" "$secs" "$c0" "$c1" "$rss0" "$rss1" "$out" "${r0:-0}" "${r1:-0}" <<'PY'
import sys
streams, buckets, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
c0, c1, rss0, rss1 = map(float, sys.argv[4:8])
r0, r1 = map(float, sys.argv[9:11])
cpu = (c1 - c0) / secs
reports = streams * buckets  # bucket reports per second
redis = f", redis CPU {(r1 - r0) / secs * 100:.1f}%" if r1 > 0 else ""
print(f"streams {streams} x buckets {buckets}: serve CPU {cpu*100:.1f}% of a core{redis}, "
      f"{cpu/reports*1e6:.1f} us per bucket report, {cpu/streams*1e6:.0f} us/s per stream; "
      f"RSS {rss1/1024:.1f} MiB (+{(rss1-rss0)/streams:.1f} KiB per stream); fleet: {sys.argv[8]}")
PY
    sleep 3
  done
  exit 0
fi

q_rate=(); q_cpu=(); r_rate=(); r_cpu=(); q_rcpu=(); r_rcpu=()
for round in 1 2 3; do
  c0=$(cpu "$serve"); rc0=${redis_pid:+$(cpu "$redis_pid")}
  q=$("$bin" bench rlqs --target "127.0.0.1:$grpc" --envoys "$envoys" --rate $((2 * budget / envoys)) \
      --warmup 2s --duration "${secs}s" 2>/dev/null | tail -1)
  c1=$(cpu "$serve"); rc1=${redis_pid:+$(cpu "$redis_pid")}
  r=$("$bin" bench grpc --target "127.0.0.1:$grpc" --concurrency "$envoys" --keys 1 \
      --domain envoy --key name --duration "${secs}s" 2>/dev/null | tail -1)
  c2=$(cpu "$serve"); rc2=${redis_pid:+$(cpu "$redis_pid")}
  qa=$(field "$q" 'admitted/s')
  # Every call of the RLS run is admitted while it stays under 50,000/s.
  ra=$(python3 -c "print(min(float('$(field "$r" 'req/s')'), $budget))")
  q_rate+=("$qa"); r_rate+=("$ra")
  q_cpu+=("$(python3 -c "print(round(($c1 - $c0) * 1e6 / ($qa * $secs), 3))")")
  r_cpu+=("$(python3 -c "print(round(($c2 - $c1) * 1e6 / ($ra * $secs), 3))")")
  if [ -n "$redis_pid" ]; then
    q_rcpu+=("$(python3 -c "print(round(($rc1 - $rc0) * 1e6 / ($qa * $secs), 3))")")
    r_rcpu+=("$(python3 -c "print(round(($rc2 - $rc1) * 1e6 / ($ra * $secs), 3))")")
  fi
  echo "round $round: rlqs [$q] serve CPU $(python3 -c "print(round($c1 - $c0, 2))") s | rls [$r] serve CPU $(python3 -c "print(round($c2 - $c1, 2))") s" >&2
done
qa=$(median "${q_rate[@]}"); ra=$(median "${r_rate[@]}")
qc=$(median "${q_cpu[@]}"); rc=$(median "${r_cpu[@]}")
echo "store $mode, $envoys Envoys, budget $budget/s, demand $((2 * budget))/s, ${secs}s rounds (medians of 3):"
echo "  RLQS: admitted/s $qa, serve CPU per admitted request ${qc} us${redis_pid:+, redis CPU $(median "${q_rcpu[@]}") us}"
echo "  RLS:  admitted/s $ra, serve CPU per admitted request ${rc} us${redis_pid:+, redis CPU $(median "${r_rcpu[@]}") us}"
python3 -c "print(f'  RLQS / RLS: admitted {float($qa)/float($ra):.2f}x, serve CPU per admitted request {float($qc)/float($rc):.4f}x')"
