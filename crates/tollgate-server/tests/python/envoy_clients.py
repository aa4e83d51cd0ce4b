"""Drives `tollgate serve` from Python's gRPC and HTTP stacks: grpcio with the stubs
that `xds-protos` generates from Envoy's published protos, and urllib with
protobuf's own proto3 JSON mapping (json_format) for /json. Run by the Rust test
tests/foreign_clients.rs, which starts the server and passes its addresses:

    python3 envoy_clients.py GRPC_ADDR HTTP_URL

Prints one line per check and exits non-zero on the first that fails.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import json_format, wrappers_pb2

grpc_addr, http_url = sys.argv[1], sys.argv[2]
Code = rls_pb2.RateLimitResponse.Code
Unit = rls_pb2.RateLimitResponse.RateLimit.Unit


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"), flush=True)
    if not ok:
        # Not sys.exit: grpcio's threads can hold the interpreter's shutdown.
        os._exit(1)


def descriptor(key, value, hits=None, limit=None):
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    if limit is not None:
        d.limit.CopyFrom(
            ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(
                requests_per_unit=limit[0], unit=limit[1]
            )
        )
    return d


def request(domain, descriptors, hits=0):
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits)


channel = grpc.insecure_channel(grpc_addr)
stub = rls_pb2_grpc.RateLimitServiceStub(channel)

# The domain the Rust test loads: key `user`, 3 per minute, named `per_user`. The
# sequences below count within one clock minute: they start with at least 20 s of it
# left (they take well under a second; the machine's own start-up is behind us).
left = 60 - time.time() % 60
if left < 20:
    time.sleep(left + 0.05)
r = stub.ShouldRateLimit(request("py", [descriptor("user", "alice")]), timeout=5)
s = r.statuses[0]
check("grpc: first call OK", r.overall_code == Code.OK, r)
check(
    "grpc: current_limit as configured",
    (s.current_limit.name, s.current_limit.requests_per_unit, s.current_limit.unit)
    == ("per_user", 3, Unit.MINUTE),
    s,
)
check("grpc: 2 remaining", s.limit_remaining == 2, s)
check(
    "grpc: duration_until_reset within the minute, whole seconds",
    0 < s.duration_until_reset.seconds <= 60 and s.duration_until_reset.nanos == 0,
    s,
)
r = stub.ShouldRateLimit(request("py", [descriptor("user", "alice", hits=0)]), timeout=5)
check("grpc: hits_addend 0 looks without counting", r.statuses[0].limit_remaining == 2, r)
r = stub.ShouldRateLimit(request("py", [descriptor("user", "alice")], hits=2), timeout=5)
check("grpc: request hits_addend 2 takes the rest", r.statuses[0].limit_remaining == 0, r)
r = stub.ShouldRateLimit(request("py", [descriptor("user", "alice")]), timeout=5)
check("grpc: then OVER_LIMIT", r.overall_code == Code.OVER_LIMIT, r)
r = stub.ShouldRateLimit(
    request("py", [descriptor("user", "bob", limit=(1, Unit.SECOND))]), timeout=5
)
check(
    "grpc: a limit override applies",
    r.statuses[0].current_limit.requests_per_unit == 1
    and r.statuses[0].current_limit.unit == Unit.SECOND,
    r,
)
# The two-call token pattern (Envoy's apply_on_stream_done): a look before the
# request, the usage reported when the stream ends. Rejected hits are counted, as
# envoyproxy/ratelimit counts them, so an overspend blocks the key until the window
# pays it back.
r = stub.ShouldRateLimit(request("py", [descriptor("user", "dave", hits=0)]), timeout=5)
check("grpc: tokens: the look before finds budget", r.overall_code == Code.OK and r.statuses[0].limit_remaining == 3, r)
r = stub.ShouldRateLimit(request("py", [descriptor("user", "dave", hits=5)]), timeout=5)
check("grpc: tokens: 5 used of 3 is over", r.overall_code == Code.OVER_LIMIT, r)
r = stub.ShouldRateLimit(request("py", [descriptor("user", "dave", hits=0)]), timeout=5)
check("grpc: tokens: the next look finds the key over its limit", r.overall_code == Code.OVER_LIMIT, r)
try:
    stub.ShouldRateLimit(request("", [descriptor("user", "x")]), timeout=5)
    check("grpc: empty domain is an error", False, "answered")
except grpc.RpcError as e:
    check(
        "grpc: empty domain is an error",
        e.code() == grpc.StatusCode.INVALID_ARGUMENT and "domain" in e.details(),
        e,
    )


def post_json(body):
    req = urllib.request.Request(
        http_url + "/json", data=body.encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# /json takes what protobuf's own JSON writer makes of a RateLimitRequest (64-bit
# integers as strings, enums by name) and answers what its JSON reader accepts.
body = json_format.MessageToJson(
    request("py", [descriptor("user", "carol", hits=2, limit=(5, Unit.HOUR))])
)
status, text = post_json(body)
check("json: 200 for OK", status == 200, (status, text))
parsed = json_format.Parse(text, rls_pb2.RateLimitResponse())
s = parsed.statuses[0]
check(
    "json: a RateLimitResponse by protobuf's reader",
    parsed.overall_code == Code.OK
    and s.limit_remaining == 3
    and s.current_limit.requests_per_unit == 5
    and s.current_limit.unit == Unit.HOUR,
    text,
)
status, text = post_json(
    json_format.MessageToJson(request("py", [descriptor("user", "carol", hits=4, limit=(5, Unit.HOUR))]))
)
parsed = json_format.Parse(text, rls_pb2.RateLimitResponse())
check("json: 429 for OVER_LIMIT", status == 429 and parsed.overall_code == Code.OVER_LIMIT, text)
# The token pattern over /json, with protobuf's JSON writer.
status, text = post_json(json_format.MessageToJson(request("py", [descriptor("user", "erin", hits=0)])))
check("json: tokens: the look before is OK", status == 200, (status, text))
status, text = post_json(json_format.MessageToJson(request("py", [descriptor("user", "erin", hits=4)])))
check("json: tokens: 4 used of 3 is over", status == 429, (status, text))
status, text = post_json(json_format.MessageToJson(request("py", [descriptor("user", "erin", hits=0)])))
parsed = json_format.Parse(text, rls_pb2.RateLimitResponse())
check("json: tokens: the next look is OVER_LIMIT", status == 429 and parsed.statuses[0].code == Code.OVER_LIMIT, text)
status, text = post_json('{"domain": "py", "descriptors": [{"entries": [{"key": "user"}]}], "bogus": 1}')
check("json: 400 for an unknown field, naming it", status == 400 and "bogus" in json.loads(text)["error"], text)
status, text = post_json(json_format.MessageToJson(request("", [descriptor("user", "x")])))
check("json: 400 for an empty domain", status == 400, (status, text))
print("all checks passed", flush=True)
# grpcio's threads can hold the interpreter's shutdown (seen once in many runs).
os._exit(0)
