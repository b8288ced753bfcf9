"""Paid posts beside a stranger's flood of failing paid requests.

Starts a host, registers an identity, then runs `wrk -t2 -c128 -d15s`
against `POST /api/timeline` with one of these floods while posting paid
posts one after another, and prints each paid post's status and seconds:
- `unknown`: an unknown secret (402 payment_invalid);
- `none`: no payment header (402 payment_required);
- `valid401`: a valid secret that is never spent, with a bad signature
  (401 after the charge);
- `macro`: free runs of a macro that spins until its budget (`while (true)
  {}`, 422 after about a second) on `POST /api/mcp/tools/execute`; the
  loop then also times `GET /api/health` and `GET /api/timeline` beside
  each paid post.

    python3 tests/bench/flood.py [BINARY] [PORT] [unknown|none|valid401|macro]

BINARY defaults to target/release/marketplace (plugins from target/plugins),
PORT to 18700 (the admin listener takes PORT+1). Needs `wrk` (apt-get
install wrk) and the `cryptography` package.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "release", "marketplace")
port = int(sys.argv[2]) if len(sys.argv) > 2 else 18700
flood = sys.argv[3] if len(sys.argv) > 3 else "valid401"
plugins = os.path.join(ROOT, "target", "plugins")
token = "flood-bench-admin-token-0123456789abcdef"
data = tempfile.mkdtemp(prefix="flood-")
env = dict(os.environ, MARKETPLACE_ADMIN_TOKEN=token)
server = subprocess.Popen(
    [binary, "serve", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{port + 1}",
     "--data-dir", data, "--plugins", plugins],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
try:
    for line in server.stdout:
        if line.startswith("marketplace listening"):
            break
    base, admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"

    def cpu_seconds():
        with open(f"/proc/{server.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    # Components staged beside the mounted ones compile in the background
    # after the ready line: wait until the server is idle.
    for _ in range(120):
        before = cpu_seconds()
        time.sleep(1)
        if cpu_seconds() - before < 0.05:
            break

    def post(url, body, headers=None):
        req = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"content-type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def mint(amount):
        return post(admin + "/admin/cash/mint", {"amount": amount},
                    {"authorization": "Bearer " + token})[1]["secret"]

    key = Ed25519PrivateKey.generate()
    fp = key.public_key().public_bytes_raw().hex()
    ts = int(time.time())
    status, _ = post(base + "/api/identity",
                     {"nickname": "flood_victim", "pgp_public_key": fp, "timestamp": ts,
                      "signature": key.sign(f"register:flood_victim:{ts}".encode()).hex()},
                     {"x-cash-secret": mint("1")})
    assert status == 201, status
    secrets = [mint("0.3") for _ in range(40)]
    target = base + "/api/timeline"
    if flood == "macro":
        status, _ = post(base + "/api/mcp/tools/define",
                         {"name": "spin", "description": "spins", "kind": "search",
                          "typescript": "while (true) {}",
                          "input_schema": {"type": "object", "properties": {}}})
        assert status == 201, status
        header, target = None, base + "/api/mcp/tools/execute"
        body = json.dumps({"tool": "spin"})
    else:
        header = {"unknown": "e0.3:secret:" + "0" * 64, "none": None,
                  "valid401": mint("0.3")}[flood]
        stranger = Ed25519PrivateKey.generate().public_key().public_bytes_raw().hex()
        body = json.dumps({"author_fingerprint": stranger, "content": "spam",
                           "signature": "00" * 64, "timestamp": int(time.time())})
    lua = os.path.join(data, "flood.lua")
    with open(lua, "w") as f:
        f.write('wrk.method="POST"; wrk.headers["Content-Type"]="application/json"\n')
        if header:
            f.write(f'wrk.headers["X-Cash-Secret"]="{header}"\n')
        f.write(f"wrk.body={json.dumps(body)}\n")
    wrk = subprocess.Popen(["wrk", "-t2", "-c128", "-d15s", "-s", lua, target],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(1)
    answered, reads = [], []

    def timed_get(path):
        started = time.time()
        try:
            with urllib.request.urlopen(base + path, timeout=120) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        return status, round(time.time() - started, 3)
    until = time.time() + 12
    for i, secret in enumerate(secrets):
        if time.time() > until:
            break
        ts = int(time.time())
        content = f"paid post {i}"
        started = time.time()
        status, _ = post(base + "/api/timeline",
                         {"author_fingerprint": fp, "content": content, "timestamp": ts,
                          "signature": key.sign(f"post:{content}:{ts}".encode()).hex()},
                         {"x-cash-secret": secret})
        answered.append((status, round(time.time() - started, 3)))
        if flood == "macro":
            reads.append((timed_get("/api/health"), timed_get("/api/timeline?limit=5")))
    out = wrk.communicate()[0]
    print(f"flood {flood}: paid posts (status, seconds): {answered}")
    if reads:
        print(f"GET /api/health, GET /api/timeline ((status, seconds) each): {reads}")
    print("\n".join(line for line in out.splitlines() if "Requests/sec" in line or "Non-2xx" in line))
finally:
    server.kill()
    server.wait()
    shutil.rmtree(data, ignore_errors=True)
