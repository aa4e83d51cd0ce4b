#!/usr/bin/env bash
# Soak: `tollgate serve` and `tollgate proxy` under mixed load for MINUTES (default 15)
# with key churn (random keys among a million, past the 200k keys bound, so eviction
# runs all the time) and a reload every 30 s (SIGHUP), on the memory store or on a
# redis-server started here. Samples each process's RSS and open file descriptors
# every 5 s into target/soak/STORE/samples.csv, charts them (soak.png beside it, drawn
# by `tollgate plot`) and checks that they stay flat: RSS at the
# end within 15 % of RSS at the half-way point (the first half fills the key tables),
# descriptors at the end within 10 of the half-way count,
# no transport errors (the limits' own 429s are expected), both processes alive.
#
#   scripts/soak.sh [MINUTES] [memory|redis]
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-15}
store=${2:-memory}
secs=$(( minutes * 60 ))
cargo build --release -q -p tollgate-server
bin=target/release/tollgate
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
. scripts/lib/bench.sh
out=target/soak/$store; rm -rf "$out"; mkdir -p "$out"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
store_yaml="  kind: memory"
if [ "$store" = redis ]; then
  need_redis
  rp=$(free_port)
  redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 & pids+=($!)
  sleep 0.5
  store_yaml="  kind: redis
  url: redis://127.0.0.1:$rp/"
fi
up=$(free_port); http=$(free_port); grpc=$(free_port); px=$(free_port)
cat > "$out/rules.yaml" <<YAML
domain: soak
descriptors:
  - key: user
    policies: ["gcra:rate=5/s,burst=10", "fixed-window:limit=100,window=1m"]
YAML
cat > "$out/tollgate.yaml" <<YAML
rules: [rules.yaml]
store:
$store_yaml
keys:
  max: 200000
proxy:
  routes:
    - name: api
      match: { path_prefix: / }
      upstream: http://127.0.0.1:$up
      key: header:X-Api-Key
      policies: ["limit-req:rate=5/s,burst=10,nodelay"]
      limit_conn: 4
YAML
"$bin" bench ceiling --listen "127.0.0.1:$up" >/dev/null 2>&1 & pids+=($!)
"$bin" serve --config "$out/tollgate.yaml" --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc" >"$out/serve.log" 2>&1 & serve=$!; pids+=($serve)
"$bin" proxy --config "$out/tollgate.yaml" --listen "127.0.0.1:$px" >"$out/proxy.log" 2>&1 & proxy=$!; pids+=($proxy)
sleep 1
cat > "$out/keys.lua" <<'LUA'
math.randomseed(os.time())
request = function()
  return wrk.format(nil, nil, { ["X-Api-Key"] = "k" .. math.random(1, 1000000) })
end
LUA
"$bin" bench http --target "127.0.0.1:$http" --domain soak --key user --keys 1000000 \
  --concurrency 16 --rate 4000 --duration "${secs}s" >"$out/bench-http.log" 2>&1 & load1=$!
"$bin" bench grpc --target "127.0.0.1:$grpc" --domain soak --key user --keys 1000000 \
  --concurrency 8 --rate 2000 --duration "${secs}s" >"$out/bench-grpc.log" 2>&1 & load2=$!
wrk -t1 -c8 -d "${secs}s" -s "$out/keys.lua" "http://127.0.0.1:$px/" >"$out/wrk.log" 2>&1 & load3=$!
pids+=($load1 $load2 $load3)
sample() { # pid -> "rss_kb fds"
  echo "$(awk '/VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0) $(ls "/proc/$1/fd" 2>/dev/null | wc -l)"
}
echo "t_s,serve_rss_kb,serve_fds,proxy_rss_kb,proxy_fds" > "$out/samples.csv"
start=$(date +%s)
while :; do
  now=$(( $(date +%s) - start ))
  [ "$now" -ge "$secs" ] && break
  read -r srss sfd < <(sample "$serve"); read -r prss pfd < <(sample "$proxy")
  echo "$now,$srss,$sfd,$prss,$pfd" >> "$out/samples.csv"
  if [ $(( now % 30 )) -lt 5 ] && [ "$now" -ge 5 ]; then
    touch "$out/rules.yaml"; kill -HUP "$serve" "$proxy"
  fi
  sleep 5
done
wait $load1 $load2 $load3 || true
"$bin" plot --csv "$out/samples.csv" --out "$out/soak.png" \
  --title "tollgate soak: $minutes min, $store store (serve + proxy, key churn, reloads)"
alive=1; kill -0 "$serve" 2>/dev/null && kill -0 "$proxy" 2>/dev/null || alive=0
python3 - "$out" "$alive" <<'PY'
import csv, re, sys
out, alive = sys.argv[1], sys.argv[2] == "1"
rows = [r for r in csv.DictReader(open(f"{out}/samples.csv"))]
ok = alive
def flat(name):
    global ok
    rss = [int(r[f"{name}_rss_kb"]) for r in rows]; fds = [int(r[f"{name}_fds"]) for r in rows]
    half, end = rss[len(rss) // 2], rss[-1]
    fhalf = fds[len(fds) // 2]
    good = end <= half * 1.15 and fds[-1] <= fhalf + 10
    ok &= good
    print(f"{name}: RSS {rss[0]/1024:.1f} MB at start, {half/1024:.1f} MB half-way, {end/1024:.1f} MB at the end (max {max(rss)/1024:.1f}); fds {fds[0]} at start, {fhalf} half-way, {fds[-1]} at the end (max {max(fds)}): {'flat' if good else 'GROWING'}")
flat("serve"); flat("proxy")
for f in ("bench-http", "bench-grpc"):
    last = open(f"{out}/{f}.log").read().strip().splitlines()[-1]
    errors = int(re.search(r"errors: (\d+)", last).group(1))
    ok &= errors == 0
    print(f"{f}: {last}")
wrk = open(f"{out}/wrk.log").read()
sock = re.search(r"Socket errors: (.*)", wrk)
reqs = re.search(r"(\d+) requests in", wrk)
print(f"proxy (wrk): {reqs.group(1) if reqs else '?'} requests; socket errors: {sock.group(1) if sock else 'none'}")
ok &= sock is None
reloads_s = open(f"{out}/serve.log").read().count("rules reloaded")
reloads_p = open(f"{out}/proxy.log").read().count("reloaded")
print(f"reloads: serve {reloads_s}, proxy {reloads_p}; both alive: {alive}")
print("soak: OK" if ok else "soak: FAILED")
sys.exit(0 if ok else 1)
PY
