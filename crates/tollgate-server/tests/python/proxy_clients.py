"""`tollgate proxy` driven by stacks nobody here wrote: an upstream on Python's own
http.server (OpenAI-shaped chat completions whose service time jitters +-20 %), and
as clients Python's http.client (keeping its connections, as every keep-alive client
does), httpx, and the `openai` package speaking to the proxy exactly as an
application would.

Usage: proxy_clients.py TOLLGATE_BINARY. Prints "all checks passed" at the end.
"""

import http.client
import json
import os
import random
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai

TOKENS = 300  # what every completion reports using
# A request to /held/ waits upstream until RELEASE is set (HELD says it arrived).
HELD, RELEASE = threading.Event(), threading.Event()
# Requests to /budget/ wait upstream until BUDGET_GO is set; what arrived there, and
# the tokens produced for them (usage: the request's max_tokens plus 10 of prompt).
BUDGET_GO = threading.Event()
BUDGET = {"arrived": 0, "produced": 0}
BUDGET_LOCK = threading.Lock()
# The stream_options of each streaming request that arrived, by path.
ASKED = {}


class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        req = json.loads(body or b"{}")
        if self.path.startswith("/held/"):
            HELD.set()
            RELEASE.wait(10)
        used = TOKENS
        if self.path.startswith("/budget/"):
            used = req.get("max_tokens", 100) + 10
            with BUDGET_LOCK:
                BUDGET["arrived"] += 1
                BUDGET["produced"] += used
            BUDGET_GO.wait(20)
        time.sleep(0.002 * random.uniform(0.8, 1.2))  # a service time that jitters
        usage = {"prompt_tokens": 10, "completion_tokens": used - 10, "total_tokens": used}
        if req.get("stream"):
            ASKED.setdefault(self.path, []).append(req.get("stream_options"))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            events = [
                {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": w},
                              "finish_reason": None}]}
                for w in ["Hello", " there"]
            ]
            # As OpenAI: the usage only when the client asked for it, in an event of
            # its own, and then every other event says `"usage": null`.
            if (req.get("stream_options") or {}).get("include_usage"):
                for e in events:
                    e["usage"] = None
                events.append({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                               "model": "m", "choices": [], "usage": usage})
            for e in events:
                self.chunk(b"data: " + json.dumps(e).encode() + b"\n\n")
            self.chunk(b"data: [DONE]\n\n")
            # The stream's end a moment after `[DONE]`, as a real upstream's may come:
            # a client that stops reading at `[DONE]` (the openai package closes the
            # response there) asks again before it.
            time.sleep(0.05)
            self.chunk(b"")
            return
        text = json.dumps({
            "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "Hello there"}}],
            "usage": usage,
        }).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def start_proxy(binary, upstream_port, workdir):
    config = os.path.join(workdir, "proxy.yaml")
    with open(config, "w") as f:
        f.write(f"""proxy:
  routes:
    - name: llm
      match: {{path_prefix: /v1/}}
      upstream: http://127.0.0.1:{upstream_port}
      key: header:authorization
      policies: ["fixed-window:limit=1000,window=1h,align=first"]
      cost:
        from: [json:usage.total_tokens]
        estimate: 1
      reject_format: openai
    - name: held
      match: {{path_prefix: /held/}}
      upstream: http://127.0.0.1:{upstream_port}
      key: header:authorization
      limit_conn: 1
      reject_format: openai
    - name: budget
      match: {{path_prefix: /budget/}}
      upstream: http://127.0.0.1:{upstream_port}
      key: header:authorization
      policies: ["token-bucket:rate=1000/d,capacity=1000"]
      cost:
        from: [json:usage.total_tokens]
        estimate: 50
      reject_format: openai
    - name: noask
      match: {{path_prefix: /noask/}}
      upstream: http://127.0.0.1:{upstream_port}
      key: header:authorization
      policies: ["token-bucket:rate=1000/d,capacity=1000"]
      cost:
        from: [json:usage.total_tokens]
        estimate: 50
        ask_usage: none
    - name: tight
      match: {{path_prefix: /tight/}}
      upstream: http://127.0.0.1:{upstream_port}
      key: header:x-key
      policies: ["fixed-window:limit=2,window=1h,align=first"]
      cost:
        from: [json:usage.total_tokens]
        estimate: 1
    - name: plain
      match: {{path_prefix: /plain/}}
      upstream: http://127.0.0.1:{upstream_port}
      key: header:x-key
      policies: ["fixed-window:limit=2,window=1h,align=first"]
""")
    proc = subprocess.Popen(
        [binary, "proxy", "--config", config, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    addr = line.split("http://")[1].split()[0]
    host, port = addr.rsplit(":", 1)
    return proc, host, int(port)


def closed_by_server(conn):
    """Whether the server closed the connection http.client still holds open."""
    if conn.sock is None:
        return False  # http.client closed it itself: the answer said so
    readable, _, _ = select.select([conn.sock], [], [], 0.3)
    if not readable:
        return False
    try:
        return conn.sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def check_every_close_is_announced(host, port):
    """Each case the proxy may close after: the answer says `Connection: close` when
    (and only when) the connection ends; http.client then opens a new one."""
    cases = [
        # (what, method, path, headers, body, HTTP/1.0)
        ("a 429 with the POST body unread (cost route)", "POST", "/tight/x", {"x-key": "c"},
         b'{"messages":[]}', False),
        ("a 429 with the POST body unread (plain route)", "POST", "/plain/x", {"x-key": "c"},
         b'{"messages":[]}', False),
        ("a 404 with a body", "POST", "/nowhere", {}, b"abc", False),
        ("HTTP/1.0", "GET", "/plain/y", {"x-key": "d"}, None, True),
        ("a kept 200", "POST", "/tight/x", {"x-key": "e"}, b'{"messages":[]}', False),
    ]
    silent = []
    for what, method, path, headers, body, old in cases:
        for _ in range(4):  # past the limits of 2 too
            conn = http.client.HTTPConnection(host, port, timeout=10)
            if old:
                conn._http_vsn, conn._http_vsn_str = 10, "HTTP/1.0"
            conn.putrequest(method, path, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            if body is not None:
                conn.putheader("content-length", str(len(body)))
            conn.endheaders()
            if body is not None:
                conn.send(body)
            resp = conn.getresponse()
            resp.read()
            says = (resp.getheader("connection") or "").lower() == "close"
            if not says and closed_by_server(conn):
                silent.append(f"{what}: {resp.status}")
            # The connection cannot go on after an unread body or an HTTP/1.0
            # request without keep-alive: the answer must say so.
            if (body is not None and resp.status != 200) or old:
                assert says, f"{what}: {resp.status} without Connection: close"
            else:
                assert not says, f"{what}: {resp.status} closed a connection that could go on"
            conn.close()
    assert not silent, f"closed without Connection: close: {silent}"
    print("every close announced:", len(cases), "cases")


def check_keep_alive_clients_under_rejections(host, port):
    """4 http.client connections, each kept, on one key of a cost route past its
    budget: every request gets an answer (none fails on a connection the proxy closed
    without saying; before, 131 in 6 s did)."""
    failures, statuses = [], {}
    lock = threading.Lock()

    def client(n):
        conn = http.client.HTTPConnection(host, port, timeout=10)
        for i in range(60):
            try:
                conn.request("POST", "/tight/chat", body=b'{"messages":[]}',
                             headers={"x-key": "shared", "content-type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                with lock:
                    statuses[resp.status] = statuses.get(resp.status, 0) + 1
            except (OSError, http.client.HTTPException) as e:
                with lock:
                    failures.append(f"client {n} request {i}: {e!r}")
                conn.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, f"{len(failures)} failed: {failures[:5]}"
    # Two requests may be admitted on their estimate (1 of 2) before the first
    # usage (300) lands: the budget holds within one response per request in flight.
    assert statuses.get(200) in (1, 2) and sum(statuses.values()) == 240, statuses
    print("kept connections under rejections:", statuses)


def check_httpx(host, port):
    """httpx's pool of kept connections, through a plain and a cost route, with
    rejections between answers: no transport error."""
    base = f"http://{host}:{port}"
    statuses = {}
    with httpx.Client(base_url=base, timeout=10) as client:
        for i in range(100):
            for path, key in [("/plain/p", "h1"), ("/tight/t", "h2")]:
                r = client.post(path, headers={"x-key": key}, content=b'{"messages":[]}')
                statuses[(path, r.status_code)] = statuses.get((path, r.status_code), 0) + 1
        # The usage of a completion is charged: a fresh key of the tight route takes
        # one request (300 tokens, into debt), then 429 with a Retry-After.
        r = client.post("/tight/t", headers={"x-key": "fresh"}, json={"messages": []})
        assert r.status_code == 200 and r.json()["usage"]["total_tokens"] == TOKENS
        r = client.post("/tight/t", headers={"x-key": "fresh"}, json={"messages": []})
        assert r.status_code == 429, r.status_code
        assert int(r.headers["retry-after"]) > 0
        assert r.headers["content-type"] == "application/problem+json"
    assert statuses[("/plain/p", 200)] == 2 and statuses[("/plain/p", 429)] == 98, statuses
    assert statuses[("/tight/t", 200)] == 1 and statuses[("/tight/t", 429)] == 99, statuses
    print("httpx:", statuses)


def check_openai(host, port):
    """The openai package against the proxy: completions, plain and streamed, charged
    what their usage says (300 tokens each) against 1,000 tokens: four are admitted
    (the fourth into debt), the fifth is a RateLimitError."""
    http_client = httpx.Client(timeout=10)
    client = openai.OpenAI(base_url=f"http://{host}:{port}/v1", api_key="team-a",
                           max_retries=0, http_client=http_client)
    messages = [{"role": "user", "content": "hi"}]
    for i in range(4):
        if i % 2 == 0:
            c = client.chat.completions.create(model="m", messages=messages)
            assert c.usage.total_tokens == TOKENS and c.choices[0].message.content
        else:
            stream = client.chat.completions.create(
                model="m", messages=messages, stream=True,
                stream_options={"include_usage": True})
            chunks = list(stream)
            assert chunks[-1].usage.total_tokens == TOKENS
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    try:
        client.chat.completions.create(model="m", messages=messages)
        raise AssertionError("the fifth completion passed a spent budget")
    except openai.RateLimitError as e:
        # OpenAI's own shape: the SDK's error says which budget refused and when.
        assert e.status_code == 429
        assert e.code == "rate_limit_exceeded" and e.type == "rate_limit_exceeded", e.body
        assert "route llm: fixed-window:limit=1000,window=1h" in e.message, e.message
        assert "on tokens: limit 1000, remaining 0, requested 1" in e.message, e.message
        assert "Please try again in " in e.message, e.message
        h = e.response.headers
        assert h["content-type"] == "application/json", h
        assert int(h["retry-after"]) > 3000 and int(h["retry-after-ms"]) > 3_000_000, h
        assert (h["x-ratelimit-limit-tokens"], h["x-ratelimit-remaining-tokens"]) == ("1000", "0"), h
        assert h["x-ratelimit-reset-tokens"].endswith("s"), h
    # Another key has its own budget.
    other = openai.OpenAI(base_url=f"http://{host}:{port}/v1", api_key="team-b",
                          max_retries=0, http_client=http_client)
    assert other.chat.completions.create(model="m", messages=messages).usage.total_tokens
    check_openai_limit_conn(host, port, http_client)
    http_client.close()
    print("openai: four completions charged, the fifth refused")


def check_openai_limit_conn(host, port, http_client):
    """A second completion of one key while its first is held upstream: refused by
    `limit_conn: 1` as OpenAI's SDK understands it, with a second to wait."""
    client = openai.OpenAI(base_url=f"http://{host}:{port}/held/v1", api_key="team-c",
                           max_retries=0, http_client=http_client)
    messages = [{"role": "user", "content": "hi"}]
    first = threading.Thread(
        target=lambda: client.chat.completions.create(model="m", messages=messages))
    first.start()
    try:
        assert HELD.wait(10), "the first completion never reached the upstream"
        try:
            client.chat.completions.create(model="m", messages=messages)
            raise AssertionError("a second request in flight passed limit_conn: 1")
        except openai.RateLimitError as e:
            assert e.code == "rate_limit_exceeded", e.body
            assert "route held: limit_conn 1" in e.message, e.message
            assert e.response.headers["retry-after"] == "1", e.response.headers
    finally:
        RELEASE.set()
        first.join(10)


def check_openai_concurrent_budget(host, port):
    """20 openai clients of one key at once, half of them streaming without asking
    for usage, against 1,000 tokens: each request reserves what it declares
    (max_tokens 100, and its prompt from its size) at admission, so the requests
    held upstream together never produce more than the budget plus one declared
    bound; the others are refused with RateLimitError naming the budget. A stream
    goes through byte for byte."""
    messages = [{"role": "user", "content": "hi"}]
    outcomes, lock = [], threading.Lock()

    def client(n):
        c = openai.OpenAI(base_url=f"http://{host}:{port}/budget/v1", api_key="team-d",
                          max_retries=0, http_client=httpx.Client(timeout=30))
        try:
            if n % 2:
                chunks = list(c.chat.completions.create(
                    model="m", messages=messages, max_tokens=100, stream=True))
                assert "".join(x.choices[0].delta.content or "" for x in chunks if x.choices)
                outcome = "streamed"
            else:
                done = c.chat.completions.create(model="m", messages=messages, max_tokens=100)
                assert done.usage.total_tokens == 110, done.usage
                outcome = "completed"
        except openai.RateLimitError as e:
            assert e.code == "rate_limit_exceeded", e.body
            assert "route budget: token-bucket:rate=1000/d,capacity=1000" in e.message, e.message
            outcome = "refused"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    # Until every request is held upstream or refused: all twenty in flight at once.
    deadline = time.monotonic() + 30
    while True:
        with BUDGET_LOCK, lock:
            settled = BUDGET["arrived"] + outcomes.count("refused")
        if settled == 20 or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    held = BUDGET["arrived"]
    BUDGET_GO.set()
    for t in threads:
        t.join(30)
    assert len(outcomes) == 20, outcomes
    produced = BUDGET["produced"]
    # Each reservation is 100 declared plus the prompt (a body of about 150 bytes: 37).
    assert 1 <= held <= 1000 // 110 and produced <= 1000 + 137, (held, produced, outcomes)
    assert outcomes.count("refused") == 20 - held, outcomes
    # A stream through the proxy is byte for byte what the upstream sends.
    body = {"model": "m", "messages": messages, "stream": True}
    upstream = BUDGET["upstream"]
    raw = []
    for base in (f"http://{host}:{port}/budget", upstream):
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body,
                          headers={"authorization": "Bearer team-e"}) as r:
            assert r.status_code == 200, r.status_code
            raw.append(b"".join(r.iter_raw()))
    assert raw[0] == raw[1], raw
    print(f"openai: 20 at once, {held} held ({produced} tokens produced of 1,000), "
          f"{outcomes.count('refused')} refused; a stream byte for byte")


def check_openai_streams_charged_their_usage(host, port):
    """Streams whose clients do not ask for their usage (the SDK's default) are
    charged what they used: the proxy asks the upstream for it and takes it out of
    what the client receives. 110 tokens each against 1,000, each taking the route's
    estimate (50) at admission: nine pass, the tenth finds 10 left. With
    `ask_usage: none` the request goes as it came."""
    messages = [{"role": "user", "content": "hi"}]
    c = openai.OpenAI(base_url=f"http://{host}:{port}/budget/v1", api_key="team-f",
                      max_retries=0, http_client=httpx.Client(timeout=30))
    passed = 0
    for _ in range(20):
        try:
            chunks = list(c.chat.completions.create(model="m", messages=messages, stream=True))
        except openai.RateLimitError as e:
            assert "route budget: token-bucket:rate=1000/d,capacity=1000" in e.message, e.message
            break
        # Nothing the client did not ask for: no usage event, no usage field.
        assert all(x.choices and x.usage is None for x in chunks), chunks
        assert "".join(x.choices[0].delta.content or "" for x in chunks) == "Hello there"
        passed += 1
    assert passed == 9, passed
    asked = ASKED["/budget/v1/chat/completions"]
    assert {"include_usage": True} in asked, asked
    noask = openai.OpenAI(base_url=f"http://{host}:{port}/noask/v1", api_key="team-f",
                          max_retries=0, http_client=httpx.Client(timeout=30))
    assert list(noask.chat.completions.create(model="m", messages=messages, stream=True))
    assert ASKED["/noask/v1/chat/completions"] == [None], ASKED
    print(f"openai: streams not asking for usage charged it ({passed} of 110 in 1,000)")


def main():
    binary = sys.argv[1]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as workdir:
        proc, host, port = start_proxy(binary, server.server_address[1], workdir)
        try:
            check_every_close_is_announced(host, port)
            check_keep_alive_clients_under_rejections(host, port)
            check_httpx(host, port)
            check_openai(host, port)
            BUDGET["upstream"] = f"http://127.0.0.1:{server.server_address[1]}/budget"
            check_openai_concurrent_budget(host, port)
            check_openai_streams_charged_their_usage(host, port)
        finally:
            proc.kill()
            proc.wait()
    print("all checks passed", flush=True)
    # grpcio-free, but httpx's and the upstream's threads must not hold the exit.
    os._exit(0)


if __name__ == "__main__":
    main()
