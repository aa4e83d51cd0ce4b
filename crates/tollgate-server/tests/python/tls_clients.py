"""Drives `tollgate serve`'s TLS listeners from Python: grpcio (its own TLS stack,
BoringSSL) over mutual TLS to the gRPC listener, and httpx to the HTTPS listener.
Run by the Rust test tests/tls.rs, which makes the certificates, starts the server
and passes its addresses:

    python3 tls_clients.py GRPC_ADDR HTTPS_URL CERT_DIR

CERT_DIR holds ca.pem, client.pem/.key (signed by ca.pem) and stranger.pem/.key
(signed by another CA). Prints one line per check and exits non-zero on the first
that fails.
"""

import os
import sys

import grpc
import httpx
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

grpc_addr, https_url, certs = sys.argv[1], sys.argv[2], sys.argv[3]
Code = rls_pb2.RateLimitResponse.Code


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"), flush=True)
    if not ok:
        # Not sys.exit: grpcio's threads can hold the interpreter's shutdown.
        os._exit(1)


def read(name):
    with open(os.path.join(certs, name), "rb") as f:
        return f.read()


def call(channel):
    """One ShouldRateLimit: the response, or the RpcError."""
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    request = rls_pb2.RateLimitRequest(
        domain="tls",
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(
                entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value="py")]
            )
        ],
    )
    try:
        return stub.ShouldRateLimit(request, timeout=5)
    except grpc.RpcError as e:
        return e


# The server's certificate names localhost; grpcio checks the name.
options = [("grpc.ssl_target_name_override", "localhost")]
ca = read("ca.pem")


def secure(client):
    key = read(client + ".key") if client else None
    chain = read(client + ".pem") if client else None
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=chain)
    return grpc.secure_channel(grpc_addr, creds, options=options)


r = call(secure("client"))
check("grpc over mutual TLS: decided", isinstance(r, rls_pb2.RateLimitResponse) and r.overall_code == Code.OK, r)
r = call(secure("client"))
check("grpc over mutual TLS: the limit holds (2 a minute)", isinstance(r, rls_pb2.RateLimitResponse), r)
r = call(secure("client"))
check(
    "grpc over mutual TLS: third call over the limit",
    isinstance(r, rls_pb2.RateLimitResponse) and r.overall_code == Code.OVER_LIMIT,
    r,
)
r = call(secure(None))
check(
    "grpc without a client certificate: refused in the handshake",
    isinstance(r, grpc.RpcError) and r.code() == grpc.StatusCode.UNAVAILABLE,
    r,
)
r = call(secure("stranger"))
check(
    "grpc with a certificate from another CA: refused",
    isinstance(r, grpc.RpcError) and r.code() == grpc.StatusCode.UNAVAILABLE,
    r,
)
r = call(grpc.insecure_channel(grpc_addr))
check(
    "grpc in plain text to the TLS port: refused",
    isinstance(r, grpc.RpcError) and r.code() == grpc.StatusCode.UNAVAILABLE,
    r,
)

with httpx.Client(verify=os.path.join(certs, "ca.pem")) as client:
    r = client.get(https_url + "/healthcheck")
    check("httpx over HTTPS: /healthcheck", r.status_code == 200 and r.text == "OK\n", r.text)
    r = client.get(https_url + "/v1/config")
    check("httpx over HTTPS: /v1/config names the domain", r.status_code == 200 and "tls" in r.text, r.text[:200])
try:
    httpx.get(https_url + "/healthcheck", verify=os.path.join(certs, "other-ca.pem"))
    check("httpx trusting another CA: refused", False, "it connected")
except httpx.ConnectError as e:
    check("httpx trusting another CA: refused", "CERTIFICATE_VERIFY_FAILED" in str(e), e)

print("all checks passed")
