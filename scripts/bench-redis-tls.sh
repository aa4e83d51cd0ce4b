#!/usr/bin/env bash
# What TLS to Redis costs, side by side on one redis-server of our own that listens
# both in plain text and over TLS (--port and --tls-port, one process, so both forms
# meet the same server): `tollgate bench redis` batched (--batch 64) and unbatched
# (--batch 1), plain and TLS alternating, ROUNDS rounds; prints each round's checks/s
# and Redis CPU per check (from /proc: user + system of redis-server), then medians
# and the TLS/plain ratios.
#
# Usage: scripts/bench-redis-tls.sh [seconds] [rounds] [callers]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
rounds=${2:-3}
callers=${3:-256}
cargo build --release -q -p tollgate-server
bin=target/release/tollgate
. scripts/lib/bench.sh
dir=$(mktemp -d)
bench_pki "$dir" server
port=$(free_port)
tls_port=$(free_port)
(cd "$dir" && exec redis-server --port "$port" --tls-port "$tls_port" --bind 127.0.0.1 \
    --tls-cert-file server.pem --tls-key-file server.key --tls-ca-cert-file ca.pem \
    --tls-auth-clients no --save '' --appendonly no >/dev/null 2>&1) &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)

# One run: prints "checks/s us-of-redis-cpu-per-check".
run() { # url batch [tls args...]
    local url=$1 batch=$2
    shift 2
    local before after out
    before=$(ticks)
    out=$("$bin" bench redis --redis-url "$url" "$@" --policy 'gcra:rate=1000/s,burst=100' \
        --concurrency "$callers" --keys 10000 --duration "${secs}s" --batch "$batch")
    after=$(ticks)
    local rate
    rate=$(echo "$out" | sed -E 's/^[a-z/]+: ([0-9.]+).*/\1/' | head -1)
    python3 -c "r=$rate; print(f'{r:.0f} {($after-$before)/$hz*1e6/(r*$secs):.2f}')"
}

declare -A results
for round in $(seq "$rounds"); do
    for batch in 64 1; do
        for form in plain tls; do
            if [ "$form" = plain ]; then
                r=$(run "redis://127.0.0.1:$port/" "$batch")
            else
                r=$(run "rediss://127.0.0.1:$tls_port/" "$batch" --redis-ca "$dir/ca.pem")
            fi
            echo "round $round batch $batch $form: $r (checks/s, Redis CPU us per check)"
            results[$batch-$form]+="$r;"
        done
    done
done
python3 - "${results[64-plain]}" "${results[64-tls]}" "${results[1-plain]}" "${results[1-tls]}" <<'EOF'
import statistics, sys
def parse(s):
    rows = [r.split() for r in s.strip(';').split(';')]
    return [float(r[0]) for r in rows], [float(r[1]) for r in rows]
for name, (plain, tls) in (("batched (64)", sys.argv[1:3]), ("unbatched (1)", sys.argv[3:5])):
    (pr, pc), (tr, tc) = parse(plain), parse(tls)
    print(f"{name}: plain {statistics.median(pr):.0f} checks/s, {statistics.median(pc):.2f} us Redis CPU/check; "
          f"TLS {statistics.median(tr):.0f} checks/s, {statistics.median(tc):.2f} us; "
          f"TLS/plain throughput {statistics.median(tr)/statistics.median(pr):.2f}x, "
          f"Redis CPU {statistics.median(tc)/statistics.median(pc):.2f}x")
EOF
