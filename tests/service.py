"""Start the built host for the Python checks (OpenAPI validator, MCP SDK)."""
import contextlib
import os
import pathlib
import subprocess
import tempfile

BINARY = pathlib.Path(__file__).resolve().parent.parent / "target" / "release" / "marketplace"


@contextlib.contextmanager
def running(admin_token=None):
    """Yield the base URL of a fresh host on a free port with a temp data dir
    (and, with `admin_token`, also the admin URL: yields (base, admin))."""
    with tempfile.TemporaryDirectory() as data:
        args = [str(BINARY), "serve", "--listen", "127.0.0.1:0", "--data-dir", data]
        env = None
        if admin_token:
            args += ["--admin-listen", "127.0.0.1:0"]
            env = dict(os.environ, MARKETPLACE_ADMIN_TOKEN=admin_token)
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
