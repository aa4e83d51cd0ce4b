#!/usr/bin/env bash
# Instructions per request of `tollgate proxy` and of nginx (`limit_req`, the same
# routes as scripts/bench-proxy.sh), counted by valgrind's callgrind: repeatable on a
# noisy machine where req/s is not. Each runs under callgrind in front of the same
# upstream (`tollgate bench ceiling`, not counted); wrk warms it up for 3 s, the counters
# are zeroed, wrk runs 5 s more (4 connections), and the instructions counted in those
# 5 s divided by the requests wrk completed is the figure. User-space instructions only
# (the kernel's share, about the same for both, is not counted).
# Under the limit every request goes upstream; over it (10/s) nearly all get a 429.
# With BASELINE_BIN=/path/to/an/older/tollgate, that binary is counted too.
# Usage: [BASELINE_BIN=...] scripts/callgrind-proxy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in valgrind wrk nginx; do
  command -v "$tool" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$tool" >/dev/null; }
done
cargo build --release -q -p tollgate-server
bin=target/release/tollgate
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
up=$(port)
"$bin" bench ceiling --listen "127.0.0.1:$up" >/dev/null 2>&1 & pids+=($!)

# Counts one server started by "$@" (under callgrind) that listens on $port.
count() { # $1 = label, $2 = port, then the command
  local label=$1 p=$2; shift 2
  valgrind --tool=callgrind --callgrind-out-file="$work/cg.$label.%p" "$@" >/dev/null 2>&1 &
  local vpid=$!
  pids+=($vpid)
  for _ in $(seq 120); do curl -s -o /dev/null "http://127.0.0.1:$p/" && break; sleep 0.5; done
  wrk -t1 -c4 -d3s -H 'X-Api-Key: k1' "http://127.0.0.1:$p/api/x" >/dev/null
  callgrind_control -z "$vpid" >/dev/null 2>&1
  local n
  n=$(wrk -t1 -c4 -d5s -H 'X-Api-Key: k1' "http://127.0.0.1:$p/api/x" | awk '/requests in/ {print $1}')
  callgrind_control -d "$vpid" >/dev/null 2>&1
  sleep 1
  kill "$vpid" 2>/dev/null || true
  wait "$vpid" 2>/dev/null || true
  local ir
  ir=$(cat "$work"/cg."$label".*.1 | awk '/^summary:/ {s += $2} END {print s}')
  printf '%-28s %8d requests %12d instructions %8d per request\n' "$label" "$n" "$ir" $((ir / n))
}

for traffic in under over; do
  rate=1000000; [ "$traffic" = over ] && rate=10
  p=$(port)
  cat > "$work/nginx-$traffic.conf" <<NGINX
master_process off;
worker_processes 1;
pid $work/nginx-$traffic.pid;
error_log $work/error.log crit;
daemon off;
events { worker_connections 4096; }
http {
  access_log off;
  limit_req_zone \$http_x_api_key zone=z:10m rate=${rate}r/s;
  limit_req_status 429;
  upstream up { server 127.0.0.1:$up; keepalive 128; }
  server {
    listen 127.0.0.1:$p;
    location /api/ {
      limit_req zone=z burst=100 nodelay;
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
NGINX
  count "nginx-$traffic" "$p" nginx -p "$work" -c "$work/nginx-$traffic.conf"
  cat > "$work/tollgate-$traffic.yaml" <<YAML
proxy:
  routes:
    - name: api
      match: { path_prefix: /api/ }
      upstream: http://127.0.0.1:$up
      key: header:X-Api-Key
      policies: ["limit-req:rate=$rate/s,burst=100,nodelay"]
      status: 429
      headers: none
YAML
  p=$(port)
  count "tollgate-$traffic" "$p" "$bin" proxy --config "$work/tollgate-$traffic.yaml" --listen "127.0.0.1:$p"
  if [ -n "${BASELINE_BIN:-}" ]; then
    p=$(port)
    count "baseline-$traffic" "$p" "$BASELINE_BIN" proxy --config "$work/tollgate-$traffic.yaml" --listen "127.0.0.1:$p"
  fi
done
