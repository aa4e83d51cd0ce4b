"""An xDS management server for the tests, on grpcio (a gRPC stack no one here wrote):
the Aggregated Discovery Service, State of the World, serving envoyproxy/ratelimit's
RateLimitConfig resources over mutual TLS, as Envoy Gateway serves its rate limit
backend. Also Envoy's side of the rate limit calls (grpcio over TLS with a client
certificate). Run by the Rust tests (tests/xds.rs):

    python3 xds_server.py CERT_DIR

CERT_DIR holds ca.pem, server.pem/.key (the server's certificate) and client.pem/.key
(the certificate of the Envoys' calls). Commands come on stdin and events go to
stdout, one JSON object per line:

    {"cmd": "set", "version": "1", "configs": [RateLimitConfig as JSON, ...]}
        the snapshot: sent now on every open stream, and to each new stream whose
        first request names another version (as go-control-plane's cache does)
    {"cmd": "stop"}, {"cmd": "start"}   the server goes away, and comes back on its port
    {"cmd": "rls", "target": "HOST:PORT", "domain": D, "entries": [[K, V], ...]}
        one ShouldRateLimit over TLS: {"event": "rls", "code": "OK"} or an error
    {"cmd": "quit"}

Events: {"event": "listening", "port": P}, {"event": "sent", "version": V, "nonce": N}
for every response sent, and {"event": "request", ...} for every
DiscoveryRequest received (version_info, nonce, error, node, and on a stream's first
request the client certificate's names and the gRPC metadata).
"""

import itertools
import json
import os
import queue
import sys
import tempfile
import threading
from concurrent import futures

import grpc
from grpc_tools import protoc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import any_pb2, json_format

TYPE_URL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
HERE = os.path.dirname(os.path.abspath(__file__))
certs = sys.argv[1]


def compile_rls_conf():
    out = tempfile.mkdtemp(prefix="tollgate-xds-proto-")
    proto_dir = os.path.join(HERE, "proto")
    code = protoc.main(
        ["protoc", f"-I{proto_dir}", f"--python_out={out}", os.path.join(proto_dir, "rls_conf.proto")]
    )
    if code != 0:
        raise SystemExit(f"grpc_tools.protoc failed on rls_conf.proto ({code})")
    sys.path.insert(0, out)


compile_rls_conf()
import rls_conf_pb2  # noqa: E402  (compiled just above)

out_lock = threading.Lock()


def emit(**event):
    with out_lock:
        print(json.dumps(event), flush=True)


def read(name):
    with open(os.path.join(certs, name), "rb") as f:
        return f.read()


lock = threading.Lock()
snapshot = None  # (version, [RateLimitConfig])
streams = []
nonces = itertools.count(1)


def response(version, configs):
    resources = [any_pb2.Any(type_url=TYPE_URL, value=c.SerializeToString()) for c in configs]
    return discovery_pb2.DiscoveryResponse(
        version_info=version, type_url=TYPE_URL, nonce=str(next(nonces)), resources=resources
    )


class Ads(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def StreamAggregatedResources(self, request_iterator, context):
        q = queue.Queue()
        context.add_callback(lambda: q.put(None))

        def reader():
            first = True
            try:
                for req in request_iterator:
                    event = dict(
                        event="request",
                        version_info=req.version_info,
                        nonce=req.response_nonce,
                        node=req.node.id,
                        type_url=req.type_url,
                        error=req.error_detail.message if req.HasField("error_detail") else None,
                        error_code=req.error_detail.code if req.HasField("error_detail") else None,
                    )
                    if first:
                        auth = context.auth_context()
                        event["client_names"] = [
                            n.decode() for n in auth.get("x509_subject_alternative_name", [])
                        ]
                        event["metadata"] = {k: v for k, v in context.invocation_metadata()}
                        with lock:
                            snap = snapshot
                        if snap is not None and snap[0] != req.version_info:
                            q.put(snap)
                        first = False
                    emit(**event)
            except Exception:  # the stream ended: cancelled, or the server stopped
                pass
            q.put(None)

        with lock:
            streams.append(q)
        threading.Thread(target=reader, daemon=True).start()
        try:
            while True:
                item = q.get()
                if item is None:
                    return
                r = response(*item)
                emit(event="sent", version=r.version_info, nonce=r.nonce)
                yield r
        finally:
            with lock:
                streams.remove(q)


def start(port):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(Ads(), server)
    creds = grpc.ssl_server_credentials(
        [(read("server.key"), read("server.pem"))],
        root_certificates=read("ca.pem"),
        require_client_auth=True,
    )
    bound = server.add_secure_port(f"127.0.0.1:{port}", creds)
    if bound == 0:
        raise SystemExit(f"cannot listen on 127.0.0.1:{port}")
    server.start()
    return server, bound


def rls(cmd):
    creds = grpc.ssl_channel_credentials(
        root_certificates=read("ca.pem"),
        private_key=read("client.key"),
        certificate_chain=read("client.pem"),
    )
    # The server's certificate names localhost; grpcio checks the name.
    options = [("grpc.ssl_target_name_override", "localhost")]
    with grpc.secure_channel(cmd["target"], creds, options=options) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        entries = [
            ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in cmd["entries"]
        ]
        request = rls_pb2.RateLimitRequest(
            domain=cmd["domain"], descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=entries)]
        )
        try:
            r = stub.ShouldRateLimit(request, timeout=5)
            emit(event="rls", code=rls_pb2.RateLimitResponse.Code.Name(r.overall_code))
        except grpc.RpcError as e:
            emit(event="rls", error=e.code().name, detail=e.details())


def main():
    global snapshot
    server, port = start(0)
    emit(event="listening", port=port)
    for line in sys.stdin:
        cmd = json.loads(line)
        name = cmd["cmd"]
        if name == "set":
            configs = [json_format.ParseDict(c, rls_conf_pb2.RateLimitConfig()) for c in cmd["configs"]]
            with lock:
                snapshot = (cmd["version"], configs)
                for q in streams:
                    q.put(snapshot)
            emit(event="set", version=cmd["version"])
        elif name == "stop":
            server.stop(grace=0).wait()
            emit(event="stopped")
        elif name == "start":
            server, _ = start(port)
            emit(event="started")
        elif name == "rls":
            rls(cmd)
        elif name == "quit":
            break
    # Not sys.exit: grpcio's threads can hold the interpreter's shutdown.
    os._exit(0)


main()
