#!/usr/bin/env bash
# Measures `tollgate serve` against the HTTP stack's ceiling (a server answering 200 to
# everything) in one run, on loopback: max throughput (3 alternating rounds; medians)
# of /v1/check, Envoy's /json (the same body and client) and gRPC, then p99 at half of
# tollgate's max load, for HTTP and gRPC.
# With `redis` as the third argument, a second `serve` on the Redis store (a
# redis-server started here; batching on, the default) runs beside the memory one,
# alternating rounds, and the ratio of their HTTP max req/s is printed.
# With `limitador` as the third argument, limitador (Kuadrant's Rust rate-limit server,
# memory storage; its gRPC server runs on one thread), `tollgate serve --workers 1`
# (the same shape) and `tollgate serve` (its default, a worker per CPU) answer the
# same Envoy RLS gRPC load instead: one
# descriptor key over 100,000 values, each value its own counter of 10^9 per minute
# (so every call is a counted, admitted decision), no response headers on either
# side, the same client (`tollgate bench grpc`), alternating rounds. Reported per
# server: max req/s, p50/p99, server CPU per decision (from /proc/PID/stat), then p99
# and CPU per decision at the same offered load (half the slowest server's max).
# limitador is built here from a checkout: LIMITADOR_SRC=/path/to/limitador (a clone
# of github.com/Kuadrant/limitador; `cargo build --release -p limitador-server` runs
# in it), or LIMITADOR_BIN=/path/to/limitador-server to use a built one.
# Then Envoy's /json again with a light client, wrk (one thread pinned to CPU 1, 32
# kept connections, a random descriptor value out of 100,000 per request), against
# the ceiling answering the same POSTs: req/s and each server's CPU per request,
# user and kernel apart (/proc/PID/stat), medians of 3 alternating rounds.
# With BASELINE_BIN=/path/to/an/older/tollgate (e.g. the previous commit's release
# build), a `serve` from that binary runs beside this one, alternating rounds, and
# the ratios new/old of HTTP and gRPC max req/s are printed (medians of 3).
# Usage: [BASELINE_BIN=...] scripts/bench-service.sh [concurrency] [seconds] [redis|limitador]
set -euo pipefail
cd "$(dirname "$0")/.."
conc=${1:-32}
secs=${2:-8}
with_redis=${3:-}
cargo build --release -q -p tollgate-server
bin=target/release/tollgate
. scripts/lib/bench.sh
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
if [ "$with_redis" = limitador ]; then
  exec scripts/bench-limitador.sh "$conc" "$secs"
fi
http=$(free_port); grpc=$(free_port); ceil=$(free_port)
"$bin" serve --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc" >/dev/null 2>&1 & serve_pid=$!
"$bin" bench ceiling --listen "127.0.0.1:$ceil" >/dev/null 2>&1 & ceil_pid=$!
pids=($serve_pid $ceil_pid)
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
if [ "$with_redis" = redis ]; then
  need_redis
  rp=$(free_port); rhttp=$(free_port); rgrpc=$(free_port)
  redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 & pids+=($!)
  sleep 0.5
  "$bin" serve --http "127.0.0.1:$rhttp" --grpc "127.0.0.1:$rgrpc" --store "redis://127.0.0.1:$rp/" >/dev/null 2>&1 & pids+=($!)
fi
sleep 1
run() { "$bin" bench "$@" --concurrency "$conc" --duration "${secs}s" 2>/dev/null | tail -1; }
field() { echo "$1" | sed -E "s#.*$2: ([0-9.]+).*#\1#"; }
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
c_rps=(); t_rps=(); g_rps=(); j_rps=()
for round in 1 2 3; do
  c=$(run http --target "127.0.0.1:$ceil"); c_rps+=("$(field "$c" 'req/s')")
  t=$(run http --target "127.0.0.1:$http"); t_rps+=("$(field "$t" 'req/s')")
  j=$(run json --target "127.0.0.1:$http"); j_rps+=("$(field "$j" 'req/s')")
  g=$(run grpc --target "127.0.0.1:$grpc"); g_rps+=("$(field "$g" 'req/s')")
  echo "round $round: ceiling [$c] | tollgate http [$t] | tollgate /json [$j] | tollgate grpc [$g]" >&2
done
cm=$(median "${c_rps[@]}"); tm=$(median "${t_rps[@]}"); gm=$(median "${g_rps[@]}"); jm=$(median "${j_rps[@]}")
half=$(python3 -c "print(int($tm/2))"); ghalf=$(python3 -c "print(int($gm/2))")
th=$(run http --target "127.0.0.1:$http" --rate "$half")
gh=$(run grpc --target "127.0.0.1:$grpc" --rate "$ghalf")
echo "concurrency $conc, ${secs}s runs, medians of 3"
echo "ceiling (200 to everything), HTTP max req/s: $cm"
echo "tollgate HTTP /v1/check max req/s: $tm (ratio $(python3 -c "print(round($tm/$cm,2))"))"
echo "tollgate Envoy /json max req/s: $jm (ratio $(python3 -c "print(round($jm/$cm,2))"); the same body and client as /v1/check)"
echo "tollgate gRPC ShouldRateLimit max req/s: $gm"
echo "tollgate HTTP at $half req/s: $th"
echo "tollgate gRPC at $ghalf req/s: $gh"
# /json under wrk: "req/s user-us kernel-us" of one run against PID on PORT.
work=$(mktemp -d)
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
cat > "$work/json.lua" <<'LUA'
math.randomseed(7)
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
request = function()
  local body = '{"domain":"example","descriptors":[{"entries":[{"key":"api_key","value":"k'
      .. math.random(0, 99999) .. '"}]}]}'
  return wrk.format(nil, "/json", nil, body)
end
LUA
hz=$(getconf CLK_TCK)
wrk_json() { # pid port
  local before after rate
  before=$(awk '{print $14, $15}' "/proc/$1/stat")
  rate=$(taskset -c 1 wrk -t1 -c32 -d"${secs}s" -s "$work/json.lua" "http://127.0.0.1:$2/json" \
    | awk '/Requests\/sec/ {print int($2)}')
  [ -n "$rate" ] || { echo "wrk gave no Requests/sec against port $2" >&2; exit 1; }
  after=$(awk '{print $14, $15}' "/proc/$1/stat")
  python3 -c "b='$before'.split(); a='$after'.split(); r=$rate; n=r*$secs
print(r, round((int(a[0])-int(b[0]))/$hz*1e6/n, 2), round((int(a[1])-int(b[1]))/$hz*1e6/n, 2))"
}
wc_=(); wcu=(); wck=(); wt=(); wtu=(); wtk=()
for round in 1 2 3; do
  read -r r u k < <(wrk_json "$ceil_pid" "$ceil"); wc_+=("$r"); wcu+=("$u"); wck+=("$k")
  read -r r2 u2 k2 < <(wrk_json "$serve_pid" "$http"); wt+=("$r2"); wtu+=("$u2"); wtk+=("$k2")
  echo "round $round (wrk /json): ceiling $r req/s, CPU ${u}+${k} us | tollgate $r2 req/s, CPU ${u2}+${k2} us (user+kernel per request)" >&2
done
a=$(median "${wc_[@]}"); b=$(median "${wt[@]}")
echo "Envoy /json under wrk (-t1 -c32, 100k values): ceiling $a req/s, CPU $(median "${wcu[@]}")+$(median "${wck[@]}") us a request (user+kernel); tollgate $b req/s (ratio $(python3 -c "print(round($b/$a,2))")), CPU $(median "${wtu[@]}")+$(median "${wtk[@]}") us"
if [ "$with_redis" = redis ]; then
  m=(); r=()
  for round in 1 2 3; do
    a=$(run http --target "127.0.0.1:$http"); m+=("$(field "$a" 'req/s')")
    b=$(run http --target "127.0.0.1:$rhttp"); r+=("$(field "$b" 'req/s')")
    echo "round $round: memory [$a] | redis [$b]" >&2
  done
  mm=$(median "${m[@]}"); rm=$(median "${r[@]}")
  echo "HTTP /v1/check max req/s, memory store: $mm; Redis store: $rm (ratio $(python3 -c "print(round($rm/$mm,2))"))"
fi
if [ -n "${BASELINE_BIN:-}" ]; then
  bhttp=$(free_port); bgrpc=$(free_port)
  "$BASELINE_BIN" serve --http "127.0.0.1:$bhttp" --grpc "127.0.0.1:$bgrpc" >/dev/null 2>&1 & pids+=($!)
  sleep 1
  nh=(); oh=(); nj=(); oj=(); ng=(); og=()
  for round in 1 2 3; do
    a=$(run http --target "127.0.0.1:$http"); nh+=("$(field "$a" 'req/s')")
    b=$(run http --target "127.0.0.1:$bhttp"); oh+=("$(field "$b" 'req/s')")
    e=$(run json --target "127.0.0.1:$http"); nj+=("$(field "$e" 'req/s')")
    f=$(run json --target "127.0.0.1:$bhttp"); oj+=("$(field "$f" 'req/s')")
    c=$(run grpc --target "127.0.0.1:$grpc"); ng+=("$(field "$c" 'req/s')")
    d=$(run grpc --target "127.0.0.1:$bgrpc"); og+=("$(field "$d" 'req/s')")
    echo "round $round: http new [$a] old [$b] | json new [$e] old [$f] | grpc new [$c] old [$d]" >&2
  done
  ratio() { python3 -c "print(round($1/$2,2))"; }
  a=$(median "${nh[@]}"); b=$(median "${oh[@]}"); c=$(median "${ng[@]}"); d=$(median "${og[@]}")
  e=$(median "${nj[@]}"); f=$(median "${oj[@]}")
  echo "against $BASELINE_BIN, max req/s new/old: HTTP $a/$b ($(ratio "$a" "$b")), /json $e/$f ($(ratio "$e" "$f")), gRPC $c/$d ($(ratio "$c" "$d"))"
fi
