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
. scripts/lib/bench.sh
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
up=$(free_port)
"$bin" bench ceiling --listen "127.0.0.1:$up" >/dev/null 2>&1 & pids+=($!)

for traffic in under over; do
  rate=1000000; [ "$traffic" = over ] && rate=10
  p=$(free_port)
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
  callgrind_per_request "$work" "nginx-$traffic" "http://127.0.0.1:$p/api/x" "-H X-Api-Key:k1" nginx -p "$work" -c "$work/nginx-$traffic.conf"
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
  p=$(free_port)
  callgrind_per_request "$work" "tollgate-$traffic" "http://127.0.0.1:$p/api/x" "-H X-Api-Key:k1" "$bin" proxy --config "$work/tollgate-$traffic.yaml" --listen "127.0.0.1:$p"
  if [ -n "${BASELINE_BIN:-}" ]; then
    p=$(free_port)
    callgrind_per_request "$work" "baseline-$traffic" "http://127.0.0.1:$p/api/x" "-H X-Api-Key:k1" "$BASELINE_BIN" proxy --config "$work/tollgate-$traffic.yaml" --listen "127.0.0.1:$p"
  fi
done
