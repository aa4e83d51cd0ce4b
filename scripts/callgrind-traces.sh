#!/usr/bin/env bash
# What traces cost per request, counted in instructions under callgrind (repeatable,
# where req/s on this machine is not): `tollgate serve` HTTP /v1/check and the proxy,
# with traces off, on at 1% of new traces (parentbased_traceidratio 0.01), the same
# with requests that carry a caller's unsampled `traceparent` (as Envoy sends when it
# samples 1%: the context is read, nothing is recorded), and on for every request,
# exporting to an OTLP/HTTP sink on Python's http.server. wrk drives each on kept
# connections; the figures are per request, after a warm-up.
#
# With BASELINE_BIN (another build, e.g. the previous release) its figures without
# traces are counted too, in the same run.
#
# Usage: [BASELINE_BIN=old/tollgate] scripts/callgrind-traces.sh   (valgrind, wrk, python3)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench.sh
cargo build --release -q -p tollgate-server
bin=$PWD/target/release/tollgate
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
cat >"$work/check.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.body = '{"domain":"example","descriptors":[{"entries":[{"key":"api_key","value":"k1"}]}]}'
LUA
cat >"$work/sink.py" <<'PY'
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
PY
sink=$(free_port)
python3 "$work/sink.py" "$sink" & pids+=($!)
up=$(free_port)
"$bin" bench ceiling --listen "127.0.0.1:$up" >/dev/null 2>&1 & pids+=($!)
printf 'proxy:\n  routes:\n    - name: api\n      upstream: http://127.0.0.1:%s\n      key: header:X-Api-Key\n      policies: ["limit-req:rate=1000000/s,burst=1000,nodelay"]\n' "$up" \
    >"$work/proxy.yaml"

declare -A per
if [ -n "${BASELINE_BIN:-}" ]; then
  p=$(free_port)
  callgrind_per_request "$work" "serve_baseline" "http://127.0.0.1:$p/v1/check" "-s $work/check.lua" \
    "$BASELINE_BIN" serve --http "127.0.0.1:$p" --grpc "127.0.0.1:$(free_port)" --workers 1
  p=$(free_port)
  callgrind_per_request "$work" "proxy_baseline" "http://127.0.0.1:$p/api/x" "-H X-Api-Key:k1" \
    "$BASELINE_BIN" proxy --config "$work/proxy.yaml" --listen "127.0.0.1:$p"
fi
unsampled="-H traceparent:00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
for form in off 1pct context all; do
  context=""
  case $form in
    off) otel=(OTEL_SDK_DISABLED=true) ;;
    1pct|context) otel=(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$sink"
                OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.01) ;;
    all) otel=(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$sink") ;;
  esac
  [ "$form" = context ] && context=$unsampled
  # Exported for valgrind and the server it runs (valgrind does not follow `env`'s exec).
  export "${otel[@]}"
  p=$(free_port)
  callgrind_per_request "$work" "serve_$form" "http://127.0.0.1:$p/v1/check" "-s $work/check.lua $context" \
    "$bin" serve --http "127.0.0.1:$p" --grpc "127.0.0.1:$(free_port)" --workers 1
  per[serve_$form]=$CG_PER_REQUEST
  p=$(free_port)
  callgrind_per_request "$work" "proxy_$form" "http://127.0.0.1:$p/api/x" "-H X-Api-Key:k1 $context" \
    "$bin" proxy --config "$work/proxy.yaml" --listen "127.0.0.1:$p"
  per[proxy_$form]=$CG_PER_REQUEST
  unset "${otel[@]%%=*}"
done
for server in serve proxy; do
  off=${per[${server}_off]}
  line="$server: instructions per request: off $off"
  for form in 1pct context all; do
    n=${per[${server}_$form]}
    line+=$(printf ', %s %d (%+.1f%%)' "$form" "$n" "$(echo "($n - $off) * 100 / $off" | bc -l)")
  done
  echo "$line"
done
