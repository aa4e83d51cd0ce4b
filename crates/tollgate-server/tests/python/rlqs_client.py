"""Drives `tollgate serve`'s rate limit quota service (RLQS) from Python's grpcio with
the stubs `xds-protos` generates from Envoy's published protos: a stack no one here
wrote checks the stream's wire. Run by tests/foreign_clients.rs, which starts the
server with a `quota_buckets` rule (domain `py`, bucket `{name: api}`, 100/s):

    python3 rlqs_client.py GRPC_ADDR

Prints one line per check and exits non-zero on the first that fails.
"""

import os
import queue
import sys
import threading

import grpc
from envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc
from envoy.type.v3 import ratelimit_strategy_pb2
from google.protobuf import duration_pb2

grpc_addr = sys.argv[1]
Blanket = ratelimit_strategy_pb2.RateLimitStrategy.BlanketRule


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"), flush=True)
    if not ok:
        # Not sys.exit: grpcio's threads can hold the interpreter's shutdown.
        os._exit(1)


def usage(bucket, allowed=0, denied=1, elapsed_ms=1):
    return rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage(
        bucket_id=rlqs_pb2.BucketId(bucket=bucket),
        time_elapsed=duration_pb2.Duration(nanos=elapsed_ms * 1_000_000),
        num_requests_allowed=allowed,
        num_requests_denied=denied,
    )


class Stream:
    """One Envoy's stream: reports are put on a queue the request iterator reads."""

    def __init__(self, channel):
        self.out = queue.Queue()
        stub = rlqs_pb2_grpc.RateLimitQuotaServiceStub(channel)
        self.responses = stub.StreamRateLimitQuotas(iter(self.out.get, None))

    def send(self, domain, usages):
        self.out.put(rlqs_pb2.RateLimitQuotaUsageReports(domain=domain, bucket_quota_usages=usages))

    def next_actions(self, timeout=5.0):
        result = {}

        def read():
            try:
                result["response"] = next(self.responses)
            except Exception as e:  # the stream's end, with its status
                result["error"] = e

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout)
        if "error" in result:
            raise result["error"]
        check("an answer within 5 s", "response" in result)
        return list(result["response"].bucket_action)

    def close(self):
        self.out.put(None)


channel = grpc.insecure_channel(grpc_addr)

# The first report subscribes the bucket: an assignment comes back for it. Its
# time_elapsed is 0, as Envoy's first report of a bucket has it.
a = Stream(channel)
a.send("py", [usage({"name": "api"}, elapsed_ms=0)])
actions = a.next_actions()
check("one action for the reported bucket", len(actions) == 1, actions)
act = actions[0]
check("it names the bucket", dict(act.bucket_id.bucket) == {"name": "api"}, act.bucket_id)
check("it is an assignment", act.HasField("quota_assignment_action"), act)
q = act.quota_assignment_action
ttl = q.assignment_time_to_live.seconds + q.assignment_time_to_live.nanos / 1e9
check("with a time to live", 0 < ttl <= 3600, ttl)
tb = q.rate_limit_strategy.token_bucket
check("as a token bucket", q.rate_limit_strategy.HasField("token_bucket"), q)
fill = tb.fill_interval.seconds + tb.fill_interval.nanos / 1e9
rate_a = tb.tokens_per_fill.value / fill
check("within the budget (100/s)", 0 < rate_a <= 100 and 1 <= tb.max_tokens <= 100, (rate_a, tb))

# A second Envoy: its share and the first one's together stay within the budget.
b = Stream(channel)
b.send("py", [usage({"name": "api"})])
tb_b = b.next_actions()[0].quota_assignment_action.rate_limit_strategy.token_bucket
rate_b = tb_b.tokens_per_fill.value / (tb_b.fill_interval.seconds + tb_b.fill_interval.nanos / 1e9)
check("two shares within the budget", rate_a + rate_b <= 100, (rate_a, rate_b))

# A bucket no rule takes: allowed, not limited here (renewals of the api share may
# come first).
b.send("", [usage({"name": "other"})])
for _ in range(5):
    acts = [x for x in b.next_actions() if dict(x.bucket_id.bucket) == {"name": "other"}]
    if acts:
        break
check("an unknown bucket is answered", len(acts) == 1, acts)
act = acts[0]
check(
    "an unknown bucket is ALLOW_ALL",
    act.quota_assignment_action.rate_limit_strategy.blanket_rule == Blanket.ALLOW_ALL,
    act,
)

# A bucket of a blanket rule (blanket: deny_all): DENY_ALL at once, for a minute
# (renewals of the api share may come first).
b.send("", [usage({"name": "blocked"})])
for _ in range(5):
    acts = [x for x in b.next_actions() if dict(x.bucket_id.bucket) == {"name": "blocked"}]
    if acts:
        break
check("a deny_all bucket is answered", len(acts) == 1, acts)
q = acts[0].quota_assignment_action
check("as DENY_ALL", q.rate_limit_strategy.blanket_rule == Blanket.DENY_ALL, q)
check("for 60 s", q.assignment_time_to_live.seconds == 60, q)

# A stream whose first report names no domain ends with INVALID_ARGUMENT.
c = Stream(channel)
c.send("", [usage({"name": "api"})])
try:
    c.next_actions()
    check("no domain is refused", False, "an answer came")
except grpc.RpcError as e:
    check("no domain is INVALID_ARGUMENT", e.code() == grpc.StatusCode.INVALID_ARGUMENT, e)
    check("which says why", "domain" in (e.details() or ""), e.details())

# A report without time_elapsed: INVALID_ARGUMENT as well.
d = Stream(channel)
bad = usage({"name": "api"})
bad.ClearField("time_elapsed")
d.send("py", [bad])
try:
    d.next_actions()
    check("no time_elapsed is refused", False, "an answer came")
except grpc.RpcError as e:
    check("no time_elapsed is INVALID_ARGUMENT", e.code() == grpc.StatusCode.INVALID_ARGUMENT, e)

for s in (a, b, c, d):
    s.close()
channel.close()
print("all checks passed", flush=True)
# grpcio's threads can hold the interpreter's shutdown (seen once in many runs).
os._exit(0)
