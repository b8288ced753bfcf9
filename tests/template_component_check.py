"""The template plugin built with `cargo component build` is a component the
host accepts: load it over the `info` family through the CLI and the admin
listener, then see it serve. Run by .ci/run after `cargo component build`.
"""
import json
import subprocess
import sys
import urllib.request

from service import BINARY, running

COMPONENT = BINARY.parent.parent / "wasm32-wasip1" / "release" / "template.wasm"

with running(admin_token="ci-token") as (base, admin):
    load = subprocess.run(
        [str(BINARY), "plugins", "load", "info", str(COMPONENT), "--admin", admin, "--token", "ci-token"],
        capture_output=True, text=True,
    )
    if load.returncode != 0:
        sys.exit(f"plugins load failed: {load.stdout} {load.stderr}")
    served = json.loads(urllib.request.urlopen(base + "/api/info").read())
if served.get("plugin") != "template":
    sys.exit(f"the template component is not serving: {served}")
print(f"template: cargo-component build loaded and serving ({json.loads(load.stdout)['hash'][:12]})")
