"""Start the built host for the Python checks (OpenAPI validator, MCP SDK)."""
import contextlib
import os
import pathlib
import subprocess
import tempfile

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
        env = dict(os.environ, MARKETPLACE_CACHE_DIR=str(CACHE))
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
