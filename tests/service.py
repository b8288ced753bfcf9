"""Start the built host for the Python checks (OpenAPI validator, MCP SDK)."""
import contextlib
import pathlib
import subprocess
import tempfile

BINARY = pathlib.Path(__file__).resolve().parent.parent / "target" / "release" / "marketplace"


@contextlib.contextmanager
def running():
    """Yield the base URL of a fresh host on a free port with a temp data dir."""
    with tempfile.TemporaryDirectory() as data:
        proc = subprocess.Popen(
            [str(BINARY), "serve", "--listen", "127.0.0.1:0", "--data-dir", data],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        try:
            for line in proc.stdout:
                if line.startswith("marketplace listening on "):
                    yield line.split(" on ", 1)[1].strip()
                    return
            raise RuntimeError("server did not start")
        finally:
            proc.kill()
            proc.wait()
