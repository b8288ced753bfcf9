"""The template plugin built with `cargo component build` is a component the
host accepts as a NEW family: mount it as family `template` through the CLI
and the admin listener (no grants: it needs none), see it serve its own
route and appear in /openapi.json and /api/health, then unmount it. Run by
.ci/run after `cargo component build`.
"""
import json
import subprocess
import sys
import urllib.error
import urllib.request

from service import BINARY, running

COMPONENT = BINARY.parent.parent / "wasm32-wasip1" / "release" / "template.wasm"


def cli(*args):
    done = subprocess.run([str(BINARY), "plugins", *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"plugins {args[0]} failed: {done.stdout} {done.stderr}")
    return json.loads(done.stdout)


def get(url):
    try:
        with urllib.request.urlopen(url) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


with running(admin_token="ci-token-0123456789abcdef0123456789") as (base, admin):
    opts = ["--admin", admin, "--token", "ci-token-0123456789abcdef0123456789"]
    loaded = cli("load", "template", str(COMPONENT), *opts)
    if not loaded.get("mounted"):
        sys.exit(f"template was not mounted as a new family: {loaded}")
    req = urllib.request.Request(
        base + "/api/template/notes", data=b'{"note": "hello"}', method="POST",
        headers={"content-type": "application/json"})
    with urllib.request.urlopen(req) as r:
        created = json.loads(r.read())
    status, served = get(base + "/api/template/notes")
    if status != 200 or served.get("count") != created.get("count"):
        sys.exit(f"the template family is not serving: {status} {served} after {created}")
    _, doc = get(base + "/openapi.json")
    if doc["paths"].get("/api/template/notes", {}).get("get", {}).get("x-family") != "template":
        sys.exit("the template's route is not in /openapi.json")
    _, health = get(base + "/api/health")
    if health["plugins"].get("template", {}).get("grants") != []:
        sys.exit(f"health does not show the template family with no grants: {health['plugins']}")
    # The info family still serves: the template was mounted beside it.
    status, _ = get(base + "/api/info")
    if status != 200:
        sys.exit("mounting the template displaced another family")
    cli("unmount", "template", *opts)
    status, gone = get(base + "/api/template/notes")
    if status != 404:
        sys.exit(f"unmounted template still answers: {status} {gone}")
print(f"template: cargo-component build mounted as a new family and served ({loaded['hash'][:12]})")
