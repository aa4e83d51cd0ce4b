#!/usr/bin/env bash
# This build's `tollgate serve` against another binary (BASELINE_BIN, e.g. the previous
# release), side by side in one run: both serve the built-in example on the memory
# store with one worker on CPU 0, each held to QUOTA % of one CPU (a CFS quota, so that
# the server, not its client, is the bottleneck; QUOTA=0 turns it off), and answer the
# same loads in alternating rounds on kept connections: gRPC ShouldRateLimit from
# `tollgate bench grpc` and HTTP /v1/check from `tollgate bench http`, on CPU 1.
# Extra arguments for the new build's `serve` (NEW_ARGS) and environment (NEW_ENV,
# e.g. "OTEL_TRACES_SAMPLER=always_off") let one run compare a setting against the
# baseline. Prints each round, then the medians and the new/baseline ratios.
#
# Usage: BASELINE_BIN=old/tollgate [QUOTA=40] [NEW_ARGS=...] [NEW_ENV=...] \
#        scripts/bench-baseline.sh [seconds] [rounds] [concurrency]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench.sh
secs=${1:-5}
rounds=${2:-5}
conc=${3:-32}
quota=${QUOTA:-40}
base=${BASELINE_BIN:?set BASELINE_BIN to the binary to compare against}
cargo build --release -q -p tollgate-server
new=$PWD/target/release/tollgate
declare -A http grpc pid
for form in base new; do
    http[$form]=$(free_port)
    grpc[$form]=$(free_port)
done
# shellcheck disable=SC2086
taskset -c 0 "$base" serve --http "127.0.0.1:${http[base]}" --grpc "127.0.0.1:${grpc[base]}" \
    --workers 1 >/dev/null 2>&1 &
pid[base]=$!
# shellcheck disable=SC2086
env ${NEW_ENV:-} taskset -c 0 "$new" serve --http "127.0.0.1:${http[new]}" \
    --grpc "127.0.0.1:${grpc[new]}" --workers 1 ${NEW_ARGS:-} >/dev/null 2>&1 &
pid[new]=$!
groups=()
trap 'kill "${pid[base]}" "${pid[new]}" 2>/dev/null || true; wait 2>/dev/null || true; cpu_quota_remove "${groups[@]}"' EXIT
sleep 1
hold_to_quota "tollgate-baseline-$$" "$quota" "${pid[base]}" "${pid[new]}"
rate() { # kind target
    taskset -c 1 "$new" bench "$1" --target "$2" --concurrency "$conc" --duration "${secs}s" \
        2>/dev/null | tail -1 | sed -E 's#.*req/s: ([0-9.]+).*#\1#'
}
declare -A g h
for round in $(seq "$rounds"); do
    for form in base new; do
        gr=$(rate grpc "127.0.0.1:${grpc[$form]}")
        hr=$(rate http "127.0.0.1:${http[$form]}")
        g[$form]+="$gr "
        h[$form]+="$hr "
        echo "round $round $form: gRPC $gr decisions/s, HTTP $hr" >&2
    done
done
echo "baseline $("$base" --version), new $("$new" --version); concurrency $conc, ${secs}s runs, medians of $rounds rounds, servers $held"
for what in g h; do
    declare -n m=$what
    b=$(median ${m[base]}); n=$(median ${m[new]})
    label="gRPC ShouldRateLimit decisions/s"
    [ "$what" = h ] && label="HTTP /v1/check decisions/s"
    echo "$label: baseline $b, new $n, new/baseline $(python3 -c "print(round($n/$b, 3))")"
done
