"""Validate the served OpenAPI document with a real validator.

Starts the built host on a free port, fetches /openapi.yaml and
/openapi.json, checks that both are the same document and that it is valid
OpenAPI 3.1 (openapi-spec-validator), and that the patterns of signed
bodies' timestamps admit what the routes read. Run by .ci/run after the
tests.
"""
import json
import random
import re
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


def schemas_named(node, name, found):
    """Every schema of a member called `name`, anywhere in the document."""
    if isinstance(node, dict):
        props = node.get("properties")
        if isinstance(props, dict) and isinstance(props.get(name), dict):
            found.append(props[name])
        for v in node.values():
            schemas_named(v, name, found)
    elif isinstance(node, list):
        for v in node:
            schemas_named(v, name, found)
    return found


# A signed body's `timestamp` string is read as a u64 (leading zeros
# allowed): its pattern must admit exactly those, so that a fuzzer's valid
# data is valid to the routes too.
timestamps = [s for s in schemas_named(doc_json, "timestamp", []) if "pattern" in s]
if not timestamps:
    sys.exit("openapi: no timestamp pattern found")
rng = random.Random(17)
cases = [0, 1, 2**64 - 1, 2**64, 10**19, 10**20, 18446744073709551614]
cases += [rng.randrange(0, 2**66) for _ in range(20000)]
for schema in timestamps:
    pattern = re.compile(schema["pattern"])
    for n in cases:
        for text in (str(n), "00" + str(n)):
            if bool(pattern.search(text)) != (n < 2**64):
                sys.exit(f"openapi: timestamp pattern {schema['pattern']!r} is wrong for {text}")
print(f"openapi: {len(timestamps)} timestamp patterns admit exactly the u64 strings")
