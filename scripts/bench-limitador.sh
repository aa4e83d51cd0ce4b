#!/usr/bin/env bash
# tollgate serve against limitador on one Envoy RLS gRPC load, side by side in one run
# (called by `scripts/bench-service.sh CONC SECS limitador`; see there for what is
# measured). Needs LIMITADOR_SRC (a limitador checkout, built here) or LIMITADOR_BIN.
# SERVE_WORKERS=N runs serve with --workers N (default: one per CPU; limitador serves
# gRPC on one thread).
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
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
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
t_grpc=$(port); t_http=$(port); l_grpc=$(port); l_http=$(port)
"$bin" serve ${SERVE_WORKERS:+--workers "$SERVE_WORKERS"} --config "$work/tollgate.yaml" --http "127.0.0.1:$t_http" --grpc "127.0.0.1:$t_grpc" >/dev/null 2>&1 &
t_pid=$!; pids+=($t_pid)
"$lim" --rls-ip 127.0.0.1 --rls-port "$l_grpc" --http-ip 127.0.0.1 --http-port "$l_http" "$work/limits.yaml" memory >/dev/null 2>&1 &
l_pid=$!; pids+=($l_pid)
sleep 2
kill -0 "$t_pid" && kill -0 "$l_pid" || { echo "a server did not start" >&2; exit 1; }
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# One bench run against PORT (PID's CPU measured around it), optional RATE; prints
# "req/s p50_us p99_us cpu_us_per_decision".
measure() {
  local port=$1 pid=$2 rate=${3:-} before after out rps
  before=$(cpu "$pid")
  out=$("$bin" bench grpc --target "127.0.0.1:$port" --domain bench --key user --keys "$keys" \
        --concurrency "$conc" --duration "${secs}s" ${rate:+--rate "$rate"} 2>/dev/null | tail -1)
  after=$(cpu "$pid")
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
declare -A R
for round in $(seq "$rounds"); do
  # Alternate who goes first.
  if [ $((round % 2)) -eq 1 ]; then order="limitador tollgate"; else order="tollgate limitador"; fi
  for who in $order; do
    if [ "$who" = tollgate ]; then m=$(measure "$t_grpc" "$t_pid"); else m=$(measure "$l_grpc" "$l_pid"); fi
    R[$who,max,$round]=$m
    echo "round $round $who max: req/s p50_us p99_us cpu_us/decision errors = $m" >&2
  done
done
summary() { # who kind -> "rps p50 p99 cpu" medians
  local who=$1 kind=$2 rps=() p50=() p99=() c=()
  for round in $(seq "$rounds"); do
    local m=${R[$who,$kind,$round]}
    rps+=("$(col "$m" 1)"); p50+=("$(col "$m" 2)"); p99+=("$(col "$m" 3)"); c+=("$(col "$m" 4)")
  done
  echo "$(median "${rps[@]}") $(median "${p50[@]}") $(median "${p99[@]}") $(median "${c[@]}")"
}
tmax=$(summary tollgate max); lmax=$(summary limitador max)
slower=$(python3 -c "print(min(float('$(col "$tmax" 1)'), float('$(col "$lmax" 1)')))")
rate=$(python3 -c "print(int($slower / 2))")
for round in $(seq "$rounds"); do
  if [ $((round % 2)) -eq 1 ]; then order="tollgate limitador"; else order="limitador tollgate"; fi
  for who in $order; do
    if [ "$who" = tollgate ]; then m=$(measure "$t_grpc" "$t_pid" "$rate"); else m=$(measure "$l_grpc" "$l_pid" "$rate"); fi
    R[$who,paced,$round]=$m
    echo "round $round $who at $rate req/s: req/s p50_us p99_us cpu_us/decision errors = $m" >&2
  done
done
tpaced=$(summary tollgate paced); lpaced=$(summary limitador paced)
ratio() { python3 -c "print(round(float('$1') / float('$2'), 2))"; }
echo "Envoy RLS gRPC, one key over $keys values, $conc callers, ${secs}s runs, medians of $rounds alternating rounds"
echo "                 max req/s  p50_us  p99_us  cpu_us/decision | at $rate req/s: p50_us  p99_us  cpu_us/decision"
printf 'limitador        %9s  %6s  %6s  %15s | %22s  %6s  %15s\n' $(col "$lmax" 1) $(col "$lmax" 2) $(col "$lmax" 3) $(col "$lmax" 4) $(col "$lpaced" 2) $(col "$lpaced" 3) $(col "$lpaced" 4)
printf 'tollgate         %9s  %6s  %6s  %15s | %22s  %6s  %15s\n' $(col "$tmax" 1) $(col "$tmax" 2) $(col "$tmax" 3) $(col "$tmax" 4) $(col "$tpaced" 2) $(col "$tpaced" 3) $(col "$tpaced" 4)
echo "tollgate / limitador: max req/s $(ratio "$(col "$tmax" 1)" "$(col "$lmax" 1)")x, CPU per decision at max $(ratio "$(col "$tmax" 4)" "$(col "$lmax" 4)")x, at $rate req/s: p99 $(ratio "$(col "$tpaced" 3)" "$(col "$lpaced" 3)")x, CPU per decision $(ratio "$(col "$tpaced" 4)" "$(col "$lpaced" 4)")x"
