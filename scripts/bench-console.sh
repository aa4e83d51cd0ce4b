#!/usr/bin/env bash
# What open consoles cost the decisions, side by side in one run: `tollgate serve`
# (this build, release) with the console on, answering `tollgate bench grpc` with no
# console open and with ten open (ten event streams, as ten browser tabs hold:
# four on the overview, three on the rules, three on the keys, whose tables read the
# top-k every second); and, for the console's own cost, the same build with the
# console off. Each server has one worker on CPU 0, held to QUOTA % of one CPU (a
# CFS quota, so that the server is the bottleneck); the load and the consoles run on
# CPU 1. Rounds alternate; prints each, then the medians and the ratios.
#
# ON_ARGS replaces the second server's `--console` (ON_ARGS= runs two alike: a control).
#
# Usage: [QUOTA=40] [ON_ARGS=...] scripts/bench-console.sh [seconds] [rounds] [concurrency]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench.sh
secs=${1:-5}
rounds=${2:-5}
conc=${3:-32}
quota=${QUOTA:-40}
cargo build --release -q -p tollgate-server
bin=$PWD/target/release/tollgate
declare -A http grpc pid
for form in off on; do
    http[$form]=$(free_port)
    grpc[$form]=$(free_port)
done
taskset -c 0 "$bin" serve --http "127.0.0.1:${http[off]}" --grpc "127.0.0.1:${grpc[off]}" \
    --workers 1 >/dev/null 2>&1 &
pid[off]=$!
taskset -c 0 "$bin" serve --http "127.0.0.1:${http[on]}" --grpc "127.0.0.1:${grpc[on]}" \
    --workers 1 ${ON_ARGS---console} >/dev/null 2>&1 &
pid[on]=$!
groups=()
viewers=()
stop_viewers() {
    [ ${#viewers[@]} -gt 0 ] && kill "${viewers[@]}" 2>/dev/null || true
    viewers=()
}
trap 'stop_viewers; kill "${pid[off]}" "${pid[on]}" 2>/dev/null || true; wait 2>/dev/null || true; cpu_quota_remove "${groups[@]}"' EXIT
sleep 1
hold_to_quota "tollgate-console-$$" "$quota" "${pid[off]}" "${pid[on]}"
rate() { # target
    taskset -c 1 "$bin" bench grpc --target "$1" --concurrency "$conc" --duration "${secs}s" \
        2>/dev/null | tail -1 | sed -E 's#.*req/s: ([0-9.]+).*#\1#'
}
open_consoles() {
    local page
    for page in overview overview overview overview rules rules rules keys keys keys; do
        taskset -c 1 curl -sN "http://127.0.0.1:${http[on]}/console/events?page=$page" >/dev/null &
        viewers+=($!)
    done
    sleep 1
}
declare -A r
for round in $(seq "$rounds"); do
    r[off]+="$(rate "127.0.0.1:${grpc[off]}") "
    r[none]+="$(rate "127.0.0.1:${grpc[on]}") "
    open_consoles
    r[ten]+="$(rate "127.0.0.1:${grpc[on]}") "
    stop_viewers
    echo "round $round: console off $(echo ${r[off]} | awk '{print $NF}'), on with none open $(echo ${r[none]} | awk '{print $NF}'), with ten open $(echo ${r[ten]} | awk '{print $NF}') decisions/s" >&2
done
off=$(median ${r[off]}); none=$(median ${r[none]}); ten=$(median ${r[ten]})
echo "$("$bin" --version); gRPC ShouldRateLimit, concurrency $conc, ${secs}s runs, medians of $rounds rounds, servers $held"
echo "decisions/s: console off $off, on with none open $none, with ten open $ten"
echo "ten open / none open: $(python3 -c "print(round($ten/$none, 3))"); console on (none open) / off: $(python3 -c "print(round($none/$off, 3))")"
