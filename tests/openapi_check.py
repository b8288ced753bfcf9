"""Validate the served OpenAPI document with a real validator.

Starts the built host on a free port, fetches /openapi.yaml and
/openapi.json, checks that both are the same document and that it is valid
OpenAPI 3.1 (openapi-spec-validator), that the patterns of signed
bodies' timestamps admit what the routes read, and that the server refuses
request bodies and PAYMENT-SIGNATURE values exactly where the document's
schemas do. Run by .ci/run after the tests.
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


# The request schemas agree with the routes' own body checks: each body
# below is 400 from the server exactly when the document's schema for that
# request refuses it (bodies a fuzzer found the two disagreeing on). A
# body the schema admits gets past the 400 to its route's 401 or 402.
from datetime import datetime, timezone

from jsonschema import Draft202012Validator

from service import http


def request_validator(template):
    body = doc_json["paths"][template]["post"]["requestBody"]
    if "$ref" in body:
        body = doc_json["components"]["requestBodies"][body["$ref"].rsplit("/", 1)[1]]
    schema = body["content"]["application/json"]["schema"]
    # The whole document as the root, so that `#/components/...` resolves.
    return Draft202012Validator({**doc_json, **schema})


FP = "ab" * 32
now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
post = {"author_fingerprint": FP, "content": "x", "signature": "00"}
buy = {"buyer_fingerprint": FP, "contract_type": "service", "amount": "1",
       "reference_post": "post_x", "accept_terms": True, "signature": "00"}
scan = {"challenge": f"recover:{FP}:{now}"}
define = {"description": "d", "kind": "search", "typescript": "return {term: 'x'}"}


def attachment(**members):
    return dict(post, attachments=[dict({"filename": "a.txt"}, **members)])


def prop(**schema):
    return {"type": "object", "properties": {"q": schema}}


cases = [
    # Another route's signer member is an unknown member (PROTOCOL 1).
    ("/api/storage/presign", dict(fingerprint=FP, file_path="a.png", content_type="image/png",
                                  signature="00", seller_fingerprint=[[]], actor_fingerprint=5)),
    ("/api/timeline", dict(post, seller_fingerprint=[[]], owner_fingerprint={})),
    ("/api/timeline", dict(post, author_fingerprint=12)),
    # An attachment's optional members may be null (absent); one of
    # content and s3_key, not both.
    ("/api/timeline", attachment(content="x", attachment_type=None, is_public=None, s3_key=None)),
    ("/api/timeline", attachment(content="x", attachment_type=5)),
    ("/api/timeline", attachment(content="x", s3_key="files/abc")),
    ("/api/timeline", attachment(content=None, s3_key=None)),
    ("/api/timeline", attachment(content=None)),
    ("/api/timeline", attachment(s3_key=None)),
    # A private reply's members are read on a private reply only.
    ("/api/timeline", dict(post, recipient_fingerprint=123, encrypted_payload=[])),
    ("/api/timeline", dict(post, post_type="private_reply", content="", parent_id="post_x",
                           recipient_fingerprint=FP, encrypted_payload="sealed")),
    ("/api/timeline", dict(post, post_type="private_reply", content="", parent_id="post_x",
                           recipient_fingerprint=123, encrypted_payload="sealed")),
    ("/api/timeline", dict(post, post_type="private_reply", content="", parent_id="post_x",
                           recipient_fingerprint=FP)),
    # A post's content is not blank (ECMAScript's \s: NBSP too); a
    # private reply's is "".
    ("/api/timeline", dict(post, content="")),
    ("/api/timeline", dict(post, content="   ")),
    ("/api/timeline", dict(post, content="\u00a0\t")),
    ("/api/timeline", dict(post, content=" x ")),
    ("/api/timeline", dict(post, post_type="private_reply", content="x", parent_id="post_x",
                           recipient_fingerprint=FP, encrypted_payload="sealed")),
    ("/api/timeline", dict({k: v for k, v in post.items() if k != "content"},
                           post_type="private_reply", parent_id="post_x",
                           recipient_fingerprint=FP, encrypted_payload="sealed")),
    ("/api/timeline", dict(post, post_type="private_reply", content=None, parent_id="post_x",
                           recipient_fingerprint=FP, encrypted_payload="sealed")),
    ("/api/timeline", dict({k: v for k, v in post.items() if k != "content"})),
    ("/api/timeline", dict(post, content=None)),
    # "" is an absent contract id and witness proof; a short id is not.
    ("/api/arbitration/contracts/buy", dict(buy, contract_id="", witness_proof="")),
    ("/api/arbitration/contracts/buy", dict(buy, contract_id="CTR_")),
    # A key index is an integer from 0 to 2^64-1 (7.0 is JSON Schema's 7).
    ("/api/recovery/scan", dict(scan, probes=[{"key_index": 7.0, "fingerprint": FP, "signature": "00"}])),
    # A recovery challenge's time exists: no 30 February, 29 February in
    # leap years only, no leap second (the route refuses `:60`).
    *[("/api/recovery/scan", {"challenge": f"recover:{FP}:{at}", "probes": []}) for at in (
        "2024-02-29T12:00:00Z", "2000-02-29 12:00:00+01:00", "2023-02-29T12:00:00Z",
        "2100-02-29T12:00:00Z", "2026-02-30T12:00:00Z", "2026-04-31T12:00:00Z",
        "2026-12-31T23:59:60Z", "2026-11-28T10:15:60Z", "2026-11-28T10:15:59.123456789012Z",
        "1969-12-31T23:59:59Z")],
    ("/api/recovery/scan", dict(scan, probes=[{"key_index": 2**64 - 1, "fingerprint": FP, "signature": "00"}])),
    ("/api/recovery/scan", dict(scan, probes=[{"key_index": -1, "fingerprint": FP, "signature": "00"}])),
    ("/api/recovery/scan", dict(scan, probes=[{"key_index": 2**64, "fingerprint": FP, "signature": "00"}])),
    # Array keywords only on an array property.
    ("/api/mcp/tools/define", dict(define, name="m_items_object",
                                   input_schema=prop(type="object", items={"type": "string"}))),
    ("/api/mcp/tools/define", dict(define, name="m_items_array",
                                   input_schema=prop(type="array", items={"type": "string"}, maxItems=3))),
    # A count is an integer below 2^64, 2.0 included (JSON Schema's 2).
    ("/api/mcp/tools/define", dict(define, name="m_count_float",
                                   input_schema=prop(type="array", items={"type": "string"}, maxItems=2.0))),
    ("/api/mcp/tools/define", dict(define, name="m_count_huge",
                                   input_schema=prop(type="array", items={"type": "string"}, maxItems=2**64))),
    # An amount to buy for has at most 11 digits before the point.
    ("/api/arbitration/contracts/buy", dict(buy, amount="99999999999.5")),
    ("/api/arbitration/contracts/buy", dict(buy, amount="1000000000000")),
    # The secret to refund is a cash secret.
    ("/api/cash/refund", {"secret": ""}),
    ("/api/cash/refund", {"secret": "e1:secret:" + "0" * 64}),
    # An attachment is not named "." or "..".
    ("/api/timeline", attachment(content="x", filename="..")),
    ("/api/timeline", attachment(content="x", filename="...")),
    # Nor holds a path separator, a control character or one that reads
    # otherwise (the invisible and bidirectional ones).
    ("/api/timeline", attachment(content="x", filename="a/b")),
    ("/api/timeline", attachment(content="x", filename="a\\b")),
    ("/api/timeline", attachment(content="x", filename="a\u0085b")),
    ("/api/timeline", attachment(content="x", filename="a\u200bb.txt")),
    ("/api/timeline", attachment(content="x", filename="caf\u00e9 \u2014 notes.txt")),
]
# The payment header's schema and the server agree too: a value the schema
# refuses is 402 payment_invalid, an empty one (which it admits: no
# payment, as an empty X-Cash-Secret) 402 payment_required.
signature_schema = doc_json["components"]["schemas"]["PaymentSignature"]
signature_validator = Draft202012Validator({**doc_json, **signature_schema})
values = ["", "QQ", "!!", "%%% not base64", "QUJD=AAA"]
disagree = []
with running() as base:
    for template, body in cases:
        status, _, answer = http("POST", base + template, body)
        refused = not request_validator(template).is_valid(body)
        if (status == 400) != refused:
            disagree.append(f"POST {template} {json.dumps(body)}: server {status} {answer[:300]!r}, "
                            f"schema {'refuses' if refused else 'admits'} it")
    for value in values:
        status, _, answer = http("POST", base + "/api/profiles/rate", {"post_id": "0", "vote": "up"},
                                 {"PAYMENT-SIGNATURE": value})
        code = json.loads(answer).get("code") if answer.startswith(b"{") else None
        want = "payment_required" if signature_validator.is_valid(value) else "payment_invalid"
        if status != 402 or code != want:
            disagree.append(f"PAYMENT-SIGNATURE {value[:40]!r}: server {status} {code}, document {want}")
# A settled contract's certificate moves by witness/replace as a bearer
# contract's witness does (tests/contracts.rs moves one): the document
# admits both kinds of id (an outside audit found it refusing certificates).
replace_validator = request_validator("/api/witness/replace")
certificate = "n:CRT_01M91XVYSHE8R7KA78HZNCN5YT:secret:" + "ab" * 32
witness = "n:CTR_2026_000123:secret:" + "cd" * 32
for admitted, secret in [(True, certificate), (True, witness),
                         (False, "n:XYZ_1:secret:" + "ab" * 32),
                         (False, "n:CRT_short:secret:" + "ab" * 32)]:
    body = {"secrets": [secret], "new_secrets": [secret]}
    if replace_validator.is_valid(body) != admitted:
        disagree.append(f"POST /api/witness/replace {json.dumps(body)}: the document "
                        f"{'refuses' if admitted else 'admits'} it")
if disagree:
    sys.exit("openapi: the document and the server disagree:\n" + "\n".join(disagree))
print(f"openapi: {len(cases)} request bodies and {len(values)} PAYMENT-SIGNATURE values, "
      "the document and the server agree on each")
