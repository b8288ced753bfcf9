// The official MCP TypeScript SDK's client against POST /mcp: the client
// most MCP hosts are built on (run by tests/mcp_conformance.py, with the
// SDK the conformance suite installs).
//
//     node tests/mcp_ts_client.mjs SDK_DIR BASE_URL
//
// Its callTool checks a result's structuredContent against the tool's
// outputSchema whenever the result has one, refusals included: a refusal
// that carried its error body there came out as a thrown schema error in
// place of the refusal. Each tool with an outputSchema is called to
// succeed and to be refused; a refusal must come back as an isError
// result whose text is the route's error body. Exits 1 on any failure.
import { pathToFileURL } from "node:url";

const [sdk, base] = process.argv.slice(2);
if (!sdk || !base) {
  console.error("usage: node mcp_ts_client.mjs SDK_DIR BASE_URL");
  process.exit(2);
}
const load = (p) => import(pathToFileURL(`${sdk}/dist/esm/${p}`).href);
const { Client } = await load("client/index.js");
const { StreamableHTTPClientTransport } = await load("client/streamableHttp.js");

const failures = [];
const client = new Client({ name: "marketplace-ts-check", version: "1" });
await client.connect(new StreamableHTTPClientTransport(new URL(`${base}/mcp`)));

// A macro that always throws (a 422 macro_error), defined through the
// define tool; then the listing that tells the client every schema.
const name = `ts_throws_${process.pid}`;
const defined = await client.callTool({
  name: "define",
  arguments: {
    name,
    description: "always fails",
    kind: "search",
    typescript: "throw new Error('no');",
    input_schema: { type: "object", properties: {} },
  },
});
if (defined.isError) failures.push(`define ${name}: ${JSON.stringify(defined)}`);
const listed = await client.listTools();
const withSchema = new Set(listed.tools.filter((t) => t.outputSchema).map((t) => t.name));
for (const t of ["get_fees", "search", "get_post", "get_contract", "get_profile", "define", name]) {
  if (!withSchema.has(t)) failures.push(`${t} lists no outputSchema (the check needs one)`);
}

async function call(tool, args, expectError, code) {
  let result;
  try {
    result = await client.callTool({ name: tool, arguments: args });
  } catch (e) {
    failures.push(`${tool} ${JSON.stringify(args)} threw: ${e.message}`);
    return;
  }
  if (Boolean(result.isError) !== expectError) {
    failures.push(`${tool}: isError ${result.isError}, wanted ${expectError}: ${JSON.stringify(result)}`);
    return;
  }
  if (!expectError) {
    if (!result.structuredContent) failures.push(`${tool}: no structuredContent`);
    return;
  }
  let body;
  try {
    body = JSON.parse(result.content[0].text);
  } catch (e) {
    failures.push(`${tool}: the refusal's text is not its JSON error body: ${JSON.stringify(result)}`);
    return;
  }
  if (body.code !== code) failures.push(`${tool}: code ${body.code}, wanted ${code}`);
}

await call("get_fees", {}, false);
await call("search", { term: "anything" }, false);
await call("search", { term: "walnut", limit: 500 }, true, "invalid_request");
await call("get_post", { post_id: "post_nope" }, true, "not_found");
await call("get_contract", { contract_id: "CTR_nope" }, true, "not_found");
await call("get_profile", { nickname: "nobody_at_all" }, true, "not_found");
await call(
  "define",
  { name, description: "again", kind: "search", typescript: "return {term: 'x'};",
    input_schema: { type: "object", properties: {} } },
  true,
  "conflict",
);
await call(name, {}, true, "macro_error");
await client.close();

if (failures.length) {
  console.error("MCP TypeScript SDK client:\n  " + failures.join("\n  "));
  process.exit(1);
}
console.log(`MCP TypeScript SDK client: ${withSchema.size} tools with an outputSchema; successes and refusals as results`);
