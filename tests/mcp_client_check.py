"""A real MCP client (the Python `mcp` SDK, Streamable HTTP) against POST /mcp.

Starts the built host on a free port, defines a macro over HTTP, then twice,
under the handshake revisions (ClientSession: initialize, 2025-11-25) and
under the stateless 2026-07-28 (Client in its default `auto` mode:
server/discover, then requests standing alone): define a macro with the
`define` tool, list tools (built-ins and both macros), call `search`, the
macro (its TypeScript runs), a runaway macro (a tool error), `get_fees`, and
the get_* tools on a listing and a contract made over HTTP (the SDK checks
each result's structuredContent against the tool's outputSchema); then
resources (list, read the OpenAPI document, templates), prompts (list, get)
and, under the handshake, logging/setLevel. Run by .ci/run after the tests.
"""
import asyncio
import json
import time
import urllib.request
import warnings

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp import ClientSession
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from service import http, mint, running

TOKEN = "mcp-client-check-admin-token-0123456789"


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())


def identity(base, admin, nickname):
    """A registered identity: its fingerprint, and what signs a message
    with a fresh timestamp into a body's signature and timestamp."""
    key = Ed25519PrivateKey.generate()
    fp = key.public_key().public_bytes_raw().hex()

    def signed(message):
        ts = int(time.time())
        return {"signature": key.sign(f"{message}:{ts}".encode()).hex(), "timestamp": ts}

    status, _, body = http("POST", base + "/api/identity",
                           {"nickname": nickname, "pgp_public_key": fp, **signed(f"register:{nickname}")},
                           {"x-cash-secret": mint(admin, TOKEN, "1")})
    assert status == 201, body
    return fp, signed


def listing_and_contract(base, admin):
    """A seller's listing and a buyer's contract on it: (post id, contract id, seller)."""
    seller, seller_signed = identity(base, admin, "mcp-seller")
    content = "a violin bow, rehaired"
    status, _, body = http("POST", base + "/api/timeline",
                           {"author_fingerprint": seller, "content": content, **seller_signed(f"post:{content}")},
                           {"x-cash-secret": mint(admin, TOKEN, "1")})
    assert status == 201, body
    post_id = json.loads(body)["post_id"]
    buyer, buyer_signed = identity(base, admin, "mcp-buyer")
    status, _, body = http("POST", base + "/api/arbitration/contracts/buy",
                           {"buyer_fingerprint": buyer, "contract_type": "service", "amount": "1",
                            "reference_post": post_id, "accept_terms": True,
                            **buyer_signed(f"buy_contract:{buyer}:{post_id}::")},
                           {"x-cash-secret": mint(admin, TOKEN, "2")})
    assert status == 201, body
    return post_id, json.loads(body)["contract_id"], seller


async def exercise(session, base, post_id, contract_id, seller, macro):
    """Tools, resources and prompts through `session` (a ClientSession after
    initialize, or a Client of the 2026-07-28 revision): defines the macro
    `macro` with the `define` tool and calls every tool kind; the SDK checks
    each result (its structuredContent against the tool's outputSchema, and
    under 2026-07-28 the result's resultType and caching hints)."""
    defined = await session.call_tool("define", {
        "name": macro, "description": "listings in a style", "kind": "search",
        "typescript": "return { term: args.style as string, limit: 5 };",
        "input_schema": {"type": "object", "properties": {"style": {"type": "string"}}},
    })
    assert not defined.is_error, defined
    assert json.loads(defined.content[0].text)["macro"]["name"] == macro, defined
    taken = await session.call_tool("define", {
        "name": macro, "description": "again", "kind": "search",
        "typescript": "return { term: 'x' };",
        "input_schema": {"type": "object", "properties": {}},
    })
    assert taken.is_error and "conflict" in taken.content[0].text, taken
    names = [t.name for t in (await session.list_tools()).tools]
    for expected in ["search", "define", "execute", "get_post", "get_thread",
                     "get_contract_status", macro, "spin"]:
        assert expected in names, (expected, names)
    found = await session.call_tool("search", {"term": "violin", "limit": 5})
    assert not found.is_error, found
    doc = json.loads(found.content[0].text)
    assert doc["term"] == "violin" and "results" in doc, doc
    styled = await session.call_tool(macro, {"style": "violin"})
    assert not styled.is_error, styled
    macro_doc = json.loads(styled.content[0].text)
    assert macro_doc["term"] == "violin" and "results" in macro_doc, macro_doc
    runaway = await session.call_tool("spin", {})
    assert runaway.is_error and "macro_error" in runaway.content[0].text, runaway
    fees = await session.call_tool("get_fees", {})
    assert json.loads(fees.content[0].text)["currency"] == "webcash"
    missing = await session.call_tool("get_post", {"post_id": "post_nope"})
    assert missing.is_error
    # Every tool but execute and get_attachment says what it answers; the
    # SDK checks each result below against it (and raises if not).
    listed = {t.name: t for t in (await session.list_tools()).tools}
    typed = sorted(n for n, t in listed.items() if t.output_schema is not None)
    assert "execute" not in typed and "get_attachment" not in typed, typed
    for name in ["search", "define", "get_post", "get_thread", "get_timeline", "get_profile",
                 "get_contract", "get_contract_status", "get_fees", macro]:
        assert name in typed, (name, typed)
    for name, arguments in [
        ("get_post", {"post_id": post_id}), ("get_thread", {"post_id": post_id}),
        ("get_timeline", {"limit": 5}), ("get_profile", {"fingerprint": seller}),
        ("get_contract", {"contract_id": contract_id}),
        ("get_contract_status", {"contract_id": contract_id}),
        ("search", {"term": "violin"}), (macro, {"style": "bow"}),
    ]:
        result = await session.call_tool(name, arguments)
        assert not result.is_error and result.structured_content, (name, result)
    resources = (await session.list_resources()).resources
    openapi = next(r for r in resources if r.name == "openapi")
    assert str(openapi.uri) == base + "/openapi.json", openapi
    read = await session.read_resource(openapi.uri)
    assert json.loads(read.contents[0].text)["openapi"].startswith("3."), read.contents[0].text[:80]
    templates = (await session.list_resource_templates()).resource_templates
    assert any(t.uri_template == base + "/api/posts/{post_id}" for t in templates), templates
    prompts = (await session.list_prompts()).prompts
    assert "find_listings" in [p.name for p in prompts], prompts
    got = await session.get_prompt("find_listings", {"what": "a violin"})
    assert "a violin" in got.messages[0].content.text, got
    return f"tools/list ({len(names)} tools, {len(typed)} with an outputSchema), " \
        f"tools/call of define, search, a macro, a runaway macro and the get_* tools, " \
        f"resources ({len(resources)} and {len(templates)} templates), prompts ({len(prompts)})"


async def check(base, admin):
    post_id, contract_id, seller = listing_and_contract(base, admin)
    post(base + "/api/mcp/tools/define", {
        "name": "spin", "description": "never returns", "kind": "search",
        "typescript": "while (true) {}", "input_schema": {"type": "object", "properties": {}},
    })
    # The handshake revisions (2025-11-25 and before): initialize first.
    async with streamable_http_client(base + "/mcp") as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            assert init.server_info.name == "marketplace", init
            assert init.protocol_version == "2025-11-25", init
            caps = init.capabilities
            assert caps.resources is not None and caps.prompts is not None and caps.logging is not None, caps
            handshake = await exercise(session, base, post_id, contract_id, seller, "find_by_style")
            # Dropped by 2026-07-28, still asked by clients of the earlier
            # revisions.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="The logging capability is deprecated")
                await session.set_logging_level("info")
    print(f"mcp client, 2025-11-25: initialize, {handshake}, logging/setLevel ok")
    # 2026-07-28 (stateless): the SDK's default `auto` mode discovers the
    # server, adopts the revision, and sends every request on its own with
    # its _meta and the routing headers.
    async with Client(base + "/mcp", mode="auto") as client:
        assert client.session.protocol_version == "2026-07-28", client.session.protocol_version
        discovered = client.session.discover_result
        assert discovered is not None and "2026-07-28" in discovered.supported_versions, discovered
        caps = discovered.capabilities
        assert caps.tools is not None and caps.resources is not None and caps.prompts is not None, caps
        assert caps.logging is None, caps
        stateless = await exercise(client, base, post_id, contract_id, seller, "find_in_style")
    print(f"mcp client, 2026-07-28: server/discover, {stateless} ok")


with running(admin_token=TOKEN) as (base, admin):
    asyncio.run(check(base, admin))
