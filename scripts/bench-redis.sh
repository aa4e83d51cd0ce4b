#!/usr/bin/env bash
# The Redis store measured side by side on one redis-server of our own (loopback):
#
# 1. What one decision costs Redis, per algorithm: redis-benchmark drives tollgate's
#    unbatched call (`tollgate bench redis-call`: FCALL of the one-try function) and a
#    minimal redis_rate-shaped GCRA script (scripts/lua/gcra-reference.lua) the same
#    way (-c 50 -P 16, 10k random keys); Redis's own accounting (INFO commandstats,
#    usec_per_call) gives the server time per call (GCRA and the reference alternate
#    5 times: medians and the median ratio). Also the EVALSHA form of tollgate, and
#    beside each policy the tollgate module's call (`TOLLGATE.TRY`, by `bench
#    redis-call --module`; the server has loaded the module) where it decides it.
# 2. Checks/s on one Redis core: `tollgate bench redis` unbatched (--batch 1) and
#    batched (--batch 64), next to redis-benchmark -P 16 of a plain INCR.
#    A charge after the fact next to a try of the same policy (`bench redis-call
#    --charge`: FCALL of the one-charge function), alternating, median ratios.
# 3. One hot key hammered by 4 client processes, unleased (batched) and leased.
#
# With BASELINE_BIN=/path/to/an/older/tollgate (e.g. the previous release build), the
# checks/s section runs that binary's `bench redis` beside this one's in every round
# (same Redis, same keys) and prints the ratios new/old (medians of 3).
#
# Usage: [BASELINE_BIN=...] scripts/bench-redis.sh [seconds] [callers]
# BENCH_SECTIONS=calls,charge,checks,hot (the default: all) picks the sections to run.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
callers=${2:-256}
keys=10000
. scripts/lib/bench.sh
need_redis
cargo build --release -q -p tollgate-server -p tollgate-redis-module
bin=target/release/tollgate
module=$PWD/target/release/libtollgate_redis_module.so
dir=$(mktemp -d)
port=$(free_port)
(cd "$dir" && exec redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --loadmodule "$module" >/dev/null 2>&1) &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
url="redis://127.0.0.1:$port/"
cli() { redis-cli -p "$port" "$@"; }

# One run of redis-benchmark on a command (shell words); prints calls/s and us/call.
server_cost() {
  local n=$1; shift
  cli config resetstat >/dev/null
  local rps
  rps=$(eval "redis-benchmark -p $port -c 50 -P 16 -r $keys -n $n -q --csv $*" | tail -1 | awk -F'","' '{print $2}' | tr -d '"')
  local us
  us=$(cli info commandstats | grep -oE '^cmdstat_(fcall|evalsha|tollgate\.(try|charge)):[^ ]*' | sed -E 's/.*usec_per_call=([0-9.]+).*/\1/' | head -1)
  echo "$rps $us"
}

ref=$(cli script load "$(cat scripts/lua/gcra-reference.lua)")
policies=(
  "gcra:rate=100/s,burst=10"
  "gcra:rate=3/s,burst=10"
  "token-bucket:rate=100/s,capacity=10"
  "leaky-bucket:rate=100/s,capacity=10"
  "fixed-window:limit=100,window=1s"
  "sliding-window:limit=100,window=1s,buckets=10"
  "sliding-window:limit=100,window=1s,mode=weighted"
  "sliding-log:limit=100,window=1s"
  "smooth-bursty:rate=100/s"
  "smooth-warmup:rate=100/s,warmup=10s"
  "limit-req:rate=100/s,burst=10,nodelay"
  "shaper:rate=100/s,queue=10"
)
# Load the code (a first call does), then measure.
"$bin" bench redis --redis-url "$url" --policy "${policies[0]}" --duration 1s --concurrency 1 --connections 1 >/dev/null 2>&1
"$bin" bench redis --redis-url "$url" --policy "${policies[0]}" --duration 1s --concurrency 1 --connections 1 --calls eval >/dev/null 2>&1
n=300000
sections=",${BENCH_SECTIONS:-calls,charge,checks,hot},"
want() { [[ "$sections" == *",$1,"* ]]; }
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
if want calls; then
echo "== server time per call (redis-benchmark -c 50 -P 16, $keys keys; INFO commandstats) =="
printf '%-52s %12s %10s %8s %10s %8s\n' "call" "calls/s" "us/call" "x ref" "module us" "x FCALL"
# The reference and tollgate's GCRA alternate 5 times; the medians are compared.
refs=(); gcras=(); ratios=()
gcra_call=$("$bin" bench redis-call --policy "${policies[0]}")
for round in 1 2 3 4 5; do
  read -r _ r < <(server_cost $n EVALSHA "$ref" 1 'ref:{k__rand_int__}' 10 100 1 1)
  read -r _ g < <(server_cost $n "$gcra_call")
  refs+=("$r"); gcras+=("$g"); ratios+=("$(python3 -c "print('%.3f' % ($g / $r))")")
  echo "round $round: reference $r us, tollgate gcra $g us" >&2
done
ref_us=$(median "${refs[@]}")
printf '%-52s %12s %10s %8s\n' "reference GCRA script (EVALSHA), median of 5" "" "$ref_us" "1.00"
printf '%-52s %12s %10s %8s\n' "${policies[0]}, median of 5" "" "$(median "${gcras[@]}")" "$(median "${ratios[@]}")"
for p in "${policies[@]:1}"; do
  read -r rps us < <(server_cost $n "$("$bin" bench redis-call --policy "$p")")
  mod_us=- mod_x=-
  if call=$("$bin" bench redis-call --policy "$p" --module 2>/dev/null); then
    read -r _ mod_us < <(server_cost $n "$call")
    mod_x=$(python3 -c "print('%.2f' % ($mod_us / $us))")
  fi
  printf '%-52s %12s %10s %8s %10s %8s\n' "$p" "$rps" "$us" "$(python3 -c "print('%.2f' % ($us / $ref_us))")" "$mod_us" "$mod_x"
done
read -r rps us < <(server_cost $n "$("$bin" bench redis-call --policy "${policies[0]}" --eval)")
printf '%-52s %12s %10s %8s\n' "${policies[0]} as EVALSHA" "$rps" "$us" "$(python3 -c "print('%.2f' % ($us / $ref_us))")"
fi

if want charge; then
echo
echo "== a charge after the fact next to a try of the same policy (us/call, 5 alternating rounds, medians) =="
printf '%-52s %10s %10s %8s\n' "policy" "try us" "charge us" "ratio"
# A charge always writes the key; a rejected try does not. So that both do the same
# work (read, decide, write), each policy has room for every try of the run (about 30
# per key): the 3/s GCRA gets a burst of 100. A shaper cannot be charged.
charge_policies=("${policies[@]/gcra:rate=3\/s,burst=10/gcra:rate=3/s,burst=100}")
for p in "${charge_policies[@]}"; do
  case "$p" in shaper:*) continue ;; esac
  try_call=$("$bin" bench redis-call --policy "$p")
  charge_call=$("$bin" bench redis-call --policy "$p" --charge)
  tries=(); charges=(); ratios=()
  for round in 1 2 3 4 5; do
    cli flushall >/dev/null
    read -r _ t < <(server_cost $n "$try_call")
    cli flushall >/dev/null
    read -r _ c < <(server_cost $n "$charge_call")
    tries+=("$t"); charges+=("$c"); ratios+=("$(python3 -c "print('%.3f' % ($c / $t))")")
  done
  printf '%-52s %10s %10s %8s\n' "$p" "$(median "${tries[@]}")" "$(median "${charges[@]}")" "$(median "${ratios[@]}")"
done
fi

if want checks; then
echo
echo "== checks/s on one Redis core ($callers callers, 2 connections, ${secs}s, 3 rounds, medians) =="
field() { echo "$1" | sed -E "s#.*$2: ([0-9.]+).*#\1#"; }
incr=(); one=(); many=(); one_p99=(); many_p99=(); old_one=(); old_many=()
checks() { # binary batch
  "$1" bench redis --redis-url "$url" --policy "${policies[0]}" --concurrency "$callers" \
    --connections 2 --keys "$keys" --duration "${secs}s" --batch "$2" 2>/dev/null | tail -1
}
for round in 1 2 3; do
  r=$(redis-benchmark -p "$port" -c 50 -P 16 -r "$keys" -n 3000000 -q --csv INCR 'k__rand_int__' | tail -1 | awk -F'","' '{print $2}' | tr -d '"')
  incr+=("$r")
  for b in 1 64; do
    t=$(checks "$bin" "$b")
    echo "round $round batch $b: $t" >&2
    if [ "$b" = 1 ]; then one+=("$(field "$t" 'checks/s')"); one_p99+=("$(field "$t" 'p99_us')")
    else many+=("$(field "$t" 'checks/s')"); many_p99+=("$(field "$t" 'p99_us')"); fi
    if [ -n "${BASELINE_BIN:-}" ]; then
      t=$(checks "$BASELINE_BIN" "$b")
      echo "round $round batch $b, baseline: $t" >&2
      if [ "$b" = 1 ]; then old_one+=("$(field "$t" 'checks/s')"); else old_many+=("$(field "$t" 'checks/s')"); fi
    fi
  done
  echo "round $round INCR: $r" >&2
done
i=$(median "${incr[@]}"); u=$(median "${one[@]}"); b=$(median "${many[@]}")
echo "redis-benchmark INCR -c 50 -P 16:     $i calls/s"
echo "tollgate unbatched (--batch 1):      $u checks/s, p99 $(median "${one_p99[@]}")us"
echo "tollgate batched (--batch 64):       $b checks/s, p99 $(median "${many_p99[@]}")us"
python3 -c "print('batched / unbatched: %.2f   batched / INCR: %.2f' % ($b / $u, $b / $i))"
if [ -n "${BASELINE_BIN:-}" ]; then
  ou=$(median "${old_one[@]}"); ob=$(median "${old_many[@]}")
  echo "against $BASELINE_BIN, checks/s new/old: unbatched $u/$ou ($(python3 -c "print('%.2f' % ($u / $ou))")), batched $b/$ob ($(python3 -c "print('%.2f' % ($b / $ob))"))"
fi
fi

if want hot; then
echo
echo "== one hot key, 4 client processes (gcra:rate=1000/s,burst=100, 16 callers each, ${secs}s) =="
hot() { # extra args
  local outs=() pids=()
  for i in 1 2 3 4; do
    outs+=("$dir/hot$i")
    "$bin" bench redis --redis-url "$url" --policy "gcra:rate=1000/s,burst=100" --keys 1 \
      --concurrency 16 --connections 1 --duration "${secs}s" "$@" > "$dir/hot$i" 2>/dev/null & pids+=($!)
  done
  wait "${pids[@]}"
  cat "${outs[@]}" | grep checks/s | sed -E 's#.*checks/s: ([0-9.]+).*#\1#' \
    | python3 -c 'import sys; print(int(sum(float(x) for x in sys.stdin)))'
}
cli flushall >/dev/null
unleased=$(hot)
leased=$(hot --lease 50ms)
echo "unleased (batched): $unleased checks/s"
echo "leased (--lease 50ms): $leased checks/s"
python3 -c "print('leased / unleased: %.1f' % ($leased / $unleased))"
fi
