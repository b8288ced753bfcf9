"""Drive the reference webcash wallet (PyPI `webcash==0.0.5`) against the
built service, as a user would (PROTOCOL section 3).

The wallet is run as its own command line (`webcash.walletclient:main`, the
`webcash` console script) in a fresh directory, one process per command,
with only its server endpoint constants pointed at the test server (they
name the public server, https://webcash.org/api/v1/...). The first run
creates the wallet and asks to accept the terms: answered `y` on stdin.

Flow: mint a secret through the admin API; `insert` it; `pay` an amount with
change (the wallet's replace with two outputs); spend the payment on a paid
route (POST /api/identity, X-Cash-Secret) and `insert` the service's change
(X-Cash-Change) back; `check`; then restore a second wallet from the first
one's master secret, `recover` it (health checks of 1,000 entries: the
wallet takes its key depth from the last entries of each answer) and
`insert` again into the recovered wallet (which reuses no spent secret only
if the depths were recovered). Run by .ci/run after the Rust tests.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from service import http, mint, public, running

TOKEN = "webcash-wallet-check-admin-token-0123456789abcdef"

# `webcash <args>` with the endpoint constants aimed at the test server.
LAUNCH = """
import sys
import webcash.walletclient as wallet
base = sys.argv[1]
wallet.WEBCASH_ENDPOINT_REPLACE = base + "/api/v1/replace"
wallet.WEBCASH_ENDPOINT_HEALTH_CHECK = base + "/api/v1/health_check"
sys.argv = ["webcash"] + sys.argv[2:]
sys.exit(wallet.main())
"""


def fail(message):
    sys.exit(f"webcash wallet: {message}")


def states(base, secrets):
    status, _, body = http("POST", base + "/api/v1/health_check", [public(s) for s in secrets])
    if status != 200:
        fail(f"health_check: {status} {body!r}")
    results = json.loads(body)["results"]
    return [(results[public(s)]["spent"], results[public(s)]["amount"]) for s in secrets]


def wallet(base, home, *args, stdin=""):
    p = subprocess.run([sys.executable, "-c", LAUNCH, base, *args], cwd=home, input=stdin,
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        fail(f"`webcash {' '.join(args)}` exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout


def load(home):
    with open(os.path.join(home, "default_wallet.webcash")) as f:
        return json.load(f)


def balance(base, home):
    out = wallet(base, home, "info")
    m = re.search(r"Total amount stored in this wallet \(if secure\): e([0-9.]+)", out)
    if not m:
        fail(f"info printed no total:\n{out}")
    return m.group(1)


def register(base, nickname, secret):
    key = Ed25519PrivateKey.generate()
    fp = key.public_key().public_bytes_raw().hex()
    ts = int(time.time())
    body = {"nickname": nickname, "pgp_public_key": fp, "timestamp": ts,
            "signature": key.sign(f"register:{nickname}:{ts}".encode()).hex()}
    return http("POST", base + "/api/identity", body, {"X-Cash-Secret": secret})


with running(admin_token=TOKEN) as (base, admin), tempfile.TemporaryDirectory() as tmp:
    # The terms the wallet's `legalese.terms` accepts are served as text.
    for path in ("/terms", "/terms/text"):
        status, headers, body = http("GET", base + path)
        ctype = {k.lower(): v for k, v in headers.items()}.get("content-type", "")
        if status != 200 or not ctype.startswith("text/plain") or not body.strip():
            fail(f"GET {path}: {status} {ctype} {body[:80]!r}")

    home = os.path.join(tmp, "alice")
    os.mkdir(home)
    # First run: a new wallet, whose terms prompt is answered on stdin.
    out = wallet(base, home, "info", stdin="y\n")
    if "Do you agree?" not in out or load(home)["legalese"] != {"terms": True}:
        fail(f"the first run did not ask for and record the terms:\n{out}")
    master = load(home)["master_secret"]

    # insert: the minted secret is replaced by one of the wallet's own.
    minted = mint(admin, TOKEN, "1")
    out = wallet(base, home, "insert", minted, "from", "the", "operator")
    if "Saved e1 in the wallet" not in out:
        fail(f"insert:\n{out}")
    if states(base, [minted]) != [(True, "1")]:
        fail("the inserted secret is not spent")
    if balance(base, home) != "1":
        fail("balance after insert")

    # pay 0.7: the wallet keeps 0.3 change and prints the payment.
    out = wallet(base, home, "pay", "0.7", "identity")
    m = re.search(r"Make this payment using the following webcash: (e0\.7:secret:[0-9a-f]{64})", out)
    if not m:
        fail(f"pay printed no payment:\n{out}")
    payment = m.group(1)
    if balance(base, home) != "0.3":
        fail("balance after pay")

    # Spend it on a paid route (identity costs 0.6): 0.1 comes back as change.
    status, headers, body = register(base, "walletuser", payment)
    if status != 201:
        fail(f"POST /api/identity with the wallet's payment: {status} {body!r}")
    change = {k.lower(): v for k, v in headers.items()}.get("x-cash-change", "")
    if not change.startswith("e0.1:secret:") or json.loads(body)["payment"]["change"] != change:
        fail(f"no change from the paid route: {headers}")
    if states(base, [payment, change]) != [(True, "0.7"), (False, "0.1")]:
        fail("payment not spent or change not live")

    # The change goes back into the wallet.
    out = wallet(base, home, "insert", change, "change")
    if "Saved e0.1 in the wallet" not in out or balance(base, home) != "0.4":
        fail(f"insert change:\n{out}")
    wallet(base, home, "check")
    if balance(base, home) != "0.4":
        fail("check removed live cash")
    depths = load(home)["walletdepths"]

    # A second wallet from the master secret alone, recovered with health
    # checks of 1,000 entries each.
    restored = os.path.join(tmp, "restored")
    os.mkdir(restored)
    wallet(base, restored, "info", stdin="y\n")
    w = load(restored)
    w["master_secret"] = master
    with open(os.path.join(restored, "default_wallet.webcash"), "w") as f:
        json.dump(w, f)
    out = wallet(base, restored, "recover", "--gaplimit", "1000")
    if "Recovered webcash: 0.3" not in out or "Recovered webcash: 0.1" not in out:
        fail(f"recover:\n{out}")
    if balance(base, restored) != "0.4":
        fail("balance after recover")
    got = load(restored)["walletdepths"]
    if got["RECEIVE"] != depths["RECEIVE"]:
        fail(f"recovered depths {got}, the wallet had {depths}")

    # insert again, into the recovered wallet: a fresh RECEIVE secret.
    more = mint(admin, TOKEN, "0.5")
    out = wallet(base, restored, "insert", more)
    if "Saved e0.5 in the wallet" not in out or balance(base, restored) != "0.9":
        fail(f"insert after recover:\n{out}")
    wallet(base, restored, "check")
    if balance(base, restored) != "0.9":
        fail("check after recover")
    if any(spent is not False for spent, _ in states(base, load(restored)["webcash"])):
        fail("the recovered wallet holds spent or unknown cash")

print(f"webcash wallet: insert, pay with change, paid route, insert change, "
      f"recover (gaplimit 1000) and insert again all work against {base}")
