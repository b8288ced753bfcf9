//! The OpenAPI 3.1 document, built from one table of operations, and the
//! docs page and docs search derived from it.

use marketplace_guest::prelude::*;

/// One operation.
pub struct Op {
    pub method: &'static str,
    pub path: &'static str,
    pub id: &'static str,
    pub tag: &'static str,
    pub summary: &'static str,
    pub description: &'static str,
    /// Fee action when the route is paid.
    pub paid: Option<&'static str>,
    /// Query parameters: (name, type, required, description).
    pub query: &'static [(&'static str, &'static str, bool, &'static str)],
    /// Request body schema name in components.
    pub body: Option<&'static str>,
    /// Success status and response schema name.
    pub ok: (u16, &'static str),
    /// Error statuses this operation documents (besides 413/500/503).
    pub errors: &'static [u16],
}

const fn op(
    method: &'static str,
    path: &'static str,
    id: &'static str,
    tag: &'static str,
    summary: &'static str,
    description: &'static str,
) -> Op {
    Op {
        method,
        path,
        id,
        tag,
        summary,
        description,
        paid: None,
        query: &[],
        body: None,
        ok: (200, "Any"),
        errors: &[],
    }
}

const LIMIT: (&str, &str, bool, &str) = (
    "limit",
    "integer",
    false,
    "1 to 100, default 20; anything else is 400",
);

/// Every operation of the service.
pub const OPS: &[Op] = &[
    Op {
        ok: (200, "Health"),
        ..op(
            "GET",
            "/api/health",
            "health",
            "info",
            "Health check",
            "Storage status with commit and fsync counters, and every plugin family's version and status.",
        )
    },
    Op {
        ok: (200, "Info"),
        ..op(
            "GET",
            "/api/info",
            "info",
            "info",
            "Service information",
            "Name, version, payment rails, fee policy in force and loaded plugins.",
        )
    },
    Op {
        ok: (200, "Any"),
        ..op(
            "GET",
            "/api/developers",
            "developers",
            "info",
            "Plugin developer guide",
            "How to build a plugin: WIT package and worlds, the template, build commands and the WIT text.",
        )
    },
    Op {
        ok: (200, "Fees"),
        ..op(
            "GET",
            "/api/fees",
            "fees",
            "payments",
            "Fee schedule",
            "Prices of paid actions from the active fee-policy plugin, the arbitration policy and the payment rails.",
        )
    },
    Op {
        body: Some("CashReplace"),
        ok: (200, "Success"),
        errors: &[400],
        ..op(
            "POST",
            "/api/cash/replace",
            "cashReplace",
            "payments",
            "Replace cash secrets",
            "Webcash-compatible replace: spends every input and creates every output atomically; sums must match exactly.",
        )
    },
    Op {
        body: Some("CashList"),
        ok: (200, "CashHealth"),
        errors: &[400],
        ..op(
            "POST",
            "/api/cash/health_check",
            "cashHealthCheck",
            "payments",
            "Check cash outputs",
            "State (spent, amount) of each public or secret cash string; unknown ones are null.",
        )
    },
    Op {
        query: &[
            LIMIT,
            (
                "before",
                "string",
                false,
                "post_id cursor: only older posts",
            ),
            ("post_type", "string", false, "filter"),
            ("author", "string", false, "author fingerprint"),
        ],
        ok: (200, "Timeline"),
        errors: &[400],
        ..op(
            "GET",
            "/api/timeline",
            "timeline",
            "posts",
            "List timeline posts",
            "Newest first, with a `before` cursor and filters.",
        )
    },
    Op {
        paid: Some("post (comment when parent_id is set)"),
        body: Some("NewPost"),
        ok: (201, "PostCreated"),
        errors: &[400, 401, 402, 404, 409],
        ..op(
            "POST",
            "/api/timeline",
            "createPost",
            "posts",
            "Create a post or comment",
            "Signed `post:{content}` by author_fingerprint. Attachments: at most 16, each at most 512 KiB, unique filenames without path separators.",
        )
    },
    Op {
        ok: (200, "PostEnvelope"),
        errors: &[404],
        ..op(
            "GET",
            "/api/posts/{post_id}",
            "getPost",
            "posts",
            "One post",
            "The post with its listing check (`terms.md` plus one descriptor attachment).",
        )
    },
    Op {
        ok: (200, "Raw"),
        errors: &[404],
        ..op(
            "GET",
            "/api/posts/{post_id}/attachments/{index}",
            "getAttachment",
            "posts",
            "One attachment",
            "The raw attachment bytes with their content type and an ETag (If-None-Match gives 304).",
        )
    },
    Op {
        ok: (200, "Thread"),
        errors: &[404],
        ..op(
            "GET",
            "/api/thread/{post_id}",
            "getThread",
            "posts",
            "A post's thread",
            "The root post and all descendants, oldest first.",
        )
    },
    Op {
        query: &[
            ("term", "string", true, "words to find (case-insensitive)"),
            LIMIT,
            ("post_type", "string", false, "filter"),
        ],
        ok: (200, "SearchResults"),
        errors: &[400],
        ..op(
            "GET",
            "/api/search",
            "search",
            "search",
            "Search posts",
            "BM25 ranking over content, keywords and markdown attachments (case-insensitive words; several words match any). `total` is exact for a one-word query without `post_type`; otherwise it counts the posts found among the best postings read per word.",
        )
    },
    Op {
        query: &[
            ("fingerprint", "string", false, "64-hex key"),
            ("nickname", "string", false, "case-insensitive"),
        ],
        ok: (200, "ProfileEnvelope"),
        errors: &[400, 404],
        ..op(
            "GET",
            "/api/profile",
            "getProfile",
            "identity",
            "A profile",
            "By fingerprint or nickname.",
        )
    },
    Op {
        paid: Some("identity"),
        body: Some("NewIdentity"),
        ok: (201, "IdentityCreated"),
        errors: &[400, 401, 402, 409],
        ..op(
            "POST",
            "/api/identity",
            "createIdentity",
            "identity",
            "Register an identity",
            "Ed25519 public key as 64 hex in pgp_public_key; signed `register:{nickname}` by that key.",
        )
    },
    Op {
        paid: Some("rate"),
        body: Some("Rate"),
        ok: (200, "Rated"),
        errors: &[400, 401, 402, 403, 404],
        ..op(
            "POST",
            "/api/profiles/rate",
            "rate",
            "identity",
            "Rate a post's author",
            "Signed `vote:{post_id}:{vote}`; one vote per (actor, post), a later vote replaces it.",
        )
    },
    Op {
        paid: Some("buy (the contract amount, held in escrow)"),
        body: Some("Buy"),
        ok: (201, "Bought"),
        errors: &[400, 401, 402, 403, 404, 409],
        ..op(
            "POST",
            "/api/arbitration/contracts/buy",
            "buy",
            "contracts",
            "Buy: open a contract",
            "Signed `buy_contract:{buyer}:{reference_post}:{contract_id}:{witness_proof}`.",
        )
    },
    Op {
        ok: (200, "Contract"),
        errors: &[404],
        ..op(
            "GET",
            "/api/arbitration/contracts/{id}",
            "getContract",
            "contracts",
            "One contract",
            "Never contains a secret.",
        )
    },
    Op {
        ok: (200, "ContractStatus"),
        errors: &[404],
        ..op(
            "GET",
            "/api/arbitration/contracts/{id}/status",
            "getContractStatus",
            "contracts",
            "Contract status",
            "Status and the actions some party could take now.",
        )
    },
    Op {
        paid: Some("pickup (first settling pickup under pickup-paid)"),
        body: Some("Action"),
        ok: (200, "ActionResult"),
        errors: &[400, 401, 402, 403, 404, 409],
        ..op(
            "POST",
            "/api/arbitration/contracts/{id}/pickup",
            "pickup",
            "contracts",
            "Pickup",
            "Collect what the contract owes you: certificate (buyer), payout (seller), refund (buyer). Payouts and refunds need a fresh signature.",
        )
    },
    Op {
        body: Some("Accept"),
        ok: (200, "ActionResult"),
        errors: &[400, 401, 403, 404, 409],
        ..op(
            "POST",
            "/api/arbitration/contracts/{id}/accept",
            "accept",
            "contracts",
            "Accept (seller)",
            "issued -> active; signed `accept:{id}:{seller_fingerprint}`.",
        )
    },
    Op {
        body: Some("Deliver"),
        ok: (200, "ActionResult"),
        errors: &[400, 401, 403, 404, 409],
        ..op(
            "POST",
            "/api/arbitration/contracts/{id}/deliver",
            "deliver",
            "contracts",
            "Deliver (seller)",
            "active -> delivered; signed `deliver:{id}:{delivered_text}`; needs the witness secret when the contract has one.",
        )
    },
    Op {
        body: Some("Action"),
        ok: (200, "ActionResult"),
        errors: &[400, 401, 403, 404, 409],
        ..op(
            "POST",
            "/api/arbitration/contracts/{id}/refund",
            "refund",
            "contracts",
            "Refund",
            "Signed `REFUND:{id}`; see the transition table.",
        )
    },
    Op {
        body: Some("Action"),
        ok: (200, "ActionResult"),
        errors: &[400, 401, 403, 404, 409],
        ..op(
            "POST",
            "/api/arbitration/contracts/{id}/release",
            "release",
            "contracts",
            "Release (buyer)",
            "active or delivered -> settled; signed `release:{id}`.",
        )
    },
    Op {
        body: Some("WitnessReplace"),
        ok: (200, "Success"),
        errors: &[400],
        ..op(
            "POST",
            "/api/witness/replace",
            "witnessReplace",
            "contracts",
            "Replace witness secrets",
            "Old secrets become spent, new ones live.",
        )
    },
    Op {
        body: Some("StringList"),
        ok: (200, "WitnessHealth"),
        errors: &[400],
        ..op(
            "POST",
            "/api/witness/health_check",
            "witnessHealthCheck",
            "contracts",
            "Witness states",
            "live, spent, burned or null for each proof.",
        )
    },
    Op {
        ok: (200, "McpDescription"),
        ..op(
            "GET",
            "/api/mcp",
            "mcpDescription",
            "mcp",
            "MCP tool endpoints",
            "Built-in tools, defined macros and the JSON-RPC endpoint.",
        )
    },
    Op {
        body: Some("McpSearch"),
        ok: (200, "SearchResults"),
        errors: &[400],
        ..op(
            "POST",
            "/api/mcp/tools/search",
            "mcpSearch",
            "mcp",
            "MCP search tool",
            "Same search as GET /api/search.",
        )
    },
    Op {
        body: Some("MacroDefinition"),
        ok: (201, "MacroEnvelope"),
        errors: &[400, 401, 409],
        ..op(
            "POST",
            "/api/mcp/tools/define",
            "mcpDefine",
            "mcp",
            "Define a macro",
            "Stores a reusable search macro; names are first come; only the signed owner may update. The TypeScript is a function body that receives `args` and returns `{term, post_type?, limit?}`. It is parsed as TypeScript (oxc) and its types erased; syntax and type-syntax errors, and TypeScript with runtime semantics (enum, namespace, parameter properties), are 400 with `details` naming `typescript` and the line and column.",
        )
    },
    Op {
        body: Some("Execute"),
        ok: (200, "Any"),
        errors: &[400, 402, 404, 422, 503],
        ..op(
            "POST",
            "/api/mcp/tools/execute",
            "mcpExecute",
            "mcp",
            "Execute a tool or endpoint",
            "Answers with the target's status and body unchanged; a paid target without payment gives its 402. A macro's arguments are checked against its input_schema (400 with details); then its JavaScript runs in a sandbox (the boa engine: no I/O, no clock but the host's, 500 ms, the plugin's memory cap) and the answer is the search it returns. A throw, a runaway or a bad return value is 422 `macro_error`.",
        )
    },
    Op {
        body: Some("JsonRpc"),
        ok: (200, "Any"),
        errors: &[400],
        ..op(
            "POST",
            "/mcp",
            "mcpJsonRpc",
            "mcp",
            "MCP server (Streamable HTTP)",
            "JSON-RPC 2.0: initialize, tools/list, tools/call, ping; notifications are answered 202.",
        )
    },
    Op {
        query: &[
            ("q", "string", true, "words to find"),
            ("limit", "integer", false, "1 to 50, default 10"),
        ],
        ok: (200, "DocsResults"),
        errors: &[400],
        ..op(
            "GET",
            "/api/docs/search",
            "docsSearch",
            "docs",
            "Search the documentation",
            "Matches operations by path, summary and description.",
        )
    },
    Op {
        ok: (200, "AgentManifest"),
        ..op(
            "GET",
            "/.well-known/agent.json",
            "agentManifest",
            "docs",
            "Agent manifest",
            "Machine-readable description for agents.",
        )
    },
    Op {
        ok: (200, "Any"),
        ..op(
            "GET",
            "/.well-known/agent-card.json",
            "agentCard",
            "docs",
            "A2A agent card",
            "The same service as an A2A agent card.",
        )
    },
    Op {
        ok: (200, "Any"),
        ..op(
            "GET",
            "/openapi.yaml",
            "openapiYaml",
            "docs",
            "This OpenAPI document (YAML)",
            "",
        )
    },
    Op {
        ok: (200, "Any"),
        ..op(
            "GET",
            "/openapi.json",
            "openapiJson",
            "docs",
            "This OpenAPI document (JSON)",
            "",
        )
    },
    Op {
        ok: (200, "Raw"),
        ..op(
            "GET",
            "/docs",
            "docs",
            "docs",
            "HTML reference",
            "Rendered from this document; works offline.",
        )
    },
];

fn obj(props: &[(&str, Value)], required: &[&str]) -> Value {
    let mut p = serde_json::Map::new();
    for (k, v) in props {
        p.insert(k.to_string(), v.clone());
    }
    json!({"type": "object", "properties": p, "required": required})
}

fn t(ty: &str) -> Value {
    json!({"type": ty})
}

/// A string with at least one non-space character.
fn nonblank(max: usize) -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": max, "pattern": "\\S"})
}

fn pattern(p: &str) -> Value {
    json!({"type": "string", "pattern": p})
}

fn r(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn schemas() -> Value {
    let amount = json!({"type": "string", "pattern": "^[0-9]+(\\.[0-9]{1,8})?$", "description": "decimal, at most 8 decimals, shortest form"});
    let signed = [
        ("signature", t("string")),
        (
            "timestamp",
            json!({"type": "integer", "minimum": 0, "maximum": 4_102_444_800u64, "description": "unix seconds: fresh form, signs {message}:{timestamp}"}),
        ),
    ];
    let positive = json!({"type": "string", "pattern": "^[0-9]+(\\.[0-9]{1,8})?$", "not": {"pattern": "^0+(\\.0+)?$"}, "description": "positive decimal, at most 8 decimals"});
    let cash = pattern("^e(?!0+(\\.0+)?:)[0-9]+(\\.[0-9]{1,8})?:(secret|public):[0-9a-f]{64}$");
    let cash_secret = pattern("^e(?!0+(\\.0+)?:)[0-9]+(\\.[0-9]{1,8})?:secret:[0-9a-f]{64}$");
    let fp = pattern("^[0-9a-fA-F]{64}$");
    let with_sig = |mut props: Vec<(&'static str, Value)>, required: &[&str]| {
        props.extend(signed.iter().cloned());
        obj(&props, required)
    };
    let post = obj(
        &[
            ("post_id", t("string")),
            ("parent_id", json!({"type": ["string", "null"]})),
            ("author_fingerprint", t("string")),
            ("author_nick", json!({"type": ["string", "null"]})),
            ("content", t("string")),
            ("post_type", t("string")),
            ("keywords", json!({"type": "array", "items": t("string")})),
            (
                "attachments",
                json!({"type": "array", "items": obj(&[("index", t("integer")), ("filename", t("string")), ("attachment_type", t("string")), ("size", t("integer")), ("sha256", t("string"))], &[])}),
            ),
            ("activity_metadata", t("object")),
            (
                "created_at",
                json!({"type": "string", "format": "date-time"}),
            ),
            ("comment_count", t("integer")),
            (
                "rating",
                obj(&[("up", t("integer")), ("down", t("integer"))], &[]),
            ),
            (
                "listing",
                obj(
                    &[
                        ("terms", t("boolean")),
                        ("descriptor", json!({"type": ["string", "null"]})),
                        ("verified", t("boolean")),
                    ],
                    &[],
                ),
            ),
        ],
        &["post_id", "author_fingerprint", "content", "post_type"],
    );
    let contract = obj(
        &[
            ("contract_id", t("string")),
            (
                "status",
                json!({"enum": ["issued", "active", "delivered", "settled", "refunded"]}),
            ),
            ("contract_type", t("string")),
            ("amount", amount.clone()),
            ("buyer_fingerprint", t("string")),
            ("target_seller_fingerprint", t("string")),
            ("reference_post", t("string")),
            ("work_spec", json!({})),
            (
                "delivery_deadline",
                json!({"type": "string", "format": "date-time"}),
            ),
            ("fee_policy", t("string")),
            ("created_at", t("string")),
            ("updated_at", t("string")),
            (
                "history",
                json!({"type": "array", "items": obj(&[("action", t("string")), ("actor", t("string")), ("at", t("string"))], &[])}),
            ),
        ],
        &["contract_id", "status"],
    );
    let profile = obj(
        &[
            ("fingerprint", t("string")),
            ("nickname", t("string")),
            ("about", t("string")),
            ("pub_key", t("string")),
            ("created_at", t("string")),
            ("post_count", t("integer")),
            (
                "rating",
                obj(
                    &[
                        ("up", t("integer")),
                        ("down", t("integer")),
                        ("score", t("integer")),
                    ],
                    &[],
                ),
            ),
        ],
        &["fingerprint", "nickname"],
    );
    let payment = obj(
        &[
            ("action", t("string")),
            ("price", amount.clone()),
            ("paid", amount.clone()),
            ("change", json!({"type": ["string", "null"]})),
        ],
        &[],
    );
    json!({
        "Any": {},
        "Raw": {"type": "string"},
        "Error": obj(&[("code", t("string")), ("message", t("string")), ("details", json!({"type": "array", "items": obj(&[("field", t("string")), ("problem", t("string"))], &[])}))], &["code", "message"]),
        "PaymentRequired": obj(&[("code", json!({"enum": ["payment_required", "payment_invalid", "payment_spent", "payment_insufficient", "payment_rail_unavailable"]})), ("message", t("string")), ("required_amount", amount.clone()),
            ("payment", obj(&[("action", t("string")), ("price", amount.clone()), ("currency", json!({"const": "webcash"})), ("header", json!({"const": "X-Cash-Secret"})), ("supported_headers", json!({"type": "array", "items": t("string")})), ("format", t("string")), ("allowed_rails", json!({"type": "array", "items": t("string")})), ("fee_schedule_url", t("string"))], &[]))], &["code", "message", "required_amount", "payment"]),
        "Success": obj(&[("status", json!({"const": "success"}))], &["status"]),
        "StringList": {"type": "array", "items": t("string"), "maxItems": 100},
        "CashList": {"type": "array", "items": cash, "maxItems": 100},
        "CashReplace": obj(&[("webcashes", json!({"type": "array", "items": cash_secret, "minItems": 1, "maxItems": 100})), ("new_webcashes", json!({"type": "array", "items": cash_secret, "minItems": 1, "maxItems": 100}))], &["webcashes", "new_webcashes"]),
        "CashHealth": obj(&[("status", t("string")), ("results", json!({"type": "object", "additionalProperties": obj(&[("spent", json!({"type": ["boolean", "null"]})), ("amount", json!({"type": ["string", "null"]}))], &[])}))], &[]),
        "Health": obj(&[("status", t("string")), ("storage", obj(&[("status", t("string")), ("commits", t("integer")), ("syncs", t("integer"))], &[])), ("plugins", t("object"))], &["status", "storage", "plugins"]),
        "Info": obj(&[("name", t("string")), ("version", t("string")), ("payment_rails", t("array")), ("fee_schedule_url", t("string")), ("fee_policy", t("string")), ("plugins", t("object"))], &["name", "version"]),
        "Fees": obj(&[("currency", t("string")), ("decimals", t("integer")), ("rails", t("array")), ("actions", t("object")), ("arbitration", obj(&[("policy", t("string")), ("rate", t("string"))], &[])), ("plugin", t("object"))], &["currency", "actions"]),
        "Post": post,
        "PostEnvelope": obj(&[("post", r("Post"))], &["post"]),
        "PostCreated": obj(&[("post_id", t("string")), ("post", r("Post")), ("payment", payment.clone())], &["post_id", "post"]),
        "Timeline": obj(&[("posts", json!({"type": "array", "items": r("Post")})), ("next_before", json!({"type": ["string", "null"]}))], &["posts"]),
        "Thread": obj(&[("root", r("Post")), ("comments", json!({"type": "array", "items": r("Post")})), ("count", t("integer"))], &["root", "comments", "count"]),
        "SearchResults": obj(&[("term", t("string")), ("total", t("integer")), ("results", json!({"type": "array", "items": {"allOf": [r("Post"), obj(&[("score", t("number"))], &[])]}}))], &["term", "total", "results"]),
        "NewPost": with_sig(vec![("author_fingerprint", t("string")), ("content", nonblank(65536)), ("post_type", pattern("^[A-Za-z0-9_-]{1,64}$")), ("parent_id", t("string")), ("keywords", json!({"type": "array", "items": nonblank(64), "maxItems": 32})),
            ("attachments", json!({"type": "array", "maxItems": 16, "items": obj(&[("filename", t("string")), ("content", t("string")), ("attachment_type", t("string"))], &["filename", "content"])})), ("activity_metadata", t("object"))], &["author_fingerprint", "content", "signature"]),
        "Profile": profile,
        "ProfileEnvelope": obj(&[("profile", r("Profile"))], &["profile"]),
        "NewIdentity": with_sig(vec![("nickname", pattern("^[A-Za-z0-9_.-]{1,32}$")), ("pgp_public_key", fp.clone()), ("about", json!({"type": "string", "maxLength": 2000}))], &["nickname", "pgp_public_key", "signature"]),
        "IdentityCreated": obj(&[("fingerprint", t("string")), ("profile", r("Profile")), ("payment", payment.clone())], &["fingerprint", "profile"]),
        "Rate": with_sig(vec![("post_id", nonblank(200)), ("actor_fingerprint", t("string")), ("vote", json!({"enum": ["up", "down"]}))], &["post_id", "actor_fingerprint", "vote", "signature"]),
        "Rated": obj(&[("post_id", t("string")), ("vote", t("string")), ("rating", t("object")), ("payment", payment.clone())], &["post_id", "vote", "rating"]),
        "Buy": with_sig(vec![("buyer_fingerprint", t("string")), ("contract_type", json!({"enum": ["service", "product_digital", "product_physical"]})), ("amount", positive), ("reference_post", nonblank(128)),
            ("contract_id", json!({"type": "string", "pattern": "^CTR_[A-Za-z0-9_-]{1,64}$"})), ("work_spec", json!({})), ("delivery_deadline", json!({"type": "string", "format": "date-time", "description": "must be in the future"})), ("witness_proof", pattern("^n:CTR_[A-Za-z0-9_-]{1,64}:public:[0-9a-f]{64}$")), ("encrypted_witness_secret", t("string")), ("accept_terms", json!({"const": true}))],
            &["buyer_fingerprint", "contract_type", "amount", "reference_post", "accept_terms", "signature"]),
        "Bought": obj(&[("contract_id", t("string")), ("status", t("string")), ("target_seller_fingerprint", t("string")), ("contract", r("Contract")), ("payment", payment)], &["contract_id", "status", "contract"]),
        "Contract": contract,
        "ContractStatus": obj(&[("contract_id", t("string")), ("status", t("string")), ("allowed_actions", json!({"type": "array", "items": t("string")})), ("updated_at", t("string"))], &["contract_id", "status", "allowed_actions"]),
        "Action": with_sig(vec![("actor_fingerprint", t("string"))], &["actor_fingerprint", "signature"]),
        "Accept": with_sig(vec![("seller_fingerprint", t("string"))], &["seller_fingerprint", "signature"]),
        "Deliver": with_sig(vec![("actor_fingerprint", t("string")), ("delivered_text", nonblank(65536)), ("witness_secret", t("string"))], &["actor_fingerprint", "delivered_text", "signature"]),
        "ActionResult": obj(&[("contract_id", t("string")), ("status", t("string")), ("allowed_actions", json!({"type": "array", "items": t("string")})), ("certificate_id", t("string")), ("certificate_secret", t("string")), ("certificate_proof", t("string")), ("delivered_text", t("string")), ("payout", t("string")), ("refund", t("string"))], &["contract_id", "status", "allowed_actions"]),
        "WitnessReplace": obj(&[("secrets", json!({"type": "array", "items": pattern("^n:CTR_[A-Za-z0-9_-]{1,64}:secret:[0-9a-f]{64}$"), "minItems": 1, "maxItems": 100})), ("new_secrets", json!({"type": "array", "items": pattern("^n:CTR_[A-Za-z0-9_-]{1,64}:secret:[0-9a-f]{64}$"), "minItems": 1, "maxItems": 100}))], &["secrets", "new_secrets"]),
        "WitnessHealth": obj(&[("status", t("string")), ("results", t("object"))], &[]),
        "McpDescription": obj(&[("name", t("string")), ("version", t("string")), ("tools", t("array")), ("macros", t("array")), ("jsonrpc", t("string"))], &["tools", "macros"]),
        "McpSearch": obj(&[("term", nonblank(1000)), ("limit", json!({"type": ["integer", "null"], "minimum": 1, "maximum": 100})), ("post_type", json!({"type": ["string", "null"]}))], &["term"]),
        "MacroDefinition": obj(&[("name", pattern("^[a-z][a-z0-9_-]{0,63}$")), ("description", json!({"type": "string", "maxLength": 1000})), ("kind", json!({"const": "search"})), ("typescript", nonblank(16384)),
            ("input_schema", obj(&[("type", json!({"const": "object"})), ("properties", json!({"type": "object", "additionalProperties": obj(&[("type", json!({"enum": ["string", "number", "integer", "boolean", "object", "array"]}))], &["type"])}))], &["type", "properties"])),
            ("timestamp", json!({"type": ["integer", "null"], "minimum": 0})), ("owner_fingerprint", json!({"type": ["string", "null"]})), ("signature", json!({"type": ["string", "null"]}))], &["name", "kind", "typescript", "input_schema"]),
        "MacroEnvelope": obj(&[("macro", t("object"))], &["macro"]),
        "Execute": {"anyOf": [
            obj(&[("tool", nonblank(64)), ("arguments", t("object"))], &["tool"]),
            obj(&[("endpoint", obj(&[("method", json!({"enum": ["GET", "POST"]})), ("path", pattern("^/api/")), ("query", t("object")), ("body", json!({}))], &["method", "path"]))], &["endpoint"]),
        ]},
        "JsonRpcError": obj(&[("jsonrpc", t("string")), ("id", json!({})), ("error", obj(&[("code", t("integer")), ("message", t("string"))], &["code", "message"]))], &["jsonrpc", "error"]),
        "JsonRpc": obj(&[("jsonrpc", json!({"const": "2.0"})), ("id", json!({})), ("method", t("string")), ("params", t("object"))], &["jsonrpc", "method"]),
        "DocsResults": obj(&[("results", json!({"type": "array", "items": obj(&[("title", t("string")), ("path", t("string")), ("snippet", t("string"))], &[])}))], &["results"]),
        "AgentManifest": obj(&[("name", t("string")), ("version", t("string")), ("description", t("string")), ("capabilities", json!({"type": "array", "items": t("string")})), ("openapi", t("string")), ("docs", t("string")), ("mcp", obj(&[("tools_search", t("string")), ("tools_define", t("string")), ("tools_execute", t("string"))], &[]))], &["name", "version", "openapi", "docs", "mcp"]),
    })
}

fn error_response(status: u16) -> Value {
    let (desc, schema) = match status {
        400 => (
            "invalid_request (with details) or invalid_attachment",
            "Error",
        ),
        401 => ("auth_required, auth_invalid or auth_expired", "Error"),
        402 => (
            "payment required: the fee is in the body",
            "PaymentRequired",
        ),
        403 => ("forbidden_party or witness_mismatch", "Error"),
        404 => ("not_found", "Error"),
        409 => (
            "invalid_transition (with current_status, allowed_actions) or conflict",
            "Error",
        ),
        413 => ("payload_too_large", "Error"),
        422 => ("macro_error", "Error"),
        503 => ("plugin_unavailable", "Error"),
        _ => ("internal", "Error"),
    };
    json!({"description": desc, "content": {"application/json": {"schema": r(schema)}}})
}

/// The whole document.
pub fn document(version: &str) -> Value {
    let mut paths = serde_json::Map::new();
    for o in OPS {
        let mut params = Vec::new();
        for seg in o.path.split('/') {
            if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                params.push(
                    json!({"name": name, "in": "path", "required": true, "schema": t("string")}),
                );
            }
        }
        for (name, ty, required, desc) in o.query {
            let schema = match (*name, o.id) {
                ("limit", "docsSearch") => json!({"type": "integer", "minimum": 1, "maximum": 50}),
                ("limit", _) => json!({"type": "integer", "minimum": 1, "maximum": 100}),
                ("term" | "q", _) => nonblank(1000),
                ("before", _) => json!({"type": "string", "pattern": "^post_[0-9A-Za-z]{1,59}$"}),
                _ => t(ty),
            };
            params.push(json!({"name": name, "in": "query", "required": required, "description": desc, "schema": schema}));
        }
        if o.paid.is_some() {
            params.push(json!({"name": "X-Cash-Secret", "in": "header", "required": false, "description": "bearer cash secret e<amount>:secret:<hex> paying the fee (X-Webcash-Secret is an alias)", "schema": t("string")}));
            params.push(json!({"name": "X-Bitcoin-Secret", "in": "header", "required": false, "description": "bitcoin rail (disabled unless configured: 402 payment_rail_unavailable)", "schema": t("string")}));
        }
        let mut responses = serde_json::Map::new();
        let ok_content = match (o.id, o.ok.1) {
            ("openapiYaml", _) => json!({"application/yaml": {"schema": r("Any")}}),
            ("docs", _) => json!({"text/html": {"schema": r("Raw")}}),
            (_, "Raw") => json!({"*/*": {"schema": r("Raw")}}),
            (_, s) => json!({"application/json": {"schema": r(s)}}),
        };
        responses.insert(
            o.ok.0.to_string(),
            json!({"description": "success", "content": ok_content}),
        );
        let mut errs: Vec<u16> = o.errors.to_vec();
        if o.paid.is_some() && !errs.contains(&402) {
            errs.push(402);
        }
        if o.method == "POST" {
            errs.push(413);
        }
        errs.extend([500, 503]);
        if o.id == "mcpJsonRpc" {
            responses.insert(
                "202".into(),
                json!({"description": "a notification: accepted, no body"}),
            );
            responses.insert("400".into(), json!({"description": "JSON-RPC parse error", "content": {"application/json": {"schema": r("JsonRpcError")}}}));
        }
        for e in errs {
            responses
                .entry(e.to_string())
                .or_insert_with(|| error_response(e));
        }
        let mut operation = json!({
            "operationId": o.id, "tags": [o.tag], "summary": o.summary,
            "description": match o.paid { Some(a) => format!("{} Paid: {a}.", o.description), None => o.description.to_string() },
            "parameters": params, "responses": responses,
        });
        if let Some(body) = o.body {
            operation["requestBody"] =
                json!({"required": true, "content": {"application/json": {"schema": r(body)}}});
        }
        let entry = paths.entry(o.path.to_string()).or_insert_with(|| json!({}));
        entry[o.method.to_ascii_lowercase()] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "Marketplace API", "version": version,
                 "description": "Listings, search, Ed25519 identities, ratings and escrow contracts, paid in bearer cash (HTTP 402). Every /api path is also served under /api/v1."},
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {"schemas": schemas()},
    })
}

/// Emit a JSON value as block-style YAML (strings always quoted).
pub fn to_yaml(v: &Value) -> String {
    fn scalar(v: &Value) -> String {
        match v {
            Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
            other => other.to_string(),
        }
    }
    fn emit(v: &Value, indent: usize, out: &mut String) {
        let pad = " ".repeat(indent);
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, val) in m {
                    let key = serde_json::to_string(k).unwrap_or_default();
                    match val {
                        Value::Object(x) if !x.is_empty() => {
                            out.push_str(&format!("{pad}{key}:\n"));
                            emit(val, indent + 2, out);
                        }
                        Value::Array(x) if !x.is_empty() => {
                            out.push_str(&format!("{pad}{key}:\n"));
                            emit(val, indent, out);
                        }
                        _ => out.push_str(&format!("{pad}{key}: {}\n", scalar(val))),
                    }
                }
            }
            Value::Array(a) if !a.is_empty() => {
                for item in a {
                    match item {
                        Value::Object(x) if !x.is_empty() => {
                            let mut inner = String::new();
                            emit(item, indent + 2, &mut inner);
                            let trimmed = inner.trim_start_matches(' ');
                            out.push_str(&format!("{pad}- {trimmed}"));
                        }
                        Value::Array(x) if !x.is_empty() => {
                            out.push_str(&format!("{pad}-\n"));
                            emit(item, indent + 2, out);
                        }
                        _ => out.push_str(&format!("{pad}- {}\n", scalar(item))),
                    }
                }
            }
            Value::Object(_) => out.push_str(&format!("{pad}{{}}\n")),
            Value::Array(_) => out.push_str(&format!("{pad}[]\n")),
            other => out.push_str(&format!("{pad}{}\n", scalar(other))),
        }
    }
    let mut out = String::new();
    emit(v, 0, &mut out);
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The self-contained HTML reference.
pub fn html(doc: &Value) -> String {
    let mut body = String::new();
    let mut nav = String::new();
    for o in OPS {
        nav.push_str(&format!(
            "<li><a href=\"#{}\"><code>{} {}</code></a></li>",
            o.id,
            o.method,
            esc(o.path)
        ));
        let op = &doc["paths"][o.path][o.method.to_ascii_lowercase()];
        let params: Vec<String> = op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                format!(
                    "<li><code>{}</code> ({}{}) {}</li>",
                    esc(p["name"].as_str().unwrap_or("")),
                    p["in"].as_str().unwrap_or(""),
                    if p["required"] == true {
                        ", required"
                    } else {
                        ""
                    },
                    esc(p["description"].as_str().unwrap_or(""))
                )
            })
            .collect();
        let responses: Vec<String> = op["responses"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(code, r)| {
                format!(
                    "<li><code>{code}</code> {}</li>",
                    esc(r["description"].as_str().unwrap_or(""))
                )
            })
            .collect();
        body.push_str(&format!(
            "<section id=\"{}\"><h2><span class=\"m {}\">{}</span> <code>{}</code></h2><p><b>{}</b></p><p>{}</p>{}{}<h4>Responses</h4><ul>{}</ul></section>",
            o.id, o.method.to_ascii_lowercase(), o.method, esc(o.path), esc(o.summary), esc(op["description"].as_str().unwrap_or("")),
            if params.is_empty() { String::new() } else { format!("<h4>Parameters</h4><ul>{}</ul>", params.join("")) },
            o.body.map(|b| format!("<h4>Request body</h4><p>JSON <code>{b}</code> (see <a href=\"/openapi.yaml\">openapi.yaml</a>)</p>")).unwrap_or_default(),
            responses.join("")
        ));
    }
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Marketplace API reference</title><style>\
body{{font-family:system-ui,sans-serif;margin:0;display:flex;color:#222}}nav{{width:330px;height:100vh;overflow:auto;position:sticky;top:0;background:#f5f5f7;padding:1em;box-sizing:border-box}}\
nav ul{{list-style:none;padding:0}}nav li{{margin:.2em 0}}main{{padding:1em 2em;max-width:900px}}section{{border-bottom:1px solid #ddd;padding:1em 0}}\
.m{{font-size:.8em;padding:.1em .5em;border-radius:4px;color:#fff}}.get{{background:#2b7}}.post{{background:#27c}}code{{font-size:.95em}}</style></head>\
<body><nav><h3>Marketplace API</h3><p>v{}</p><p><a href=\"/openapi.yaml\">openapi.yaml</a></p><ul>{nav}</ul></nav><main><h1>Marketplace API reference</h1>\
<p>{}</p><p>Errors are JSON <code>{{\"code\", \"message\"}}</code>; clients branch on <code>code</code>. Paid routes answer 402 until <code>X-Cash-Secret</code> carries a secret covering the fee (<a href=\"/api/fees\">/api/fees</a>).</p>{body}</main></body></html>",
        esc(doc["info"]["version"].as_str().unwrap_or("")),
        esc(doc["info"]["description"].as_str().unwrap_or(""))
    )
}

/// Docs search: operations ranked by query words found, a word in the
/// path or summary counting three times one in the description.
pub fn search(q: &str, limit: usize) -> Value {
    use marketplace_common::text::tokens;
    let words = tokens(q);
    let mut hits: Vec<(usize, &Op)> = OPS
        .iter()
        .map(|o| {
            let title = tokens(&format!("{} {}", o.path, o.summary));
            let rest = tokens(&format!(
                "{} {} {}",
                o.description,
                o.tag,
                o.paid.unwrap_or("")
            ));
            let score = words
                .iter()
                .map(|w| 3 * usize::from(title.contains(w)) + usize::from(rest.contains(w)))
                .sum();
            (score, o)
        })
        .filter(|(n, _)| *n > 0)
        .collect();
    hits.sort_by_key(|h| std::cmp::Reverse(h.0));
    let results: Vec<Value> = hits
        .into_iter()
        .take(limit)
        .map(|(_, o)| json!({"title": format!("{} {} - {}", o.method, o.path, o.summary), "path": format!("/docs#{}", o.id), "snippet": o.description}))
        .collect();
    json!({"results": results})
}
