#!/usr/bin/env bash
# Builds the tollgate image with podman (deploy/Containerfile) from a release build,
# FROM scratch: the binary, the shared libraries `ldd` lists for it, the loader, a
# passwd/group with nobody, and nsswitch.conf.
#
# Usage: scripts/image.sh [tag]            (default tag: tollgate:dev)
#        scripts/image.sh [tag] --run      then runs it as Envoy Gateway does (user
#                                          65534, read-only root, no capabilities)
#                                          on the host network, with the built-in
#                                          example rules and a Redis reached by a
#                                          Kubernetes service name (--add-host), and
#                                          checks /healthcheck, /readyz (Redis
#                                          found by name) and a gRPC call.
# TOLLGATE_BIN=path uses that binary instead of a release build (the test command
# builds the image from its debug build).
# On this machine `podman run` needs `--runtime runc` (cgroups in hybrid mode) and
# explicit ulimits (no higher than the shell's hard limits); both are passed.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-tollgate:dev}
run=${2:-}
command -v podman >/dev/null || { apt-get update -qq && apt-get install -y -qq podman runc >/dev/null; }
bin=${TOLLGATE_BIN:-}
[ -n "$bin" ] && bin=$(realpath "$bin")
if [ -z "$bin" ]; then
    cargo build --release -q -p tollgate-server
    bin=target/release/tollgate
fi
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
root=$ctx/rootfs
mkdir -p "$root/bin" "$root/etc"
cp "$bin" "$root/bin/tollgate"
ln -s tollgate "$root/bin/ratelimit"
# Every library the binary loads, at the path the loader looks for it.
ldd "$bin" | awk '/=> \// {print $3} /^[ \t]*\/lib/ {print $1}' | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done
printf 'root:x:0:0:root:/:/bin/tollgate\nnobody:x:65534:65534:nobody:/:/bin/tollgate\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
# The system's roots, for TLS to a managed Redis whose CA is a public one.
mkdir -p "$root/etc/ssl/certs"
cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
cp deploy/Containerfile "$ctx/Containerfile"
podman build -q -t "$tag" "$ctx" >/dev/null
echo "built $tag ($(podman image inspect "$tag" --format '{{.Size}}') bytes)"
[ "$run" = --run ] || exit 0

. scripts/lib/bench.sh
http=$(free_port)
grpc=$(free_port)
redis=$(free_port)
name=tollgate-image-check-$$
redis_pid=
trap 'podman rm -f "$name" >/dev/null 2>&1 || true; [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null; rm -rf "$ctx"' EXIT
redis-server --port "$redis" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
redis_pid=$!
service=redis-master.limits.svc.cluster.local
podman run -d --rm --name "$name" --runtime runc --network host \
    --add-host "$service:127.0.0.1" \
    -e REDIS_SOCKET_TYPE=tcp -e REDIS_URL="$service:$redis" \
    --user 65534:65534 --read-only --cap-drop ALL --security-opt no-new-privileges \
    --ulimit nofile="$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096 \
    -e HOST=127.0.0.1 -e PORT="$http" -e GRPC_HOST=127.0.0.1 -e GRPC_PORT="$grpc" \
    --entrypoint /bin/ratelimit "$tag" >/dev/null
# Up, then ready (Redis found by its name): a busy machine takes a while.
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$http/readyz" >/dev/null && break
    sleep 0.1
done
health=$(curl -s "http://127.0.0.1:$http/healthcheck" || true)
ready=$(curl -s "http://127.0.0.1:$http/readyz" || true)
calls=$("$bin" bench grpc --target "127.0.0.1:$grpc" --concurrency 1 --duration 1s 2>&1 | tail -1 || true)
echo "healthcheck: $health"
echo "readyz (Redis at $service): $ready"
echo "gRPC from the host: $calls"
logs=$(podman logs "$name" 2>&1 || true)
echo "${logs%%$'\n'*}"
[ "$health" = OK ] && [ "$ready" = OK ] && [[ "$calls" == *"errors: 0"* ]] || {
    echo "scripts/image.sh: the image does not serve as it should" >&2
    exit 1
}
echo "the image serves as user 65534 on a read-only root without capabilities"
