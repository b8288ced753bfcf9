"""x402 v2 against the official x402 Python SDK (PyPI `x402`, v2 API).

Starts the built host, then:
- the SDK's header decoders read our 402 (`PAYMENT-REQUIRED`) and the paid
  answer (`PAYMENT-RESPONSE`) into its own types (PaymentRequired,
  SettleResponse);
- the SDK's client (x402ClientSync with a scheme client for "exact" on
  "webcash:mainnet", behind its requests adapter) meets the 402, builds the
  PaymentPayload, encodes `PAYMENT-SIGNATURE` and pays a paid route end to
  end;
- a payload built with its types and its payment-identifier helpers is an
  idempotency key (same request: the stored answer; another: 409);
- a malformed `PAYMENT-SIGNATURE` is 402 payment_invalid;
- the SDK's MCP client (x402MCPSession over the MCP SDK's Streamable HTTP
  client) calls the `execute` tool on a paid endpoint: it reads the
  PaymentRequired of the unpaid result, pays with `_meta["x402/payment"]`
  and reads the settlement from the result's `_meta`.
Run by .ci/run after the Rust tests.
"""
import asyncio
import json
import sys
import time
from decimal import Decimal

import requests
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from x402 import x402Client, x402ClientSync
from x402.extensions.payment_identifier import (
    append_payment_identifier_to_extensions,
    extract_payment_identifier,
)
from x402.http import (
    PAYMENT_REQUIRED_HEADER,
    PAYMENT_RESPONSE_HEADER,
    PAYMENT_SIGNATURE_HEADER,
    decode_payment_required_header,
    decode_payment_response_header,
    encode_payment_signature_header,
)
from x402.http.clients.requests import x402_http_adapter
from x402.mcp import x402MCPSession
from x402.schemas import PaymentPayload, PaymentRequired, SettleResponse

from service import http, mint, public, running

TOKEN = "x402-check-admin-token-0123456789abcdef0123"
NETWORK = "webcash:mainnet"


def fail(message):
    sys.exit(f"x402 check: {message}")


def spent(base, secret):
    pub = public(secret)
    status, _, body = http("POST", base + "/api/cash/health_check", [pub])
    return json.loads(body)["results"][pub]["spent"]


def registration(nickname):
    key = Ed25519PrivateKey.generate()
    fp = key.public_key().public_bytes_raw().hex()
    ts = int(time.time())
    return {"nickname": nickname, "pgp_public_key": fp, "timestamp": ts,
            "signature": key.sign(f"register:{nickname}:{ts}".encode()).hex()}


class WebcashExact:
    """The SDK's scheme client for "exact" on webcash: pays with a cash
    secret from a small wallet (a secret worth at least the amount)."""

    scheme = "exact"

    def __init__(self, wallet):
        self.wallet = wallet
        self.paid = []

    def create_payment_payload(self, requirements):
        units = int(requirements.amount)
        for s in self.wallet:
            if Decimal(s.split(":")[0][1:]) * 10**8 >= units:
                self.wallet.remove(s)
                self.paid.append(s)
                return {"secret": s}
        raise RuntimeError(f"no secret worth {units} units")


with running(admin_token=TOKEN) as (base, admin):
    url = base + "/api/identity"

    # 1. The 402, read by the SDK's decoder.
    status, headers, body = http("POST", url, registration("probe"))
    if status != 402 or json.loads(body)["code"] != "payment_required":
        fail(f"expected 402 payment_required: {status} {body!r}")
    required = decode_payment_required_header(headers[PAYMENT_REQUIRED_HEADER])
    if not isinstance(required, PaymentRequired) or required.x402_version != 2:
        fail(f"not a v2 PaymentRequired: {required!r}")
    if not required.resource.url.endswith("/api/identity") or required.resource.mime_type != "application/json":
        fail(f"resource: {required.resource!r}")
    if not required.error:
        fail("no error")
    [accept] = required.accepts
    want = {"scheme": "exact", "network": NETWORK, "asset": "webcash", "amount": "60000000",
            "pay_to": "marketplace", "max_timeout_seconds": 300,
            "extra": {"header": "X-Cash-Secret", "price": "0.6"}}
    got = {k: getattr(accept, k) for k in want}
    if got != want:
        fail(f"accepts[0] = {got}, want {want}")
    if "payment-identifier" not in (required.extensions or {}):
        fail("the payment-identifier extension is not declared")

    # 2. The SDK's client pays end to end through its requests adapter.
    wallet = [mint(admin, TOKEN, "1")]
    scheme = WebcashExact(wallet)
    client = x402ClientSync()
    client.register(NETWORK, scheme)
    client.set_spend_controls(False)
    created = []
    client.on_after_payment_creation(lambda ctx: created.append(ctx.payment_payload))
    session = requests.Session()
    adapter = x402_http_adapter(client)
    session.mount("http://", adapter)
    r = session.post(url, json=registration("sdkbuyer"), timeout=30)
    if r.status_code != 201:
        fail(f"the SDK's paid retry: {r.status_code} {r.text}")
    [payload] = created
    if payload.accepted.network != NETWORK or payload.payload != {"secret": scheme.paid[0]}:
        fail(f"the SDK built {payload!r}")
    settle = decode_payment_response_header(r.headers[PAYMENT_RESPONSE_HEADER])
    if not isinstance(settle, SettleResponse) or not settle.success:
        fail(f"settlement: {settle!r}")
    change = r.headers.get("X-Cash-Change")
    if (settle.transaction != public(scheme.paid[0]) or settle.network != NETWORK
            or settle.amount != "60000000" or settle.payer != ""
            or settle.extra != {"change": change} or not change.startswith("e0.4:secret:")):
        fail(f"settlement: {settle!r}, change {change}")
    if r.json()["payment"]["change"] != change or spent(base, scheme.paid[0]) is not True:
        fail("the body's change or the spend")

    # 3. A payload built with the SDK's types, with a payment identifier.
    body = registration("idempotent")
    extensions = dict(required.extensions)
    append_payment_identifier_to_extensions(extensions)

    def pay(secret, body):
        p = PaymentPayload(x402_version=2, accepted=accept, payload={"secret": secret},
                           resource=required.resource, extensions=extensions)
        return p, http("POST", url, body, {PAYMENT_SIGNATURE_HEADER: encode_payment_signature_header(p)})

    first_secret = mint(admin, TOKEN, "0.6")
    p, (s1, h1, b1) = pay(first_secret, body)
    pid = extract_payment_identifier(p)
    if not pid or s1 != 201:
        fail(f"first paid request: {s1} {b1!r} (id {pid})")
    if decode_payment_response_header(h1[PAYMENT_RESPONSE_HEADER]).extra != {"change": None}:
        fail("an exact payment has no change")
    second_secret = mint(admin, TOKEN, "0.6")
    _, (s2, h2, b2) = pay(second_secret, body)
    if (s2, json.loads(b2)) != (201, json.loads(b1)) or h2[PAYMENT_RESPONSE_HEADER] != h1[PAYMENT_RESPONSE_HEADER]:
        fail(f"the same id and request did not get the stored answer: {s2} {b2!r}")
    if spent(base, second_secret) is not False:
        fail("the retry with the same id was charged")
    _, (s3, _, b3) = pay(second_secret, registration("other"))
    if s3 != 409 or json.loads(b3)["code"] != "idempotency_conflict":
        fail(f"the same id for another request: {s3} {b3!r}")
    if spent(base, second_secret) is not False:
        fail("the conflicting request was charged")

    # 4. A malformed PAYMENT-SIGNATURE: 402 payment_invalid, still x402.
    status, headers, b = http("POST", url, registration("bad"), {PAYMENT_SIGNATURE_HEADER: "bm90IGpzb24="})
    if status != 402 or json.loads(b)["code"] != "payment_invalid":
        fail(f"malformed signature: {status} {b!r}")
    if decode_payment_required_header(headers[PAYMENT_REQUIRED_HEADER]).accepts[0].amount != "60000000":
        fail("the payment_invalid 402 has no PAYMENT-REQUIRED")

    # 5. The SDK's MCP client pays a tool call with `_meta["x402/payment"]`.
    async def over_mcp():
        wallet = [mint(admin, TOKEN, "1")]
        scheme = WebcashExact(wallet)
        client = x402Client()
        client.register(NETWORK, scheme)
        client.set_spend_controls(False)
        async with streamable_http_client(base + "/mcp") as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                paying = x402MCPSession(session, client, auto_payment=True)
                await paying.initialize()
                reg = registration("mcppayer")
                result = await paying.call_tool(
                    "execute", {"endpoint": {"method": "POST", "path": "/api/identity", "body": reg}})
                return scheme, reg, result

    scheme, reg, result = asyncio.run(over_mcp())
    if result.is_error or not result.payment_made:
        fail(f"the MCP client's paid call: {result!r}")
    doc = json.loads(result.content[0].text)
    if doc.get("fingerprint") != reg["pgp_public_key"]:
        fail(f"the MCP client's paid call answered {doc!r}")
    settle = result.payment_response
    if (not isinstance(settle, SettleResponse) or not settle.success
            or settle.transaction != public(scheme.paid[0]) or settle.amount != "60000000"
            or not (settle.extra or {}).get("change", "").startswith("e0.4:secret:")):
        fail(f"the MCP settlement: {settle!r}")
    if spent(base, scheme.paid[0]) is not True or spent(base, settle.extra["change"]) is not False:
        fail("the MCP payment's spend or its change")

print("x402: the SDK decodes PAYMENT-REQUIRED and PAYMENT-RESPONSE, its client pays with "
      "PAYMENT-SIGNATURE, payment-identifier replays and conflicts, malformed is payment_invalid, "
      "its MCP client pays a tool call through _meta")
