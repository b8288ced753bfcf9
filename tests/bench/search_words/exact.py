"""Exact BM25F top-k from the timeline (independent model) vs the server's page.
usage: exact.py BASE query [query...]   (queries as plain text)"""
import sys, json, math, re, urllib.request, urllib.parse, collections
BASE = sys.argv[1]
def get(path):
    with urllib.request.urlopen(BASE + path) as r:
        return json.load(r)
posts, before = [], None
while True:
    q = "/api/timeline?limit=100" + (f"&before={before}" if before else "")
    page = get(q)
    posts += page["posts"]
    before = page.get("next_before")
    if not before:
        break
def toks(text):
    return [t[:64].lower() for t in re.split(r"[^A-Za-z0-9]+", text) if t]
tf, lens = {}, {}
df = collections.Counter()
for p in posts:
    c = collections.Counter()
    for t in toks(p["content"]):
        c[t] += 3
    for k in p.get("keywords") or []:
        for t in toks(k):
            c[t] += 2
    tf[p["post_id"]] = c
    lens[p["post_id"]] = sum(c.values())
    df.update(c.keys())
N = len(posts); avgdl = sum(lens.values()) / N
def score(pid, terms):
    s = 0.0
    for t in terms:
        f = tf[pid].get(t, 0)
        if not f: continue
        idf = math.log(1 + (N - df[t] + 0.5) / (df[t] + 0.5))
        s += idf * f * 2.2 / (f + 1.2 * (0.25 + 0.75 * lens[pid] / avgdl))
    return s
for query in sys.argv[2:]:
    terms = sorted(set(toks(query)))
    ranked = sorted(((score(p, terms), p) for p in tf), key=lambda x: -x[0])[:20]
    got = get("/api/search?" + urllib.parse.urlencode({"term": query, "limit": 20}))
    ids = [r["post_id"] for r in got["results"]]
    exact = [p for _, p in ranked]
    kth = ranked[-1][0]
    # a result counts as right when its score reaches the exact 20th (ties)
    right = sum(1 for r in got["results"] if score(r["post_id"], terms) >= kth - 1e-9)
    print(f"{query!r}: N={N} in exact top20 {len(set(ids) & set(exact))}/20, at least the 20th's score {right}/20, 20th={kth:.4f}")
