"""Traces from `tollgate serve` (and `tollgate proxy`) into OTLP collectors written here
on Python's http.server and on grpcio, their requests decoded with the OpenTelemetry
protos (`opentelemetry.proto`, as the `xds-protos` package ships them); the callers
are grpcio (B3 metadata, W3C `traceparent` metadata, an RLQS stream) and httpx
(`traceparent`).

    python3 otlp_traces.py TOLLGATE_BINARY

Checks that spans arrive with the caller's trace id and parent, with the decision's
attributes; that an unsampled caller is followed; that malformed context starts a
new trace and fails nothing; that a collector that is down or never answers changes
no decision, its spans dropped and counted, one warning said. Prints one line per
check and "all checks passed" at the end.
"""

import os
import queue
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import httpx
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import duration_pb2


def otlp_protos():
    """The `opentelemetry-proto` package, installed apart by scripts/test.sh: the
    `opentelemetry` package `xds-protos` installs holds OTLP protos from before
    `scope_spans`, and it would shadow this one on the usual path."""
    import types
    where = os.environ.get("TOLLGATE_OTLP_PROTO_DIR",
                           os.path.expanduser("~/.cache/tollgate/opentelemetry-proto-1.39.1"))
    package = types.ModuleType("opentelemetry")
    package.__path__ = [os.path.join(where, "opentelemetry")]
    sys.modules["opentelemetry"] = package
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    return trace_service_pb2


trace_service_pb2 = otlp_protos()

BINARY = sys.argv[1]
WORK = tempfile.mkdtemp(prefix="tollgate-otlp-")
RULES = os.path.join(WORK, "rules.yaml")
with open(RULES, "w") as f:
    f.write(
        "domain: traced\n"
        "descriptors:\n"
        "  - key: user\n"
        '    policies: ["fixed-window:limit=2,window=1h,align=first"]\n'
        "  - key: bulk\n"
        '    policies: ["fixed-window:limit=100000,window=1h,align=first"]\n'
        "quota_buckets:\n"
        "  - bucket: { name: api }\n"
        '    policy: "gcra:rate=100/s,burst=20"\n'
    )
SERVER_SPAN = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER
CLIENT_SPAN = 3
STATUS_ERROR = 2


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"), flush=True)
    if not ok:
        # Not sys.exit: grpcio's threads can hold the interpreter's shutdown.
        os._exit(1)


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class Collector:
    """The spans every export brought, for the checks to wait on."""

    def __init__(self):
        self.spans = []
        self.cv = threading.Condition()

    def add(self, request):
        with self.cv:
            for rs in request.resource_spans:
                resource = {a.key: value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for sp in ss.spans:
                        self.spans.append({
                            "trace": sp.trace_id.hex(),
                            "span": sp.span_id.hex(),
                            "parent": sp.parent_span_id.hex(),
                            "name": sp.name,
                            "kind": sp.kind,
                            "status": sp.status.code,
                            "attrs": {a.key: value(a.value) for a in sp.attributes},
                            "resource": resource,
                        })
            self.cv.notify_all()

    def wait_for(self, what, pred, timeout=20):
        deadline = time.time() + timeout
        with self.cv:
            while True:
                found = [s for s in self.spans if pred(s)]
                if found:
                    return found[0]
                left = deadline - time.time()
                if left <= 0:
                    check(what, False, f"no such span among {len(self.spans)}: {self.spans[-5:]}")
                self.cv.wait(left)

    def traces(self):
        with self.cv:
            return {s["trace"] for s in self.spans}


def http_collector():
    collector = Collector()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            ok = (self.path == "/v1/traces"
                  and self.headers.get("content-type") == "application/x-protobuf")
            if ok:
                collector.add(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                collector.headers = dict(self.headers)
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200 if ok else 400)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return collector, f"http://127.0.0.1:{server.server_address[1]}"


def grpc_collector():
    collector = Collector()

    def export(request, context):
        collector.add(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService",
        {"Export": grpc.unary_unary_rpc_method_handler(
            export,
            request_deserializer=trace_service_pb2.ExportTraceServiceRequest.FromString,
            response_serializer=trace_service_pb2.ExportTraceServiceResponse.SerializeToString,
        )},
    ),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return collector, f"http://127.0.0.1:{port}", server


class Serve:
    """`tollgate serve` on the rules above, with `env` added to this environment."""

    def __init__(self, env, name):
        self.log = os.path.join(WORK, f"{name}.log")
        full = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        full.update(env)
        self.proc = subprocess.Popen(
            [BINARY, "serve", "--rules", RULES, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=open(self.log, "w"), text=True, env=full)
        self.banner = self.proc.stdout.readline()
        self.http = re.search(r"HTTP on (\S+)", self.banner).group(1)
        self.grpc = re.search(r"gRPC on (\S+)", self.banner).group(1)
        self.client = httpx.Client(base_url=self.http, timeout=10)
        self.stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(self.grpc))

    def should_rate_limit(self, user, metadata):
        d = ratelimit_pb2.RateLimitDescriptor(
            entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value=user)])
        return self.stub.ShouldRateLimit(
            rls_pb2.RateLimitRequest(domain="traced", descriptors=[d]),
            metadata=metadata, timeout=10)

    def check(self, key, value, headers=None):
        body = {"domain": "traced", "descriptors": [{"entries": [{"key": key, "value": value}]}]}
        return self.client.post("/v1/check", json=body, headers=headers or {})

    def metric(self, name):
        text = self.client.get("/metrics").text
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(found.group(1)) if found else None

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.proc.stdout.close()


def ids():
    return secrets.token_hex(16), secrets.token_hex(8)


def spans_of_serve_over_http(collector, endpoint):
    serve = Serve({
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "tollgate-under-test",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=s%3Dcret",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }, "http")
    # The banner, its domains, where the rules are, then the traces.
    lines = [serve.proc.stdout.readline() for _ in range(3)]
    check("serve: the banner names the traces' endpoint",
          f"traces: {endpoint}/v1/traces" in lines[-1], lines)

    # gRPC ShouldRateLimit with Envoy's B3 metadata (x-b3-*).
    trace, parent = ids()
    r = serve.should_rate_limit("alice", [("x-b3-traceid", trace), ("x-b3-spanid", parent),
                                          ("x-b3-sampled", "1")])
    check("grpc: the decision is OK", r.overall_code == rls_pb2.RateLimitResponse.OK, r)
    s = collector.wait_for("grpc + x-b3-*: a span in the caller's trace",
                           lambda s: s["trace"] == trace)
    check("grpc + x-b3-*: the caller's span is the parent", s["parent"] == parent, s)
    check("grpc: the span is ShouldRateLimit's, kind server",
          s["name"] == "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
          and s["kind"] == SERVER_SPAN, s)
    a = s["attrs"]
    check("grpc: the span carries the decision",
          a.get("tollgate.domain") == "traced" and a.get("tollgate.outcome") == "OK"
          and a.get("tollgate.rule") == "traced/user" and a.get("tollgate.store") == "memory"
          and a.get("tollgate.remaining") == 1 and a.get("rpc.grpc.status_code") == 0
          and a.get("rpc.system") == "grpc", a)
    check("the resource names the service and OTEL_RESOURCE_ATTRIBUTES",
          s["resource"].get("service.name") == "tollgate-under-test"
          and s["resource"].get("deployment.environment") == "ci", s["resource"])
    check("the export carries OTEL_EXPORTER_OTLP_HEADERS, decoded",
          collector.headers.get("x-api-key") == "s=cret", collector.headers)

    # The single b3 header, and a rejection: the rule that rejected, its wait.
    serve.should_rate_limit("alice", [])
    trace, parent = ids()
    r = serve.should_rate_limit("alice", [("b3", f"{trace}-{parent}-1")])
    check("grpc: the third call is over the limit",
          r.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT, r)
    s = collector.wait_for("grpc + b3: a span in the caller's trace", lambda s: s["trace"] == trace)
    a = s["attrs"]
    check("grpc + b3: parent, outcome OVER_LIMIT, the rule, its retry",
          s["parent"] == parent and a.get("tollgate.outcome") == "OVER_LIMIT"
          and a.get("tollgate.rule") == "traced/user" and a.get("tollgate.retry_after_us", 0) > 0
          and "fixed-window" in a.get("tollgate.policy", ""), s)

    # gRPC with W3C traceparent metadata.
    trace, parent = ids()
    serve.should_rate_limit("bob", [("traceparent", f"00-{trace}-{parent}-01")])
    s = collector.wait_for("grpc + traceparent: a span in the caller's trace",
                           lambda s: s["trace"] == trace)
    check("grpc + traceparent: the caller's span is the parent", s["parent"] == parent, s)

    # /json (Envoy's HTTP API) and /v1/check with traceparent.
    trace, parent = ids()
    body = {"domain": "traced", "descriptors": [{"entries": [{"key": "user", "value": "carol"}]}]}
    r = serve.client.post("/json", json=body, headers={"traceparent": f"00-{trace}-{parent}-01"})
    check("/json: answered", r.status_code == 200, r.text)
    s = collector.wait_for("/json + traceparent: a span in the caller's trace",
                           lambda s: s["trace"] == trace)
    check("/json: parent, name, the HTTP status, the decision",
          s["parent"] == parent and s["name"] == "POST /json" and s["kind"] == SERVER_SPAN
          and s["attrs"].get("http.response.status_code") == 200
          and s["attrs"].get("tollgate.outcome") == "OK", s)
    trace, parent = ids()
    for _ in range(3):
        r = serve.check("user", "dave", {"traceparent": f"00-{trace}-{parent}-01"})
    check("/v1/check: the third is refused", r.status_code == 429, r.text)
    collector.wait_for("/v1/check: a 429 span with outcome OVER_LIMIT",
                       lambda s: s["trace"] == trace and s["name"] == "POST /v1/check"
                       and s["attrs"].get("http.response.status_code") == 429
                       and s["attrs"].get("tollgate.outcome") == "OVER_LIMIT")

    # An unsampled caller is followed (the default sampler is parent-based): nothing
    # is exported for it, while a sampled one sent after it is.
    unsampled, parent = ids()
    serve.check("bulk", "u1", {"traceparent": f"00-{unsampled}-{parent}-00"})
    trace, parent = ids()
    serve.check("bulk", "u1", {"traceparent": f"00-{trace}-{parent}-01"})
    collector.wait_for("a sampled call after an unsampled one", lambda s: s["trace"] == trace)
    time.sleep(0.3)  # one more export round: what was queued before has been sent
    check("an unsampled caller's call is not exported", unsampled not in collector.traces())

    # Malformed context: a new trace, and the call answers as usual.
    before = collector.traces()
    bad = [
        {"traceparent": "00-zzzz-not-hex-01"},
        {"traceparent": f"00-{'0' * 32}-{'0' * 16}-01"},
        {"x-b3-traceid": "xyz", "x-b3-spanid": "1"},
        {"b3": "garbage-garbage"},
    ]
    for headers in bad:
        r = serve.check("bulk", "malformed", headers)
        check(f"malformed context {headers}: answered 200", r.status_code == 200, r.text)
    serve.check("bulk", "malformed-done", {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"})
    collector.wait_for("the call after the malformed ones", lambda s: s["trace"] == "1" * 32)
    # (The malformed ones' spans may come in a batch after it.)
    for _ in range(100):
        with collector.cv:
            n = len([s for s in collector.spans if s["trace"] not in before
                     and s["attrs"].get("http.route") == "/v1/check" and s["trace"] != "1" * 32])
        if n >= len(bad):
            break
        time.sleep(0.1)
    with collector.cv:
        fresh = [s for s in collector.spans if s["trace"] not in before
                 and s["attrs"].get("http.route") == "/v1/check" and s["trace"] != "1" * 32]
    check("malformed context: each call starts a new trace without a parent",
          len(fresh) == len(bad) and all(s["parent"] == "" for s in fresh)
          and len({s["trace"] for s in fresh}) == len(bad), fresh)

    # What is not traced: health checks.
    serve.client.get("/healthcheck", headers={"traceparent": f"00-{'3' * 32}-{'4' * 16}-01"})
    time.sleep(0.3)
    check("health checks are not traced", "3" * 32 not in collector.traces())
    exported = serve.metric('tollgate_trace_spans_total{outcome="exported"}')
    check("/metrics counts the exported spans", exported and exported >= 8, exported)
    check("nothing dropped", serve.metric('tollgate_trace_spans_total{outcome="dropped"}') == 0)
    serve.stop()


def spans_of_serve_over_grpc():
    collector, endpoint, server = grpc_collector()
    serve = Serve({
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attributes",
    }, "grpc")
    trace, parent = ids()
    serve.should_rate_limit("erin", [("x-b3-traceid", trace), ("x-b3-spanid", parent),
                                     ("x-b3-sampled", "1")])
    s = collector.wait_for("OTLP/gRPC: the span arrives", lambda s: s["trace"] == trace)
    check("OTLP/gRPC: parent, and the service named by OTEL_RESOURCE_ATTRIBUTES",
          s["parent"] == parent and s["resource"].get("service.name") == "from-attributes", s)
    spans_of_quota_reports(serve, collector)
    serve.stop()
    server.stop(0)


def spans_of_quota_reports(serve, collector):
    """An Envoy's RLQS stream opened with `traceparent` metadata: a span per usage
    report in that trace, under the caller's span; the report that ends the stream
    (no time_elapsed) has an error status."""
    trace, parent = ids()
    reports = queue.Queue()
    stub = rlqs_pb2_grpc.RateLimitQuotaServiceStub(grpc.insecure_channel(serve.grpc))
    # A deadline: a stream that should end and does not fails the check, never hangs.
    responses = stub.StreamRateLimitQuotas(
        iter(reports.get, None), metadata=[("traceparent", f"00-{trace}-{parent}-01")],
        timeout=30)

    def report(elapsed_ms, *buckets):
        elapsed = {} if elapsed_ms is None else {
            "time_elapsed": duration_pb2.Duration(nanos=elapsed_ms * 1_000_000)}
        usages = [rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage(
            bucket_id=rlqs_pb2.BucketId(bucket={"name": b}), num_requests_allowed=1,
            **elapsed) for b in buckets]
        reports.put(rlqs_pb2.RateLimitQuotaUsageReports(domain="traced",
                                                        bucket_quota_usages=usages))

    report(1, "api", "other")
    # Both buckets answered: in one message, or in two when their divisions complete
    # apart (each group is sent as it completes; a busy machine splits them).
    answered = set()
    while answered != {"api", "other"}:
        answered |= {a.bucket_id.bucket["name"] for a in next(responses).bucket_action}
    check("rlqs: the first report is answered", answered == {"api", "other"}, answered)
    report(None, "api")  # no time_elapsed: refused, and the stream ends
    try:
        # What was under way before the refusal (a renewal) may still come; then the
        # stream must end, within its deadline.
        for _ in range(20):
            next(responses)
        check("rlqs: a report without time_elapsed ends the stream", False, "20 answers came")
    except grpc.RpcError as e:
        check("rlqs: a report without time_elapsed ends the stream",
              e.code() == grpc.StatusCode.INVALID_ARGUMENT, e)
    reports.put(None)
    collector.wait_for("rlqs: the refused report's span",
                       lambda s: s["trace"] == trace and s["status"] == STATUS_ERROR)
    with collector.cv:
        spans = [s for s in collector.spans if s["trace"] == trace]
    check("rlqs: a span per report, in the stream's trace, under the caller's span",
          len(spans) == 2 and all(s["parent"] == parent and s["kind"] == SERVER_SPAN
                                  and s["name"] == "RLQS usage report" for s in spans), spans)
    counts = sorted(s["attrs"].get("tollgate.quota.reports") for s in spans)
    check("rlqs: each span counts its report's buckets", counts == [1, 2], spans)
    check("rlqs: only the refused report's span is an error",
          sorted(s["status"] for s in spans) == sorted([STATUS_ERROR, 0])
          and [s for s in spans if s["status"] == STATUS_ERROR][0]["attrs"].get(
              "tollgate.quota.reports") == 1, spans)


def decisions_ignore_a_collector(endpoint, what):
    """A collector that is `what`: 300 decisions answer exactly as without traces."""
    serve = Serve({
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_BSP_MAX_QUEUE_SIZE": "4",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "2",
        "OTEL_BSP_SCHEDULE_DELAY": "20",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "200",
    }, what.replace(" ", "-"))
    remaining = []
    for i in range(300):
        r = serve.check("bulk", "steady", {"traceparent": f"00-{secrets.token_hex(16)}-{'5' * 16}-01"})
        check_ok = r.status_code == 200
        if not check_ok:
            check(f"a collector {what}: decision {i} answered", False, r.text)
        remaining.append(r.json()["statuses"][0]["limit_remaining"])
    check(f"a collector {what}: every decision answered in order",
          remaining == list(range(99999, 99999 - 300, -1)), remaining[:5])
    dropped = serve.metric('tollgate_trace_spans_total{outcome="dropped"}')
    check(f"a collector {what}: spans dropped and counted", dropped and dropped > 0, dropped)
    deadline = time.time() + 10
    while (serve.metric('tollgate_trace_spans_total{outcome="failed"}') or 0) == 0:
        check(f"a collector {what}: failed exports counted", time.time() < deadline)
        time.sleep(0.1)
    check(f"a collector {what}: the server is up", serve.proc.poll() is None)
    serve.stop()
    with open(serve.log) as f:
        warnings = f.read().count("the export queue is full")
    check(f"a collector {what}: one warning about drops (per minute)", warnings == 1, warnings)


class Upstream(BaseHTTPRequestHandler):
    """The proxy's upstream: answers 200 and keeps the headers each request came with."""
    protocol_version = "HTTP/1.1"
    seen = {}

    def log_message(self, *args):
        pass

    def do_GET(self):
        Upstream.seen[self.path] = {k.lower(): v for k, v in self.headers.items()}
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


def raw_http10(host, port, path, headers):
    """A request in HTTP/1.0, which the proxy serves through hyper (not its fast path)."""
    with socket.create_connection((host, port), timeout=10) as c:
        lines = [f"GET {path} HTTP/1.0", f"Host: {host}"] + [f"{k}: {v}" for k, v in headers.items()]
        c.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        reply = b""
        while chunk := c.recv(4096):
            reply += chunk
    return int(reply.split(b" ")[1])


def spans_of_the_proxy(collector, endpoint):
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    config = os.path.join(WORK, "proxy.yaml")
    with open(config, "w") as f:
        f.write(f"""proxy:
  routes:
    - name: api
      match: {{path_prefix: /}}
      upstream: http://127.0.0.1:{upstream.server_address[1]}
      key: header:x-key
      policies: ["fixed-window:limit=1,window=1h,align=first"]
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
                "OTEL_SERVICE_NAME": "tollgate-proxy"})
    proc = subprocess.Popen([BINARY, "proxy", "--config", config, "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    banner = proc.stdout.readline()
    host, port = banner.split("http://")[1].split()[0].rsplit(":", 1)
    traces_line = proc.stdout.readline()
    check("proxy: the banner names the traces' endpoint", "traces: " + endpoint in traces_line,
          traces_line)
    client = httpx.Client(base_url=f"http://{host}:{port}", timeout=10)

    for form in ["fast path", "hyper"]:
        trace, parent = ids()
        path = f"/{form.replace(' ', '-')}"
        headers = {"x-key": form, "traceparent": f"00-{trace}-{parent}-01",
                   "x-b3-traceid": "f" * 32, "x-b3-spanid": "e" * 16}
        if form == "hyper":
            status = raw_http10(host, int(port), path, headers)
        else:
            status = client.get(path, headers=headers).status_code
        check(f"proxy ({form}): answered", status == 200, status)
        seen = Upstream.seen[path]
        sent = seen.get("traceparent", "")
        check(f"proxy ({form}): the upstream gets the caller's trace, sampled",
              sent.startswith(f"00-{trace}-") and sent.endswith("-01"), seen)
        sent_parent = sent.split("-")[2]
        check(f"proxy ({form}): ... under the proxy's own span, in B3 too, the client's B3 replaced",
              sent_parent != parent and seen.get("x-b3-traceid") == trace
              and seen.get("x-b3-spanid") == sent_parent, seen)
        server = collector.wait_for(f"proxy ({form}): the request's span",
                                    lambda s: s["trace"] == trace and s["kind"] == SERVER_SPAN)
        call = collector.wait_for(f"proxy ({form}): the upstream call's span",
                                  lambda s: s["trace"] == trace and s["kind"] == CLIENT_SPAN)
        check(f"proxy ({form}): the request's span is the caller's child, named by its route",
              server["parent"] == parent and server["name"] == "GET api"
              and server["attrs"].get("http.response.status_code") == 200
              and server["attrs"].get("tollgate.outcome") == "OK"
              and server["resource"].get("service.name") == "tollgate-proxy", server)
        check(f"proxy ({form}): the upstream's parent is the upstream call's span",
              call["parent"] == server["span"] and call["span"] == sent_parent
              and call["attrs"].get("http.response.status_code") == 200, call)

    # Baggage whose percent-decoded property holds CR LF: never a header of its own.
    r = client.get("/baggage", headers={"x-key": "b", "baggage": "k=v;p%0D%0AX-Injected:%20yes"})
    check("proxy: answered despite a baggage with an encoded CR LF", r.status_code == 200, r)
    check("proxy: ... and no header injected upstream",
          "x-injected" not in Upstream.seen["/baggage"], Upstream.seen["/baggage"])

    # Over the limit: refused here, nothing sent upstream.
    trace, parent = ids()
    r = client.get("/refused", headers={"x-key": "fast path", "traceparent": f"00-{trace}-{parent}-01"})
    check("proxy: the second request of a key is refused", r.status_code == 429, r.status_code)
    s = collector.wait_for("proxy: the refused request's span", lambda s: s["trace"] == trace)
    check("proxy: ... with its status and outcome, and no upstream call",
          s["attrs"].get("http.response.status_code") == 429
          and s["attrs"].get("tollgate.outcome") == "OVER_LIMIT"
          and "/refused" not in Upstream.seen, s)

    # Unsampled: the decision passes on, and nothing is exported.
    trace, parent = ids()
    client.get("/unsampled", headers={"x-key": "u", "traceparent": f"00-{trace}-{parent}-00"})
    sent = Upstream.seen["/unsampled"].get("traceparent", "")
    check("proxy: an unsampled caller's trace goes on unsampled",
          sent.startswith(f"00-{trace}-") and sent.endswith("-00"), sent)
    # Without context: a new trace, sent upstream.
    client.get("/fresh", headers={"x-key": "f"})
    sent = Upstream.seen["/fresh"].get("traceparent", "")
    fresh = sent.split("-")[1] if sent else ""
    collector.wait_for("proxy: a request without context starts a trace",
                       lambda s: s["trace"] == fresh and s["parent"] == "" and s["kind"] == SERVER_SPAN)
    check("proxy: ... and no span of the unsampled one", trace not in collector.traces())
    proc.terminate()
    proc.wait(10)
    upstream.shutdown()


def main():
    collector, endpoint = http_collector()
    spans_of_serve_over_http(collector, endpoint)
    spans_of_the_proxy(collector, endpoint)
    spans_of_serve_over_grpc()
    # Down: nothing listens on the port.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    down = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()
    decisions_ignore_a_collector(down, "down")
    # Slow: it takes the connection (the kernel's backlog) and never answers.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    decisions_ignore_a_collector(f"http://127.0.0.1:{silent.getsockname()[1]}", "that never answers")
    silent.close()
    print("all checks passed", flush=True)
    os._exit(0)


main()
