#!/usr/bin/env bash
# Instructions per request that TLS adds, counted by valgrind's callgrind (repeatable
# on a noisy machine where req/s is not): `tollgate serve` (HTTP /v1/check) and
# `tollgate proxy` (GETs to `tollgate bench ceiling`, not counted), each plain and with
# TLS, one at a time under callgrind. wrk warms each up for 3 s, the counters are
# zeroed, wrk runs 5 s more (4 connections, kept), and the instructions counted in
# those 5 s divided by the requests wrk completed is the figure. User-space
# instructions only: the kernel's share (the same system calls either way, a few
# more bytes with TLS) is not counted.
# Usage: scripts/callgrind-tls.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in valgrind wrk openssl; do
  command -v "$tool" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$tool" >/dev/null; }
done
cargo build --release -q -p tollgate-server
bin=$PWD/target/release/tollgate
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
(
  cd "$work"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
      -out ca.pem -days 2 -subj "/CN=bench ca" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key \
      -out server.csr -subj "/CN=server" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >server.ext
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
      -out server.pem -days 2 -extfile server.ext 2>/dev/null
  cat >check.lua <<'LUA'
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.body = '{"domain":"example","descriptors":[{"entries":[{"key":"api_key","value":"k1"}]}]}'
LUA
)
up=$(port)
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

# Counts one server started by "$@" (under callgrind) at URL $2 with wrk's extra args $3.
count() { # $1 = label, $2 = url, $3 = wrk args, then the command
  local label=$1 url=$2 args=$3; shift 3
  valgrind --tool=callgrind --callgrind-out-file="$work/cg.$label.%p" "$@" >/dev/null 2>&1 &
  local vpid=$!
  pids+=($vpid)
  for _ in $(seq 120); do curl -sk -o /dev/null "$url/healthz" && break; sleep 0.5; done
  # shellcheck disable=SC2086
  wrk -t1 -c4 -d3s $args "$url" >/dev/null
  callgrind_control -z "$vpid" >/dev/null 2>&1
  local n
  # shellcheck disable=SC2086
  n=$(wrk -t1 -c4 -d5s $args "$url" | awk '/requests in/ {print $1}')
  callgrind_control -d "$vpid" >/dev/null 2>&1
  sleep 1
  kill "$vpid" 2>/dev/null || true
  wait "$vpid" 2>/dev/null || true
  local ir
  ir=$(cat "$work"/cg."$label".*.1 | awk '/^summary:/ {s += $2} END {print s}')
  printf '%-14s %8d requests %12d instructions %8d per request\n' "$label" "$n" "$ir" $((ir / n))
  eval "ir_$label=$((ir / n))"
}

for form in plain tls; do
  scheme=http; [ "$form" = tls ] && scheme=https
  p=$(port)
  count "serve_$form" "$scheme://127.0.0.1:$p/v1/check" "-s $work/check.lua" \
    "$bin" serve --config "$work/serve-$form.yaml" --http "127.0.0.1:$p" --grpc "127.0.0.1:$(port)" --workers 1
  p=$(port)
  count "proxy_$form" "$scheme://127.0.0.1:$p/api/x" "-H X-Api-Key:k1" \
    "$bin" proxy --config "$work/proxy-$form.yaml" --listen "127.0.0.1:$p"
done
python3 -c "print(f'TLS/plain instructions per request: serve {$ir_serve_tls/$ir_serve_plain:.2f}x, proxy {$ir_proxy_tls/$ir_proxy_plain:.2f}x')"
