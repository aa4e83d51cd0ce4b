#!/usr/bin/env bash
# tollgate serve against limitador on one Envoy RLS gRPC load, side by side in one run
# (called by `scripts/bench-service.sh CONC SECS limitador`; see there for what is
# measured). Needs LIMITADOR_SRC (a limitador checkout, built here) or LIMITADOR_BIN.
# Three servers answer in turn: limitador (its gRPC server runs on one thread),
# `tollgate serve --workers 1` (the same shape: one thread serves the connections) and
# `tollgate serve` as configured by default (one worker per CPU). Rounds rotate who
# goes first.
# Usage: scripts/bench-limitador.sh [concurrency] [seconds] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
conc=${1:-32}
secs=${2:-8}
rounds=${3:-3}
keys=100000
cargo build --release -q -p tollgate-server
bin=target/release/tollgate
lim=${LIMITADOR_BIN:-}
if [ -z "$lim" ]; then
  src=${LIMITADOR_SRC:?set LIMITADOR_SRC to a limitador checkout (or LIMITADOR_BIN to a built limitador-server)}
  command -v protoc >/dev/null || { apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null; }
  [ -e /usr/lib/llvm-14/lib/libclang.so ] || ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq libclang-dev >/dev/null; }
  (cd "$src" && cargo build --release -q -p limitador-server)
  lim=$src/target/release/limitador-server
fi
. scripts/lib/bench.sh
work=$(mktemp -d)
# The same limit on both sides: per value of `user`, 10^9 a minute.
mkdir -p "$work/rules"
cat > "$work/rules/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
YAML
cat > "$work/tollgate.yaml" <<'YAML'
rules: [rules]
service:
  headers: {style: none}
YAML
cat > "$work/limits.yaml" <<'YAML'
- namespace: bench
  max_value: 1000000000
  seconds: 60
  conditions: []
  variables:
    - "descriptors[0]['user']"
YAML
declare -A ports pids
start() { # name command... (the command execs the server: $! is its PID)
  local name=$1 grpc
  shift
  grpc=$(free_port)
  "$@" "$grpc" >/dev/null 2>&1 &
  pids[$name]=$!; all_pids+=($!); ports[$name]=$grpc
}
all_pids=()
trap 'kill "${all_pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
tollgate_on() { # workers grpc_port
  exec "$bin" serve ${1:+--workers "$1"} --config "$work/tollgate.yaml" --http "127.0.0.1:$(free_port)" --grpc "127.0.0.1:$2"
}
limitador_on() { # grpc_port
  exec "$lim" --rls-ip 127.0.0.1 --rls-port "$1" --http-ip 127.0.0.1 --http-port "$(free_port)" "$work/limits.yaml" memory
}
servers=(limitador tollgate-1 tollgate)
start limitador limitador_on
start tollgate-1 tollgate_on 1
start tollgate tollgate_on ""
sleep 2
for who in "${servers[@]}"; do
  kill -0 "${pids[$who]}" || { echo "$who did not start" >&2; exit 1; }
done
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# One bench run against WHO (its CPU measured around it), optional RATE; prints
# "req/s p50_us p99_us cpu_us_per_decision errors".
measure() {
  local who=$1 rate=${2:-} before after out
  before=$(cpu "${pids[$who]}")
  out=$("$bin" bench grpc --target "127.0.0.1:${ports[$who]}" --domain bench --key user --keys "$keys" \
        --concurrency "$conc" --duration "${secs}s" ${rate:+--rate "$rate"} 2>/dev/null | tail -1)
  after=$(cpu "${pids[$who]}")
  python3 - "$out" "$before" "$after" "$ticks" "$secs" <<'PY'
import re, sys
out, before, after, ticks, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
rps = float(re.search(r"/s: ([0-9.]+)", out).group(1))
p50 = int(re.search(r"p50_us: (\d+)", out).group(1))
p99 = int(re.search(r"p99_us: (\d+)", out).group(1))
errors = int(re.search(r"errors: (\d+)", out).group(1))
cpu_us = (after - before) / ticks * 1e6
print(f"{rps:.0f} {p50} {p99} {cpu_us / max(rps * secs, 1):.2f} {errors}")
PY
}
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
col() { echo "$1" | cut -d' ' -f"$2"; }
# The servers in round R's order: the list rotated by R.
order() { local r=$1 n=${#servers[@]} i; for i in $(seq 0 $((n - 1))); do echo "${servers[$(( (i + r) % n ))]}"; done; }
declare -A R
run_rounds() { # kind [rate]
  local kind=$1 rate=${2:-} round who m
  for round in $(seq "$rounds"); do
    for who in $(order "$round"); do
      m=$(measure "$who" "$rate")
      R[$who,$kind,$round]=$m
      echo "round $round $who at ${rate:-max} req/s: req/s p50_us p99_us cpu_us/decision errors = $m" >&2
    done
  done
}
summary() { # who kind -> "rps p50 p99 cpu" medians
  local who=$1 kind=$2 rps=() p50=() p99=() c=() round m
  for round in $(seq "$rounds"); do
    m=${R[$who,$kind,$round]}
    rps+=("$(col "$m" 1)"); p50+=("$(col "$m" 2)"); p99+=("$(col "$m" 3)"); c+=("$(col "$m" 4)")
  done
  echo "$(median "${rps[@]}") $(median "${p50[@]}") $(median "${p99[@]}") $(median "${c[@]}")"
}
run_rounds max
declare -A MAX PACED
for who in "${servers[@]}"; do MAX[$who]=$(summary "$who" max); done
slowest=$(for who in "${servers[@]}"; do col "${MAX[$who]}" 1; done | sort -n | head -1)
rate=$(python3 -c "print(int($slowest / 2))")
run_rounds paced "$rate"
for who in "${servers[@]}"; do PACED[$who]=$(summary "$who" paced); done
ratio() { python3 -c "print(round(float('$1') / float('$2'), 2))"; }
echo "Envoy RLS gRPC, one key over $keys values, $conc callers, ${secs}s runs, medians of $rounds rotating rounds"
echo "                 max req/s  p50_us  p99_us  cpu_us/decision | at $rate req/s: p50_us  p99_us  cpu_us/decision"
for who in "${servers[@]}"; do
  printf '%-16s %9s  %6s  %6s  %15s | %22s  %6s  %15s\n' "$who" $(col "${MAX[$who]}" 1) $(col "${MAX[$who]}" 2) $(col "${MAX[$who]}" 3) $(col "${MAX[$who]}" 4) $(col "${PACED[$who]}" 2) $(col "${PACED[$who]}" 3) $(col "${PACED[$who]}" 4)
done
l=limitador
for who in tollgate-1 tollgate; do
  echo "$who / limitador: max req/s $(ratio "$(col "${MAX[$who]}" 1)" "$(col "${MAX[$l]}" 1)")x, CPU per decision at max $(ratio "$(col "${MAX[$who]}" 4)" "$(col "${MAX[$l]}" 4)")x, at $rate req/s: p99 $(ratio "$(col "${PACED[$who]}" 3)" "$(col "${PACED[$l]}" 3)")x, CPU per decision $(ratio "$(col "${PACED[$who]}" 4)" "$(col "${PACED[$l]}" 4)")x"
done
