"""A client generated from the served OpenAPI document, used as a developer
would use it.

Generates a Python client with openapi-python-client (the document must
give it every operation and every schema: a `$ref` it cannot follow or an
array without `items` makes it drop operations and models with no more
than a warning), then drives it against a fresh host: typed reads
(health, fees, info, the MCP description), a paid registration and post
(402 first, parsed as PaymentRequired, then paid), the post read back and
found by search, a file uploaded as raw bytes and read back byte for byte,
a contract bought and read with its state typed, and typed errors. The
client raises on any status its operation does not document. Run by
.ci/run after the tests.
"""
import importlib
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from service import mint, running

TOKEN = "generated-client-check-admin-token-0123"
# The generator's warnings that lose nothing: responses of media types it
# does not parse (YAML, the stored bytes of files and attachments, whose
# type is the uploader's), and the upload's `*/*` beside its
# `application/octet-stream`.
HARMLESS = re.compile(r"Unsupported content[_ ]type (application/yaml|\*/\*)")
LOST = re.compile(r"will not be generated|removal of|Could not find|Unable to process")


def fail(message):
    sys.exit(f"generated client: {message}")


def generate(doc, out):
    """Generate the client into `out`; every warning must be harmless."""
    # The generator installed beside this interpreter (a virtualenv's), or on PATH.
    beside = pathlib.Path(sys.executable).parent / "openapi-python-client"
    generator = str(beside) if beside.exists() else "openapi-python-client"
    run = subprocess.run(
        [generator, "generate", "--path", str(doc), "--output-path", str(out),
         "--meta", "none"],
        capture_output=True, text=True)
    if run.returncode != 0:
        fail(f"generation failed:\n{run.stdout}\n{run.stderr}")
    # Each warning runs from its heading to the next one.
    said = run.stdout + run.stderr
    warnings = re.split(r"(?m)^(?=WARNING |Unable to process )", said)[1:]
    for warning in warnings:
        if not HARMLESS.search(warning) or LOST.search(warning):
            fail(f"the generator lost something:\n{warning[:1500]}")
    return len(warnings)


def modelled(schema):
    """Whether the generator makes a model of a component schema: an object
    with members, or an enum of strings."""
    return bool(schema.get("properties")) or (
        schema.get("type") == "string" and bool(schema.get("enum")))


with tempfile.TemporaryDirectory() as tmp, running(admin_token=TOKEN) as (base, admin):
    doc = json.loads(urllib.request.urlopen(base + "/openapi.json").read())
    path = pathlib.Path(tmp) / "openapi.json"
    path.write_text(json.dumps(doc))
    harmless = generate(path, pathlib.Path(tmp) / "mpclient")
    sys.path.insert(0, tmp)
    client_module = importlib.import_module("mpclient")
    api = importlib.import_module("mpclient.api")
    models = importlib.import_module("mpclient.models")

    # Every operation of the document has its function.
    operations = [op["operationId"] for item in doc["paths"].values()
                  for op in item.values() if isinstance(op, dict) and "operationId" in op]
    # (Its module's name is the id in snake case, digits apart: a_2_a_json_rpc.)
    modules = {p.stem.replace("_", "") for p in pathlib.Path(api.__file__).parent.rglob("*.py")}
    missing = [o for o in operations if o.lower() not in modules]
    if missing:
        fail(f"operations not generated: {missing}")
    # And every model.
    schemas = [name for name, schema in doc["components"]["schemas"].items() if modelled(schema)]
    # (Its class's name is the schema's, cased its own way: A2AJsonRpcResponse.)
    classes = {name.lower() for name in dir(models)}
    unmodelled = [name for name in schemas if re.sub(r"\W", "", name).lower() not in classes]
    if unmodelled:
        fail(f"schemas without a model: {unmodelled}")
    print(f"generated client: {len(operations)} operations, {len(schemas)} models, "
          f"{harmless} harmless warnings")

    client = client_module.Client(base_url=base, raise_on_unexpected_status=True)

    def op(family, name):
        return importlib.import_module(f"mpclient.api.{family}.{name}")

    def parsed(response, model, status):
        if response.status_code != status or not isinstance(response.parsed, getattr(models, model)):
            fail(f"expected {status} {model}, got {response.status_code} "
                 f"{type(response.parsed).__name__}: {response.content[:300]!r}")
        return response.parsed

    # Typed reads.
    parsed(op("info", "health").sync_detailed(client=client), "Health", 200)
    fees = parsed(op("payments", "fees").sync_detailed(client=client), "Fees", 200)
    if not any(r.rail == "webcash" and r.enabled for r in fees.rails):
        fail(f"fees.rails: {fees.rails}")
    info = parsed(op("info", "info").sync_detailed(client=client), "Info", 200)
    if not info.payment_rails or not info.payment_rails[0].header:
        fail(f"info.payment_rails: {info.payment_rails}")
    mcp = parsed(op("mcp", "mcp_description").sync_detailed(client=client), "McpDescription", 200)
    if not any(t.name == "search" and t.method.value == "POST" for t in mcp.tools):
        fail(f"mcp tools: {[t.name for t in mcp.tools]}")

    def identity():
        """A new key: its fingerprint, and what signs a message with a fresh timestamp."""
        key = Ed25519PrivateKey.generate()

        def signed(message):
            ts = int(time.time())
            return key.sign(f"{message}:{ts}".encode()).hex(), ts

        return key.public_key().public_bytes_raw().hex(), signed

    def registration(nickname, fp, signed):
        signature, ts = signed(f"register:{nickname}")
        return models.NewIdentity.from_dict(
            {"nickname": nickname, "pgp_public_key": fp, "timestamp": ts, "signature": signature})

    # A paid registration: 402 first, typed, then paid.
    fp, signed = identity()
    registering = registration("gen-seller", fp, signed)
    refused = parsed(op("identity", "create_identity").sync_detailed(client=client, body=registering),
                     "PaymentRequired", 402)
    if refused.code.value != "payment_required":
        fail(f"402 code {refused.code}")
    created = op("identity", "create_identity").sync_detailed(
        client=client, body=registering, x_cash_secret=mint(admin, TOKEN, "10"))
    parsed(created, "IdentityCreated", 201)
    change = created.headers.get("x-cash-change")
    if not change:
        fail("no X-Cash-Change on an overpaid registration")

    # A paid post, read back and found.
    signature, ts = signed("post:a walnut desk, generated")
    post = models.NewPost.from_dict({"author_fingerprint": fp, "content": "a walnut desk, generated",
                                     "timestamp": ts, "signature": signature})
    made = parsed(op("posts", "create_post").sync_detailed(client=client, body=post, x_cash_secret=change),
                  "PostCreated", 201)
    got = parsed(op("posts", "get_post").sync_detailed(made.post_id, client=client), "PostEnvelope", 200)
    if got.post.content != "a walnut desk, generated":
        fail(f"post read back: {got.post.content!r}")
    found = parsed(op("search", "search").sync_detailed(client=client, term="walnut"), "SearchResults", 200)
    if made.post_id not in [r.post_id for r in found.results]:
        fail("the post is not found by search")

    # Raw bytes up, the same bytes down.
    signature, ts = signed("presign:gen/pic.png")
    presign = models.Presign.from_dict({"fingerprint": fp, "file_path": "gen/pic.png",
                                        "content_type": "image/png", "is_public": True,
                                        "timestamp": ts, "signature": signature})
    presigned = parsed(op("identity", "presign_upload").sync_detailed(client=client, body=presign),
                       "Presigned", 200)
    upload = presigned.presigned_url.rsplit("/", 1)[1]
    file_id = presigned.s3_key.split("/", 1)[1]
    data = bytes(range(256)) * 3
    types = importlib.import_module("mpclient.types")
    parsed(op("identity", "upload_file").sync_detailed(
        upload, client=client, body=types.File(payload=data, mime_type="application/octet-stream")),
        "Uploaded", 200)
    back = op("identity", "get_file").sync_detailed(file_id, client=client)
    if back.status_code != 200 or back.content != data:
        fail(f"the file read back: {back.status_code}, {len(back.content)} bytes")

    # A contract bought by another identity, its state typed.
    buyer, buyer_signed = identity()
    parsed(op("identity", "create_identity").sync_detailed(
        client=client, body=registration("gen-buyer", buyer, buyer_signed),
        x_cash_secret=mint(admin, TOKEN, "1")), "IdentityCreated", 201)
    signature, ts = buyer_signed(f"buy_contract:{buyer}:{made.post_id}::")
    buy = models.Buy.from_dict({"buyer_fingerprint": buyer, "contract_type": "service", "amount": "1",
                                "reference_post": made.post_id, "accept_terms": True,
                                "timestamp": ts, "signature": signature})
    bought = parsed(op("contracts", "buy").sync_detailed(client=client, body=buy,
                                                          x_cash_secret=mint(admin, TOKEN, "2")),
                    "Bought", 201)
    if bought.status.value != "issued" or not all(hasattr(a, "value") for a in bought.allowed_actions):
        fail(f"bought: {bought.status}, {bought.allowed_actions}")
    contract = parsed(op("contracts", "get_contract").sync_detailed(bought.contract_id, client=client),
                      "Contract", 200)
    if contract.status.value != "issued":
        fail(f"contract status {contract.status}")

    # Typed errors.
    missing = parsed(op("contracts", "get_contract").sync_detailed("CTR_none", client=client), "Error", 404)
    if missing.code != "not_found":
        fail(f"404 code {missing.code}")
    parsed(op("posts", "get_post").sync_detailed("post_none", client=client), "Error", 404)
    print("generated client: typed reads, paid registration and post, search, raw upload, "
          "contract, typed errors: ok")
