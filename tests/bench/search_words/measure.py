"""Server CPU per search request, old (A) vs new (B) search plugin.

Usage: python3 measure.py ROUNDS [query-keys]   (e.g. python3 measure.py 3 a b c d e f)
Each run: fresh `cp -a` of the master data dir, start the server with pA or pB
(MARKETPLACE_LOG=warn), wait until /api/health says every family is ok, 2 s idle
(background check), 2 s warm-up. Before each run it waits until the machine is quiet
(< 0.1 core busy over 3 s) and records other_cores: CPU used during the wrk run by
processes other than the server and wrk (system busy ticks - server - wrk) (wrk), then `wrk -t2 -c16 -d6s --latency URL`
bracketed by utime+stime of the server from /proc/<pid>/stat (fields 14, 15).
Results appended as JSON lines to results.jsonl, wrk output kept in runs/.
"""
import os, sys, json, time, shutil, signal, subprocess, re, resource, urllib.parse

M = os.environ.get("M", "/tmp/search-words")
MASTER = f"{M}/data"
PORT, APORT = 18810, 18811
TCK = os.sysconf("SC_CLK_TCK")
QUERIES = {
    "a": ("camabu", None),                    # very common (39% of posts)
    "b": ("kuvike", None),                    # mid-frequency (2%)
    "c": ("camabu helopulu", None),           # two common words
    "d": ("faceka zaneha", None),             # the pair, together in 214 posts
    "e": ("sori siralojo dapo", None),        # common + mid + rare
    "f": ("camabu", "general"),               # common word, post_type filter
    "g": ("kuvike camabu", None),             # mid-frequency + common
}

def url(key):
    term, pt = QUERIES[key]
    q = {"term": term, "limit": "20"}
    if pt:
        q["post_type"] = pt
    return f"http://127.0.0.1:{PORT}/api/search?" + urllib.parse.urlencode(q, quote_via=urllib.parse.quote)

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])  # fields 14, 15 (1-based, after pid and comm)

def parse_wrk(out):
    def dur(s):
        v, u = re.match(r"([\d.]+)(us|ms|s)", s).groups()
        return float(v) * {"us": 1e-3, "ms": 1, "s": 1e3}[u]
    r = {}
    r["requests"] = int(re.search(r"(\d+) requests in", out).group(1))
    r["rps"] = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    for p in ("50", "99"):
        r[f"p{p}_ms"] = dur(re.search(rf"^\s+{p}(?:\.000)?%\s+(\S+)", out, re.M).group(1))
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    r["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: (.*)", out)
    r["socket_errors"] = m.group(1) if m else ""
    return r

def sys_busy():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(f) - f[3] - f[4], sum(f)  # busy (all but idle, iowait), total

def wait_quiet(max_other=0.10, window=3.0):
    """Wait until the machine (none of our processes running) is idle: < max_other cores busy."""
    waited = 0
    while True:
        b0, _ = sys_busy(); time.sleep(window); b1, _ = sys_busy()
        cores = (b1 - b0) / TCK / window
        if cores < max_other:
            return waited
        waited += window
        if waited % 60 < window:
            print(f"waiting for a quiet machine: {cores:.2f} cores busy, waited {waited:.0f}s", flush=True)

def run(key, variant, rnd):
    quiet_wait = wait_quiet()
    name = f"{key}_{variant}_{rnd}"
    d = f"{M}/runs/{name}"
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(f"{M}/runs", exist_ok=True)
    subprocess.run(["cp", "-a", MASTER, d], check=True)
    pid = int(subprocess.run([os.path.join(os.path.dirname(os.path.abspath(__file__)), "start_server.sh"), f"{M}/p{variant}", d, str(PORT), str(APORT),
                              f"{M}/runs/{name}.server.log"], capture_output=True, text=True).stdout.strip())
    try:
        u = url(key)
        c = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", u], capture_output=True, text=True).stdout
        c0 = cpu(pid); time.sleep(2); idle = cpu(pid) - c0
        subprocess.run(["wrk", "-t2", "-c16", "-d2s", u], capture_output=True)  # warm-up
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN); s1, _ = sys_busy()
        c1 = cpu(pid); t1 = time.time()
        out = subprocess.run(["wrk", "-t2", "-c16", "-d6s", "--latency", u], capture_output=True, text=True).stdout
        c2 = cpu(pid); t2 = time.time()
        s2, _ = sys_busy(); ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
        wrk_s = (ru2.ru_utime + ru2.ru_stime) - (ru1.ru_utime + ru1.ru_stime)
        open(f"{M}/runs/{name}.wrk.txt", "w").write(out)
        r = parse_wrk(out)
        ticks = c2 - c1
        r.update(query=key, variant=variant, round=rnd, url=u, curl_status=c, idle_ticks_2s=idle,
                 cpu_ticks=ticks, wall_s=round(t2 - t1, 2),
                 cpu_us_per_req=round(ticks / TCK * 1e6 / r["requests"], 1),
                 cpu_util=round(ticks / TCK / (t2 - t1), 2), wrk_cpu_s=round(wrk_s, 2),
                 other_cores=round(((s2 - s1) / TCK - ticks / TCK - wrk_s) / (t2 - t1), 2),
                 quiet_wait_s=quiet_wait, t=time.strftime("%H:%M:%S"))
    finally:
        os.kill(pid, signal.SIGTERM)
        for _ in range(150):
            try:
                os.kill(pid, 0); time.sleep(0.1)
            except ProcessLookupError:
                break
        else:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(d, ignore_errors=True)
    with open(f"{M}/results.jsonl", "a") as f:
        f.write(json.dumps(r) + "\n")
    print(json.dumps(r), flush=True)

if __name__ == "__main__":
    rounds = int(sys.argv[1])
    keys = sys.argv[2:] or list(QUERIES)
    for key in keys:
        for rnd in range(rounds):
            for v in ("A", "B"):
                run(key, v, rnd)
