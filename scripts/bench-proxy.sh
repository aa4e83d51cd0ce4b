#!/usr/bin/env bash
# tollgate proxy next to nginx (Debian's, 2 workers) in one run: both proxy to the same
# upstream (`tollgate bench ceiling`) with equivalent limit_req configs, driven by wrk
# on loopback, under the limit (every request passes) and over it (most rejected).
# With `redis` as the third argument, tollgate also runs on the Redis store (a
# redis-server started here), without and with the negative cache.
# Each label runs ROUNDS times (default 3), nginx and tollgate alternating; the last
# lines are the medians and the ratios tollgate/nginx of req/s and p99.
# Usage: [ROUNDS=3] scripts/bench-proxy.sh [seconds] [connections] [redis]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
conns=${2:-64}
with_redis=${3:-}
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
command -v nginx >/dev/null || { apt-get update -qq && apt-get install -y -qq nginx >/dev/null; }
cargo build --release -q -p tollgate-server
bin=target/release/tollgate
. scripts/lib/bench.sh
up=$(free_port); tg=$(free_port); ng=$(free_port)
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
"$bin" bench ceiling --listen "127.0.0.1:$up" >/dev/null 2>&1 & pids+=($!)
stores=(":")
if [ "$with_redis" = redis ]; then
  need_redis
  rp=$(free_port)
  (cd "$work" && exec redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1) & pids+=($!)
  stores+=("redis:  kind: redis\n  url: redis://127.0.0.1:$rp/" "redis+negative-cache:  kind: redis\n  url: redis://127.0.0.1:$rp/\n  negative_cache: true")
fi

run_pair() { # $1 = label, $2 = nginx rate, $3 = tollgate rate
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
  for store in "${stores[@]}"; do
    local name=${store%%:*} section=${store#*:}
    { [ -n "$section" ] && printf 'store:\n%b\n' "$section"; cat <<YAML
proxy:
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
  kill $ngpid 2>/dev/null || true
  wait $ngpid 2>/dev/null || true
}
measure() { # $1 = name, $2 = port
  out=$(wrk -t2 -c"$conns" -d"${secs}s" --latency -H 'X-Api-Key: k1' "http://127.0.0.1:$2/api/x")
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  non2xx=$(echo "$out" | awk '/Non-2xx/ {print $5}')
  echo "$label $1: req/s $rps p99 $p99 non-2xx ${non2xx:-0}"
  # p99 in ms, whatever unit wrk chose.
  echo "$label|$1|$rps|$(python3 -c "v='$p99'; print(float(v[:-2])/1000 if v.endswith('us') else float(v[:-2]) if v.endswith('ms') else float(v[:-1])*1000)")" >> "$work/results"
}
for round in $(seq "${ROUNDS:-3}"); do
  label="under-limit" run_pair x "1000000r/s" "1000000/s"
  label="over-limit" run_pair x "10r/s" "10/s"
done
echo "== medians of ${ROUNDS:-3} rounds (tollgate / nginx) =="
python3 - "$work/results" <<'PY'
import sys, statistics
rows = [l.strip().split("|") for l in open(sys.argv[1]) if l.strip()]
for label in dict.fromkeys(r[0] for r in rows):
    runs = {}
    for r in rows:
        if r[0] == label:
            runs.setdefault(r[1], []).append((float(r[2]), float(r[3])))
    ng = runs.pop("nginx")
    ng_rps, ng_p99 = statistics.median(x[0] for x in ng), statistics.median(x[1] for x in ng)
    print(f"{label} nginx: req/s {ng_rps:.0f} p99 {ng_p99:.2f}ms")
    for name, rs in runs.items():
        rps, p99 = statistics.median(x[0] for x in rs), statistics.median(x[1] for x in rs)
        print(f"{label} {name}: req/s {rps:.0f} p99 {p99:.2f}ms  ratio req/s {rps / ng_rps:.2f}  p99 {p99 / ng_p99:.2f}")
PY
