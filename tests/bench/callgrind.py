#!/usr/bin/env python3
"""Instructions per request of a running server, counted by callgrind.

    python3 tests/bench/callgrind.py [BIN] [N]

BIN (default target/release/marketplace) runs under `valgrind
--tool=callgrind` with instrumentation off while it starts and warms up;
then, for each of GET /_testing/native (host handler), GET /_testing/ok
(trivial plugin), GET /api/health and a
durable paid POST /api/timeline, instrumentation is switched on for N
(default 30) sequential requests on one keep-alive connection and the count
dumped; then for N rounds of CALLGRIND_BATCH (default 8) paid posts sent at
once on as many connections, so that they share commit batches as under
load (one at a time, each post is a batch of its own); then N searches
for a word all those posts have (20 results). Prints instructions
per request of each: the whole server process
(hyper, tokio, the host, wasmtime and the component), deterministic where
the wall clock and CPU time of this shared VM are not, so two builds can be
compared to about a per cent (the trivial plugin's count falls in one of
two groups, by which worker thread frees what: compare within a group; a
paid post's moves by up to 3 %, by how much of the applier's and the
checkpoints' work falls inside the window). valgrind runs the code on its own CPU
model (no SHA extensions, for one): compare builds with each other, not
with figures from `perf`.

Needs valgrind (Debian package) and Python's `cryptography`; the components
in target/plugins (`cargo xtask build-plugins`). When the plain hyper server
of host/examples/hello.rs is built (`cargo build --release -p marketplace
--example hello`, or HELLO_BIN), it is counted first, on PORT + 1, and its
count is printed first. callgrind counts user-space instructions only: the
kernel's part (the socket reads and writes, the loopback delivery), most of
hello's CPU time, is not in any figure, so these counts compare builds, not
the CPU-time ratios to hello of the external bench. The server gets
`memory_reservation_mib = 256` and 8 instances: valgrind cannot map the
pool's default reservations. Its data dir, log and dumps (for
callgrind_annotate) stay in BENCH_DIR (default /tmp/callgrind-bench).

CALLGRIND_SEED=DIR starts the server on a copy of the data dir DIR (the
external bench's paid run keeps one with BENCH_KEEP=1), so that the search
row is a search over that many posts. CALLGRIND_PLUGINS=DIR serves the
components of DIR (a copy of another build's target/plugins) instead.

CALLGRIND_COMPONENTS=K also prints, for each route, the instructions per
request spent in the components' compiled code and its K dearest
functions: the server then writes a perf map (`perf_map`), whose names
stand in for the addresses callgrind cannot name.
"""
import atexit
import bisect
import collections
import glob
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/marketplace")
N = int(sys.argv[2]) if len(sys.argv) > 2 else 30
PORT = int(os.environ.get("BENCH_PORT", "18090"))
OUT = os.environ.get("BENCH_DIR", "/tmp/callgrind-bench")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
DATA = os.path.join(OUT, "data")
# CALLGRIND_SEED=<data dir>: start from a copy of it (say, the paid run's of
# the external bench, kept with BENCH_KEEP=1), so that the search row reads
# what a search over that many posts reads, not the whole short lists of
# this script's own posts.
SEED = os.environ.get("CALLGRIND_SEED")
if SEED:
    shutil.copytree(SEED, DATA, ignore=shutil.ignore_patterns("*.log", "cache"))


def mint(amount):
    out = subprocess.run([BIN, "cash", "mint", "--data-dir", DATA, amount],
                         check=True, capture_output=True, text=True).stdout
    return out.strip().split()[-1]


# Minted offline, before the server holds the database.
funding = mint("100")
# Paid posts also go BATCH at a time on as many connections, so that they
# share commit batches as under load (one at a time, each is a batch).
BATCH = int(os.environ.get("CALLGRIND_BATCH", "8"))
secrets = [mint("1") for _ in range(N + 5 + N * BATCH)]

env = dict(os.environ,
           MARKETPLACE_LISTEN=f"127.0.0.1:{PORT}",
           MARKETPLACE_TESTING_ROUTES="true",
           # CALLGRIND_PLUGINS: another build's components (a copy of
           # target/plugins), to count two builds of them.
           MARKETPLACE_PLUGINS_DIR=os.environ.get(
               "CALLGRIND_PLUGINS", os.path.join(ROOT, "target/plugins")),
           MARKETPLACE_DATA_DIR=DATA,
           MARKETPLACE_MAX_INSTANCES="8",
           MARKETPLACE_MEMORY_RESERVATION_MIB="256",
           MARKETPLACE_WATCH_PLUGINS="false",
           # CALLGRIND_LOG=info counts the access lines too, as the
           # external bench (and production) runs.
           MARKETPLACE_LOG=os.environ.get("CALLGRIND_LOG", "warn"),
           # Under valgrind a call runs tens of times slower.
           MARKETPLACE_REQUEST_TIMEOUT_MS="60000")
COMPONENTS = int(os.environ.get("CALLGRIND_COMPONENTS", "0"))
if COMPONENTS:
    env["MARKETPLACE_PERF_MAP"] = "true"
conn = None


def connect():
    global conn
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)


def request(method, path, body=None, headers=None, on=None):
    c = on or conn
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    return r.status, r.read()


def start(wrapper):
    """The server, once every family's component is loaded."""
    log = open(os.path.join(OUT, "server.log"), "a")
    server = subprocess.Popen(wrapper + [BIN, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    atexit.register(lambda: server.poll() is None and server.kill())
    for _ in range(900):
        try:
            connect()
            status, body = request("GET", "/api/health")
            plugins = json.loads(body).get("plugins", {}) if status == 200 else {}
            if plugins and all(p.get("status") == "ok" for p in plugins.values()):
                return server
        except (OSError, ValueError, http.client.HTTPException):
            pass
        if server.poll() is not None:
            sys.exit(f"the server exited; see {OUT}/server.log")
        time.sleep(1)
    sys.exit("the components never loaded")


# Once natively, so the components are compiled (into the data dir's cache)
# before valgrind runs the server.
first = start([])
first.terminate()
first.wait()
server = start(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={OUT}/callgrind.out.%p"])
key = Ed25519PrivateKey.generate()
fp = key.public_key().public_bytes_raw().hex()
status, body = request(
    "POST", "/api/identity",
    json.dumps({"nickname": "callgrind", "pgp_public_key": fp,
                "signature": key.sign(b"register:callgrind").hex()}),
    {"content-type": "application/json", "x-cash-secret": funding})
assert status == 201, (status, body)


def post(i, on=None):
    ts = int(time.time())
    content = f"callgrind post {i}: durable paid writes over HTTP"
    body = json.dumps({"author_fingerprint": fp, "content": content, "keywords": [],
                       "post_type": "general", "timestamp": ts,
                       "signature": key.sign(f"post:{content}:{ts}".encode()).hex()})
    status, answer = request("POST", "/api/timeline", body,
                             {"content-type": "application/json", "x-cash-secret": secrets[i]}, on)
    assert status == 201, (status, answer)


together = []


def connect_together():
    """BATCH new connections, each used once (so that their set-up is not
    counted)."""
    together[:] = [http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)
                   for _ in range(BATCH)]
    for c in together:
        request("GET", "/_testing/ok", on=c)


def posts_together(i):
    """BATCH posts at once, one per connection of `together`; a post that
    fails fails the run (a thread's exception would not)."""
    first = 5 + N + i * BATCH
    failed = []

    def one(j, c):
        try:
            post(first + j, c)
        except Exception as e:  # noqa: BLE001 (raised again below)
            failed.append(e)

    threads = [threading.Thread(target=one, args=(j, c)) for j, c in enumerate(together)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]


def count(pid, name, run):
    """Count `pid`'s instructions over N runs of `run` (given 0..N) into the
    dump `name`."""
    def control(*args):
        subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)
    control("-z")
    control("-i", "on")
    for i in range(N):
        run(i)
    control("-i", "off")
    control("-d", name)


for i in range(5):
    request("GET", "/_testing/ok")
    request("GET", "/api/health")
    post(i)
# (name, one run, requests per run)
runs = [("native", lambda i: request("GET", "/_testing/native"), 1),
        ("ok", lambda i: request("GET", "/_testing/ok"), 1),
        ("health", lambda i: request("GET", "/api/health"), 1),
        ("post", lambda i: post(5 + i), 1),
        (f"post-x{BATCH}", posts_together, BATCH),
        # Over the posts made above (every one has the word): 20 results.
        ("search", lambda i: request("GET", "/api/search?term=durable&limit=20"), 1)]

# CALLGRIND_ROUTES=native,ok,... counts only those rows.
only = os.environ.get("CALLGRIND_ROUTES")
if only:
    runs = [r for r in runs if r[0] in only.split(",")]

# The reference: the plain hyper server of host/examples/hello.rs (what the
# external bench calls hello), counted the same way, when it is built.
HELLO = os.environ.get("HELLO_BIN", os.path.join(ROOT, "target/release/examples/hello"))
hello = None
if os.path.exists(HELLO):
    hello = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no",
         f"--callgrind-out-file={OUT}/hello.out.%p", HELLO, f"127.0.0.1:{PORT + 1}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    atexit.register(lambda: hello.poll() is None and hello.kill())
    for _ in range(120):
        try:
            c = http.client.HTTPConnection("127.0.0.1", PORT + 1, timeout=60)
            c.request("GET", "/")
            c.getresponse().read()
            break
        except OSError:
            time.sleep(1)

    def hello_get(_):
        c.request("GET", "/")
        c.getresponse().read()

    for i in range(5):
        hello_get(i)
    count(hello.pid, "hello", hello_get)
    hello.terminate()
    hello.wait()

for name, run, per_run in runs:
    connect()
    request("GET", "/_testing/ok")
    if per_run > 1:
        connect_together()
    count(server.pid, name, run)
server.terminate()
server.wait()


def dump_of(name):
    """The path and text of the dump `name`."""
    for dump in glob.glob(f"{OUT}/*.out.*"):
        with open(dump, errors="ignore") as f:
            text = f.read()
        if f"Trigger: dump {name}\n" in text:
            return dump, text
    return None, ""


def counted(name, per_run=1):
    """Instructions per request of the dump `name` (`per_run` requests in
    each of its N runs)."""
    _, text = dump_of(name)
    if not text:
        return 0
    return max(int(line.split()[1]) for line in text.splitlines()
               if line.startswith(("summary:", "totals:"))) / (N * per_run)


def component_functions(name, per_run):
    """Instructions per request in the components' compiled code, and the
    dearest functions, named from the server's perf map."""
    entries = []
    with open(f"/tmp/perf-{server.pid}.map", errors="ignore") as f:
        for line in f:
            parts = line.rstrip("\n").split(" ", 2)
            if len(parts) == 3:
                entries.append((int(parts[0], 16), int(parts[1], 16), parts[2]))
    entries.sort()
    starts = [e[0] for e in entries]
    dump, _ = dump_of(name)
    table = subprocess.run(["callgrind_annotate", "--threshold=100", dump],
                           check=True, capture_output=True, text=True).stdout
    by_name = collections.Counter()
    for line in table.splitlines():
        m = re.match(r"\s*([\d,]+) .*\?\?\?:0x([0-9a-f]+) \[\?\?\?\]", line)
        if not m:
            continue
        at = int(m.group(2), 16)
        i = bisect.bisect_right(starts, at) - 1
        if i < 0 or at >= entries[i][0] + entries[i][1]:
            continue
        # Without the function's index and the mangled name's hash.
        fn = re.sub(r"^wasm\[\d+\]::function\[\d+\]::", "", entries[i][2])
        fn = re.sub(r"17h[0-9a-f]{16}E$", "E", fn)
        by_name[fn] += int(m.group(1).replace(",", ""))
    per = N * per_run
    return sum(by_name.values()) / per, [(n / per, fn) for fn, n in by_name.most_common(COMPONENTS)]


base = counted("hello") if hello else 0
if base:
    print(f"hello: {base:,.0f} instructions/request ({N} requests)")
for name, _, per_run in runs:
    print(f"{name}: {counted(name, per_run):,.0f} instructions/request ({N * per_run} requests)")
    if COMPONENTS:
        total, dearest = component_functions(name, per_run)
        print(f"  in components: {total:,.0f}")
        for n, fn in dearest:
            print(f"  {n:>9,.0f}  {fn[:110]}")
