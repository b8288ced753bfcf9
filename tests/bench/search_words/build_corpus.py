"""Build the search corpus: ~20,000 paid posts on a running server.

Env: BASE, ADMIN, DATA (see mk.py). Usage: python3 build_corpus.py [N_POSTS] [THREADS]
Vocabulary: 3,000 synthetic words, Zipf-Mandelbrot p(r) ~ 1/(r+25)^1.5.
Each post: 8..40 words; post_type general 40% / service_offer 30% / service_request 30%.
PAIR_N extra-designed posts carry both PAIR words (ranks 150 and 170, mid-frequency).
Payment: each thread mints one secret and chains X-Cash-Change from post to post.
"""
import os, sys, json, time, random, threading, bisect
import requests
import mk

N_POSTS = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 8
PAIR_N = 200
SEED = 36

def vocab(n=3000, seed=SEED):
    rnd = random.Random(seed)
    cons = "bcdfghjklmnprstvz"; vow = "aeiou"
    out, seen = [], set()
    while len(out) < n:
        w = "".join(rnd.choice(cons) + rnd.choice(vow) for _ in range(rnd.randint(2, 4)))
        if w not in seen:
            seen.add(w); out.append(w)
    return out

WORDS = vocab()
S_EXP, Q = 1.5, 25
_w = [1 / (r + Q) ** S_EXP for r in range(1, len(WORDS) + 1)]
_cum = []
_t = 0.0
for x in _w:
    _t += x; _cum.append(_t)
PAIR = (WORDS[149], WORDS[169])

def draw(rnd):
    return WORDS[min(bisect.bisect_left(_cum, rnd.random() * _t), len(WORDS) - 1)]

def content(rnd, pair):
    n = rnd.randint(8, 40)
    ws = [draw(rnd) for _ in range(n - (2 if pair else 0))]
    if pair:
        for w in PAIR:
            ws.insert(rnd.randrange(len(ws) + 1), w)
    return " ".join(ws)

def ptype(rnd):
    x = rnd.random()
    return "general" if x < 0.4 else ("service_offer" if x < 0.7 else "service_request")

lock = threading.Lock()
done = [0]
errors = []

def worker(tid, count, pair_idx):
    rnd = random.Random(SEED * 1000 + tid)
    sess = requests.Session()
    keys = [mk.register(nick=f"bench{tid}x{j}") for j in range(2)]
    secret = mk.mint(count * float(mk.fee("post")) + 5)
    i = 0
    while i < count:
        k = rnd.choice(keys)
        body = {"author_fingerprint": k.fp, "content": content(rnd, i in pair_idx),
                "post_type": ptype(rnd)}
        sig, ts = k.fresh("post:" + body["content"])
        body["signature"] = sig; body["timestamp"] = ts
        for attempt in range(5):
            try:
                r = sess.post(mk.BASE + "/api/timeline", json=body,
                              headers={"X-Cash-Secret": secret}, timeout=60)
                break
            except requests.RequestException as e:  # identical retry gets the stored answer
                time.sleep(0.5)
        else:
            raise SystemExit(f"thread {tid}: no answer")
        if r.status_code != 201:
            with lock:
                errors.append((tid, r.status_code, r.text[:200]))
            if r.status_code == 409:
                continue  # new content/timestamp next time; the secret was not spent
            raise SystemExit(f"thread {tid}: {r.status_code} {r.text[:300]}")
        secret = r.headers["X-Cash-Change"]
        i += 1
        with lock:
            done[0] += 1

def main():
    per = N_POSTS // THREADS
    rnd = random.Random(SEED)
    # spread the PAIR_N pair posts over the threads
    pair_per = PAIR_N // THREADS
    ths = []
    t0 = time.time()
    for tid in range(THREADS):
        idx = set(random.Random(tid).sample(range(per), pair_per))
        th = threading.Thread(target=worker, args=(tid, per, idx), daemon=True)
        th.start(); ths.append(th)
    while any(t.is_alive() for t in ths):
        time.sleep(10)
        print(f"{time.time()-t0:.0f}s posts={done[0]} errors={len(errors)}", flush=True)
    print("done", done[0], "in", round(time.time() - t0), "s; errors:", errors[:5])
    json.dump({"words": WORDS, "pair": PAIR, "zipf": [S_EXP, Q], "posts": done[0]},
              open(os.environ.get("M", "/tmp/search-words") + "/corpus_meta.json", "w"))

if __name__ == "__main__":
    main()
