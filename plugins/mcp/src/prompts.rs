//! MCP prompts (`prompts/list`, `prompts/get`): the marketplace's common
//! tasks as ready instructions for an agent, naming the tools that do
//! each step. A prompt's text is built from its arguments only; nothing is
//! read or run.

use crate::rpc::RpcFault;
use marketplace_guest::prelude::*;

/// A prompt's arguments as given: the trimmed value of a name, if not
/// empty.
type Args<'a> = &'a dyn Fn(&str) -> Option<String>;

/// An argument of a prompt.
struct Arg {
    name: &'static str,
    description: &'static str,
    required: bool,
}

struct Prompt {
    name: &'static str,
    title: &'static str,
    description: &'static str,
    arguments: &'static [Arg],
    /// The user message, from the arguments (each present when required).
    text: fn(Args) -> String,
}

/// Longest argument value taken.
const MAX_ARGUMENT: usize = 1000;

const PROMPTS: &[Prompt] = &[
    Prompt {
        name: "find_listings",
        title: "Find listings",
        description: "Search the marketplace for listings of something and compare the best offers and their sellers.",
        arguments: &[
            Arg {
                name: "what",
                description: "What you are looking for, in a few words",
                required: true,
            },
            Arg {
                name: "budget",
                description: "The most you would pay, in webcash (optional)",
                required: false,
            },
        ],
        text: |arg| {
            let what = arg("what").unwrap_or_default();
            let budget = arg("budget")
                .map(|b| format!(" Leave out offers above {b} webcash."))
                .unwrap_or_default();
            format!(
                "Find marketplace listings for: {what}.{budget}\n\
                 1. Call the `search` tool with the key words as `term` (try a synonym too if little comes back).\n\
                 2. Read the promising results with `get_post`, and their sellers with `get_profile` (fingerprint = the post's author) to see their ratings.\n\
                 3. Before relying on a listing, check it carries its terms and a description: `listing.verified` is true when the post has an attachment named `terms.md` and one named `service.md`, `product.md`, `skill.md` or `description.md` (names only: read both with `get_attachment` and judge them). Say which offers lack them.\n\
                 4. Answer with the best few offers: what is offered, the price if stated, the post id, the seller and their rating, whether it has its terms and description, and anything that makes an offer doubtful."
            )
        },
    },
    Prompt {
        name: "sell_item",
        title: "Sell an item",
        description: "Draft a listing for something to sell and publish it as a paid, signed post.",
        arguments: &[
            Arg {
                name: "item",
                description: "What you sell",
                required: true,
            },
            Arg {
                name: "price",
                description: "The asking price, in webcash (optional)",
                required: false,
            },
        ],
        text: |arg| {
            let item = arg("item").unwrap_or_default();
            let price = arg("price")
                .map(|p| format!(" at {p} webcash"))
                .unwrap_or_default();
            format!(
                "Help me sell {item}{price} on this marketplace.\n\
                 1. Search for similar listings with the `search` tool and say how their prices compare.\n\
                 2. Draft a short, honest listing (what it is, its condition, the price, how it is delivered) and show it to me before publishing. A listing clients rely on has two attachments: `terms.md` (the terms of sale) and `product.md` (or `service.md`, `skill.md`, `description.md`: what is offered); draft both.\n\
                 3. Publishing is a paid request signed with my Ed25519 key: check its price with `get_fees`, then send `POST /api/timeline` through the `execute` tool with the signed body, the two attachments, and the payment header on the MCP request (the OpenAPI resource describes both); its answer's `post.listing.verified` must be true. Never publish without my approval."
            )
        },
    },
    Prompt {
        name: "contract_next_step",
        title: "Next step of a contract",
        description: "Explain where an arbitration (escrow) contract stands and what each party can do next.",
        arguments: &[Arg {
            name: "contract_id",
            description: "The contract's id (CTR_...)",
            required: true,
        }],
        text: |arg| {
            let id = arg("contract_id").unwrap_or_default();
            format!(
                "Where does arbitration contract {id} stand?\n\
                 Call `get_contract_status` with contract_id {id} (and `get_contract` for its terms), then explain in plain words its state, \
                 who must act next (its actions_by_role), the actions allowed now and their deadlines, and what happens to the escrowed money in each case."
            )
        },
    },
];

/// `prompts/list`: one page.
pub fn list(params: &Value) -> Result<Value, RpcFault> {
    crate::resources::no_cursor(params)?;
    let prompts: Vec<Value> = PROMPTS
        .iter()
        .map(|p| {
            let arguments: Vec<Value> = p
                .arguments
                .iter()
                .map(|a| json!({"name": a.name, "description": a.description, "required": a.required}))
                .collect();
            json!({"name": p.name, "title": p.title, "description": p.description, "arguments": arguments})
        })
        .collect();
    Ok(json!({ "prompts": prompts }))
}

/// `prompts/get {name, arguments?}`: an unknown prompt, a missing required
/// argument, an unknown one or a value that is not a string (of at most
/// [`MAX_ARGUMENT`] bytes) is -32602.
pub fn get(params: &Value) -> Result<Value, RpcFault> {
    let Some(name) = params.get("name").and_then(Value::as_str) else {
        return Err(RpcFault::invalid_params(
            "params.name is required (a string)",
        ));
    };
    let Some(prompt) = PROMPTS.iter().find(|p| p.name == name) else {
        let known: Vec<&str> = PROMPTS.iter().map(|p| p.name).collect();
        return Err(RpcFault::invalid_params(&format!(
            "unknown prompt {name:?}; prompts: {}",
            known.join(", ")
        )));
    };
    let empty = serde_json::Map::new();
    let given = match params.get("arguments") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(RpcFault::invalid_params(
                "params.arguments must be an object",
            ));
        }
    };
    for (k, v) in given {
        if !prompt.arguments.iter().any(|a| a.name == k) {
            return Err(RpcFault::invalid_params(&format!(
                "prompt {name} has no argument {k:?}"
            )));
        }
        match v.as_str() {
            Some(s) if s.len() <= MAX_ARGUMENT => {}
            Some(_) => {
                return Err(RpcFault::invalid_params(&format!(
                    "argument {k} is longer than {MAX_ARGUMENT} bytes"
                )));
            }
            None => {
                return Err(RpcFault::invalid_params(&format!(
                    "argument {k} must be a string"
                )));
            }
        }
    }
    let value = |k: &str| {
        given
            .get(k)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    if let Some(a) = prompt
        .arguments
        .iter()
        .find(|a| a.required && value(a.name).is_none())
    {
        return Err(RpcFault::invalid_params(&format!(
            "prompt {name} needs argument {}",
            a.name
        )));
    }
    Ok(json!({
        "description": prompt.description,
        "messages": [{"role": "user", "content": {"type": "text", "text": (prompt.text)(&value)}}],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_prompt_renders_from_its_required_arguments() {
        let listed = list(&json!({})).unwrap();
        for p in listed["prompts"].as_array().unwrap() {
            let mut args = serde_json::Map::new();
            for a in p["arguments"].as_array().unwrap() {
                if a["required"] == true {
                    args.insert(a["name"].as_str().unwrap().into(), json!("violin"));
                }
            }
            let got = get(&json!({"name": p["name"], "arguments": args})).unwrap();
            let text = got["messages"][0]["content"]["text"].as_str().unwrap();
            assert!(text.contains("violin"), "{text}");
            assert_eq!(got["messages"][0]["role"], "user");
        }
    }

    #[test]
    fn bad_requests_are_invalid_params() {
        for params in [
            json!({}),
            json!({"name": "nope"}),
            json!({"name": "find_listings"}),
            json!({"name": "find_listings", "arguments": {"what": "  "}}),
            json!({"name": "find_listings", "arguments": {"what": 5}}),
            json!({"name": "find_listings", "arguments": {"what": "x", "colour": "red"}}),
            json!({"name": "find_listings", "arguments": {"what": "x".repeat(1001)}}),
            json!({"name": "find_listings", "arguments": []}),
        ] {
            assert_eq!(get(&params).unwrap_err().code, -32602, "{params}");
        }
        let ok = get(
            &json!({"name": "find_listings", "arguments": {"what": "a cello", "budget": "20"}}),
        )
        .unwrap();
        let text = ok["messages"][0]["content"]["text"].as_str().unwrap();
        assert!(
            text.contains("a cello") && text.contains("above 20 webcash"),
            "{text}"
        );
    }
}
