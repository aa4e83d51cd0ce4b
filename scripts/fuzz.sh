#!/usr/bin/env bash
# Runs every cargo fuzz target (fuzz/fuzz_targets/) for SECONDS each (default 600),
# JOBS at a time (default 1), on the nightly toolchain, growing the committed corpora
# in fuzz/corpus/. Not part of scripts/test.sh. Prints, per target, executions,
# executions per second and coverage (libFuzzer's cov/ft counters); a crash stops with
# the reproducer's path (fuzz/artifacts/TARGET/).
#
#   scripts/fuzz.sh [SECONDS] [JOBS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
jobs="${2:-1}"
shift $(( $# > 2 ? 2 : $# ))
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
cargo +nightly fuzz build >/dev/null
mkdir -p target/fuzz-logs
run() {
    local t=$1 log="target/fuzz-logs/$1.log"
    mkdir -p "fuzz/corpus/$t"
    if cargo +nightly fuzz run "$t" "fuzz/corpus/$t" -- -max_total_time="$seconds" \
        -print_final_stats=1 -rss_limit_mb=4096 -timeout=10 >"$log" 2>&1; then
        local execs cov ft corp
        execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
        read -r cov ft corp < <(grep -E '^#[0-9]+.*(DONE|pulse)' "$log" | tail -1 |
            sed -E 's/.*cov: ([0-9]+) ft: ([0-9]+) corp: ([0-9]+).*/\1 \2 \3/')
        printf '%-12s %6ss  %12s execs  %8s execs/s  cov %s  ft %s  corpus %s  ok\n' \
            "$t" "$seconds" "$execs" "$(( execs / seconds ))" "$cov" "$ft" "$corp"
    else
        printf '%-12s FAILED: see %s\n' "$t" "$log"
        grep -E 'panicked|ERROR|artifact' "$log" | head -5
        return 1
    fi
}
status=0
pids=()
for t in "${targets[@]}"; do
    run "$t" & pids+=($!)
    if [ ${#pids[@]} -ge "$jobs" ]; then wait "${pids[0]}" || status=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
