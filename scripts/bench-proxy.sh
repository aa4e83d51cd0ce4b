#!/usr/bin/env bash
# tollgate proxy next to nginx (Debian's, 2 workers) and HAProxy (Debian's, 2 threads)
# in one run: all three proxy to the same upstream (`tollgate bench ceiling`) behind a
# per-key limit (nginx `limit_req`, tollgate `limit-req`, both 10/s with a burst of
# 100 over the limit; an HAProxy stick table's request rate over 1 s, which counts
# refused requests too, so over the limit HAProxy admits fewer), driven by wrk on
# loopback (2 threads): under the limit (every
# request passes; each request's X-Api-Key drawn at random out of KEYS keys, default
# 100,000) and over it (one key; most rejected). tollgate runs with its metrics on (a
# metrics listener, the per-route request metrics), as a deployment would.
# With `redis` as the third argument, tollgate also runs on the Redis store (a
# redis-server started here), without and with the negative cache.
# Each label runs ROUNDS times (default 3), the servers alternating; the last lines
# are the medians and the ratios of tollgate's req/s and p99 to nginx's, to HAProxy's
# and to the faster of the two.
# Usage: [ROUNDS=3] [KEYS=100000] scripts/bench-proxy.sh [seconds] [connections] [redis]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
conns=${2:-64}
with_redis=${3:-}
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
for tool in nginx haproxy; do
  command -v "$tool" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$tool" >/dev/null; }
done
cargo build --release -q -p tollgate-server
bin=target/release/tollgate
. scripts/lib/bench.sh
up=$(free_port); tg=$(free_port); ng=$(free_port); hp=$(free_port); mx=$(free_port)
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
cat > "$work/keys.lua" <<LUA
-- Each wrk thread its own sequence of keys.
local threads = 0
function setup(thread) threads = threads + 1; thread:set("id", threads) end
function init(args) math.randomseed(11 + id) end
request = function()
  return wrk.format(nil, "/api/x", {["X-Api-Key"] = "k" .. math.random(0, ${KEYS:-100000} - 1)})
end
LUA
"$bin" bench ceiling --listen "127.0.0.1:$up" >/dev/null 2>&1 & pids+=($!)
stores=(":")
if [ "$with_redis" = redis ]; then
  need_redis
  rp=$(free_port)
  (cd "$work" && exec redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1) & pids+=($!)
  stores+=("redis:  kind: redis\n  url: redis://127.0.0.1:$rp/" "redis+negative-cache:  kind: redis\n  url: redis://127.0.0.1:$rp/\n  negative_cache: true")
fi

run_pair() { # $1 = label, $2 = nginx rate, $3 = tollgate rate, $4 = HAProxy requests a second
  cat > "$work/nginx.conf" <<NGINX
worker_processes 2;
pid $work/nginx.pid;
error_log $work/error.log crit;
daemon off;
events { worker_connections 4096; }
http {
  access_log off;
  limit_req_zone \$http_x_api_key zone=z:10m rate=$2;
  limit_req_status 429;
  upstream up { server 127.0.0.1:$up; keepalive 128; }
  server {
    listen 127.0.0.1:$ng;
    location /api/ {
      limit_req zone=z burst=100 nodelay;
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
NGINX
  nginx -p "$work" -c "$work/nginx.conf" & local ngpid=$!
  pids+=($ngpid)
  sleep 1
  measure "nginx" "$ng"
  kill $ngpid 2>/dev/null || true
  wait $ngpid 2>/dev/null || true
  # HAProxy: a stick table per key of its request rate over 1 s; past the rate, 429.
  cat > "$work/haproxy.cfg" <<HAPROXY
global
  nbthread 2
  maxconn 8192
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend api
  bind 127.0.0.1:$hp
  stick-table type string len 32 size 200k expire 10s store http_req_rate(1s)
  http-request track-sc0 req.hdr(X-Api-Key)
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt $4 }
  default_backend up
backend up
  http-reuse always
  server up 127.0.0.1:$up maxconn 128
HAPROXY
  haproxy -db -f "$work/haproxy.cfg" >/dev/null 2>&1 & local hppid=$!
  pids+=($hppid)
  sleep 1
  measure "haproxy" "$hp"
  kill $hppid 2>/dev/null || true
  wait $hppid 2>/dev/null || true
  for store in "${stores[@]}"; do
    local name=${store%%:*} section=${store#*:}
    { [ -n "$section" ] && printf 'store:\n%b\n' "$section"; cat <<YAML
proxy:
  metrics: 127.0.0.1:$mx
  routes:
    - name: api
      match: { path_prefix: /api/ }
      upstream: http://127.0.0.1:$up
      key: header:X-Api-Key
      policies: ["limit-req:rate=$3,burst=100,nodelay"]
      status: 429
      headers: none
YAML
    } > "$work/tollgate.yaml"
    "$bin" proxy --config "$work/tollgate.yaml" --listen "127.0.0.1:$tg" >/dev/null 2>&1 & local tgpid=$!
    pids+=($tgpid)
    sleep 1
    measure "tollgate${name:+ ($name)}" "$tg"
    kill $tgpid 2>/dev/null || true
    wait $tgpid 2>/dev/null || true
  done
}
measure() { # $1 = name, $2 = port
  # Under the limit, KEYS keys; over it, one key (spread over many keys, 10/s each
  # would not be reached).
  local keys=(-s "$work/keys.lua")
  [ "$label" = over-limit ] && keys=(-H 'X-Api-Key: k1')
  out=$(wrk -t2 -c"$conns" -d"${secs}s" --latency "${keys[@]}" "http://127.0.0.1:$2/api/x")
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  non2xx=$(echo "$out" | awk '/Non-2xx/ {print $5}')
  echo "$label $1: req/s $rps p99 $p99 non-2xx ${non2xx:-0}"
  # p99 in ms, whatever unit wrk chose.
  echo "$label|$1|$rps|$(python3 -c "v='$p99'; print(float(v[:-2])/1000 if v.endswith('us') else float(v[:-2]) if v.endswith('ms') else float(v[:-1])*1000)")" >> "$work/results"
}
for round in $(seq "${ROUNDS:-3}"); do
  label="under-limit" run_pair x "1000000r/s" "1000000/s" 1000000
  label="over-limit" run_pair x "10r/s" "10/s" 10
done
echo "== medians of ${ROUNDS:-3} rounds (tollgate / nginx, / HAProxy, / the faster) =="
python3 - "$work/results" <<'PY'
import sys, statistics
rows = [l.strip().split("|") for l in open(sys.argv[1]) if l.strip()]
for label in dict.fromkeys(r[0] for r in rows):
    runs = {}
    for r in rows:
        if r[0] == label:
            runs.setdefault(r[1], []).append((float(r[2]), float(r[3])))
    med = lambda rs, i: statistics.median(x[i] for x in rs)
    ng, hp = runs.pop("nginx"), runs.pop("haproxy")
    for name, rs in (("nginx", ng), ("haproxy", hp)):
        print(f"{label} {name}: req/s {med(rs, 0):.0f} p99 {med(rs, 1):.2f}ms")
    best = max(med(ng, 0), med(hp, 0))
    for name, rs in runs.items():
        rps, p99 = med(rs, 0), med(rs, 1)
        print(f"{label} {name}: req/s {rps:.0f} p99 {p99:.2f}ms  ratio req/s {rps / med(ng, 0):.2f} (nginx), "
              f"{rps / med(hp, 0):.2f} (HAProxy), {rps / best:.2f} (the faster)  p99 {p99 / med(ng, 1):.2f} (nginx)")
PY
