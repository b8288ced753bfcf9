"""Validate the served OpenAPI document with a real validator.

Starts the built host on a free port, fetches /openapi.yaml and
/openapi.json, checks that both are the same document and that it is valid
OpenAPI 3.1 (openapi-spec-validator). Run by .ci/run after the tests.
"""
import json
import pathlib
import subprocess
import sys
import tempfile
import urllib.request

import yaml
from openapi_spec_validator import validate

root = pathlib.Path(__file__).resolve().parent.parent
binary = root / "target" / "release" / "marketplace"
with tempfile.TemporaryDirectory() as data:
    proc = subprocess.Popen(
        [str(binary), "serve", "--listen", "127.0.0.1:0", "--data-dir", data],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        base = None
        for line in proc.stdout:
            if line.startswith("marketplace listening on "):
                base = line.split(" on ", 1)[1].strip()
                break
        if base is None:
            sys.exit("server did not start")
        doc_yaml = yaml.safe_load(urllib.request.urlopen(base + "/openapi.yaml").read())
        doc_json = json.loads(urllib.request.urlopen(base + "/openapi.json").read())
    finally:
        proc.kill()
if doc_yaml != doc_json:
    sys.exit("openapi.yaml and openapi.json differ")
validate(doc_yaml)
print(f"openapi: valid OpenAPI {doc_yaml['openapi']}, {len(doc_yaml['paths'])} paths")
