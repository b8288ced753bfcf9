"""Legitimate CPU-heavy macros started together from one address.

Starts a host on a fresh data dir, waits for it to be idle (staged
components compile after the ready line), defines a macro that loops
3,000,000 times (about 270 ms here) and prints the status and seconds of
one run alone, then of two runs started together (three times), then of
eight. Each run should answer 200: the long calls' turns and the
per-address admission (README, "Long calls") must not fail a macro that
fits its budget (950 ms; 500 ms until the hundredth session) with the
time its wait for its turn left it (twice the budget less that wait).

    python3 tests/bench/macros_together.py [BINARY] [PORT] [runaway]

With `runaway`, it runs a macro that never returns (`while (true) {}`)
instead: alone, then 6, 10, 30 and 100 sent together from this one
address, printing each batch's statuses and its first and last answer's
seconds (PROTOCOL 8: each answered 422 within 2 s; README, "Macros").

BINARY defaults to target/release/marketplace (plugins from target/plugins),
PORT to 18930.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "release", "marketplace")
port = int(sys.argv[2]) if len(sys.argv) > 2 else 18930
data = tempfile.mkdtemp(prefix="macros-")
env = dict(os.environ, MARKETPLACE_ADMIN_TOKEN="macros-bench-admin-token-0123456789abcdef")
server = subprocess.Popen(
    [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data,
     "--plugins", os.path.join(ROOT, "target", "plugins")],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)


def cpu_seconds():
    with open(f"/proc/{server.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    started = time.time()
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    return status, round(time.time() - started, 3)


runaway = len(sys.argv) > 3 and sys.argv[3] == "runaway"


def together(n):
    out = []
    tool = {"tool": "spin", "arguments": {}} if runaway else {"tool": "loop", "arguments": {"term": "hello"}}
    run = lambda: out.append(post("/api/mcp/tools/execute", tool))
    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(out)


try:
    for line in server.stdout:
        if line.startswith("marketplace listening"):
            break
    for _ in range(120):
        before = cpu_seconds()
        time.sleep(1)
        if cpu_seconds() - before < 0.05:
            break
    if runaway:
        status, _ = post("/api/mcp/tools/define", {
            "name": "spin", "kind": "search", "description": "never returns",
            "typescript": "while (true) {}", "input_schema": {"type": "object", "properties": {}}})
        assert status == 201, status
        for n in [1, 6, 10, 30, 100]:
            answers = sorted(together(n), key=lambda a: a[1])
            print(f"{n} together: statuses {sorted(set(s for s, _ in answers))}, "
                  f"first {answers[0][1]} s, last {answers[-1][1]} s")
        sys.exit(0)
    status, _ = post("/api/mcp/tools/define", {
        "name": "loop", "kind": "search", "description": "a loop, then a search",
        "typescript": "let x = 0; for (let i = 0; i < 3000000; i++) { x += i % 7; } return {term: args.term, limit: 5};",
        "input_schema": {"type": "object", "properties": {"term": {"type": "string"}}}})
    assert status == 201, status
    print("alone (status, seconds):", together(1))
    for _ in range(3):
        print("two together:", together(2))
    print("eight together:", together(8))
finally:
    server.kill()
    server.wait()
    shutil.rmtree(data, ignore_errors=True)
