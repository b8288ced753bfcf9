"""Helpers for black-box tests of the marketplace. BASE / ADMIN from env."""
import os, time, json, hashlib, requests
from nacl.signing import SigningKey

BASE = os.environ.get("BASE", "http://127.0.0.1:18650")
ADMIN = os.environ.get("ADMIN", "http://127.0.0.1:18651")
DATA = os.environ.get("DATA", os.environ.get("M", "/tmp/search-words") + "/data")
S = requests.Session()


def token():
    return open(os.path.join(DATA, "admin.token")).read().strip()


def mint(amount):
    r = requests.post(ADMIN + "/admin/cash/mint", json={"amount": str(amount)},
                      headers={"Authorization": "Bearer " + token()})
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()["secret"]


class Key:
    def __init__(self, seed=None):
        self.sk = SigningKey(seed) if seed else SigningKey.generate()
        self.fp = self.sk.verify_key.encode().hex()

    def sign(self, msg):
        return self.sk.sign(msg.encode()).signature.hex()

    def fresh(self, msg, ts=None):
        ts = int(time.time()) if ts is None else ts
        return self.sign(f"{msg}:{ts}"), ts


def post(path, body, secret=None, headers=None):
    h = dict(headers or {})
    if secret:
        h["X-Cash-Secret"] = secret
    return S.post(BASE + path, json=body, headers=h)


def get(path, **params):
    return S.get(BASE + path, params=params)


_fees = {}


def fee(action):
    if not _fees:
        _fees.update({k: v["price"] for k, v in S.get(BASE + "/api/fees").json()["actions"].items()})
    return _fees[action]


_nick = [0]


def register(nick=None, about=None, k=None):
    k = k or Key()
    nick = nick or f"u{int(time.time()*1000)%10**9}{_nick[0]}"
    _nick[0] += 1
    body = {"nickname": nick, "pgp_public_key": k.fp, "signature": k.sign(f"register:{nick}")}
    if about is not None:
        body["about"] = about
    r = post("/api/identity", body, mint(fee("identity")))
    assert r.status_code == 201, (r.status_code, r.text)
    k.nick = nick
    return k


def mkpost(k, content, fresh=True, price=None, **extra):
    price = price or fee("post")
    body = {"author_fingerprint": k.fp, "content": content}
    body.update(extra)
    msg_content = extra.get("encrypted_payload", content) if extra.get("post_type") == "private_reply" else content
    if fresh:
        sig, ts = k.fresh(f"post:{msg_content}")
        body["signature"] = sig
        body["timestamp"] = ts
    else:
        body["signature"] = k.sign(f"post:{msg_content}")
    return post("/api/timeline", body, mint(price))


def mkpost_ok(k, content, **kw):
    price = fee("comment") if kw.get("parent_id") else fee("post")
    r = mkpost(k, content, price=price, **kw)
    assert r.status_code == 201, (r.status_code, r.text)
    return r.json()["post_id"]


def show(r):
    try:
        b = json.dumps(r.json())
    except Exception:
        b = r.text
    return f"{r.status_code} {b[:600]}"
