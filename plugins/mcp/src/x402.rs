//! x402 over MCP, as the x402 SDKs' MCP clients speak it:
//! - a `tools/call` pays with an x402 PaymentPayload in
//!   `params._meta["x402/payment"]`: it goes to the host as the
//!   `PAYMENT-SIGNATURE` header of the request the tool dispatches, so it
//!   pays exactly as that header would over HTTP (the host reads it; no
//!   plugin keeps it);
//! - a result whose endpoint answered 402 carries the x402
//!   PaymentRequired (`x402Version`, `accepts`, `resource`, `error`) in its
//!   `structuredContent`, beside the endpoint's own 402 body, and the
//!   same JSON as its first text part;
//! - a paid result carries the settlement in `_meta["x402/payment-response"]`
//!   (its `extra.change` is the change of an overpayment).

use base64::Engine as _;
use marketplace_guest::prelude::*;
use serde_json::{Value, json};

/// Where a tools/call carries its payment.
pub const PAYMENT_META: &str = "x402/payment";
/// Where a paid result carries its settlement.
pub const RESPONSE_META: &str = "x402/payment-response";

/// The `PAYMENT-SIGNATURE` header value of the x402 payment in the
/// `_meta` of a tools/call's `params` (`None`: no payment there). `Err`:
/// the payment is neither a PaymentPayload object nor its base64 header
/// form.
pub fn payment_header(params: &Value) -> Result<Option<String>, &'static str> {
    match params.get("_meta").and_then(|m| m.get(PAYMENT_META)) {
        None | Some(Value::Null) => Ok(None),
        Some(payload @ Value::Object(_)) => Ok(Some(
            base64::engine::general_purpose::STANDARD.encode(payload.to_string().as_bytes()),
        )),
        Some(Value::String(header)) => Ok(Some(header.clone())),
        Some(_) => Err(
            "params._meta[\"x402/payment\"] must be an x402 PaymentPayload object (or its base64 PAYMENT-SIGNATURE form)",
        ),
    }
}

/// Add to `result` (a tools/call result of the endpoint answer `resp`)
/// what an x402 MCP client reads: the PaymentRequired of a 402, the
/// settlement of a paid answer.
pub fn annotate(result: &mut Value, resp: &Response) {
    if resp.status == 402
        && let Some(Value::Object(required)) = header_document(resp, "payment-required")
    {
        match &mut result["structuredContent"] {
            Value::Object(structured) => {
                for (name, value) in required {
                    structured.entry(name).or_insert(value);
                }
            }
            slot => *slot = Value::Object(required),
        }
        // Its serialized JSON as the first text part too (MCP: structured
        // content SHOULD also be given as text; clients of revisions
        // before structuredContent, and x402 clients, read it there).
        let text = result["structuredContent"].to_string();
        if result["content"][0]["type"] == "text" {
            result["content"][0]["text"] = Value::String(text);
        }
    }
    if let Some(settled @ Value::Object(_)) = header_document(resp, "payment-response") {
        match &mut result["_meta"] {
            Value::Object(meta) => {
                meta.insert(RESPONSE_META.into(), settled);
            }
            slot => *slot = json!({RESPONSE_META: settled}),
        }
    }
}

/// The JSON document of an x402 header of `resp`: base64 of JSON, or the
/// JSON itself (as the host hands a dispatched answer's settlement on
/// before it encodes it for the wire).
fn header_document(resp: &Response, name: &str) -> Option<Value> {
    let value = resp
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())?;
    if value.starts_with('{') {
        return serde_json::from_str(value).ok();
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(value)
        .ok()?;
    serde_json::from_slice(&raw).ok()
}
