#!/usr/bin/env bash
# The one test command (see README): builds and runs the whole test suite.
# Installs what the tests need when it is missing, and starts/stops any servers itself.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "scripts/test.sh: cargo is required (https://rustup.rs)" >&2
    exit 1
fi

# What the tests (and the Redis module's build) need, installed where it is missing.
. scripts/lib/needs.sh
# Servers already running on this machine (a packaged nginx on port 80, redis-server on
# 6379) are left alone: the tests run their own on free loopback ports.

# Property tests: 400 cases per property by default; PROPTEST_CASES=100000 for a soak.
export PROPTEST_CASES="${PROPTEST_CASES:-400}"

# Module imports point one way in every crate (no cycles), and crates depend only on
# crates below them.
python3 scripts/import-graph.py
# The Redis suites load the tollgate module into their servers (--loadmodule): built
# first, its path given to them.
cargo build -p tollgate-redis-module --locked
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
export TOLLGATE_REDIS_MODULE="$target_dir/debug/libtollgate_redis_module.so"
# --all-features includes the server's external-servers: the tests that start
# redis-server and nginx run too.
cargo test --workspace --all-targets --all-features --locked
# The Redis suites again on Valkey 8: decisions and conformance (memory = Functions =
# EVALSHA = the module = Cluster), the module's writes on a replica, the one interface,
# leases, permits, faults, Sentinel failovers, and the quota ledger shared by serve instances (TLS is left to Redis: this Valkey
# has none).
export TOLLGATE_REDIS_SERVER="$valkey_bin/valkey-server" TOLLGATE_REDIS_CLI="$valkey_bin/valkey-cli"
# The test binaries the build above made, run as cargo runs them (from their
# package's directory): `cargo test --test X` alone would unify features differently
# and build some of them again.
declare -A test_bin test_dir
while read -r name exe dir; do
    test_bin[$name]=$exe
    test_dir[$name]=$dir
done < <(cargo test --workspace --all-targets --all-features --locked --no-run --message-format=json \
    | python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and t.get("kind") == ["test"] and m.get("executable"):
        print(t["name"], m["executable"], os.path.dirname(m["manifest_path"]))')
run_test() { # test-target [filters...]
    local name=$1
    shift
    [ -n "${test_bin[$name]:-}" ] || {
        echo "scripts/test.sh: the build above made no test binary named $name" >&2
        exit 1
    }
    echo "     Running tests/$name.rs on Valkey"
    (cd "${test_dir[$name]}" && "${test_bin[$name]}" "$@")
}
for t in redis redis_conformance rate_limiter redis_lease redis_concurrency redis_link replication; do run_test "$t"; done
run_test redis_sentinel failover
run_test rlqs in_redis redis_outage two_servers cluster_with
run_test serve_redis in_redis redis_outage two_servers cluster_with
unset TOLLGATE_REDIS_SERVER TOLLGATE_REDIS_CLI
# The doctests (the guide's recipes among them: docs/library.md) and the per-store
# example (docs/redis.md), run against a redis-server of their own, stopped by PID.
redis_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
redis_pid=$!
trap 'kill "$redis_pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
TOLLGATE_TEST_REDIS_URL="redis://127.0.0.1:$redis_port/" cargo test --workspace --doc --all-features --locked
cargo run -q -p tollgate --all-features --locked --example stores -- "redis://127.0.0.1:$redis_port/"
# The tower, axum, http and tonic features' examples, as a user runs them (each checks its own answers and exits).
cargo run -q -p tollgate --features tower --locked --example axum -- --check
cargo run -q -p tollgate --features tower --locked --example adaptive -- --check
cargo run -q -p tollgate --features axum --locked --example per_peer_ip -- --check
cargo run -q -p tollgate --features http --locked --example headers -- --check
# The tonic feature's example: a gRPC service behind the layer, called with tonic's client.
cargo run -q -p tollgate --features tonic,redis --locked --example grpc -- --check
kill "$redis_pid"
# The image (deploy/Containerfile, FROM scratch) built with podman from the debug build
# and run as Envoy Gateway runs it: user 65534, read-only root, no capabilities, as
# /bin/ratelimit; it must answer /healthcheck, find Redis by a service name, and
# decide a gRPC call from the host.
need podman /usr/bin/podman
need runc /usr/sbin/runc
# (The binary the server tests ran, in $target_dir found above.)
TOLLGATE_BIN="$target_dir/debug/tollgate" scripts/image.sh tollgate:test --run
# The keyed fast path's gate, model-checked with loom (all interleavings of a reader
# and a writer; own target directory, since the cfg rebuilds every dependency).
RUSTFLAGS="--cfg tollgate_loom" CARGO_TARGET_DIR=target/loom \
    cargo test -p tollgate --lib --release --locked reader_gate::model
