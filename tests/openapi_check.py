"""Validate the served OpenAPI document with a real validator.

Starts the built host on a free port, fetches /openapi.yaml and
/openapi.json, checks that both are the same document and that it is valid
OpenAPI 3.1 (openapi-spec-validator). Run by .ci/run after the tests.
"""
import json
import sys
import urllib.request

import yaml
from openapi_spec_validator import validate

from service import running

with running() as base:
    doc_yaml = yaml.safe_load(urllib.request.urlopen(base + "/openapi.yaml").read())
    doc_json = json.loads(urllib.request.urlopen(base + "/openapi.json").read())
if doc_yaml != doc_json:
    sys.exit("openapi.yaml and openapi.json differ")
validate(doc_yaml)
print(f"openapi: valid OpenAPI {doc_yaml['openapi']}, {len(doc_yaml['paths'])} paths")
