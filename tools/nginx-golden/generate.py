#!/usr/bin/env python3
"""Golden vectors for tollgate's limit-req policy, produced by the real nginx
limit_req module (Debian's nginx) on a frozen, script-controlled clock.

nginx runs under libfaketime (Debian's `faketime` package) with its clock read from a
file on every call, so each request arrives at exactly the trace's time: the script
writes the time, sends one request and waits until nginx has decided it. Rejected
requests get 503 at once; admitted ones 200 at once; delayed ones wait on a timer that
cannot fire while time stands still, so their decision is read from nginx's
"delaying request, excess: E" log line, and their delay is nginx's
`(excess - delay) * 1000 / rate` ms (ngx_http_limit_req_account).

Output CSV (stdout): spec,t_us,key,allowed,wait_us
Usage: tools/nginx-golden/generate.py > crates/tollgate-core/tests/fixtures/nginx.csv
Needs: apt-get install -y nginx faketime
"""
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
BASE_S = 1_767_225_600  # 2026-01-01T00:00:00Z

# (zone, nginx rate, rate in requests/s, limit_req options, tollgate spec, mean gap us)
SCENARIOS = [
    ("z1", "10r/s", 10.0, "burst=5 nodelay", "limit-req:rate=10/s,burst=5,nodelay", 80_000),
    ("z2", "10r/s", 10.0, "burst=5", "limit-req:rate=10/s,burst=5", 80_000),
    ("z3", "2r/s", 2.0, "burst=4 delay=2", "limit-req:rate=2/s,burst=4,delay=2", 400_000),
    ("z4", "30r/m", 0.5, "burst=1 nodelay", "limit-req:rate=30/m,burst=1,nodelay", 1_500_000),
    ("z5", "1r/s", 1.0, "", "limit-req:rate=1/s", 700_000),
    ("z6", "7r/m", 7 / 60, "burst=3", "limit-req:rate=7/m,burst=3", 6_000_000),
    ("z7", "100r/s", 100.0, "burst=20 delay=5", "limit-req:rate=100/s,burst=20,delay=5", 8_000),
]
DELAY = {"z1": None, "z2": 0, "z3": 2, "z4": None, "z5": 0, "z6": 0, "z7": 5}
RATE_MILLI = {"z1": 10000, "z2": 10000, "z3": 2000, "z4": 500, "z5": 1000, "z6": 116, "z7": 100000}
ROWS = 250


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_time(path, t_us):
    s, us = divmod(t_us, 1_000_000)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(BASE_S + s))
    with open(path + ".tmp", "w") as f:
        f.write(f"{stamp}.{us:06d}\n")
    os.replace(path + ".tmp", path)


def main():
    work = tempfile.mkdtemp(prefix="tollgate-nginx-golden-")
    port = free_port()
    timefile = os.path.join(work, "time")
    log = os.path.join(work, "error.log")
    with open(os.path.join(work, "ok.txt"), "w") as f:
        f.write("ok\n")
    zones = "\n".join(f"  limit_req_zone $arg_key zone={z}:1m rate={r};" for z, r, *_ in SCENARIOS)
    locations = "\n".join(
        f"    location /{z} {{ limit_req zone={z} {opts}; alias {work}/ok.txt; }}"
        for z, _, _, opts, _, _ in SCENARIOS
    )
    # nginx clears its environment at start; `env` keeps what libfaketime reads per call.
    conf = f"""env FAKETIME_TIMESTAMP_FILE;
env FAKETIME_NO_CACHE;
daemon off;
master_process off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {log} info;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  limit_req_log_level notice;
{zones}
  server {{
    listen 127.0.0.1:{port};
{locations}
  }}
}}
"""
    with open(os.path.join(work, "nginx.conf"), "w") as f:
        f.write(conf)
    set_time(timefile, 0)
    env = dict(os.environ, LD_PRELOAD=FAKETIME_LIB, FAKETIME_TIMESTAMP_FILE=timefile, FAKETIME_NO_CACHE="1")
    proc = subprocess.Popen([NGINX, "-p", work, "-c", os.path.join(work, "nginx.conf")], env=env)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        version = subprocess.run([NGINX, "-v"], capture_output=True, text=True).stderr.strip()
        print(f"# {version}; libfaketime; {ROWS} requests per scenario", file=sys.stderr)
        print("spec,t_us,key,allowed,wait_us")
        rng = random.Random(42)
        t = 0
        pending = []
        log_pos = 0
        for zone, _, _, _, spec, gap in SCENARIOS:
            # Each scenario starts well after the previous one: every node is drained.
            t += 100_000_000
            for i in range(ROWS):
                r = rng.random()
                if r < 0.25:
                    pass
                elif r < 0.97:
                    t += int(rng.expovariate(1 / gap))
                else:
                    t += gap * 20
                key = rng.choice("abc")
                set_time(timefile, t)
                rid = f"{zone}-{i}"
                sock = socket.create_connection(("127.0.0.1", port))
                sock.sendall(f"GET /{zone}?key={key}&id={rid} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                sock.settimeout(0.002)
                decided = None
                deadline = time.time() + 5
                while decided is None:
                    try:
                        head = sock.recv(64)
                        status = int(head.split()[1])
                        decided = (1, 0) if status == 200 else (0, None) if status == 503 else None
                        if decided is None:
                            raise SystemExit(f"{rid}: unexpected status {status}")
                    except socket.timeout:
                        with open(log) as f:
                            f.seek(log_pos)
                            text = f.read()
                        m = re.search(r"delaying request, excess: (\d+)\.(\d{3}), by zone \"\w+\".*id=" + re.escape(rid) + r" ", text)
                        if m:
                            excess = int(m.group(1)) * 1000 + int(m.group(2))
                            delay_ms = (excess - DELAY[zone] * 1000) * 1000 // RATE_MILLI[zone]
                            decided = (1, delay_ms * 1000)
                            pending.append(sock)
                        elif time.time() > deadline:
                            raise SystemExit(f"{rid}: no decision from nginx")
                if sock not in pending:
                    sock.close()
                with open(log) as f:
                    f.seek(0, 2)
                    log_pos = f.tell()
                allowed, wait = decided
                print(f"\"{spec}\",{t},{key},{allowed},{'' if wait is None else wait}")
        for s in pending:
            s.close()
    finally:
        proc.terminate()
        proc.wait()
        if os.environ.get("KEEP_LOG"):
            shutil.copy(log, os.environ["KEEP_LOG"])
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
