#!/usr/bin/env python3
"""Does a read cost more CPU once the cache is warm?  Pairs, alternating.

Two hosts (the real `target/release/marketplace`) on two copies of one data
dir: W warmed once over the whole database (every vocabulary word searched
at limit=100, the whole timeline walked), F restarted before each round
(then a short warm-up on the measured paths only). Each round loads F and
W, in turn first, with `wrk` (2 threads, 32 connections) over the same search paths, and
prints each host's CPU per request (utime + stime of /proc/<pid>/stat over
the load, divided by the requests answered) and its resident memory.

The data dir and its paths come from the search bench:

    BENCH_KEEP=1 BENCH_POSTS=200000 BENCH_SECONDS=2 BENCH_ROUNDS=1 \\
      BENCH_DIR=/tmp/wc cargo bench -p marketplace --bench search
    python3 tests/bench/warm_cache.py /tmp/wc/.tmpXXXX   # the dir it says it kept

With WARM_OTHER_CACHE_MIB=N, F is instead a second host warmed as W is,
once, with `store_cache_mib = N`: two cache sizes compared, both warm.
Any other MARKETPLACE_* setting in the environment reaches both hosts.

Settings (environment): WARM_ROUNDS (4), WARM_SECONDS (10 per load),
WARM_PORT (18080; F takes the next port), WARM_BIN and WARM_PLUGINS (the
release host and `target/plugins`), WARM_VOCABULARY (20000, the bench's).
"""

import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("WARM_BIN", os.path.join(ROOT, "target/release/marketplace"))
PLUGINS = os.environ.get("WARM_PLUGINS", os.path.join(ROOT, "target/plugins"))
ROUNDS = int(os.environ.get("WARM_ROUNDS", "4"))
SECONDS = int(os.environ.get("WARM_SECONDS", "10"))
PORT = int(os.environ.get("WARM_PORT", "18080"))
VOCABULARY = int(os.environ.get("WARM_VOCABULARY", "20000"))
TICK = os.sysconf("SC_CLK_TCK")

# The search bench's words (tests/bench/search.rs, `word`).
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "zi",
             "pe", "su", "do", "ga", "hi", "ju", "be", "fa"]


def word(i):
    w, n = "", i + 16
    while n > 0:
        w += SYLLABLES[n % 16]
        n //= 16
    return w


class Host:
    """A host serving `data`; listed in `started` (to be stopped) at once."""

    def __init__(self, data, port, log, started, env=None):
        self.port = port
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [BIN, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data,
                 "--plugins", PLUGINS],
                stdout=subprocess.DEVNULL, stderr=err,
                env=dict(os.environ, **(env or {})))
        started.append(self)
        until = time.time() + 120
        while time.time() < until and self.proc.poll() is None:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/api/health")
                # (`loading` is 200 too, while families still load.)
                if json.loads(c.getresponse().read()).get("status") == "ok":
                    return
            except (OSError, ValueError, http.client.HTTPException):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the host on port {port} did not become healthy (log: {log})")

    def cpu(self):
        fields = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return int(fields[11]) / TICK, int(fields[12]) / TICK

    def rss_mib(self):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
        return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


def load(host, lua, seconds):
    """wrk over the paths; (requests, CPU µs a request, of it the kernel's)."""
    u0, s0 = host.cpu()
    out = subprocess.run(
        ["wrk", "-t2", "-c32", f"-d{seconds}s", "-s", lua, f"http://127.0.0.1:{host.port}"],
        capture_output=True, text=True, check=True).stdout
    u1, s1 = host.cpu()
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"failed requests:\n{out}")
    return requests, (u1 - u0 + s1 - s0) / requests * 1e6, (s1 - s0) / requests * 1e6


def warm(port, threads=3):
    """Every vocabulary word searched, and the whole timeline walked."""
    def get(c, path):
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"{path}: {r.status} {body[:200]!r}")
        return body

    errors = []

    def caught(f, *args):
        try:
            f(*args)
        except Exception as e:  # noqa: BLE001 (re-raised by the caller)
            errors.append(e)

    def searcher(k):
        c = http.client.HTTPConnection("127.0.0.1", port)
        for i in range(k, VOCABULARY, threads):
            get(c, f"/api/search?term={word(i)}&limit=100")

    walked = []

    def walker():
        c = http.client.HTTPConnection("127.0.0.1", port)
        before, n = None, 0
        while True:
            page = json.loads(get(c, "/api/timeline?limit=100" + (f"&before={before}" if before else "")))
            n += len(page["posts"])
            before = page.get("next_before")
            if not before:
                break
        walked.append(n)

    ts = [threading.Thread(target=caught, args=(searcher, k)) for k in range(threads)]
    ts.append(threading.Thread(target=caught, args=(walker,)))
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return walked[0]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    kept = sys.argv[1]
    paths = open(os.path.join(kept, "search_paths.txt")).read().split()
    work = tempfile.mkdtemp(prefix="warm_cache.", dir=os.environ.get("BENCH_DIR"))
    lua = os.path.join(work, "paths.lua")
    with open(lua, "w") as f:
        f.write("local paths = {" + ",".join(json.dumps(p) for p in paths) + "}\n"
                "local i = 0\nrequest = function()\n  i = i + 1\n"
                "  return wrk.format('GET', paths[(i % #paths) + 1])\nend\n")
    started = []
    try:
        rows = rounds(kept, work, lua, started)
    finally:
        for host in started:
            host.stop()
        shutil.rmtree(work)
    ratios = sorted(b / a for a, b in rows)
    cache = os.environ.get("MARKETPLACE_STORE_CACHE_MIB", "1024")
    other = os.environ.get("WARM_OTHER_CACHE_MIB")
    what = f"cache {cache} MiB / {other} MiB, both warm" if other else f"warm / fresh, cache {cache} MiB"
    print(f"W/F ({what}) CPU a search: median {statistics.median(ratios):.2f} "
          f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})")


def rounds(kept, work, lua, started):
    """The pairs: [(F's CPU a search, W's)], one a round."""
    w_data, f_data = os.path.join(work, "w"), os.path.join(work, "f")
    for d in (w_data, f_data):
        shutil.copytree(os.path.join(kept, "data"), d)
    other = os.environ.get("WARM_OTHER_CACHE_MIB")
    w = Host(w_data, PORT, os.path.join(work, "w.log"), started)
    hosts = [(w, "W", PORT)]
    kept_f = None
    if other:
        kept_f = Host(f_data, PORT + 1, os.path.join(work, "f.log"), started,
                      {"MARKETPLACE_STORE_CACHE_MIB": other})
        hosts.append((kept_f, f"F (store_cache_mib = {other})", PORT + 1))
    for host, name, port in hosts:
        began = time.time()
        posts = 0
        for _ in range(2):
            posts = warm(port)
        print(f"{name} warmed: {VOCABULARY} words searched and {posts} posts walked, twice, "
              f"in {time.time() - began:.0f} s; resident {host.rss_mib()} MiB", flush=True)
    f_name = f"F (cache {other} MiB, warm)" if other else "F (fresh)"
    rows = []
    for r in range(1, ROUNDS + 1):
        f = kept_f or Host(f_data, PORT + 1, os.path.join(work, "f.log"), started)
        if not other:
            load(f, lua, 5)
        # Each first in turn: the VM drifts within a round too.
        if r % 2:
            fresh = load(f, lua, SECONDS)
            warmed = load(w, lua, SECONDS)
        else:
            warmed = load(w, lua, SECONDS)
            fresh = load(f, lua, SECONDS)
        f_rss = f.rss_mib()
        if not other:
            f.stop()
            started.remove(f)
        rows.append((fresh[1], warmed[1]))
        print(f"round {r}: {f_name} {fresh[1]:.1f} µs/search (kernel {fresh[2]:.1f}, "
              f"{fresh[0] / SECONDS:.0f}/s, {f_rss} MiB); W {warmed[1]:.1f} µs "
              f"(kernel {warmed[2]:.1f}, {warmed[0] / SECONDS:.0f}/s, {w.rss_mib()} MiB); "
              f"W/F {warmed[1] / fresh[1]:.2f}", flush=True)
    return rows


if __name__ == "__main__":
    main()
