"""docs/llm.md's recipe run as written: its YAML block (the listen and upstream
addresses aside) in front of an OpenAI-compatible upstream on Python's http.server,
driven by the `openai` package as an application drives it: requests per minute and
tokens per minute per API key, streams that do not ask for their usage, and the
SDK's RateLimitError naming what refused.

Usage: llm_recipe.py TOLLGATE_BINARY DOCS/LLM.MD. Prints "all checks passed" at the end.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai

# Usage of a completion that states no max_tokens (a long answer).
UNBOUNDED = 5000
ASKED = []  # the stream_options of each stream that arrived


class Upstream(BaseHTTPRequestHandler):
    """OpenAI's chat completions: usage max_tokens + 10 (or UNBOUNDED); a stream's
    usage in an event of its own only when asked, the other events then saying
    `"usage": null`."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        used = req["max_tokens"] + 10 if "max_tokens" in req else UNBOUNDED
        usage = {"prompt_tokens": 10, "completion_tokens": used - 10, "total_tokens": used}
        if req.get("stream"):
            asked = bool((req.get("stream_options") or {}).get("include_usage"))
            ASKED.append(asked)
            events = [{"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                       "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]}
                      for w in ["Hello", " there"]]
            if asked:
                for e in events:
                    e["usage"] = None
                events.append({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                               "model": "m", "choices": [], "usage": usage})
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for e in events + ["[DONE]"]:
                data = e if isinstance(e, str) else json.dumps(e)
                self.chunk(f"data: {data}\n\n".encode())
            self.chunk(b"")
            return
        text = json.dumps({"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": "Hello there"}}],
                           "usage": usage}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def recipe(docs):
    """The first YAML block of the recipe page, as written."""
    text = open(docs).read()
    return re.search(r"```yaml\n(.*?)```", text, re.S).group(1)


def start_proxy(binary, config_text, upstream, workdir):
    # The addresses are this test's; everything else is the page's.
    assert "http://127.0.0.1:9000" in config_text, config_text
    config = os.path.join(workdir, "llm.yaml")
    with open(config, "w") as f:
        f.write(config_text.replace("http://127.0.0.1:9000", upstream))
    proc = subprocess.Popen([binary, "proxy", "--config", config, "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    return proc, line.split("http://")[1].split()[0]


def client(addr, key):
    return openai.OpenAI(base_url=f"http://{addr}/v1", api_key=key, max_retries=0,
                         http_client=httpx.Client(timeout=30))


def check_requests_per_minute(addr):
    """60 small completions a minute per key, streamed or not; the 61st is refused,
    in OpenAI's words, naming the requests per minute."""
    c = client(addr, "key-rpm")
    messages = [{"role": "user", "content": "hi"}]
    # Every answer says where both budgets stand, as OpenAI's do.
    raw = c.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=1)
    h = raw.headers
    assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("60", "59"), h
    assert h["x-ratelimit-limit-tokens"] == "40000", h
    assert int(h["x-ratelimit-remaining-tokens"]) < 40000 and h["x-ratelimit-reset-tokens"], h
    assert raw.parse().usage.total_tokens == 11
    for i in range(1, 60):
        if i % 2:
            chunks = list(c.chat.completions.create(model="m", messages=messages,
                                                    max_tokens=1, stream=True))
            assert "".join(x.choices[0].delta.content for x in chunks) == "Hello there"
        else:
            assert c.chat.completions.create(model="m", messages=messages, max_tokens=1)
    try:
        c.chat.completions.create(model="m", messages=messages, max_tokens=1)
        raise AssertionError("a 61st request in a minute passed")
    except openai.RateLimitError as e:
        assert "route llm: sliding-window:limit=60,window=1m" in e.message, e.message
        assert "on requests: limit 60, remaining 0" in e.message, e.message
        assert e.response.headers["x-ratelimit-limit-requests"] == "60", e.response.headers
        assert int(e.response.headers["retry-after"]) >= 1, e.response.headers
    print("requests per minute: 60 passed, the 61st refused")


def check_tokens_per_minute(addr):
    """Streams that state no max_tokens and do not ask for their usage, each using
    5,000 tokens of 40,000 a minute: each takes the estimate (1,000) at admission and
    is charged what it used, which the proxy asked the upstream for. Eight spend the
    budget; the ninth is refused (or, on a machine slow enough for 1,000 tokens to
    refill meanwhile, the tenth) naming the token budget. The client's stream holds
    no usage it did not ask for."""
    c = client(addr, "key-tpm")
    messages = [{"role": "user", "content": "write a long answer"}]
    passed = 0
    for _ in range(20):
        try:
            chunks = list(c.chat.completions.create(model="m", messages=messages, stream=True))
        except openai.RateLimitError as e:
            assert "route llm: token-bucket:rate=40000/m,capacity=40000 on tokens" in e.message, e.message
            assert e.response.headers["x-ratelimit-limit-tokens"] == "40000", e.response.headers
            break
        assert all(x.choices and x.usage is None for x in chunks), chunks
        passed += 1
    # Charged the estimate only, forty would pass.
    assert 8 <= passed <= 9, passed
    assert ASKED and all(ASKED), ASKED
    print(f"tokens per minute: {passed} streams of 5,000 tokens passed 40,000, then refused")


def main():
    binary, docs = sys.argv[1], sys.argv[2]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    upstream = f"http://127.0.0.1:{server.server_address[1]}"
    with tempfile.TemporaryDirectory() as workdir:
        proc, addr = start_proxy(binary, recipe(docs), upstream, workdir)
        try:
            check_requests_per_minute(addr)
            check_tokens_per_minute(addr)
        finally:
            proc.kill()
            proc.wait()
    print("all checks passed", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
