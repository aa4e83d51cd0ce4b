#!/usr/bin/env bash
# Instructions per request that TLS adds, counted by valgrind's callgrind (repeatable
# on a noisy machine where req/s is not): `tollgate serve` (HTTP /v1/check) and
# `tollgate proxy` (GETs to `tollgate bench ceiling`, not counted), each plain and with
# TLS, and nginx (Debian's, one process, an equivalent limit_req, OpenSSL) in front of
# the same upstream as the reference, one at a time under callgrind. wrk warms each up for 3 s, the counters are
# zeroed, wrk runs 5 s more (4 connections, kept), and the instructions counted in
# those 5 s divided by the requests wrk completed is the figure. User-space
# instructions only: the kernel's share (the same system calls either way, a few
# more bytes with TLS) is not counted.
# Usage: scripts/callgrind-tls.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in valgrind wrk openssl nginx; do
  command -v "$tool" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$tool" >/dev/null; }
done
cargo build --release -q -p tollgate-server
bin=$PWD/target/release/tollgate
. scripts/lib/bench.sh
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
bench_pki "$work" server
(
  cd "$work"
  cat >check.lua <<'LUA'
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.body = '{"domain":"example","descriptors":[{"entries":[{"key":"api_key","value":"k1"}]}]}'
LUA
)
up=$(free_port)
"$bin" bench ceiling --listen "127.0.0.1:$up" >/dev/null 2>&1 & pids+=($!)
tls="{cert_file: $work/server.pem, key_file: $work/server.key}"
printf 'listen: {}\n' >"$work/serve-plain.yaml"
printf 'listen:\n  http_tls: %s\n' "$tls" >"$work/serve-tls.yaml"
for form in plain tls; do
  { echo "proxy:"
    [ "$form" = tls ] && echo "  tls: $tls"
    printf '  routes:\n    - name: api\n      upstream: http://127.0.0.1:%s\n      key: header:X-Api-Key\n' "$up"
    printf '      policies: ["limit-req:rate=1000000/s,burst=1000,nodelay"]\n'
  } >"$work/proxy-$form.yaml"
done

for form in plain tls; do
  scheme=http; [ "$form" = tls ] && scheme=https
  p=$(free_port)
  callgrind_per_request "$work" "serve_$form" "$scheme://127.0.0.1:$p/v1/check" "-s $work/check.lua" \
    "$bin" serve --config "$work/serve-$form.yaml" --http "127.0.0.1:$p" --grpc "127.0.0.1:$(free_port)" --workers 1
  eval "ir_serve_$form=$CG_PER_REQUEST"
  p=$(free_port)
  callgrind_per_request "$work" "proxy_$form" "$scheme://127.0.0.1:$p/api/x" "-H X-Api-Key:k1" \
    "$bin" proxy --config "$work/proxy-$form.yaml" --listen "127.0.0.1:$p"
  eval "ir_proxy_$form=$CG_PER_REQUEST"
  p=$(free_port)
  ssl=""; [ "$form" = tls ] && ssl=" ssl"
  nginx_bench_conf "$work/nginx-$form.conf" "$up" off "$p$ssl"
  callgrind_per_request "$work" "nginx_$form" "$scheme://127.0.0.1:$p/api/x" "-H X-Api-Key:k1" \
    nginx -p "$work" -c "$work/nginx-$form.conf"
  eval "ir_nginx_$form=$CG_PER_REQUEST"
done
python3 -c "print(f'TLS/plain instructions per request: serve {$ir_serve_tls/$ir_serve_plain:.2f}x, proxy {$ir_proxy_tls/$ir_proxy_plain:.2f}x, nginx {$ir_nginx_tls/$ir_nginx_plain:.2f}x')"
