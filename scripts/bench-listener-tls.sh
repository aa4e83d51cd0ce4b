#!/usr/bin/env bash
# What TLS on the listeners costs, side by side in one run: two `tollgate serve`
# processes from one binary and one config, one plain and one with TLS on both
# listeners (gRPC with mutual TLS, as Envoy Gateway runs it), two `tollgate proxy`
# (plain, HTTPS) in front of one upstream (`tollgate bench ceiling`), and nginx (one
# worker, an equivalent limit_req, a plain and an HTTPS listener) in front of the same
# upstream as the reference, answering the same loads in alternating rounds on kept
# connections: gRPC ShouldRateLimit from `tollgate bench grpc`, HTTP /v1/check and
# proxied GETs from wrk.
#
# Each server runs on CPU 0 with one worker, every client (and the upstream) on CPU 1.
# A TLS client spends more than a plain one, so on two cores the clients can become
# the bottleneck and hide what TLS costs the server; each server is therefore also held
# to QUOTA % of one CPU (a CFS quota in a cgroup of its own; QUOTA=0 turns it off),
# which makes it the bottleneck, so decisions/s is the server's capacity. The server's
# CPU per request (from /proc/PID/stat) is printed as well. Then what a new TLS
# connection costs: full handshakes a second from `openssl s_time -new` and the
# server's CPU per handshake. Medians of ROUNDS rounds; TLS/plain ratios.
#
# Usage: [QUOTA=40] scripts/bench-listener-tls.sh [seconds] [rounds] [concurrency]
# (needs two CPUs; taskset is util-linux's; the quota needs a writable cgroup tree)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench.sh
secs=${1:-5}
rounds=${2:-3}
conc=${3:-32}
quota=${QUOTA:-40}
for tool in wrk nginx openssl; do
    command -v "$tool" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$tool" >/dev/null; }
done
cargo build --release -q -p tollgate-server
bin=$PWD/target/release/tollgate
dir=$(mktemp -d)
bench_pki "$dir" server client
upstream=$(free_port)
declare -A http grpc pid proxy ppid nginx
for form in plain tls; do
    http[$form]=$(free_port)
    grpc[$form]=$(free_port)
    proxy[$form]=$(free_port)
    nginx[$form]=$(free_port)
done
(
    cd "$dir"
    cat >tls.yaml <<EOF
listen:
  grpc_tls: {cert_file: $dir/server.pem, key_file: $dir/server.key, client_ca_file: $dir/ca.pem}
  http_tls: {cert_file: $dir/server.pem, key_file: $dir/server.key}
EOF
    echo "listen: {}" >plain.yaml
    for form in plain tls; do
        tls=""
        [ "$form" = tls ] && tls="  tls: {cert_file: $dir/server.pem, key_file: $dir/server.key}"
        cat >proxy-$form.yaml <<EOF
proxy:
$tls
  routes:
    - name: api
      match: { path_prefix: /api/ }
      upstream: http://127.0.0.1:$upstream
      key: header:X-Api-Key
      policies: ["limit-req:rate=1000000/s,burst=1000,nodelay"]
EOF
    done
    cat >key.lua <<'EOF'
counter = 0
request = function()
  counter = counter + 1
  return wrk.format("GET", "/api/x", {["X-Api-Key"] = "k" .. (counter % 1000)})
end
EOF
    cat >check.lua <<'EOF'
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
counter = 0
request = function()
  counter = counter + 1
  return wrk.format(nil, "/v1/check", nil,
    '{"domain":"example","descriptors":[{"entries":[{"key":"api_key","value":"k' .. (counter % 1000) .. '"}]}]}')
end
EOF
)
taskset -c 1 "$bin" bench ceiling --listen "127.0.0.1:$upstream" >/dev/null 2>&1 &
uppid=$!
for form in plain tls; do
    taskset -c 0 "$bin" serve --config "$dir/$form.yaml" --http "127.0.0.1:${http[$form]}" \
        --grpc "127.0.0.1:${grpc[$form]}" --workers 1 >/dev/null 2>&1 &
    pid[$form]=$!
    taskset -c 0 "$bin" proxy --config "$dir/proxy-$form.yaml" --listen "127.0.0.1:${proxy[$form]}" \
        >/dev/null 2>&1 &
    ppid[$form]=$!
done
nginx_bench_conf "$dir/nginx.conf" "$upstream" on "${nginx[plain]}" "${nginx[tls]} ssl"
taskset -c 0 nginx -p "$dir" -c "$dir/nginx.conf" &
ngpid=$!
groups=()
cleanup() {
    kill "${pid[plain]}" "${pid[tls]}" "${ppid[plain]}" "${ppid[tls]}" "$ngpid" "$uppid" 2>/dev/null || true
    wait 2>/dev/null || true
    cpu_quota_remove "${groups[@]}"
    rm -rf "$dir"
}
trap cleanup EXIT
sleep 1
ngworker=$(pgrep -P "$ngpid" | head -1)
hold_to_quota "tollgate-bench-$$" "$quota" "${pid[plain]}" "${pid[tls]}" "${ppid[plain]}" "${ppid[tls]}" "$ngworker"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# gRPC: prints "decisions/s us-of-server-cpu-per-decision".
grpc_run() { # form
    local form=$1 before after out rate
    local tls=()
    [ "$form" = tls ] && tls=(--ca "$dir/ca.pem" --cert "$dir/client.pem" --key-file "$dir/client.key")
    before=$(ticks "${pid[$form]}")
    out=$(taskset -c 1 "$bin" bench grpc --target "127.0.0.1:${grpc[$form]}" "${tls[@]}" \
        --concurrency "$conc" --duration "${secs}s" 2>/dev/null | tail -1)
    after=$(ticks "${pid[$form]}")
    rate=$(echo "$out" | sed -E 's#.*req/s: ([0-9.]+).*#\1#')
    python3 -c "r=$rate; print(f'{r:.0f} {($after-$before)/$hz*1e6/(r*$secs):.2f}')"
}
# wrk against a server: its requests/s and the server's CPU per request (us).
wrk_run() { # form server-pid port script
    local form=$1 server=$2 port=$3 script=$4 scheme=http before after rate
    [ "$form" = tls ] && scheme=https
    before=$(ticks "$server")
    rate=$(taskset -c 1 wrk -t 1 -c "$conc" -d "${secs}s" -s "$dir/$script" "$scheme://127.0.0.1:$port" \
        | awk '/Requests\/sec/ {print int($2)}')
    after=$(ticks "$server")
    python3 -c "r=$rate; print(f'{r:.0f} {($after-$before)/$hz*1e6/(r*$secs):.2f}')"
}
# HTTP /v1/check on serve, GETs through the proxy, and the same GETs through nginx.
http_run() { wrk_run "$1" "${pid[$1]}" "${http[$1]}" check.lua; }
proxy_run() { wrk_run "$1" "${ppid[$1]}" "${proxy[$1]}" key.lua; }
nginx_run() { wrk_run "$1" "$ngworker" "${nginx[$1]}" key.lua; }
declare -A g gc h hc x xc n nc
for round in $(seq "$rounds"); do
    for form in plain tls; do
        read -r rate cpu < <(grpc_run "$form")
        g[$form]+="$rate "; gc[$form]+="$cpu "
        read -r hr hcpu < <(http_run "$form")
        h[$form]+="$hr "; hc[$form]+="$hcpu "
        read -r xr xcpu < <(proxy_run "$form")
        x[$form]+="$xr "; xc[$form]+="$xcpu "
        read -r nr ncpu < <(nginx_run "$form")
        n[$form]+="$nr "; nc[$form]+="$ncpu "
        echo "round $round $form: gRPC $rate decisions/s, ${cpu} us server CPU each; HTTP (wrk) $hr req/s, ${hcpu} us each; proxy (wrk) $xr req/s, ${xcpu} us each; nginx (wrk) $nr req/s, ${ncpu} us each" >&2
    done
done
# New connections: full TLS handshakes a second, and the server's CPU for each.
before=$(ticks "${pid[tls]}")
hs=$(taskset -c 1 openssl s_time -connect "127.0.0.1:${http[tls]}" -new -time "$secs" 2>/dev/null \
    | awk '/connections in/ && /real seconds/ {print $1; exit}')
after=$(ticks "${pid[tls]}")
echo "concurrency $conc, ${secs}s runs, medians of $rounds rounds, servers $held"
for what in g gc h hc x xc n nc; do
    declare -n m=$what
    p=$(median ${m[plain]}); t=$(median ${m[tls]})
    case $what in
        g) label="gRPC ShouldRateLimit decisions/s (kept connections; mutual TLS)" ;;
        gc) label="gRPC server CPU per decision (us)" ;;
        h) label="HTTP /v1/check req/s (wrk, kept connections)" ;;
        hc) label="HTTP server CPU per request (us)" ;;
        x) label="proxy GET req/s (wrk, kept connections)" ;;
        xc) label="proxy CPU per request (us)" ;;
        n) label="nginx GET req/s (wrk, kept connections; the reference)" ;;
        nc) label="nginx worker CPU per request (us)" ;;
    esac
    echo "$label: plain $p, TLS $t, TLS/plain $(python3 -c "print(round($t/$p, 2))")"
done
python3 -c "n=$hs; print(f'new TLS connections (openssl s_time -new, full handshakes): {n/$secs:.0f}/s, server CPU {($after-$before)/$hz*1e6/max(n,1):.0f} us each')"
