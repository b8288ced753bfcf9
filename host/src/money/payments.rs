//! The payment gate: prices come from the fee plugin, secrets from the
//! request headers; the spend is written into the request's transaction and
//! so becomes final only if the whole request commits.

use crate::money::ledger::{Ledger, SecretError, add_total};
use crate::reply::Reply;
use crate::store::WriteTxn;
use marketplace_common::amount;
use serde_json::json;

pub use crate::money::ledger::{Charge, replay_key};
pub use crate::reply::{BITCOIN_HEADER, CASH_HEADERS};

/// Payment rails of this host: (rail, header, enabled). The bitcoin rail
/// has no verifier here, so it is always disabled.
pub const RAILS: &[(&str, &str, bool)] = &[
    ("webcash", "X-Cash-Secret", true),
    ("bitcoin", "X-Bitcoin-Secret", false),
];

/// Actions whose payment is held in escrow rather than earned: the request
/// must hold it in a contract's account (`escrow.hold`) to commit.
pub const ESCROW_ACTIONS: &[&str] = &["buy"];

/// Payment secrets presented with a request (never passed to plugins).
#[derive(Debug, Clone, Default)]
pub struct PaymentHeaders {
    /// `X-Cash-Secret` or its alias `X-Webcash-Secret`.
    pub cash: Option<String>,
    /// `X-Bitcoin-Secret`.
    pub bitcoin: Option<String>,
    /// What an x402 `PAYMENT-SIGNATURE` header said (its secret is in
    /// `cash`): a refusal, the payment identifier.
    pub x402: crate::money::x402::Signature,
}

/// Request headers that carry payment secrets: read by the host, never
/// passed to plugins and never logged.
pub const PAYMENT_HEADERS: &[&str] = &[
    "x-cash-secret",
    "x-webcash-secret",
    "x-bitcoin-secret",
    crate::money::x402::PAYMENT_SIGNATURE,
];

/// What a payment header with bytes outside visible ASCII reads as.
pub const NOT_ASCII: &str = "(not visible ASCII)";

/// Reads a request's payment headers (an HTTP request's, or those a
/// plugin put on a request it dispatches) into [`PaymentHeaders`].
#[derive(Default)]
pub struct PaymentReader {
    payment: PaymentHeaders,
    /// The secrets of `X-Webcash-Secret` and `PAYMENT-SIGNATURE`, joined
    /// to `X-Cash-Secret`'s by [`PaymentReader::finish`].
    webcash: Option<String>,
    x402: Option<String>,
}

impl PaymentReader {
    /// A reader that adds to `payment` (a dispatching request's own).
    pub fn from(payment: PaymentHeaders) -> PaymentReader {
        PaymentReader {
            payment,
            ..PaymentReader::default()
        }
    }

    /// Read the header `name` (lower case) when it is a payment header
    /// (`value` is `None` when it is not visible ASCII): whether it was.
    pub fn read(&mut self, name: &str, value: Option<&str>) -> bool {
        if !PAYMENT_HEADERS.contains(&name) {
            return false;
        }
        // A payment header with bytes outside visible ASCII is still a
        // payment attempt: it stands as a value no rail accepts, so it is
        // refused as malformed (402 `payment_invalid`), not taken as
        // missing (and its bytes go nowhere).
        let value = value.unwrap_or(NOT_ASCII);
        // An empty value carries no secret: the request is unpaid, as if
        // the header were absent (402 `payment_required`). The original
        // client's first try of a paid call sends `X-Webcash-Secret: `
        // to learn the price from the 402.
        if value.trim().is_empty() {
            return true;
        }
        match name {
            // Two lines of one header are one comma-separated value (RFC
            // 9110 5.3), which no rail accepts: never one of them silently.
            "x-cash-secret" => add_line(&mut self.payment.cash, value),
            "x-webcash-secret" => add_line(&mut self.webcash, value),
            "x-bitcoin-secret" => add_line(&mut self.payment.bitcoin, value),
            // x402: base64 JSON whose `payload.secret` pays as X-Cash-Secret.
            _ => {
                if let Some(secret) =
                    crate::money::x402::read_signature(&mut self.payment.x402, value)
                {
                    add_line(&mut self.x402, &secret);
                }
            }
        }
        true
    }

    /// The payment read. One secret pays: the alias and x402's only stand
    /// in for a missing X-Cash-Secret. Two different secrets in different
    /// headers are, like two lines of one, a malformed payment: never one
    /// of them silently while the client thinks the other paid too.
    pub fn finish(mut self) -> PaymentHeaders {
        for other in [self.webcash, self.x402].into_iter().flatten() {
            add_line(&mut self.payment.cash, &other);
        }
        self.payment
    }
}

/// A payment header's line added to those of the same header before it
/// as HTTP combines them: comma-separated, each item trimmed. A secret
/// already there is not added again (the same secret twice is one
/// payment, whether on two lines or as `S, S` on one: RFC 9110 5.3 makes
/// the two the same).
fn add_line(slot: &mut Option<String>, line: &str) {
    let mut items = line
        .split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .peekable();
    // (An empty line is kept as it is: a malformed secret, said so.)
    if items.peek().is_none() {
        add_item(slot, line.trim());
        return;
    }
    for item in items {
        if !add_item(slot, item) {
            break;
        }
    }
}

/// Add one item to `slot` unless it is there: false once the slot names
/// two different ones. That payment is several secrets, refused whatever
/// follows ([`presented`]), so the rest is not read: comparing each of a
/// header's thousands of items with all before it cost half a second of
/// a worker for one 64 KB `X-Cash-Secret: 0,1,2,...` (an outside
/// review's finding), on any family's route.
fn add_item(slot: &mut Option<String>, item: &str) -> bool {
    match slot {
        // (No item holds a comma: a ", " is two of them.)
        Some(value) if value.contains(", ") => return false,
        Some(value) if value == item => {}
        Some(value) => {
            value.push_str(", ");
            value.push_str(item);
        }
        None => *slot = Some(item.to_string()),
    }
    true
}

/// A 402 with the protocol's body.
pub fn refusal(code: &str, message: impl Into<String>, action: &str, price: u64) -> Reply {
    debug_assert!(
        crate::metrics::PAYMENT_REFUSALS.contains(&code),
        "{code} is not in PAYMENT_REFUSALS (its series is shown at 0 from the start)"
    );
    crate::metrics::metrics()
        .payments_refused
        .get_or_create(&crate::metrics::CodeLabels { code: code.into() })
        .inc();
    let price = amount::format(price);
    Reply::json(
        402,
        &json!({
            "code": code,
            "message": message.into(),
            "required_amount": price,
            "payment": {
                "action": action,
                "price": price,
                "currency": "webcash",
                "header": CASH_HEADERS[0],
                "supported_headers": [CASH_HEADERS[0], CASH_HEADERS[1], BITCOIN_HEADER, "PAYMENT-SIGNATURE"],
                "format": "e<amount>:secret:<hex>",
                "allowed_rails": ["webcash"],
                "fee_schedule_url": "/api/fees",
            },
        }),
    )
}

/// The cash secret a request presents to pay `price` for `action`, or its
/// 402 (a refused x402 header, no secret, only the disabled bitcoin rail).
pub fn presented<'a>(
    headers: &'a PaymentHeaders,
    action: &str,
    price: u64,
) -> Result<&'a str, Reply> {
    let shown = amount::format(price);
    if let Some(why) = &headers.x402.invalid {
        return Err(refusal(
            "payment_invalid",
            // (Over MCP the payment comes in the call's `_meta`, which the
            // mcp family forwards as this header.)
            format!(
                "the x402 payment (the PAYMENT-SIGNATURE header, or _meta[\"x402/payment\"] of an MCP call) {why}"
            ),
            action,
            price,
        ));
    }
    let Some(secret) = &headers.cash else {
        if headers.bitcoin.is_some() {
            return Err(refusal(
                "payment_rail_unavailable",
                format!(
                    "the bitcoin rail is not enabled on this server; pay {shown} with the X-Cash-Secret header (webcash)"
                ),
                action,
                price,
            ));
        }
        return Err(refusal(
            "payment_required",
            format!(
                "{action} costs {shown} webcash: retry with the X-Cash-Secret header (or x402's PAYMENT-SIGNATURE)"
            ),
            action,
            price,
        ));
    };
    // An x402 payment agreed to its 402's amount: a price risen since
    // (another fee component, another body) is not charged to it.
    if let Some(accepted) = headers.x402.accepted.filter(|a| *a < price)
        && headers.x402.seen.as_ref().is_some_and(|(s, _)| s == secret)
    {
        return Err(refusal(
            "payment_insufficient",
            format!(
                "{action} costs {shown}, more than the {} the x402 payment's `accepted.amount` agreed to: pay again with the 402's entry; nothing was spent",
                amount::format(accepted)
            ),
            action,
            price,
        ));
    }
    // (No secret holds a comma: this is several, from two lines of one
    // header or from different payment headers.)
    if secret.contains(',') {
        return Err(refusal(
            "payment_invalid",
            "several different payment secrets were sent (two lines of a payment header, or one listing two; X-Cash-Secret, X-Webcash-Secret and PAYMENT-SIGNATURE naming different secrets; or over MCP, a payment header and a different _meta[\"x402/payment\"]): send one; none was spent",
            action,
            price,
        ));
    }
    Ok(secret)
}

/// Charge `price` for `action` from the request's payment headers.
pub fn charge(
    ledger: &Ledger,
    txn: &WriteTxn,
    headers: &PaymentHeaders,
    action: &str,
    price: u64,
) -> Result<Charge, Reply> {
    if price == 0 {
        return Ok(Charge {
            action: action.into(),
            price: 0,
            paid: 0,
            public: String::new(),
            change: None,
            change_derivation: None,
        });
    }
    let secret = presented(headers, action, price)?;
    let (public, paid) = ledger
        .check(txn, secret)
        .map_err(|e| secret_refused(e, action, price))?;
    if paid < price {
        return Err(insufficient(paid, action, price));
    }
    let internal = |e: anyhow::Error| {
        crate::store::log_failure("ledger write failed", &format_args!("{e:#}"));
        Reply::error(500, "internal", "internal error")
    };
    ledger.spend(txn, &public).map_err(internal)?;
    let bucket = if ESCROW_ACTIONS.contains(&action) {
        "escrow"
    } else {
        "fees"
    };
    add_total(txn, bucket, price as i128).map_err(internal)?;
    let (change, change_derivation) = if paid > price {
        let units = paid - price;
        let (secret, _) = ledger
            .issue(txn, &format!("change:{public}"), units)
            .map_err(internal)?;
        let hex = marketplace_common::secret::parse(&secret)
            .map_err(|e| internal(anyhow::anyhow!(e)))?
            .hex;
        let derivation = crate::money::ledger::Derivation {
            purpose: format!("change:{public}:{units}"),
            amount: Some(units),
            public: crate::money::ledger::public_hash(&hex),
        };
        (Some(secret), Some(derivation))
    } else {
        (None, None)
    };
    Ok(Charge {
        action: action.into(),
        price,
        paid,
        public,
        change,
        change_derivation,
    })
}

/// The 402 (or 500) of a secret the ledger refuses.
pub fn secret_refused(e: SecretError, action: &str, price: u64) -> Reply {
    match e {
        SecretError::Storage(e) => {
            crate::store::log_failure(&format!("payment check ({action})"), &e);
            Reply::error(500, "internal", "internal error")
        }
        SecretError::Malformed(m) => refusal(
            "payment_invalid",
            format!("payment secret {m}"),
            action,
            price,
        ),
        SecretError::Unknown => refusal(
            "payment_invalid",
            "payment secret is not known to this ledger",
            action,
            price,
        ),
        SecretError::AmountMismatch => refusal(
            "payment_invalid",
            "payment secret's amount does not match the ledger",
            action,
            price,
        ),
        SecretError::Spent => refusal(
            "payment_spent",
            "payment secret was already spent",
            action,
            price,
        ),
    }
}

/// The 402 of a secret worth less than the price.
pub fn insufficient(paid: u64, action: &str, price: u64) -> Reply {
    refusal(
        "payment_insufficient",
        format!(
            "payment of {} is less than the price {}",
            amount::format(paid),
            amount::format(price)
        ),
        action,
        price,
    )
}

/// Where a paid request's answer is kept for identical retries: the
/// public hash of the secret it presented, and its [`replay_key`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryKey {
    pub public: String,
    pub key: [u8; 32],
}

impl RetryKey {
    /// The key of a request presenting `secret` (None when it does not
    /// parse: such a request is refused before anything is kept).
    pub fn new(secret: &str, method: &str, path: &str, body: &[u8]) -> Option<RetryKey> {
        let s = marketplace_common::secret::parse(secret).ok()?;
        let public = crate::money::ledger::public_hash(&s.hex);
        let key = replay_key(&public, method, path, body);
        Some(RetryKey { public, key })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::money::x402::base64_encode;

    #[test]
    fn a_payment_line_is_its_comma_separated_items_each_once() {
        let lines = |given: &[&str]| {
            let mut slot = None;
            for line in given {
                add_line(&mut slot, line);
            }
            slot
        };
        assert_eq!(lines(&["S"]).as_deref(), Some("S"));
        assert_eq!(lines(&["S, S"]).as_deref(), Some("S"));
        assert_eq!(lines(&["S", " S "]).as_deref(), Some("S"));
        assert_eq!(lines(&["S,T", "S"]).as_deref(), Some("S, T"));
        assert_eq!(lines(&["S,"]).as_deref(), Some("S"));
        // An empty line stays a (malformed) secret of its own.
        assert_eq!(lines(&[" "]).as_deref(), Some(""));
        // Past two different items the payment is several: the rest is
        // not read (a header of thousands of items was read quadratically).
        let many: Vec<String> = (0..12_500).map(|i| i.to_string()).collect();
        assert_eq!(lines(&[&many.join(",")]).as_deref(), Some("0, 1"));
        assert_eq!(lines(&["S", "S, T", "U"]).as_deref(), Some("S, T"));
        // The same one many times is still one.
        assert_eq!(lines(&[&["S"; 5_000].join(",")]).as_deref(), Some("S"));
    }

    fn signature(secret: &str, id: Option<&str>) -> String {
        let mut doc = json!({"x402Version": 2,
            "accepted": {"scheme": "exact", "network": "webcash:mainnet", "asset": "webcash", "amount": "1"},
            "payload": {"secret": secret}});
        if let Some(id) = id {
            doc["extensions"] = json!({"payment-identifier": {"info": {"id": id}}});
        }
        base64_encode(doc.to_string().as_bytes())
    }

    fn read(headers: &[(&str, Option<&str>)]) -> PaymentHeaders {
        let mut r = PaymentReader::default();
        for (name, value) in headers {
            assert!(r.read(name, *value), "{name} is a payment header");
        }
        r.finish()
    }

    const A: &str = "e1:secret:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "e1:secret:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    #[test]
    fn one_secret_however_many_headers_name_it() {
        let p = read(&[
            ("x-cash-secret", Some(A)),
            ("x-webcash-secret", Some(A)),
            ("payment-signature", Some(&signature(A, None))),
            ("payment-signature", Some(&signature(A, None))),
        ]);
        assert_eq!(p.cash.as_deref(), Some(A));
        assert!(p.x402.invalid.is_none());
        // Only the payment headers are read.
        assert!(!PaymentReader::default().read("authorization", Some("x")));
    }

    #[test]
    fn an_empty_payment_header_is_no_payment() {
        let p = read(&[
            ("x-webcash-secret", Some("")),
            ("x-cash-secret", Some("  ")),
        ]);
        assert!(p.cash.is_none());
        let p = read(&[
            ("payment-signature", Some("")),
            ("x-bitcoin-secret", Some("")),
        ]);
        assert!(p.cash.is_none() && p.bitcoin.is_none() && p.x402.invalid.is_none());
        // Beside a secret, an empty line adds nothing to it.
        let p = read(&[("x-cash-secret", Some(A)), ("x-webcash-secret", Some(""))]);
        assert_eq!(p.cash.as_deref(), Some(A));
    }

    #[test]
    fn different_secrets_are_several_and_refused() {
        let p = read(&[("x-cash-secret", Some(A)), ("x-webcash-secret", Some(B))]);
        assert!(p.cash.as_deref().is_some_and(|c| c.contains(',')));
        assert!(presented(&p, "post", 1).is_err());
        let p = read(&[("x-cash-secret", Some(A)), ("x-cash-secret", Some(B))]);
        assert!(presented(&p, "post", 1).is_err());
        // Two x402 payments that differ (secret, or payment identifier).
        let p = read(&[
            ("payment-signature", Some(&signature(A, None))),
            ("payment-signature", Some(&signature(B, None))),
        ]);
        assert!(p.x402.invalid.is_some());
        let p = read(&[
            (
                "payment-signature",
                Some(&signature(A, Some("id_0123456789abcdef"))),
            ),
            ("payment-signature", Some(&signature(A, None))),
        ]);
        assert!(p.x402.invalid.is_some());
    }

    #[test]
    fn a_value_that_is_not_ascii_is_a_malformed_payment() {
        let p = read(&[("x-cash-secret", None)]);
        assert_eq!(p.cash.as_deref(), Some(NOT_ASCII));
        let p = read(&[("payment-signature", None)]);
        assert!(p.x402.invalid.is_some());
    }

    #[test]
    fn a_dispatched_payment_adds_to_the_callers() {
        let caller = read(&[("x-cash-secret", Some(A))]);
        let mut r = PaymentReader::from(caller.clone());
        r.read("payment-signature", Some(&signature(A, None)));
        assert_eq!(r.finish().cash.as_deref(), Some(A));
        let mut r = PaymentReader::from(caller);
        r.read("payment-signature", Some(&signature(B, None)));
        assert!(r.finish().cash.as_deref().is_some_and(|c| c.contains(',')));
    }
}
