"""Peak memory of the host under large cash health checks.

Starts a host, then `wrk -t2 -c250 -d10s` posts a 10,000-entry
`/api/cash/health_check` body (random public hashes, about 750 KB) and
prints the server's resident memory before, its peak (VmHWM of
/proc/<pid>/status) and requests/s.

    python3 tests/bench/health_check_memory.py [BINARY] [PORT]

BINARY defaults to target/release/marketplace (plugins from target/plugins),
PORT to 18750. Needs `wrk` (apt-get install wrk). Linux only.
"""
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "release", "marketplace")
port = int(sys.argv[2]) if len(sys.argv) > 2 else 18750
data = tempfile.mkdtemp(prefix="hc-memory-")
server = subprocess.Popen(
    [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", os.path.join(data, "db"),
     "--plugins", os.path.join(ROOT, "target", "plugins")],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def status(field):
    with open(f"/proc/{server.pid}/status") as f:
        return next(line.split()[1] + " kB" for line in f if line.startswith(field + ":"))


try:
    for line in server.stdout:
        if line.startswith("marketplace listening"):
            break
    body = json.dumps([f"e1:public:{secrets.token_hex(32)}" for _ in range(10_000)])
    body_file = os.path.join(data, "body.json")
    with open(body_file, "w") as f:
        f.write(body)
    lua = os.path.join(data, "hc.lua")
    with open(lua, "w") as f:
        f.write(f'local f=io.open("{body_file}"); local b=f:read("*a"); f:close()\n'
                'wrk.method="POST"; wrk.body=b; wrk.headers["Content-Type"]="application/json"\n')
    before = status("VmRSS")
    out = subprocess.run(["wrk", "-t2", "-c250", "-d10s", "-s", lua,
                          f"http://127.0.0.1:{port}/api/cash/health_check"],
                         capture_output=True, text=True).stdout
    rate = next((line.split()[1] for line in out.splitlines() if "Requests/sec" in line), "?")
    print(f"resident before {before}, peak {status('VmHWM')}, now {status('VmRSS')}; {rate} requests/s")
finally:
    server.kill()
    server.wait()
    shutil.rmtree(data, ignore_errors=True)
