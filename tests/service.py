"""Start the built host for the Python checks, and the small HTTP helpers
they share."""
import contextlib
import hashlib
import json
import os
import pathlib
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

TARGET = pathlib.Path(__file__).resolve().parent.parent / "target"
BINARY = TARGET / "release" / "marketplace"
# The compile cache the Rust tests share (CARGO_TARGET_TMPDIR), so the
# components are compiled once per build.
CACHE = TARGET / "tmp" / "compile-cache"


@contextlib.contextmanager
def running(admin_token=None):
    """Yield the base URL of a fresh host on a free port with a temp data dir
    (and, with `admin_token`, also the admin URL: yields (base, admin))."""
    with tempfile.TemporaryDirectory() as data:
        args = [str(BINARY), "serve", "--listen", "127.0.0.1:0", "--data-dir", data]
        # The test harness's own variables are not server settings.
        harness = ("MARKETPLACE_TEST_", "MARKETPLACE_REQUIRE_PG")
        env = {k: v for k, v in os.environ.items() if not k.startswith(harness)}
        env["MARKETPLACE_CACHE_DIR"] = str(CACHE)
        if admin_token:
            args += ["--admin-listen", "127.0.0.1:0"]
            env["MARKETPLACE_ADMIN_TOKEN"] = admin_token
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        try:
            admin = None
            for line in proc.stdout:
                if line.startswith("marketplace admin listening on "):
                    admin = line.split(" on ", 1)[1].strip()
                if line.startswith("marketplace listening on "):
                    base = line.split(" on ", 1)[1].strip()
                    yield (base, admin) if admin_token else base
                    return
            raise RuntimeError("server did not start")
        finally:
            proc.kill()
            proc.wait()


def http(method, url, body=None, headers=None):
    """One request, a JSON body if given: (status, headers, body bytes),
    error statuses included."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def mint(admin, token, amount):
    """A new secret worth `amount`, through the admin listener."""
    status, _, body = http("POST", admin + "/admin/cash/mint", {"amount": amount},
                           {"authorization": f"Bearer {token}"})
    if status != 200:
        raise RuntimeError(f"mint {amount}: {status} {body!r}")
    return json.loads(body)["secret"]


def public(secret):
    """The public form of a cash secret (sha256 of its hex string)."""
    amount, _, hex_ = secret.split(":")
    return f"{amount}:public:{hashlib.sha256(hex_.encode()).hexdigest()}"


class Identity:
    """An Ed25519 identity: `fp`, its public key in hex, and `sign`."""

    def __init__(self):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self.key = Ed25519PrivateKey.generate()
        self.fp = self.key.public_key().public_bytes_raw().hex()

    def sign(self, message):
        """The hex of the Ed25519 signature over `message`'s UTF-8."""
        return self.key.sign(message.encode()).hex()


def create_listing(base, admin, token, content, nickname="a2aseller"):
    """A newly registered identity's post (both paid with minted cash); its
    id."""
    me = Identity()

    def paid(path, body, price):
        status, _, answer = http("POST", base + path, body, {"x-cash-secret": mint(admin, token, price)})
        if status not in (200, 201):
            raise RuntimeError(f"POST {path}: {status} {answer!r}")
        return json.loads(answer)

    ts = int(time.time())
    paid("/api/identity", {"nickname": nickname, "pgp_public_key": me.fp,
                           "signature": me.sign(f"register:{nickname}:{ts}"), "timestamp": ts}, "0.6")
    ts = int(time.time())
    return paid("/api/timeline", {"author_fingerprint": me.fp, "content": content,
                                  "signature": me.sign(f"post:{content}:{ts}"), "timestamp": ts}, "0.3")["post_id"]
