//! Upstream webcash mode (`cash_upstream`): payment secrets are validated
//! and spent at an upstream webcash server instead of the embedded ledger,
//! with the embedded mode's guarantees.
//!
//! # Flow of a paid request
//!
//! The payer's secret `S` is worth `A` (written in it); the route's price
//! is `P`. Every secret the server makes is derived (HMAC under
//! `server.key`, [`Ledger::derive`]) from public hashes, so the journal
//! holds derivations, never a live secret:
//!
//! - the hold `X` = derive(`upstream:hold:{public(S)}:{A}`), worth `A`;
//! - when `A > P`: the fee `F` = derive(`upstream:fee:{public(X)}:{P}`) and
//!   the change `C` = derive(`upstream:change:{public(X)}:{A-P}`); when
//!   `A = P` the fee is `X` itself (no second call);
//! - a recovery refund `R` = derive(`upstream:refund:{public(X)}:{A}`).
//!
//! 1. **charge** (the plugin's `payments.charge`, before the request's
//!    transaction opens): the intent `{state: swapping, A, P, X, F, C}` is
//!    committed durably on its own under `public(S)` in
//!    `cash:upstream-journal`, then `POST {upstream}/api/v1/replace
//!    {webcashes: [S], new_webcashes: [X], legalese: {terms: true}}`. The
//!    request goes on holding `X`; `C` is already in the receipt.
//! 2. **plugin answers 2xx**: `replace {[X] -> [F, C]}`, then the request's
//!    own transaction removes the journal entry and records the fee
//!    (`cash:upstream-fees`, by public hash with its derivation) beside the
//!    mutation, and commits. The answer carries `C` (`X-Cash-Change`,
//!    `payment.change`).
//! 3. **anything else** (4xx/5xx, trap, deadline, a failed split): nothing
//!    of the request is kept; the error body gets `payment.refund` = `X`
//!    (worth `A` at the upstream) and the entry becomes `refund`.
//!
//! A request holds its input's entry exclusively ([`Upstream::lock`]), so
//! the recovery sweep and the refund claim never act on a live request.
//!
//! # Journal states and crash points
//!
//! | point | durable journal | at the upstream | resolved by |
//! |---|---|---|---|
//! | before the intent commits | nothing | `S` unspent | nothing happened: the payer holds `S` |
//! | intent written, replace not (yet) done | `swapping` | `S` unspent, `X` unknown | an identical retry swaps again; the sweep removes the entry after [`GRACE_MS`] (a timed-out call may still land) |
//! | `S -> X` done, no answer yet | `swapping` | `X` unspent | an identical retry re-runs holding `X`; the sweep turns it into `refund(X)` |
//! | the request failed | `refund(X)` (after the answer; a crash first = the row above) | `X` unspent | `X` was in `payment.refund`; `POST /api/cash/refund` returns it again |
//! | `X -> F + C` done, commit not | `swapping` | `X` spent, `F`, `C` unspent | the sweep (or a claim) swaps `F + C -> R`: `refund(R)` |
//! | committed | removed, fee recorded (the mutation's transaction) | `F` the server's, `C` the payer's | nothing to resolve |
//! | the payer spent its refund | `refund` | refund spent | the sweep removes the entry |
//!
//! What an entry comes to is read from the upstream ([`verdict`]), not
//! from its state alone, so a crash at any point between two writes is
//! resolved the same way: the state only says whether the refund was shown.
//!
//! # Failures
//!
//! - Nothing reached the upstream (connection refused, unknown host):
//!   `503 upstream_unavailable` (with `Retry-After`), entry removed.
//! - No answer within `cash_upstream_timeout_ms`: `503
//!   upstream_unavailable`; the entry stays (the swap may still be carried
//!   out), so an identical retry or the sweep finds the value.
//! - A 5xx or an answer that is not webcash's: `502 upstream_error`, after
//!   asking the upstream whether the swap happened anyway.
//! - A 4xx: the payer's secret is refused, `402 payment_spent` or
//!   `payment_invalid` as the embedded ledger would answer (told apart with
//!   a health check of `S`).

use crate::money::ledger::{Derivation, Ledger, public_hash};
use crate::money::payments::{Charge, PaymentHeaders, insufficient, presented, refusal};
use crate::reply::Reply;
use crate::store::{Kv, Storage, StorageError, WriteTxn};
use marketplace_common::{amount, secret};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// What upstream mode works on: the store, the ledger, the host clock and
/// the configured upstream. The service's state is one (money sits below
/// it and does not name it).
pub trait Books: Send + Sync + 'static {
    fn storage(&self) -> &Storage;
    fn ledger(&self) -> &Ledger;
    /// The upstream, when `cash_upstream` is set.
    fn upstream(&self) -> Option<&Arc<Upstream>>;
    /// Host clock in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// Input public hash -> [`Entry`] (JSON).
pub const JOURNAL: &str = "cash:upstream-journal";
/// Fee public hash -> [`FeeRecord`] (JSON): what the server earned, held
/// at the upstream as secrets it can derive again.
pub const FEES: &str = "cash:upstream-fees";

/// An entry whose swap never happened is removed only this long after its
/// intent: a call that timed out may still be carried out by the upstream.
pub const GRACE_MS: u64 = 10 * 60 * 1000;
/// How often abandoned entries are resolved (and once at start).
pub const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// The state recorded with an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryState {
    /// The intent: the hold (and split) below is being (or was) made.
    Swapping,
    /// The payer is owed the hold: it was shown as `payment.refund`, or
    /// the sweep made it the refund.
    Refund,
}

/// One unsettled upstream payment, keyed by the input's public hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub state: EntryState,
    /// Units of the input (and of the hold).
    pub amount: u64,
    /// The price this attempt charges.
    pub price: u64,
    /// Hex of the request's replay key (identical retry), or empty.
    pub replay: String,
    /// When the intent was recorded (host clock, ms).
    pub at_ms: u64,
    /// The server-held secret holding the payer's value.
    pub hold: Derivation,
    /// Fee and change of the split, when `amount > price`.
    pub fee: Option<Derivation>,
    pub change: Option<Derivation>,
    /// With a split: the refund `R` its fee and change become if the
    /// request never commits.
    pub recovery: Option<Derivation>,
}

/// A fee the server earned: a secret at the upstream it can derive again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeeRecord {
    pub derivation: Derivation,
    /// Public hash of the input that paid it.
    pub input: String,
    pub at_ms: u64,
}

/// State of one public hash at the upstream (None when unknown there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Out {
    pub spent: bool,
    pub amount: Option<u64>,
}

/// Why a call to the upstream did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// Nothing reached the upstream (connection refused, unknown host).
    NotSent(String),
    /// No answer in time: the call may or may not be carried out.
    Timeout,
    /// The upstream refused the call (4xx): it did nothing.
    Refused(u16, String),
    /// A 5xx or an answer that is not webcash's: outcome unknown.
    Bad(String),
}

impl CallError {
    /// The kind, for logs (an upstream's own message is shown to the
    /// client it concerns, never logged).
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::NotSent(_) => "not_sent",
            CallError::Timeout => "timeout",
            CallError::Refused(..) => "refused",
            CallError::Bad(_) => "bad_answer",
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::NotSent(m) => write!(f, "cannot be reached ({m})"),
            CallError::Timeout => write!(f, "did not answer in time"),
            CallError::Refused(s, m) => write!(f, "refused the call ({s}: {m})"),
            CallError::Bad(m) => write!(f, "answered badly ({m})"),
        }
    }
}

/// A webcash server's two calls.
pub trait Mint: Send + Sync {
    /// `replace`: spend every input, create every output, atomically.
    fn replace(&self, inputs: &[String], outputs: &[String]) -> Result<(), CallError>;
    /// `health_check` of public strings `e{amount}:public:{hash}`, in order.
    fn health_check(&self, publics: &[String]) -> Result<Vec<Option<Out>>, CallError>;
}

/// A webcash server over HTTP (`ureq`, http only in this build).
pub struct HttpMint {
    base: String,
    agent: ureq::Agent,
}

impl HttpMint {
    pub fn new(base: &str, timeout: Duration) -> HttpMint {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            // A fresh connection per call: a pooled one that died would
            // leave it unclear whether the call was sent.
            .max_idle_connections(0)
            .max_idle_connections_per_host(0)
            .user_agent(format!(
                "{}/{}",
                crate::config::SERVICE_NAME,
                crate::config::SERVICE_VERSION
            ))
            .build()
            .into();
        HttpMint {
            base: base.trim_end_matches('/').to_string(),
            agent,
        }
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value, CallError> {
        let request = ureq::http::Request::builder()
            .method("POST")
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_string().into_bytes())
            .map_err(|e| CallError::NotSent(e.to_string()))?;
        let mut resp = self.agent.run(request).map_err(call_error)?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(4 << 20)
            .read_to_string()
            .map_err(|e| match call_error(e) {
                // The request was answered: it was sent.
                CallError::NotSent(m) => CallError::Bad(m),
                other => other,
            })?;
        match status {
            200..=299 => serde_json::from_str(&text).map_err(|_| {
                CallError::Bad(format!(
                    "{path} answered {status} with a body that is not JSON"
                ))
            }),
            400..=499 => Err(CallError::Refused(status, upstream_message(&text))),
            _ => Err(CallError::Bad(format!("{path} answered {status}"))),
        }
    }
}

/// The message of an upstream's error body, short.
fn upstream_message(text: &str) -> String {
    let v: Option<Value> = serde_json::from_str(text).ok();
    let m = v
        .as_ref()
        .and_then(|v| {
            v.get("message")
                .or_else(|| v.get("error"))
                .and_then(Value::as_str)
        })
        .map(str::to_string)
        .unwrap_or_else(|| text.to_string());
    m.chars().take(200).collect()
}

fn call_error(e: ureq::Error) -> CallError {
    use ureq::Timeout as T;
    match e {
        ureq::Error::Timeout(T::Connect | T::Resolve) => CallError::NotSent(e.to_string()),
        ureq::Error::Timeout(_) => CallError::Timeout,
        ureq::Error::HostNotFound | ureq::Error::ConnectionFailed | ureq::Error::BadUri(_) => {
            CallError::NotSent(e.to_string())
        }
        ureq::Error::Io(ref io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::AddrNotAvailable
                    | std::io::ErrorKind::NetworkUnreachable
                    | std::io::ErrorKind::HostUnreachable
            ) =>
        {
            CallError::NotSent(e.to_string())
        }
        ureq::Error::Io(ref io) if io.kind() == std::io::ErrorKind::TimedOut => CallError::Timeout,
        other => CallError::Bad(other.to_string()),
    }
}

impl Mint for HttpMint {
    fn replace(&self, inputs: &[String], outputs: &[String]) -> Result<(), CallError> {
        let v = self.post(
            "/api/v1/replace",
            &json!({"webcashes": inputs, "new_webcashes": outputs, "legalese": {"terms": true}}),
        )?;
        if v.get("status").and_then(Value::as_str) == Some("success") {
            Ok(())
        } else {
            Err(CallError::Bad(
                "replace answered without status success".into(),
            ))
        }
    }

    fn health_check(&self, publics: &[String]) -> Result<Vec<Option<Out>>, CallError> {
        let v = self.post("/api/v1/health_check", &json!(publics))?;
        let results = v
            .get("results")
            .and_then(Value::as_object)
            .ok_or_else(|| CallError::Bad("health_check answered without results".into()))?;
        publics
            .iter()
            .map(|p| {
                let r = results.get(p).ok_or_else(|| {
                    CallError::Bad("health_check left out an entry it was asked".into())
                })?;
                Ok(match r.get("spent") {
                    Some(Value::Bool(spent)) => Some(Out {
                        spent: *spent,
                        amount: r
                            .get("amount")
                            .and_then(Value::as_str)
                            .and_then(|a| amount::parse(a).ok()),
                    }),
                    Some(Value::Null) | None => None,
                    Some(_) => {
                        return Err(CallError::Bad("health_check spent is not a bool".into()));
                    }
                })
            })
            .collect()
    }
}

/// The upstream mode of a host: where, how long to wait, and which inputs
/// a request (or a claim, or the sweep) is working on.
pub struct Upstream {
    pub url: String,
    pub timeout: Duration,
    mint: Box<dyn Mint>,
    live: Mutex<HashSet<String>>,
}

/// An input's entry held by one request, claim or sweep; released on drop.
pub struct Live {
    up: Arc<Upstream>,
    input: String,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.up
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.input);
    }
}

impl Upstream {
    /// The configured upstream, if any (`cash_upstream`).
    pub fn from_config(config: &crate::config::Config) -> Option<Arc<Upstream>> {
        let url = config.cash_upstream.as_deref()?;
        let timeout = Duration::from_millis(config.cash_upstream_timeout_ms);
        Some(Upstream::with_mint(
            url,
            timeout,
            Box::new(HttpMint::new(url, timeout)),
        ))
    }

    pub fn with_mint(url: &str, timeout: Duration, mint: Box<dyn Mint>) -> Arc<Upstream> {
        Arc::new(Upstream {
            url: url.trim_end_matches('/').to_string(),
            timeout,
            mint,
            live: Mutex::new(HashSet::new()),
        })
    }

    /// Hold the entry of `input` exclusively; None when someone else does.
    pub fn lock(self: &Arc<Self>, input: &str) -> Option<Live> {
        let fresh = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(input.to_string());
        fresh.then(|| Live {
            up: self.clone(),
            input: input.to_string(),
        })
    }

    /// States at the upstream of an entry's secrets.
    fn facts(&self, input: &str, e: &Entry) -> Result<Facts, CallError> {
        let mut publics = vec![secret::public_string(e.amount, input), public_of(&e.hold)];
        let split = split_of(e).map(|(f, c, r)| {
            publics.extend([public_of(f), public_of(c), public_of(r)]);
        });
        let states = self.mint.health_check(&publics)?;
        let at = |i: usize| split.and(states.get(i).copied().flatten());
        Ok(Facts {
            input: states.first().copied().flatten(),
            hold: states.get(1).copied().flatten(),
            fee: at(2),
            change: at(3),
            recovery: at(4),
        })
    }

    fn unavailable(&self, why: &str) -> Reply {
        let mut r = Reply::error(
            503,
            "upstream_unavailable",
            format!("the upstream webcash server {} {why}", self.url),
        );
        r.headers.push((
            "retry-after".into(),
            self.timeout.as_secs().max(1).to_string(),
        ));
        r
    }

    fn error(&self, why: &str) -> Reply {
        Reply::error(
            502,
            "upstream_error",
            format!("the upstream webcash server {} {why}", self.url),
        )
    }

    /// The answer to a failed call when its outcome is unknown or nothing
    /// was done.
    fn call_reply(&self, e: &CallError, after: &str) -> Reply {
        match e {
            CallError::NotSent(_) | CallError::Timeout => {
                self.unavailable(&format!("{e}; {after}"))
            }
            _ => self.error(&format!("{e}; {after}")),
        }
    }
}

/// The `public_string` of a derived cash secret.
fn public_of(d: &Derivation) -> String {
    secret::public_string(d.amount.unwrap_or_default(), &d.public)
}

/// Fee, change and recovery refund of an entry that splits its hold.
fn split_of(e: &Entry) -> Option<(&Derivation, &Derivation, &Derivation)> {
    match (&e.fee, &e.change, &e.recovery) {
        (Some(f), Some(c), Some(r)) => Some((f, c, r)),
        _ => None,
    }
}

/// The entry of a payer owed `hold` (no split).
fn refund_entry(e: &Entry, hold: Derivation) -> Entry {
    Entry {
        state: EntryState::Refund,
        hold,
        fee: None,
        change: None,
        recovery: None,
        ..e.clone()
    }
}

/// States at the upstream of an entry's secrets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Facts {
    pub input: Option<Out>,
    pub hold: Option<Out>,
    pub fee: Option<Out>,
    pub change: Option<Out>,
    pub recovery: Option<Out>,
}

/// Where an entry's value is, from the upstream's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The hold is unspent: it is what the payer is owed.
    Owed,
    /// The hold was split into fee and change and the request never
    /// committed: the value is in fee + change (or already in the recovery
    /// refund).
    Split,
    /// Nothing is owed: the hold was spent by whoever was shown it (the
    /// payer, given its refund).
    Closed,
    /// The hold does not exist and the input is unspent: the swap never
    /// happened, the payer still holds its secret.
    NotSwapped,
    /// The hold does not exist and the input is spent or unknown there.
    Gone,
}

/// Where an entry's value is.
pub fn verdict(e: &Entry, f: &Facts) -> Verdict {
    match f.hold {
        Some(h) if !h.spent => Verdict::Owed,
        Some(_) if split_of(e).is_some() && (f.change.is_some() || f.recovery.is_some()) => {
            Verdict::Split
        }
        Some(_) => Verdict::Closed,
        None => match f.input {
            Some(i) if !i.spent => Verdict::NotSwapped,
            _ => Verdict::Gone,
        },
    }
}

/// A cash secret derived from `purpose`, and its derivation.
fn derived(ledger: &Ledger, purpose: String, units: u64) -> (String, Derivation) {
    let hex = ledger.derive(purpose.as_bytes());
    let d = Derivation {
        purpose,
        amount: Some(units),
        public: public_hash(&hex),
    };
    (secret::secret_string(units, &hex), d)
}

/// Whether the server-held secret `public` is recorded as an earned fee
/// (a settled payment's hold, kept whole when the price was the amount).
fn fee_taken(state: &dyn Books, public: &str) -> bool {
    state
        .storage()
        .begin_read()
        .ok()
        .and_then(|txn| txn.get_in(FEES, public.as_bytes()).ok().flatten())
        .is_some()
}

/// The hold of an input worth `amount`.
fn hold_for(ledger: &Ledger, input: &str, amount: u64) -> Derivation {
    derived(ledger, format!("upstream:hold:{input}:{amount}"), amount).1
}

/// The entry of an attempt charging `price` from the value held in `hold`.
fn plan(
    ledger: &Ledger,
    hold: Derivation,
    amount: u64,
    price: u64,
    replay: String,
    now_ms: u64,
) -> Entry {
    let h = hold.public.clone();
    let split = |purpose: String, units: u64| Some(derived(ledger, purpose, units).1);
    let splits = amount > price;
    Entry {
        state: EntryState::Swapping,
        amount,
        price,
        replay,
        at_ms: now_ms,
        fee: splits
            .then(|| split(format!("upstream:fee:{h}:{price}"), price))
            .flatten(),
        change: splits
            .then(|| {
                split(
                    format!("upstream:change:{h}:{}", amount - price),
                    amount - price,
                )
            })
            .flatten(),
        recovery: splits
            .then(|| split(format!("upstream:refund:{h}:{amount}"), amount))
            .flatten(),
        hold,
    }
}

fn derive(ledger: &Ledger, d: &Derivation) -> Result<String, Reply> {
    d.derive(ledger).ok_or_else(|| {
        tracing::error!(
            "an upstream journal secret cannot be derived again: the server key changed"
        );
        Reply::error(
            409,
            "conflict",
            "this payment's secrets can no longer be derived by this server (its key changed)",
        )
    })
}

fn internal(e: impl std::fmt::Display) -> Reply {
    tracing::error!("upstream journal: {e}");
    Reply::error(500, "internal", "internal error")
}

/// The journal entry of `input`, as committed.
pub fn read(storage: &Storage, input: &str) -> Result<Option<Entry>, Reply> {
    let txn = storage.begin_read().map_err(internal)?;
    read_in(&txn, input)
}

fn read_in(kv: &impl Kv, input: &str) -> Result<Option<Entry>, Reply> {
    match kv.get_in(JOURNAL, input.as_bytes()).map_err(internal)? {
        Some(v) => serde_json::from_slice(&v).map(Some).map_err(internal),
        None => Ok(None),
    }
}

/// Write (or with None remove) the entry of `input` in a durable commit of
/// its own.
fn write(storage: &Storage, input: &str, entry: Option<&Entry>) -> Result<(), Reply> {
    let txn = storage.begin_write().map_err(internal)?;
    put(&txn, input, entry).map_err(internal)?;
    storage.commit(txn).map_err(internal)
}

fn put(txn: &WriteTxn, input: &str, entry: Option<&Entry>) -> Result<(), StorageError> {
    match entry {
        Some(e) => txn.put_in(
            JOURNAL,
            input.as_bytes(),
            &serde_json::to_vec(e).map_err(|e| StorageError::Internal(e.to_string()))?,
        ),
        None => txn.delete_in(JOURNAL, input.as_bytes()).map(|_| ()),
    }
}

/// A request's payment held at the upstream.
pub struct Held {
    /// The request holds the input's entry until it ends.
    _live: Live,
    /// Public hash of the payer's input.
    pub input: String,
    pub entry: Entry,
    /// Whether the hold is known to be unspent, so it may be shown as a
    /// refund if the request fails.
    pub refundable: bool,
    /// The action paid for (for a 402 at the split).
    pub action: String,
}

/// Take a payment of `price` for `action` from the request's payment
/// headers: swap the payer's secret for the hold at the upstream (see the
/// module doc). The request's own transaction must not be open yet (the
/// intent is committed on its own before the call).
pub fn charge(
    up: &Arc<Upstream>,
    state: &dyn Books,
    headers: &PaymentHeaders,
    action: &str,
    price: u64,
    replay: Option<&[u8; 32]>,
) -> Result<(Charge, Held), Reply> {
    let presented_secret = presented(headers, action, price)?;
    let invalid = |m: String| refusal("payment_invalid", m, action, price);
    let parsed =
        secret::parse(presented_secret).map_err(|m| invalid(format!("payment secret {m}")))?;
    if parsed.kind != secret::Kind::Secret {
        return Err(invalid(
            "payment secret is malformed: a public hash cannot pay; send the secret".into(),
        ));
    }
    let (input, paid) = (public_hash(&parsed.hex), parsed.amount);
    if paid < price {
        return Err(insufficient(paid, action, price));
    }
    let live = up.lock(&input).ok_or_else(|| {
        Reply::error(
            409,
            "conflict",
            "a request paying with this secret is in progress; retry once it has answered",
        )
    })?;
    let ledger = state.ledger();
    let replay = replay
        .map(|k| marketplace_common::hex::encode(k))
        .unwrap_or_default();
    let spent_elsewhere = |m: &str| refusal("payment_spent", m.to_string(), action, price);
    // An entry of an earlier attempt: where is its value now?
    let (hold, swap) = match read(state.storage(), &input)? {
        None => (hold_for(ledger, &input, paid), true),
        Some(e) => {
            let facts = up.facts(&input, &e).map_err(|err| {
                up.call_reply(
                    &err,
                    "while checking an earlier attempt with this secret; nothing was spent",
                )
            })?;
            match verdict(&e, &facts) {
                Verdict::NotSwapped => (hold_for(ledger, &input, paid), true),
                // Once its hold was shown as a refund, only when the retry
                // splits the hold at the upstream (so a refund the payer
                // kept cannot also pay): an exact payment's hold would stay
                // whole as the fee while the payer still holds it.
                Verdict::Owed
                    if (e.state != EntryState::Refund || e.amount > e.price)
                        && !e.replay.is_empty()
                        && e.replay == replay
                        && e.amount == paid =>
                {
                    // An identical retry: it runs again holding the value
                    // the earlier attempt swapped.
                    (e.hold.clone(), false)
                }
                Verdict::Owed | Verdict::Split => {
                    return Err(spent_elsewhere(
                        "payment secret was already spent: it paid an earlier request that did not succeed, and its value is held for its payer (POST /api/cash/refund {\"secret\": ...} returns it)",
                    ));
                }
                Verdict::Closed | Verdict::Gone => {
                    return Err(spent_elsewhere("payment secret was already spent"));
                }
            }
        }
    };
    if swap && fee_taken(state, &hold.public) {
        // The hold of a settled exact payment stays the server's fee: the
        // input paid for it and is spent.
        return Err(spent_elsewhere("payment secret was already spent"));
    }
    let entry = plan(ledger, hold, paid, price, replay, state.now_ms());
    write(state.storage(), &input, Some(&entry))?;
    if swap {
        let x = derive(ledger, &entry.hold)?;
        if let Err(err) = up
            .mint
            .replace(&[presented_secret.to_string()], std::slice::from_ref(&x))
        {
            swap_failed(up, state, &input, &entry, err, action, price)?;
        }
    }
    let change = match &entry.change {
        Some(d) => Some((derive(ledger, d)?, d.clone())),
        None => None,
    };
    let charge = Charge {
        action: action.into(),
        price,
        paid,
        public: input.clone(),
        change: change.as_ref().map(|(s, _)| s.clone()),
        change_derivation: change.map(|(_, d)| d),
    };
    Ok((
        charge,
        Held {
            _live: live,
            input,
            entry,
            refundable: true,
            action: action.to_string(),
        },
    ))
}

/// The swap `S -> X` failed: find out whether it happened anyway (Ok:
/// it did, the request goes on) and otherwise answer, keeping the entry
/// only while the swap may still be carried out.
fn swap_failed(
    up: &Upstream,
    state: &dyn Books,
    input: &str,
    entry: &Entry,
    err: CallError,
    action: &str,
    price: u64,
) -> Result<(), Reply> {
    let forget = || write(state.storage(), input, None);
    match &err {
        CallError::NotSent(_) => {
            forget()?;
            return Err(up.unavailable(&format!("{err}; nothing was spent")));
        }
        CallError::Timeout => {
            tracing::warn!("upstream replace timed out; the entry is kept until resolved");
            return Err(up.unavailable(&format!(
                "{err}; if it still carries the payment out, its value is kept for you: retry this request as it was, or claim it with POST /api/cash/refund"
            )));
        }
        CallError::Refused(..) | CallError::Bad(_) => {}
    }
    // It answered: ask whether the swap happened.
    let facts = up.mint.health_check(&[
        secret::public_string(entry.amount, input),
        public_of(&entry.hold),
    ]);
    let refused = |code: &str, m: String| refusal(code, m, action, price);
    match (facts.as_deref(), &err) {
        (Ok([_, Some(h)]), _) if !h.spent => {
            tracing::warn!(
                failure = err.kind(),
                "upstream replace failed but the swap is there: going on"
            );
            Ok(())
        }
        (Ok([Some(i), None]), _) if i.spent => {
            forget()?;
            Err(refused(
                "payment_spent",
                "payment secret was already spent (at the upstream webcash server)".into(),
            ))
        }
        (Ok([None, None]), _) => {
            forget()?;
            Err(refused(
                "payment_invalid",
                "payment secret is not known to the upstream webcash server".into(),
            ))
        }
        (Ok([Some(i), None]), CallError::Refused(_, m)) => {
            forget()?;
            let why = if i.amount.is_some_and(|a| a != entry.amount) {
                "payment secret's amount does not match the upstream webcash server's".to_string()
            } else {
                format!("the upstream webcash server refused the payment secret: {m}")
            };
            Err(refused("payment_invalid", why))
        }
        (Ok([Some(_), None]), _) => {
            forget()?;
            Err(up.error(&format!("{err}; nothing was spent")))
        }
        (_, CallError::Refused(_, m)) => {
            // Refused: nothing was done, whatever the health check says.
            forget()?;
            let code = if m.contains("spent") {
                "payment_spent"
            } else {
                "payment_invalid"
            };
            Err(refused(
                code,
                format!("the upstream webcash server refused the payment secret: {m}"),
            ))
        }
        _ => Err(up.error(&format!(
            "{err}; whether it took the payment is not known yet: retry this request as it was, or claim its value later with POST /api/cash/refund"
        ))),
    }
}

/// The request answers 2xx: split the hold into fee and change at the
/// upstream, then settle the entry and record the fee in the request's own
/// transaction (which the caller commits). On failure the answer to give
/// instead; `held.refundable` says whether the hold may be shown.
pub fn settle(
    up: &Upstream,
    state: &dyn Books,
    txn: &WriteTxn,
    held: &mut Held,
) -> Result<(), Reply> {
    let ledger = state.ledger();
    let e = &held.entry;
    let fee = match split_of(e) {
        Some((f, c, _)) => {
            let inputs = [derive(ledger, &e.hold)?];
            let outputs = [derive(ledger, f)?, derive(ledger, c)?];
            if let Err(err) = up.mint.replace(&inputs, &outputs) {
                let done = match &err {
                    CallError::NotSent(_) => Some(false),
                    CallError::Timeout => None,
                    _ => match up.facts(&held.input, e) {
                        Ok(facts) => match verdict(e, &facts) {
                            Verdict::Owed => Some(false),
                            Verdict::Split if facts.change.is_some_and(|c| !c.spent) => Some(true),
                            Verdict::Closed => {
                                // The held value was spent meanwhile (an
                                // identical retry holding a refund the
                                // payer also spent elsewhere).
                                held.refundable = false;
                                return Err(refusal(
                                    "payment_spent",
                                    "payment secret was already spent: its refund was spent meanwhile",
                                    &held.action,
                                    e.price,
                                ));
                            }
                            _ => None,
                        },
                        Err(_) => None,
                    },
                };
                match done {
                    Some(true) => {
                        tracing::warn!(
                            failure = err.kind(),
                            "upstream split failed but it is there: going on"
                        );
                    }
                    Some(false) => {
                        return Err(
                            up.call_reply(&err, "nothing was done; the payment is refunded")
                        );
                    }
                    None => {
                        held.refundable = false;
                        return Err(up.call_reply(
                            &err,
                            "the payment's outcome is not known yet: retry this request as it was, or claim its value later with POST /api/cash/refund",
                        ));
                    }
                }
            }
            f.clone()
        }
        None => e.hold.clone(),
    };
    if fee != held.entry.hold {
        // The hold is spent into fee and change: a failed commit leaves
        // the value to the sweep (a recovery refund), not to be shown.
        held.refundable = false;
    }
    let record = FeeRecord {
        derivation: fee.clone(),
        input: held.input.clone(),
        at_ms: state.now_ms(),
    };
    put(txn, &held.input, None)
        .and_then(|_| {
            txn.put_in(
                FEES,
                fee.public.as_bytes(),
                &serde_json::to_vec(&record).map_err(|e| StorageError::Internal(e.to_string()))?,
            )
        })
        .map_err(internal)
}

/// The request failed: show the hold as `payment.refund` (body member of a
/// JSON answer, else the `X-Cash-Refund` header) and mark the entry, in a
/// commit of its own (the request's transaction must be gone).
pub fn refund_into(state: &dyn Books, held: &Held, reply: &mut Reply) {
    if !held.refundable {
        return;
    }
    let Some(x) = held.entry.hold.derive(state.ledger()) else {
        tracing::error!("the hold of a failed upstream payment cannot be derived again");
        return;
    };
    let shown = amount::format(held.entry.amount);
    match serde_json::from_slice::<Value>(&reply.body) {
        Ok(Value::Object(mut body)) => {
            let payment = body.entry("payment").or_insert_with(|| json!({}));
            if !payment.is_object() {
                *payment = json!({});
            }
            payment["refund"] = Value::String(x);
            payment["refund_amount"] = Value::String(shown);
            reply.body = serde_json::to_vec(&Value::Object(body)).unwrap_or_default();
        }
        _ => reply.headers.push(("x-cash-refund".into(), x)),
    }
    let marked = refund_entry(&held.entry, held.entry.hold.clone());
    if write(state.storage(), &held.input, Some(&marked)).is_err() {
        // The sweep comes to the same: the hold is unspent.
        tracing::warn!("could not mark an upstream payment refunded; the sweep will");
    }
}

/// What an unsettled entry comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The payer is owed this secret, worth `amount` (state `refund`).
    Refund { secret: String, amount: u64 },
    /// Nothing is owed; the entry is removed once that is final.
    Nothing(Verdict),
}

/// Resolve the entry of `input` (held exclusively by the caller): ask the
/// upstream where its value is, make a split's value one refund, and
/// record the outcome. None when there is no entry.
pub fn resolve(
    up: &Upstream,
    state: &dyn Books,
    input: &str,
    now_ms: u64,
) -> Result<Option<Resolved>, Reply> {
    let Some(e) = read(state.storage(), input)? else {
        return Ok(None);
    };
    let facts = up
        .facts(input, &e)
        .map_err(|err| up.call_reply(&err, "try again later"))?;
    let ledger = state.ledger();
    let owed = |hold: &Derivation| -> Result<Resolved, Reply> {
        let secret = derive(ledger, hold)?;
        let refund = refund_entry(&e, hold.clone());
        if refund != e {
            write(state.storage(), input, Some(&refund))?;
        }
        Ok(Resolved::Refund {
            secret,
            amount: e.amount,
        })
    };
    let v = verdict(&e, &facts);
    match v {
        Verdict::Owed => owed(&e.hold).map(Some),
        Verdict::Split => {
            let (f, c, r) = split_of(&e).expect("a split entry");
            match facts.recovery {
                Some(o) if !o.spent => return owed(r).map(Some),
                Some(_) => {
                    write(state.storage(), input, None)?;
                    return Ok(Some(Resolved::Nothing(Verdict::Closed)));
                }
                None => {}
            }
            let inputs = [derive(ledger, f)?, derive(ledger, c)?];
            if let Err(err) = up.mint.replace(&inputs, &[derive(ledger, r)?]) {
                let there = matches!(err, CallError::Refused(..) | CallError::Bad(_))
                    && up
                        .mint
                        .health_check(&[public_of(r)])
                        .is_ok_and(|s| s.first().copied().flatten().is_some_and(|o| !o.spent));
                if !there {
                    tracing::warn!(
                        failure = err.kind(),
                        "upstream recovery of a split payment failed"
                    );
                    return Err(up.call_reply(&err, "try again later"));
                }
            }
            owed(r).map(Some)
        }
        Verdict::Closed => {
            write(state.storage(), input, None)?;
            Ok(Some(Resolved::Nothing(v)))
        }
        Verdict::NotSwapped | Verdict::Gone => {
            if now_ms.saturating_sub(e.at_ms) >= GRACE_MS {
                write(state.storage(), input, None)?;
            }
            Ok(Some(Resolved::Nothing(v)))
        }
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SweepStats {
    /// Entries now owed to their payer as a refund.
    pub refunds: u64,
    /// Entries removed (nothing owed) or left (outcome not final).
    pub closed: u64,
    pub pending: u64,
    /// Entries the upstream could not be asked about.
    pub failed: u64,
}

/// Resolve every entry no request is working on.
pub fn sweep(up: &Arc<Upstream>, state: &dyn Books) -> Result<SweepStats, Reply> {
    let inputs: Vec<String> = {
        let txn = state.storage().begin_read().map_err(internal)?;
        txn.scan_in(JOURNAL, b"", None, false, usize::MAX)
            .map_err(internal)?
            .into_iter()
            .map(|(k, _)| String::from_utf8_lossy(&k).into_owned())
            .collect()
    };
    let mut stats = SweepStats::default();
    for input in inputs {
        let Some(_live) = up.lock(&input) else {
            continue;
        };
        match resolve(up, state, &input, state.now_ms()) {
            Ok(Some(Resolved::Refund { .. })) => stats.refunds += 1,
            Ok(Some(Resolved::Nothing(Verdict::NotSwapped | Verdict::Gone))) => {
                if read(state.storage(), &input)?.is_some() {
                    stats.pending += 1;
                } else {
                    stats.closed += 1;
                }
            }
            Ok(Some(Resolved::Nothing(_))) => stats.closed += 1,
            Ok(None) => {}
            Err(_) => stats.failed += 1,
        }
    }
    Ok(stats)
}

/// Resolve abandoned entries now (they are all abandoned at start: no
/// request survives a restart) and every [`SWEEP_EVERY`], on a thread of
/// its own that ends with the state.
pub fn spawn_sweeper<S: Books>(state: &Arc<S>) {
    let Some(up) = state.upstream().cloned() else {
        return;
    };
    let weak: Weak<S> = Arc::downgrade(state);
    let spawned = std::thread::Builder::new()
        .name("upstream-sweep".into())
        .spawn(move || {
            loop {
                let Some(state) = weak.upgrade() else { return };
                match sweep(&up, &*state) {
                    Ok(s) if s != SweepStats::default() => tracing::info!(
                        refunds = s.refunds,
                        closed = s.closed,
                        pending = s.pending,
                        failed = s.failed,
                        "upstream journal: resolved abandoned payments"
                    ),
                    Ok(_) => {}
                    Err(_) => tracing::warn!("upstream journal sweep failed (retried later)"),
                }
                drop(state);
                std::thread::park_timeout(SWEEP_EVERY);
            }
        });
    if let Err(e) = spawned {
        tracing::error!("cannot start the upstream journal sweep: {e}");
    }
}

/// `POST /api/cash/refund {"secret": S}`: the value of a payment taken
/// with `S` whose request did not succeed, as one secret at the upstream.
/// Only the payer knows `S`, whose public hash keys the entry.
pub fn claim(state: &dyn Books, body: &[u8]) -> Reply {
    // The body first (PROTOCOL 1: 400 before 404), on either kind of server.
    let bad = |problem: &str| Reply::invalid("secret", problem);
    let doc: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return Reply::invalid(
                "body",
                "must be a JSON object {\"secret\": \"e<amount>:secret:<hex>\"}",
            );
        }
    };
    let s = match doc.get("secret") {
        Some(Value::String(s)) => s,
        None | Some(Value::Null) => return bad("is required"),
        Some(_) => return bad("must be a string: \"e<amount>:secret:<hex>\""),
    };
    let parsed = match secret::parse(s) {
        Ok(p) if p.kind == secret::Kind::Secret => p,
        Ok(_) => return bad("must be the secret that paid, not its public hash"),
        Err(m) => return bad(&m),
    };
    match state.upstream() {
        Some(up) => claim_at(up, state, &parsed.hex),
        None => Reply::error(
            404,
            "not_found",
            "this server keeps its own ledger: a payment is taken only when its request succeeds, so there is nothing to refund",
        ),
    }
}

/// Claim the refund of the secret of hex `secret_hex` at `up`.
fn claim_at(up: &Arc<Upstream>, state: &dyn Books, secret_hex: &str) -> Reply {
    let input = public_hash(secret_hex);
    let Some(_live) = up.lock(&input) else {
        return Reply::error(
            409,
            "conflict",
            "a request paying with this secret is in progress; claim once it has answered",
        );
    };
    match resolve(up, state, &input, state.now_ms()) {
        Ok(Some(Resolved::Refund { secret, amount })) => Reply::json(
            200,
            &json!({"status": "success", "refund": secret, "amount": amount::format(amount)}),
        ),
        Ok(Some(Resolved::Nothing(v))) => Reply::error(
            409,
            "conflict",
            match v {
                Verdict::NotSwapped => {
                    "this secret was never swapped: it is still unspent at the upstream webcash server"
                }
                Verdict::Gone => {
                    "this secret was spent at the upstream webcash server, not by this payment"
                }
                _ => "nothing is owed: the refund of this payment was already spent",
            },
        ),
        Ok(None) => Reply::error(
            404,
            "not_found",
            "no payment is held for this secret: it was never taken here, or the request it paid succeeded",
        ),
        Err(reply) => reply,
    }
}

/// `GET /admin/cash/upstream-fees`: the fees earned in upstream mode that
/// are still unspent at the upstream, as secrets (the operator withdraws
/// them by inserting them into a webcash wallet), and how many were spent.
pub fn fees(state: &dyn Books) -> Reply {
    let Some(up) = state.upstream().cloned() else {
        return Reply::error(404, "not_found", "this server is not in upstream mode");
    };
    let storage = state.storage();
    let records: Vec<FeeRecord> = match storage.begin_read().map_err(internal).and_then(|t| {
        t.scan_in(FEES, b"", None, false, usize::MAX)
            .map_err(internal)
    }) {
        Ok(rows) => rows
            .iter()
            .filter_map(|(_, v)| serde_json::from_slice(v).ok())
            .collect(),
        Err(r) => return r,
    };
    let mut unspent = Vec::new();
    let (mut spent, mut total) = (0u64, 0u64);
    for chunk in records.chunks(1000) {
        let publics: Vec<String> = chunk.iter().map(|r| public_of(&r.derivation)).collect();
        let states = match up.mint.health_check(&publics) {
            Ok(s) => s,
            Err(e) => return up.call_reply(&e, "try again later"),
        };
        for (r, s) in chunk.iter().zip(states) {
            match (s, r.derivation.derive(state.ledger())) {
                (Some(o), Some(secret)) if !o.spent => {
                    let units = r.derivation.amount.unwrap_or_default();
                    total += units;
                    unspent.push(json!({"secret": secret, "amount": amount::format(units)}));
                }
                _ => spent += 1,
            }
        }
    }
    Reply::json(
        200,
        &json!({"upstream": up.url, "unspent": unspent, "total": amount::format(total), "spent_or_unknown": spent}),
    )
}

/// With `cash_upstream`: the embedded ledger's own routes answer 409
/// naming the upstream (a wallet belongs there).
pub fn ledger_route(state: &dyn Books) -> Option<Reply> {
    let up = state.upstream()?;
    Some(Reply::error(
        409,
        "conflict",
        format!(
            "this server takes payments at the upstream webcash server {}: use {}/api/v1/replace and /api/v1/health_check there",
            up.url, up.url
        ),
    ))
}

/// A `503 upstream_unavailable` answer says when to retry (the header is
/// lost when the refusal passes through a plugin).
pub fn add_retry_after(state: &dyn Books, reply: &mut Reply) {
    let Some(up) = state.upstream() else { return };
    if reply.status != 503
        || reply
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("retry-after"))
    {
        return;
    }
    let code = serde_json::from_slice::<Value>(&reply.body)
        .ok()
        .and_then(|v| v.get("code").and_then(Value::as_str).map(str::to_string));
    if code.as_deref() == Some("upstream_unavailable") {
        reply.headers.push((
            "retry-after".into(),
            up.timeout.as_secs().max(1).to_string(),
        ));
    }
}

#[cfg(test)]
mod tests {
    //! The journal's transitions, against a webcash server in memory whose
    //! calls can be made to fail; crash points are set up as the durable
    //! journal and the upstream would be left by them.
    use super::*;
    use std::collections::HashMap;

    /// How the fake upstream's calls go wrong.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Fail {
        /// Nothing reaches it.
        Down,
        /// It carries the call out, then the answer is lost (a timeout).
        LostAnswer,
        /// It answers something that is not webcash's, doing nothing.
        Garbage,
    }

    #[derive(Default)]
    struct Fake {
        outs: Mutex<HashMap<String, (u64, bool)>>,
        fail: Mutex<Option<Fail>>,
        calls: Mutex<u64>,
    }

    struct Shared(Arc<Fake>);

    impl Fake {
        fn mint(&self, units: u64) -> String {
            let mut raw = [0u8; 32];
            crate::ids::fill_random(&mut raw);
            let hex = marketplace_common::hex::encode(&raw);
            self.outs
                .lock()
                .unwrap()
                .insert(public_hash(&hex), (units, false));
            secret::secret_string(units, &hex)
        }

        /// (amount, spent) of a secret, None when unknown.
        fn state(&self, s: &str) -> Option<(u64, bool)> {
            let p = secret::parse(s).unwrap();
            self.outs.lock().unwrap().get(&public_hash(&p.hex)).copied()
        }

        fn set(&self, f: Option<Fail>) {
            *self.fail.lock().unwrap() = f;
        }

        fn apply(&self, inputs: &[String], outputs: &[String]) -> Result<(), CallError> {
            let mut outs = self.outs.lock().unwrap();
            let refuse = |m: &str| Err(CallError::Refused(400, m.into()));
            let (mut total_in, mut total_out) = (0u64, 0u64);
            for s in inputs {
                let p = secret::parse(s).unwrap();
                match outs.get(&public_hash(&p.hex)) {
                    None => return refuse("an input is not known to this ledger"),
                    Some((_, true)) => return refuse("an input is already spent"),
                    Some((a, false)) if *a != p.amount => return refuse("amount mismatch"),
                    Some(_) => total_in += p.amount,
                }
            }
            for s in outputs {
                let p = secret::parse(s).unwrap();
                if outs.contains_key(&public_hash(&p.hex)) {
                    return refuse("an output already exists");
                }
                total_out += p.amount;
            }
            if total_in != total_out {
                return refuse("sums differ");
            }
            for s in inputs {
                let p = secret::parse(s).unwrap();
                outs.insert(public_hash(&p.hex), (p.amount, true));
            }
            for s in outputs {
                let p = secret::parse(s).unwrap();
                outs.insert(public_hash(&p.hex), (p.amount, false));
            }
            Ok(())
        }
    }

    impl Mint for Shared {
        fn replace(&self, inputs: &[String], outputs: &[String]) -> Result<(), CallError> {
            *self.0.calls.lock().unwrap() += 1;
            match *self.0.fail.lock().unwrap() {
                Some(Fail::Down) => Err(CallError::NotSent("refused".into())),
                Some(Fail::Garbage) => Err(CallError::Bad("not JSON".into())),
                Some(Fail::LostAnswer) => {
                    let _ = self.0.apply(inputs, outputs);
                    Err(CallError::Timeout)
                }
                None => self.0.apply(inputs, outputs),
            }
        }

        fn health_check(&self, publics: &[String]) -> Result<Vec<Option<Out>>, CallError> {
            match *self.0.fail.lock().unwrap() {
                Some(Fail::Down) => return Err(CallError::NotSent("refused".into())),
                Some(Fail::Garbage) => return Err(CallError::Bad("not JSON".into())),
                Some(Fail::LostAnswer) => return Err(CallError::Timeout),
                None => {}
            }
            let outs = self.0.outs.lock().unwrap();
            Ok(publics
                .iter()
                .map(|p| {
                    let p = secret::parse(p).unwrap();
                    outs.get(&p.hex).map(|(a, spent)| Out {
                        spent: *spent,
                        amount: Some(*a),
                    })
                })
                .collect())
        }
    }

    /// A store and a ledger of their own (the upstream is passed apart).
    struct TestBooks {
        storage: Storage,
        ledger: Ledger,
    }

    impl Books for TestBooks {
        fn storage(&self) -> &Storage {
            &self.storage
        }
        fn ledger(&self) -> &Ledger {
            &self.ledger
        }
        fn upstream(&self) -> Option<&Arc<Upstream>> {
            None
        }
        fn now_ms(&self) -> u64 {
            let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            since.unwrap_or_default().as_millis() as u64
        }
    }

    struct World {
        _dir: tempfile::TempDir,
        state: TestBooks,
        fake: Arc<Fake>,
        up: Arc<Upstream>,
    }

    fn world() -> World {
        let dir = tempfile::tempdir().unwrap();
        let state = TestBooks {
            storage: Storage::open(&dir.path().join("db.redb"), Default::default()).unwrap(),
            ledger: Ledger::open(dir.path()).unwrap(),
        };
        let fake = Arc::new(Fake::default());
        let up = Upstream::with_mint(
            "http://upstream.test",
            Duration::from_secs(1),
            Box::new(Shared(fake.clone())),
        );
        World {
            _dir: dir,
            state,
            fake,
            up,
        }
    }

    fn pay(secret: &str) -> PaymentHeaders {
        PaymentHeaders {
            cash: Some(secret.to_string()),
            ..Default::default()
        }
    }

    fn input_of(s: &str) -> String {
        public_hash(&secret::parse(s).unwrap().hex)
    }

    fn code(r: &Reply) -> (u16, String) {
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        (r.status, v["code"].as_str().unwrap_or_default().to_string())
    }

    impl World {
        fn charge(&self, s: &str, price: u64, key: u8) -> Result<(Charge, Held), Reply> {
            charge(
                &self.up,
                &self.state,
                &pay(s),
                "post",
                price,
                Some(&[key; 32]),
            )
        }

        /// The request answers 2xx and commits.
        fn commit(&self, held: &mut Held) -> Result<(), Reply> {
            let txn = self.state.storage.begin_write().unwrap();
            settle(&self.up, &self.state, &txn, held)?;
            self.state.storage.commit(txn).unwrap();
            Ok(())
        }

        fn entry(&self, s: &str) -> Option<Entry> {
            read(&self.state.storage, &input_of(s)).unwrap()
        }

        fn derive(&self, d: &Derivation) -> String {
            d.derive(&self.state.ledger).unwrap()
        }

        /// An entry left by a crash: the intent of paying `price` with `s`.
        fn intent(&self, s: &str, price: u64) -> Entry {
            let (input, amount) = (input_of(s), secret::parse(s).unwrap().amount);
            let e = plan(
                &self.state.ledger,
                hold_for(&self.state.ledger, &input, amount),
                amount,
                price,
                String::new(),
                self.state.now_ms(),
            );
            write(&self.state.storage, &input, Some(&e)).unwrap();
            e
        }

        fn claim(&self, s: &str) -> Reply {
            claim_at(&self.up, &self.state, &secret::parse(s).unwrap().hex)
        }

        /// Raw bytes of the host's upstream tables.
        fn raw(&self) -> String {
            let txn = self.state.storage.begin_read().unwrap();
            let mut text = String::new();
            for table in [JOURNAL, FEES] {
                for (k, v) in txn.scan_in(table, b"", None, false, usize::MAX).unwrap() {
                    text.push_str(&String::from_utf8_lossy(&k));
                    text.push_str(&String::from_utf8_lossy(&v));
                }
            }
            text
        }
    }

    /// A new random secret (not known upstream yet).
    fn fresh(units: u64) -> String {
        let mut raw = [0u8; 32];
        crate::ids::fill_random(&mut raw);
        secret::secret_string(units, &marketplace_common::hex::encode(&raw))
    }

    fn hex_of(s: &str) -> String {
        secret::parse(s).unwrap().hex
    }

    #[test]
    fn a_committed_payment_splits_into_fee_and_change() {
        let w = world();
        let s = w.fake.mint(100);
        let (charge, mut held) = w.charge(&s, 30, 1).unwrap();
        let change = charge.change.clone().unwrap();
        assert_eq!((charge.paid, charge.price), (100, 30));
        assert_eq!(w.fake.state(&s), Some((100, true)), "the input is spent");
        let x = w.derive(&held.entry.hold);
        assert_eq!(w.fake.state(&x), Some((100, false)), "held as X");
        assert_eq!(w.entry(&s).unwrap().state, EntryState::Swapping);
        w.commit(&mut held).unwrap();
        assert_eq!(w.fake.state(&x), Some((100, true)));
        assert_eq!(w.fake.state(&change), Some((70, false)), "change valid");
        let fee = w.derive(held.entry.fee.as_ref().unwrap());
        assert_eq!(w.fake.state(&fee), Some((30, false)));
        assert!(w.entry(&s).is_none(), "settled with the commit");
        let raw = w.raw();
        assert!(
            raw.contains(&held.entry.fee.as_ref().unwrap().public),
            "fee recorded"
        );
        for secret in [&s, &x, &change, &fee] {
            assert!(!raw.contains(&hex_of(secret)), "no live secret at rest");
        }
        // Nothing to claim once it succeeded.
        drop(held);
        assert_eq!(code(&w.claim(&s)), (404, "not_found".into()));
    }

    #[test]
    fn an_exact_payment_keeps_the_hold_as_the_fee() {
        let w = world();
        let s = w.fake.mint(30);
        let (charge, mut held) = w.charge(&s, 30, 1).unwrap();
        assert!(charge.change.is_none());
        let calls = *w.fake.calls.lock().unwrap();
        w.commit(&mut held).unwrap();
        assert_eq!(*w.fake.calls.lock().unwrap(), calls, "no second call");
        assert!(w.raw().contains(&held.entry.hold.public));
    }

    #[test]
    fn a_failed_request_refunds_the_hold_and_a_claim_shows_it_again() {
        let w = world();
        let s = w.fake.mint(100);
        let (_, held) = w.charge(&s, 30, 1).unwrap();
        let mut reply = Reply::error(409, "conflict", "taken");
        refund_into(&w.state, &held, &mut reply);
        let body: Value = serde_json::from_slice(&reply.body).unwrap();
        let refund = body["payment"]["refund"].as_str().unwrap().to_string();
        assert_eq!(body["payment"]["refund_amount"], "0.000001");
        assert_eq!(w.fake.state(&refund), Some((100, false)), "worth the input");
        assert_eq!(w.entry(&s).unwrap().state, EntryState::Refund);
        assert_eq!(
            code(&w.claim(&s)),
            (409, "conflict".into()),
            "its request is live"
        );
        drop(held);
        let r = w.claim(&s);
        assert_eq!(r.status, 200);
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["refund"], refund.as_str());
        // The payer spends its refund: nothing is owed any more.
        w.fake.apply(&[refund], &[fresh(100)]).unwrap();
        let stats = sweep(&w.up, &w.state).unwrap();
        assert_eq!(stats.closed, 1);
        assert!(w.entry(&s).is_none());
        assert_eq!(code(&w.claim(&s)), (404, "not_found".into()));
    }

    #[test]
    fn an_unreachable_upstream_spends_nothing() {
        let w = world();
        let s = w.fake.mint(100);
        w.fake.set(Some(Fail::Down));
        let r = w.charge(&s, 30, 1).err().unwrap();
        assert_eq!(code(&r), (503, "upstream_unavailable".into()));
        assert!(r.headers.iter().any(|(k, _)| k == "retry-after"));
        assert_eq!(w.fake.state(&s), Some((100, false)));
        assert!(w.entry(&s).is_none(), "nothing in flight");
    }

    #[test]
    fn a_lost_answer_keeps_the_value_for_an_identical_retry() {
        let w = world();
        let s = w.fake.mint(100);
        w.fake.set(Some(Fail::LostAnswer));
        let r = w.charge(&s, 30, 1).err().unwrap();
        assert_eq!(code(&r), (503, "upstream_unavailable".into()));
        assert_eq!(w.fake.state(&s), Some((100, true)), "carried out anyway");
        assert_eq!(w.entry(&s).unwrap().state, EntryState::Swapping);
        w.fake.set(None);
        // Another request with the same secret: spent, as ever.
        let r = w.charge(&s, 30, 2).err().unwrap();
        assert_eq!(code(&r), (402, "payment_spent".into()));
        // The identical retry runs again holding the swapped value.
        let (charge, mut held) = w.charge(&s, 30, 1).unwrap();
        w.commit(&mut held).unwrap();
        assert_eq!(
            w.fake.state(charge.change.as_deref().unwrap()),
            Some((70, false))
        );
        assert!(w.entry(&s).is_none());
    }

    #[test]
    fn refused_secrets_answer_as_the_embedded_ledger() {
        let w = world();
        let s = w.fake.mint(100);
        w.charge(&s, 30, 1).map(|(_, h)| drop(h)).unwrap();
        // Spent (by the request above, which then committed nothing, so
        // its value is held): another request is refused.
        let r = w.charge(&s, 30, 2).err().unwrap();
        assert_eq!(code(&r), (402, "payment_spent".into()));
        // Spent at the upstream by someone else.
        let spent = w.fake.mint(100);
        w.fake
            .apply(std::slice::from_ref(&spent), &[fresh(100)])
            .unwrap();
        let r = w.charge(&spent, 30, 5).err().unwrap();
        assert_eq!(code(&r), (402, "payment_spent".into()));
        assert!(w.entry(&spent).is_none(), "refused: nothing in flight");
        let unknown = secret::secret_string(100, &"ab".repeat(32));
        let r = w.charge(&unknown, 30, 3).err().unwrap();
        assert_eq!(code(&r), (402, "payment_invalid".into()));
        assert!(w.entry(&unknown).is_none());
        let r = w
            .charge(&secret::secret_string(10, &"cd".repeat(32)), 30, 4)
            .err()
            .unwrap();
        assert_eq!(code(&r), (402, "payment_insufficient".into()));
    }

    #[test]
    fn garbage_is_an_upstream_error_and_the_sweep_waits_out_the_grace() {
        let w = world();
        let s = w.fake.mint(100);
        w.fake.set(Some(Fail::Garbage));
        let r = w.charge(&s, 30, 1).err().unwrap();
        assert_eq!(code(&r), (502, "upstream_error".into()));
        assert!(w.entry(&s).is_some(), "outcome unknown: kept");
        w.fake.set(None);
        let stats = sweep(&w.up, &w.state).unwrap();
        assert_eq!(
            stats.pending, 1,
            "never swapped, but a call could still land"
        );
        let later = w.state.now_ms() + GRACE_MS;
        assert_eq!(
            resolve(&w.up, &w.state, &input_of(&s), later).unwrap(),
            Some(Resolved::Nothing(Verdict::NotSwapped))
        );
        assert!(w.entry(&s).is_none());
        assert_eq!(w.fake.state(&s), Some((100, false)), "the payer holds S");
    }

    #[test]
    fn crash_after_the_intent_before_the_swap() {
        let w = world();
        let s = w.fake.mint(100);
        w.intent(&s, 30);
        assert_eq!(code(&w.claim(&s)), (409, "conflict".into()), "not swapped");
        assert!(w.entry(&s).is_some(), "kept through the grace");
        // An identical (or any) new payment with S swaps it afresh.
        let (_, mut held) = w.charge(&s, 30, 1).unwrap();
        w.commit(&mut held).unwrap();
        assert!(w.entry(&s).is_none());
    }

    #[test]
    fn crash_after_the_swap_before_the_answer() {
        let w = world();
        let s = w.fake.mint(100);
        let e = w.intent(&s, 30);
        let x = w.derive(&e.hold);
        w.fake
            .apply(std::slice::from_ref(&s), std::slice::from_ref(&x))
            .unwrap();
        let stats = sweep(&w.up, &w.state).unwrap();
        assert_eq!(stats.refunds, 1);
        assert_eq!(w.entry(&s).unwrap().state, EntryState::Refund);
        let v: Value = serde_json::from_slice(&w.claim(&s).body).unwrap();
        assert_eq!(v["refund"], x.as_str());
        assert_eq!(v["amount"], "0.000001");
    }

    #[test]
    fn crash_after_the_split_before_the_commit() {
        let w = world();
        let s = w.fake.mint(100);
        let e = w.intent(&s, 30);
        let x = w.derive(&e.hold);
        let (f, c) = (
            w.derive(e.fee.as_ref().unwrap()),
            w.derive(e.change.as_ref().unwrap()),
        );
        w.fake
            .apply(std::slice::from_ref(&s), std::slice::from_ref(&x))
            .unwrap();
        w.fake.apply(&[x], &[f.clone(), c.clone()]).unwrap();
        // The first recovery's answer is lost; the next finds it done.
        w.fake.set(Some(Fail::LostAnswer));
        let live = w.up.lock(&input_of(&s)).unwrap();
        assert!(resolve(&w.up, &w.state, &input_of(&s), w.state.now_ms()).is_err());
        drop(live);
        w.fake.set(None);
        let r = w.claim(&s);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        let refund = v["refund"].as_str().unwrap();
        assert_eq!(refund, w.derive(e.recovery.as_ref().unwrap()));
        assert_eq!(w.fake.state(refund), Some((100, false)), "worth the input");
        assert_eq!(w.fake.state(&f), Some((30, true)));
        assert_eq!(w.fake.state(&c), Some((70, true)));
        // Claimed again: the same refund.
        let again: Value = serde_json::from_slice(&w.claim(&s).body).unwrap();
        assert_eq!(again["refund"], refund);
    }

    #[test]
    fn a_retry_whose_refund_was_spent_meanwhile_is_refused_at_the_split() {
        let w = world();
        let s = w.fake.mint(100);
        let (_, held) = w.charge(&s, 30, 1).unwrap();
        let mut reply = Reply::error(409, "conflict", "taken");
        refund_into(&w.state, &held, &mut reply);
        drop(held);
        let (_, mut held) = w.charge(&s, 30, 1).unwrap();
        // The payer spends the refund it was shown while the retry runs.
        let x = w.derive(&held.entry.hold);
        w.fake.apply(&[x], &[fresh(100)]).unwrap();
        let r = w.commit(&mut held).err().unwrap();
        assert_eq!(code(&r), (402, "payment_spent".into()));
        assert!(!held.refundable);
    }

    #[test]
    fn the_sweep_leaves_live_requests_alone() {
        let w = world();
        let s = w.fake.mint(100);
        let (_, held) = w.charge(&s, 30, 1).unwrap();
        let before = w.entry(&s);
        assert_eq!(sweep(&w.up, &w.state).unwrap(), SweepStats::default());
        assert_eq!(w.entry(&s), before);
        // A concurrent request with the same secret waits its turn.
        assert_eq!(
            code(&w.charge(&s, 30, 1).err().unwrap()),
            (409, "conflict".into())
        );
        drop(held);
    }

    #[test]
    fn verdicts() {
        let w = world();
        let s = w.fake.mint(100);
        let split = w.intent(&s, 30);
        let exact = Entry {
            fee: None,
            change: None,
            recovery: None,
            ..split.clone()
        };
        let unspent = Some(Out {
            spent: false,
            amount: None,
        });
        let spent = Some(Out {
            spent: true,
            amount: None,
        });
        let f = |input, hold, change| Facts {
            input,
            hold,
            fee: change,
            change,
            recovery: None,
        };
        for (e, facts, v) in [
            (&split, f(spent, unspent, None), Verdict::Owed),
            (&split, f(spent, spent, unspent), Verdict::Split),
            (&split, f(spent, spent, None), Verdict::Closed),
            (&exact, f(spent, spent, None), Verdict::Closed),
            (&split, f(unspent, None, None), Verdict::NotSwapped),
            (&split, f(spent, None, None), Verdict::Gone),
            (&split, f(None, None, None), Verdict::Gone),
        ] {
            assert_eq!(verdict(e, &facts), v, "{facts:?}");
        }
    }
}
