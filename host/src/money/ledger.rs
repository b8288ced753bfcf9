//! The embedded cash ledger (webcash-compatible).
//!
//! Only public hashes are stored: `sha256(hex string of the secret)` ->
//! (amount, spent). Secrets the server makes (change, payouts, refunds) are
//! derived with HMAC-SHA256 under a server key kept in the data dir, so a
//! repeat returns the same secret without storing it. The answer of a paid
//! request kept for identical retries is stored with every secret it
//! carried taken out and replaced by how to derive it again.
//!
//! Value accounting, kept in `cash:totals`: `minted` (operator mints),
//! `fees` (earned), `escrow` (held for contracts). Invariant:
//! `minted = sum(unspent outputs) + fees + escrow`.

use crate::store::{Kv, WriteTxn};
use anyhow::{Context, Result};
use hmac::{Hmac, Mac};
use marketplace_common::hex::{decode as decode_hex, encode as hex};
use marketplace_common::{amount, secret};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::Sha256;
use std::collections::HashSet;
use std::path::Path;

/// public hash (hex) -> amount (u64 BE) and spent flag; a spent output
/// whose request's answer is kept adds the u64 BE milliseconds it was kept
/// at (see [`Ledger::record_paid_replay_at`]).
const OUTPUTS: &str = "cash:outputs";
/// total name -> u64 BE.
const TOTALS: &str = "cash:totals";
/// An operator's mint idempotency key -> the units minted under it (u64
/// BE): a key names one mint, so its repeat with another amount is
/// refused ([`MintKeyReused`]) rather than minting a second secret.
pub const MINT_KEYS: &str = "cash:mint-keys";
/// replay key -> where its kept answer is: [`encode_pointer`], the
/// milliseconds it was recorded at. Records of older versions hold the
/// stored reply itself (with that time, or none in the oldest). An answer
/// paid from this ledger has no record here: its spent output names the
/// time instead.
pub const REPLAYS: &str = "cash:replays";
/// The same records by time, for retention (`crate::retention`): u64 BE
/// milliseconds of recording, then the replay key -> the stored reply
/// (empty for a record of an older version, which holds its reply itself).
///
/// The reply (about 1.3 KB for a created post) lives here rather than
/// under its random replay key: here each new one goes at the end of the
/// table, so a batch of paid requests writes a few pages of answers
/// instead of one B-tree leaf (often split) per answer. And an answer paid
/// from this ledger is found through the output its secret spent, a row
/// the payment writes anyway, so keeping it adds no row at a random place.
pub const REPLAYS_BY_TIME: &str = "cash:replays-by-time";

/// First two bytes of a pointer record in [`REPLAYS`]: no HTTP status is
/// 0xFFFF, so it never begins a stored reply.
const POINTER: [u8; 2] = [0xff, 0xff];

/// The [`REPLAYS`] record of an answer kept at `at_ms`.
fn encode_pointer(at_ms: u64) -> [u8; 10] {
    let mut p = [0; 10];
    p[..2].copy_from_slice(&POINTER);
    p[2..].copy_from_slice(&at_ms.to_be_bytes());
    p
}

/// The time a pointer record names; None for a record of an older version.
fn decode_pointer(record: &[u8]) -> Option<u64> {
    let ms: [u8; 8] = record.strip_prefix(&POINTER)?.try_into().ok()?;
    Some(u64::from_be_bytes(ms))
}

/// Most inputs or outputs of one replace.
pub const MAX_REPLACE: usize = 100;
/// Most entries of one health check (webcash wallets recover by checking
/// their secrets in batches).
pub const MAX_HEALTH_CHECK: usize = 10_000;

/// Totals for the conservation invariant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    pub minted: u64,
    pub fees: u64,
    pub escrow: u64,
    pub unspent: u64,
}

/// A ledger output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Output {
    pub amount: u64,
    pub spent: bool,
}

fn encode(o: Output) -> [u8; 9] {
    let mut b = [0u8; 9];
    b[..8].copy_from_slice(&o.amount.to_be_bytes());
    b[8] = o.spent as u8;
    b
}

/// A spent output whose request's answer was kept at `at_ms`.
fn encode_kept(o: Output, at_ms: u64) -> [u8; 17] {
    let mut b = [0u8; 17];
    b[..9].copy_from_slice(&encode(o));
    b[9..].copy_from_slice(&at_ms.to_be_bytes());
    b
}

/// When the answer of the request that spent this output was kept, if it
/// was (see [`encode_kept`]).
fn kept_at(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(9..17)?.try_into().ok()?))
}

fn decode(b: &[u8]) -> Output {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    Output {
        amount: u64::from_be_bytes(a),
        spent: b[8] != 0,
    }
}

/// sha256 hex of the 64-char hex string (webcash public hash).
pub fn public_hash(secret_hex: &str) -> String {
    marketplace_common::hex::sha256(secret_hex)
}

/// A secret issued in this request, and how to make it again: what a
/// replay record keeps instead of the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Derivation {
    /// Input of the server-key HMAC.
    pub purpose: String,
    /// `Some(units)`: a cash secret `e{amount}:secret:{hex}`; None: the
    /// bare 64 hex of a certificate.
    pub amount: Option<u64>,
    /// The public hash it must have.
    pub public: String,
}

impl Derivation {
    /// The secret, re-derived; None when it no longer has the recorded
    /// public hash (the server key changed).
    pub fn derive(&self, ledger: &Ledger) -> Option<String> {
        let h = ledger.derive(self.purpose.as_bytes());
        match self.amount {
            Some(units) => {
                (public_hash(&h) == self.public).then(|| secret::secret_string(units, &h))
            }
            None => (certificate_public(&h) == self.public).then_some(h),
        }
    }
}

/// sha256 of a certificate's 32 bytes (its proof).
pub fn certificate_public(secret_hex: &str) -> String {
    let raw = decode_hex(secret_hex).unwrap_or_default();
    marketplace_common::hex::sha256(raw)
}

/// Why a secret was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretError {
    Malformed(String),
    /// The store failed while looking the secret up (not the payer's fault).
    Storage(String),
    Unknown,
    Spent,
    /// The amount written in the secret differs from the ledger's.
    AmountMismatch,
}

/// What is wrong with a mint's idempotency key, if anything.
pub fn mint_key_problem(key: &str) -> Option<&'static str> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_-.:".contains(c);
    if key.is_empty() || key.len() > 128 || !key.chars().all(allowed) {
        return Some("must be 1 to 128 characters of A-Z a-z 0-9 _ - . :");
    }
    None
}

pub struct Ledger {
    key: [u8; 32],
}

/// Why a replace or a health check was not done.
#[derive(Debug)]
pub enum LedgerError {
    /// The request's fault (400): the body member it concerns, and why.
    Refused(&'static str, String),
    /// The store failed (500; nothing of the request is committed).
    Storage(String),
}

impl Ledger {
    /// Load the server key from `<data_dir>/server.key`, creating it (mode
    /// 0600) on first start. (Its tables are made by `Storage::open`.)
    pub fn open(data_dir: &Path) -> Result<Ledger> {
        let path = data_dir.join("server.key");
        let key = match std::fs::read_to_string(&path) {
            Ok(text) => {
                let bytes =
                    decode_hex(text.trim()).context("server.key is not 64 hex characters")?;
                <[u8; 32]>::try_from(bytes.as_slice())
                    .map_err(|_| anyhow::anyhow!("server.key must hold 32 bytes"))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut key = [0u8; 32];
                crate::ids::fill_random(&mut key);
                write_private(&path, &hex(&key))?;
                key
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Ok(Ledger { key })
    }

    /// A ledger under a given server key (64 hex): `server_key` in the
    /// config, or the shared store's.
    pub fn from_hex(hex: &str) -> Result<Ledger> {
        let bytes = decode_hex(hex.trim()).context("the server key is not 64 hex characters")?;
        let key = <[u8; 32]>::try_from(bytes.as_slice())
            .map_err(|_| anyhow::anyhow!("the server key must hold 32 bytes"))?;
        Ok(Ledger { key })
    }

    /// The key itself, 64 lower-case hex (for its check digest).
    pub fn key_hex(&self) -> String {
        hex(&self.key)
    }

    /// The secret hex derived from `purpose`.
    pub fn derive(&self, purpose: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        mac.update(purpose);
        hex(&mac.finalize().into_bytes())
    }

    /// Mint a new random secret worth `units` (operator action).
    pub fn mint(&self, txn: &WriteTxn, units: u64) -> Result<String> {
        anyhow::ensure!(units > 0, "amount must be positive");
        let mut raw = [0u8; 32];
        crate::ids::fill_random(&mut raw);
        let secret_hex = hex(&raw);
        self.create(txn, &public_hash(&secret_hex), units)?;
        add_total(txn, "minted", units as i128)?;
        Ok(secret::secret_string(units, &secret_hex))
    }

    /// Mint a secret worth `units`; with the operator's `key`, derived
    /// from it (HMAC under the server key, as change and payouts are), so
    /// a repeat of the same key and amount, a retry after an answer that
    /// was lost, returns the same secret and mints nothing more; the same
    /// key with another amount is [`MintKeyReused`], nothing minted. A key
    /// is 1 to 128 of `A-Z a-z 0-9 _ - . :` ([`mint_key_problem`]).
    /// Returns the secret and whether it was minted now (false for a
    /// repeat).
    pub fn mint_with_key(
        &self,
        txn: &WriteTxn,
        units: u64,
        key: Option<&str>,
    ) -> Result<(String, bool)> {
        let Some(key) = key else {
            return Ok((self.mint(txn, units)?, true));
        };
        anyhow::ensure!(units > 0, "amount must be positive");
        if let Some(problem) = mint_key_problem(key) {
            anyhow::bail!("idempotency_key {problem}");
        }
        // A space: no family's escrow purpose (`{family}:...`) nor change's
        // (`change:...`) can be the same text.
        let purpose = format!("admin mint:{key}");
        match txn.get_in(MINT_KEYS, key.as_bytes())? {
            Some(v) => {
                let first = u64::from_be_bytes(
                    v.as_slice()
                        .try_into()
                        .context("a mint key's record is 8 bytes")?,
                );
                if first != units {
                    return Err(MintKeyReused { first }.into());
                }
                // Its secret is derived again; outputs are never removed, so
                // one not found was minted under another server key (a lost
                // server.key made anew): a repeat would mint a second one.
                let public = public_hash(&self.issued_hex(&purpose, units));
                if txn.get_in(OUTPUTS, public.as_bytes())?.is_none() {
                    return Err(MintKeyOtherServerKey.into());
                }
            }
            // A key minted with before keys were recorded has no row: its
            // repeat with the same amount still finds its output.
            None => txn.put_in(MINT_KEYS, key.as_bytes(), &units.to_be_bytes())?,
        }
        let (secret, created) = self.issue(txn, &purpose, units)?;
        if created {
            add_total(txn, "minted", units as i128)?;
        }
        Ok((secret, created))
    }

    /// The secret hex [`Ledger::issue`] derives for `purpose` and `units`.
    fn issued_hex(&self, purpose: &str, units: u64) -> String {
        self.derive(format!("{purpose}:{units}").as_bytes())
    }

    /// Create an unspent output; false when it already exists.
    fn create(&self, txn: &WriteTxn, public: &str, units: u64) -> Result<bool> {
        if txn.get_in(OUTPUTS, public.as_bytes())?.is_some() {
            return Ok(false);
        }
        let out = Output {
            amount: units,
            spent: false,
        };
        txn.put_in(OUTPUTS, public.as_bytes(), &encode(out))?;
        Ok(true)
    }

    /// Issue a server-derived secret worth `units` for `purpose`; a repeat
    /// returns the same secret. Returns (secret, newly created).
    pub fn issue(&self, txn: &WriteTxn, purpose: &str, units: u64) -> Result<(String, bool)> {
        let secret_hex = self.issued_hex(purpose, units);
        let created = self.create(txn, &public_hash(&secret_hex), units)?;
        Ok((secret::secret_string(units, &secret_hex), created))
    }

    /// Check a secret string against the ledger (not spending it).
    pub fn check(&self, kv: &impl Kv, secret_str: &str) -> Result<(String, u64), SecretError> {
        let parsed = secret::parse(secret_str).map_err(SecretError::Malformed)?;
        if parsed.kind != secret::Kind::Secret {
            return Err(SecretError::Malformed(
                "a public hash cannot pay; send the secret".into(),
            ));
        }
        let public = public_hash(&parsed.hex);
        let out = kv
            .get_in(OUTPUTS, public.as_bytes())
            .map_err(|e| SecretError::Storage(e.to_string()))?
            .map(|v| decode(&v))
            .ok_or(SecretError::Unknown)?;
        if out.amount != parsed.amount {
            return Err(SecretError::AmountMismatch);
        }
        if out.spent {
            return Err(SecretError::Spent);
        }
        Ok((public, out.amount))
    }

    /// Mark an output spent.
    pub fn spend(&self, txn: &WriteTxn, public: &str) -> Result<()> {
        let out = txn
            .get_in(OUTPUTS, public.as_bytes())?
            .map(|v| decode(&v))
            .context("spending an unknown output")?;
        txn.put_in(
            OUTPUTS,
            public.as_bytes(),
            &encode(Output { spent: true, ..out }),
        )?;
        Ok(())
    }

    /// Webcash `replace`: spend every input, create every output, atomically.
    /// A refusal is the 400's field (`webcashes`: the inputs, or both
    /// lists; `new_webcashes`: the outputs and their total) and problem.
    pub fn replace(
        &self,
        txn: &WriteTxn,
        inputs: &[String],
        outputs: &[String],
    ) -> Result<(), LedgerError> {
        let input = |m: String| LedgerError::Refused("webcashes", m);
        let output = |m: String| LedgerError::Refused("new_webcashes", m);
        if inputs.is_empty() || outputs.is_empty() {
            let field = if inputs.is_empty() { input } else { output };
            return Err(field(
                "webcashes and new_webcashes must both be non-empty (or both empty, a replace of nothing)".into(),
            ));
        }
        if inputs.len() > MAX_REPLACE {
            return Err(input(format!("at most {MAX_REPLACE} inputs")));
        }
        if outputs.len() > MAX_REPLACE {
            return Err(output(format!("at most {MAX_REPLACE} outputs")));
        }
        let internal = |e: &dyn std::fmt::Display| LedgerError::Storage(e.to_string());
        let mut seen = HashSet::new();
        let mut total_in: u128 = 0;
        let mut spend = Vec::new();
        {
            for s in inputs {
                let (public, units) = self.check(txn, s).map_err(|e| {
                    input(match e {
                        SecretError::Storage(m) => return LedgerError::Storage(m),
                        SecretError::Malformed(m) => format!("input {s:.20}...: {m}"),
                        SecretError::Unknown => "an input is not known to this ledger".into(),
                        SecretError::Spent => "an input is already spent".into(),
                        SecretError::AmountMismatch => {
                            "an input's amount does not match the ledger".into()
                        }
                    })
                })?;
                if !seen.insert(public.clone()) {
                    return Err(input("duplicate input".into()));
                }
                total_in += units as u128;
                spend.push(public);
            }
        }
        let mut total_out: u128 = 0;
        let mut create = Vec::new();
        let mut seen_out = HashSet::new();
        {
            for s in outputs {
                let parsed = secret::parse(s).map_err(|m| output(format!("output: {m}")))?;
                if parsed.kind != secret::Kind::Secret {
                    return Err(output("outputs must be secrets".into()));
                }
                let public = public_hash(&parsed.hex);
                if !seen_out.insert(public.clone()) {
                    return Err(output("duplicate output".into()));
                }
                if seen.contains(&public) {
                    return Err(output(
                        "an output reuses an input's secret: an output must be a new secret".into(),
                    ));
                }
                if txn
                    .get_in(OUTPUTS, public.as_bytes())
                    .map_err(|e| internal(&e))?
                    .is_some()
                {
                    return Err(output("an output already exists".into()));
                }
                total_out += parsed.amount as u128;
                create.push((public, parsed.amount));
            }
        }
        if total_in != total_out {
            return Err(output(format!(
                "input total {} does not equal output total {}",
                amount::format_sum(total_in),
                amount::format_sum(total_out)
            )));
        }
        for public in &spend {
            self.spend(txn, public).map_err(|e| internal(&e))?;
        }
        for (public, units) in &create {
            self.create(txn, public, *units).map_err(|e| internal(&e))?;
        }
        Ok(())
    }

    /// Webcash `health_check`: state of each public string, in the order
    /// of the request (a repeated entry at its first place): wallets
    /// recover their key depth from the last entries.
    pub fn health_check(
        &self,
        kv: &impl Kv,
        publics: &[String],
    ) -> Result<Vec<(String, Value)>, LedgerError> {
        let refused = |m: String| LedgerError::Refused("body", m);
        if publics.len() > MAX_HEALTH_CHECK {
            return Err(refused(format!("at most {MAX_HEALTH_CHECK} entries")));
        }
        let mut results: Vec<(String, Value)> = Vec::with_capacity(publics.len());
        let mut seen = HashSet::new();
        for p in publics {
            let parsed = secret::parse(p).map_err(|m| refused(format!("{p:.24}: {m}")))?;
            let public = match parsed.kind {
                secret::Kind::Public => parsed.hex.clone(),
                secret::Kind::Secret => public_hash(&parsed.hex),
            };
            let state = kv
                .get_in(OUTPUTS, public.as_bytes())
                .map_err(|e| LedgerError::Storage(e.to_string()))?
                .map(|v| decode(&v));
            let key = secret::public_string(parsed.amount, &public);
            if !seen.insert(key.clone()) {
                continue;
            }
            results.push((
                key,
                match state {
                    Some(o) => json!({"spent": o.spent, "amount": amount::format(o.amount)}),
                    None => json!({"spent": null, "amount": null}),
                },
            ));
        }
        Ok(results)
    }

    /// The stored response of an identical earlier paid request, its
    /// secrets derived again. An answer whose secrets can no longer be
    /// derived (the server key changed) is a 409 rather than a new secret.
    /// One recorded before `since_ms` is past the retry horizon: gone,
    /// whether or not retention has swept it yet (a record of the oldest
    /// versions, with no time, stays until it is swept).
    pub fn replay(
        &self,
        kv: &impl Kv,
        key: &[u8; 32],
        since_ms: u64,
    ) -> Option<crate::reply::Reply> {
        let record = kv.get_in(REPLAYS, key).ok()??;
        let stored = match decode_pointer(&record) {
            Some(at_ms) if at_ms < since_ms => return None,
            Some(at_ms) => kept_answer(kv, at_ms, key)?,
            None => decode_reply(&record)?,
        };
        if stored.at_ms.is_some_and(|at| at < since_ms) {
            return None;
        }
        Some(self.restore(stored))
    }

    /// [`Ledger::replay`] for a request that presented the secret with
    /// public hash `public` (`key` is made from it): an answer kept with
    /// that secret's output first (see [`Ledger::record_paid_replay_at`]).
    pub fn replay_paid(
        &self,
        kv: &impl Kv,
        public: &str,
        key: &[u8; 32],
        since_ms: u64,
    ) -> Option<crate::reply::Reply> {
        let kept = kv
            .get_in(OUTPUTS, public.as_bytes())
            .ok()
            .flatten()
            .and_then(|o| kept_at(&o))
            .filter(|at_ms| *at_ms >= since_ms)
            .and_then(|at_ms| kept_answer(kv, at_ms, key));
        match kept {
            Some(stored) => Some(self.restore(stored)),
            None => self.replay(kv, key, since_ms),
        }
    }

    /// A stored answer with its secrets derived again; an answer whose
    /// secrets can no longer be derived is a 409.
    fn restore(&self, stored: StoredReply) -> crate::reply::Reply {
        let mut reply = stored.reply;
        for (i, d) in stored.issued.iter().enumerate() {
            let Some(secret) = d.derive(self) else {
                tracing::error!(
                    "a stored answer's secret cannot be derived again: the server key changed"
                );
                return crate::reply::Reply::error(
                    409,
                    "conflict",
                    "this paid request was answered before, and its answer can no longer be shown",
                );
            };
            let mark = placeholder(&stored.nonce, i);
            reply.body = replace_bytes(&reply.body, mark.as_bytes(), secret.as_bytes());
            for (_, v) in reply.headers.iter_mut() {
                *v = v.replace(&mark, &secret);
            }
        }
        reply
    }

    /// Record the response of a paid request for identical retries: each
    /// secret in `issued` (as `(secret, derivation)`) is replaced by a mark
    /// and kept only as its derivation. Recorded at `now_ms` (host clock):
    /// the answer goes in `cash:replays-by-time` under that time, so
    /// retention finds it once it is older than the retry horizon, and the
    /// replay key points at it.
    pub fn record_replay_at(
        txn: &WriteTxn,
        key: &[u8; 32],
        reply: &crate::reply::Reply,
        issued: &[(String, Derivation)],
        now_ms: u64,
    ) -> Result<()> {
        txn.put_in(REPLAYS, key, &encode_pointer(now_ms))?;
        keep_answer(txn, key, reply, issued, now_ms)
    }

    /// [`Ledger::record_replay_at`] for a request paid with the secret of
    /// public hash `public` (`key` is made from it): when that secret was
    /// spent from this ledger (in this transaction), its output records the
    /// time instead of a `cash:replays` record.
    pub fn record_paid_replay_at(
        txn: &WriteTxn,
        public: &str,
        key: &[u8; 32],
        reply: &crate::reply::Reply,
        issued: &[(String, Derivation)],
        now_ms: u64,
    ) -> Result<()> {
        match txn.get_in(OUTPUTS, public.as_bytes())?.map(|v| decode(&v)) {
            Some(out) if out.spent => {
                txn.put_in(OUTPUTS, public.as_bytes(), &encode_kept(out, now_ms))?;
                keep_answer(txn, key, reply, issued, now_ms)
            }
            // Paid at an upstream server: not an output of this ledger.
            _ => Self::record_replay_at(txn, key, reply, issued, now_ms),
        }
    }

    /// Totals for the conservation invariant (scans every output).
    pub fn totals(kv: &impl Kv) -> Result<Totals> {
        let mut unspent = 0u64;
        for (_, v) in kv.scan_in(OUTPUTS, b"", None, false, usize::MAX)? {
            let o = decode(&v);
            if !o.spent {
                unspent += o.amount;
            }
        }
        Ok(Totals {
            minted: total(kv, "minted")?,
            fees: total(kv, "fees")?,
            escrow: total(kv, "escrow")?,
            unspent,
        })
    }
}

/// A mint idempotency key sent again with another amount than its first
/// mint's: refused (409 `idempotency_conflict` from the admin API), nothing
/// minted.
#[derive(Debug)]
pub struct MintKeyReused {
    /// The units the key first minted.
    pub first: u64,
}

impl std::fmt::Display for MintKeyReused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "this idempotency_key already minted {}: a key names one mint; use another key for another amount",
            marketplace_common::amount::format(self.first)
        )
    }
}

impl std::error::Error for MintKeyReused {}

/// A mint idempotency key sent again after the server key changed: its
/// first mint's secret was derived under the earlier key, so this key
/// cannot give it back, and minting another would mint the amount twice:
/// refused (409 `idempotency_conflict` from the admin API), nothing minted.
#[derive(Debug)]
pub struct MintKeyOtherServerKey;

impl std::fmt::Display for MintKeyOtherServerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "this idempotency_key minted under another server key (this database's server.key was lost and made anew, or replaced), so its secret cannot be given again and another would mint the amount twice: put back the key it minted under, or use another idempotency key",
        )
    }
}

impl std::error::Error for MintKeyOtherServerKey {}

/// A named total that a change would take below zero or past `u64::MAX`
/// units: the change is refused (a mint too large for the ledger is the
/// operator's 400, not an internal error).
#[derive(Debug)]
pub struct OutOfRange(String);

impl std::fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OutOfRange {}

/// Add `delta` to a named total (refusing to go below zero or past
/// `u64::MAX`: [`OutOfRange`]).
///
/// On a shared store every paid request of the fleet adds to `fees` or
/// `escrow`: one row would make any two hosts' batches conflict. There each
/// host adds to a shard of its own (`<name>#<shard>`, a signed i128 BE:
/// escrow held on one host may be released through another's), and the total is
/// the plain row plus every shard ([`total`]). An increase of `fees` or
/// `escrow` is bounded by what was minted (the conservation invariant), so
/// it reads only its shard; a decrease, or a mint, reads the whole total
/// to check its range (rarer requests, which may then race other hosts').
pub fn add_total(txn: &WriteTxn, name: &str, delta: i128) -> Result<()> {
    let out_of_range = |next: i128| OutOfRange(format!("{name} would become {next}"));
    // The total after the change, refused out of range.
    let after = |now: u64| {
        let next = now as i128 + delta;
        u64::try_from(next).map_err(|_| out_of_range(next))
    };
    let Some(shard) = txn.counter_shard() else {
        // The embedded store never has shards.
        let next = after(plain_total(txn, name)?)?;
        txn.put_in(TOTALS, name.as_bytes(), &next.to_be_bytes())?;
        return Ok(());
    };
    if delta < 0 || name == "minted" {
        after(total(txn, name)?)?;
    }
    let key = shard_key(name, shard);
    let mine = match txn.get_in(TOTALS, &key)? {
        Some(v) => i128::from_be_bytes(v.as_slice().try_into().context("a shard is 16 bytes")?),
        None => 0,
    };
    let next = mine.checked_add(delta).ok_or_else(|| out_of_range(mine))?;
    txn.put_in(TOTALS, &key, &next.to_be_bytes())?;
    Ok(())
}

/// The row of a total's shard: the name, `#`, the shard in hex.
fn shard_key(name: &str, shard: u16) -> Vec<u8> {
    format!("{name}#{shard:04x}").into_bytes()
}

/// The row of a named total (all of it on the embedded store).
fn plain_total(kv: &impl Kv, name: &str) -> Result<u64> {
    Ok(match kv.get_in(TOTALS, name.as_bytes())? {
        Some(v) => u64::from_be_bytes(v.as_slice().try_into().context("a total is 8 bytes")?),
        None => 0,
    })
}

/// Read a named total: its row, plus its shards on a shared store.
pub fn total(kv: &impl Kv, name: &str) -> Result<u64> {
    let mut sum = plain_total(kv, name)? as i128;
    // `#`..`$`: every `<name>#...` row.
    let (start, end) = (format!("{name}#"), format!("{name}$"));
    for (_, v) in kv.scan_in(
        TOTALS,
        start.as_bytes(),
        Some(end.as_bytes()),
        false,
        usize::MAX,
    )? {
        let shard = i128::from_be_bytes(v.as_slice().try_into().context("a shard is 16 bytes")?);
        sum = sum
            .checked_add(shard)
            .context("a total's rows add up past i128")?;
    }
    u64::try_from(sum).map_err(|_| anyhow::anyhow!("the {name} total's rows add up to {sum}"))
}

/// A kept answer: secrets replaced by marks `{nonce}-{i}`.
#[derive(Debug, Clone, PartialEq)]
struct StoredReply {
    reply: crate::reply::Reply,
    nonce: String,
    issued: Vec<Derivation>,
    /// When it was recorded (host clock, ms); None in older records.
    at_ms: Option<u64>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct StoredMeta {
    headers: Vec<(String, String)>,
    nonce: String,
    issued: Vec<Derivation>,
    /// Absent in records written before retention existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at_ms: Option<u64>,
}

/// When a [`REPLAYS`] record was recorded (ms): a pointer's time, or an
/// older version's stored reply's, from its metadata alone; None for a
/// record of the oldest versions (no time) or one that does not decode.
pub fn replay_recorded_ms(record: &[u8]) -> Option<u64> {
    if let Some(at_ms) = decode_pointer(record) {
        return Some(at_ms);
    }
    #[derive(serde::Deserialize)]
    struct Time {
        #[serde(default)]
        at_ms: Option<u64>,
    }
    let mlen = u32::from_be_bytes(record.get(2..6)?.try_into().ok()?) as usize;
    serde_json::from_slice::<Time>(record.get(6..6usize.checked_add(mlen)?)?)
        .ok()?
        .at_ms
}

fn placeholder(nonce: &str, i: usize) -> String {
    format!("@@secret:{nonce}:{i}@@")
}

/// `hay` with every occurrence of `from` (non-overlapping, left to right)
/// replaced by `to`.
pub(crate) fn replace_bytes(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    replace_found(&Searcher::new(from, hay.len()), hay, to)
}

/// Longest text a [`Searcher`] scans from each place the needle's first
/// byte is, rather than with a `memmem::Finder`.
const SCAN_BYTES: usize = 16 << 10;

/// Finds a secret in a paid answer. Building a `memmem::Finder` for a
/// secret of 70-odd bytes costs about ten times searching an answer of a
/// few hundred bytes from each of its first byte's places (measured, 0.43
/// µs against 0.04, twice per paid post); a text longer than
/// [`SCAN_BYTES`], which a component could fill with that byte, gets the
/// finder's linear time.
enum Searcher<'n> {
    Scan(&'n [u8]),
    Finder(Box<memchr::memmem::Finder<'n>>),
}

impl<'n> Searcher<'n> {
    /// A searcher for `needle` in texts of about `hay_len` bytes.
    fn new(needle: &'n [u8], hay_len: usize) -> Searcher<'n> {
        if hay_len > SCAN_BYTES {
            Searcher::Finder(Box::new(memchr::memmem::Finder::new(needle)))
        } else {
            Searcher::Scan(needle)
        }
    }

    fn needle(&self) -> &[u8] {
        match self {
            Searcher::Scan(n) => n,
            Searcher::Finder(f) => f.needle(),
        }
    }

    /// Where the needle (not empty) first is in `hay`.
    fn find(&self, hay: &[u8]) -> Option<usize> {
        let needle = match self {
            Searcher::Finder(f) => return f.find(hay),
            Searcher::Scan(n) => *n,
        };
        let mut at = 0;
        while let Some(i) = memchr::memchr(*needle.first()?, &hay[at..]) {
            if hay[at + i..].starts_with(needle) {
                return Some(at + i);
            }
            at += i + 1;
        }
        None
    }
}

/// [`replace_bytes`] of what `searcher` looks for.
fn replace_found(searcher: &Searcher<'_>, hay: &[u8], to: &[u8]) -> Vec<u8> {
    let from = searcher.needle().len();
    if from == 0 {
        return hay.to_vec();
    }
    let mut out = Vec::with_capacity(hay.len());
    let mut done = 0;
    while let Some(at) = searcher.find(&hay[done..]) {
        out.extend_from_slice(&hay[done..done + at]);
        out.extend_from_slice(to);
        done += at + from;
    }
    out.extend_from_slice(&hay[done..]);
    out
}

/// Keep `reply` under `cash:replays-by-time` at `now_ms`: each secret in
/// `issued` (as `(secret, derivation)`) replaced by a mark, kept only as
/// its derivation.
fn keep_answer(
    txn: &WriteTxn,
    key: &[u8; 32],
    reply: &crate::reply::Reply,
    issued: &[(String, Derivation)],
    now_ms: u64,
) -> Result<()> {
    let mut raw = [0u8; 12];
    crate::ids::fill_random(&mut raw);
    let nonce = hex(&raw);
    let mut kept = reply.clone();
    for (i, (secret, _)) in issued.iter().enumerate() {
        let mark = placeholder(&nonce, i);
        // One searcher for the body and every header; headers without the
        // secret are left as they are.
        let longest = kept.headers.iter().map(|(_, v)| v.len());
        let searcher = Searcher::new(secret.as_bytes(), longest.fold(kept.body.len(), usize::max));
        kept.body = replace_found(&searcher, &kept.body, mark.as_bytes());
        for (_, v) in kept.headers.iter_mut() {
            if searcher.find(v.as_bytes()).is_some() {
                // ASCII replaced by ASCII: the value stays UTF-8.
                let bytes = replace_found(&searcher, v.as_bytes(), mark.as_bytes());
                *v = String::from_utf8(bytes)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
            }
        }
    }
    let stored = StoredReply {
        reply: kept,
        nonce,
        issued: issued.iter().map(|(_, d)| d.clone()).collect(),
        at_ms: Some(now_ms),
    };
    txn.put_in(
        REPLAYS_BY_TIME,
        &crate::store::time_key(now_ms, key),
        &encode_reply(&stored),
    )?;
    Ok(())
}

/// The answer kept for `key` at `at_ms`, if it is still there.
fn kept_answer(kv: &impl Kv, at_ms: u64, key: &[u8; 32]) -> Option<StoredReply> {
    decode_reply(
        &kv.get_in(REPLAYS_BY_TIME, &crate::store::time_key(at_ms, key))
            .ok()??,
    )
}

fn encode_reply(r: &StoredReply) -> Vec<u8> {
    let meta = serde_json::to_vec(&StoredMeta {
        headers: r.reply.headers.clone(),
        nonce: r.nonce.clone(),
        issued: r.issued.clone(),
        at_ms: r.at_ms,
    })
    .unwrap_or_default();
    let mut out = Vec::with_capacity(6 + meta.len() + r.reply.body.len());
    out.extend_from_slice(&r.reply.status.to_be_bytes());
    out.extend_from_slice(&(meta.len() as u32).to_be_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(&r.reply.body);
    out
}

fn decode_reply(b: &[u8]) -> Option<StoredReply> {
    let status = u16::from_be_bytes(b.get(..2)?.try_into().ok()?);
    let mlen = u32::from_be_bytes(b.get(2..6)?.try_into().ok()?) as usize;
    let meta: StoredMeta = serde_json::from_slice(b.get(6..6 + mlen)?).ok()?;
    Some(StoredReply {
        reply: crate::reply::Reply {
            status,
            headers: meta.headers,
            body: b.get(6 + mlen..)?.to_vec(),
        },
        nonce: meta.nonce,
        issued: meta.issued,
        at_ms: meta.at_ms,
    })
}

/// Write a file readable by the owner only.
pub fn write_private(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    Ok(())
}

/// What a successful charge took.
#[derive(Debug, Clone)]
pub struct Charge {
    pub action: String,
    pub price: u64,
    pub paid: u64,
    /// Public hash of the spent input (empty for a free action).
    pub public: String,
    pub change: Option<String>,
    /// How to derive the change secret again (kept instead of it).
    pub change_derivation: Option<Derivation>,
}

/// Key of a paid request's replay record: the same input (`public`),
/// method, path and body bytes.
pub fn replay_key(public: &str, method: &str, path: &str, body: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let mut h = Sha256::new();
    h.update(public.as_bytes());
    h.update([0]);
    h.update(method.as_bytes());
    h.update([0]);
    h.update(path.as_bytes());
    h.update([0]);
    h.update(Sha256::digest(body));
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, crate::store::Storage, Ledger) {
        let (dir, db) = crate::store::temp_storage();
        let l = Ledger::open(dir.path()).unwrap();
        (dir, db, l)
    }

    fn hexes(seed: u8) -> String {
        format!("{seed:02x}").repeat(32)
    }

    #[test]
    fn server_key_is_private_and_stable() {
        let (dir, _db, l) = setup();
        let again = Ledger::open(dir.path()).unwrap();
        assert_eq!(l.derive(b"x"), again.derive(b"x"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("server.key"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    use crate::store::StorageError;

    /// A store whose every read fails.
    struct Broken;
    impl Kv for Broken {
        fn get_in(&self, _: &str, _: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
            Err(StorageError::Internal("disk gone".into()))
        }
        fn get_many_into(
            &self,
            _: &str,
            _: &[Vec<u8>],
            _: usize,
            _: &mut dyn crate::store::ValueSink,
        ) -> Result<(), StorageError> {
            Err(StorageError::Internal("disk gone".into()))
        }
        fn scan_into(
            &self,
            _: &str,
            _: &[u8],
            _: Option<&[u8]>,
            _: bool,
            _: usize,
            _: usize,
            _: &mut dyn crate::store::RowSink,
        ) -> Result<(), StorageError> {
            Err(StorageError::Internal("disk gone".into()))
        }
    }

    #[test]
    fn a_failing_store_is_not_the_callers_fault() {
        // A storage failure while checking a secret or a health check is
        // the server's (500), not a malformed secret or body (400).
        let (_dir, _db, l) = setup();
        let s = secret::secret_string(5, &hexes(9));
        assert!(matches!(l.check(&Broken, &s), Err(SecretError::Storage(_))));
        assert!(matches!(
            l.check(&Broken, "not a secret"),
            Err(SecretError::Malformed(_))
        ));
        assert!(matches!(
            l.health_check(&Broken, &[s]),
            Err(LedgerError::Storage(_))
        ));
        assert!(matches!(
            l.health_check(&Broken, &["junk".into()]),
            Err(LedgerError::Refused("body", _))
        ));
    }

    /// A mint key's repeat under another server key (a lost `server.key`
    /// made anew) cannot give its secret back, and mints nothing.
    #[test]
    fn a_mint_key_under_another_server_key_mints_nothing() {
        let (_d, db, l) = setup();
        let txn = db.begin_write().unwrap();
        let (secret, created) = l.mint_with_key(&txn, 200, Some("k1")).unwrap();
        assert!(created);
        let other = Ledger::from_hex(&hexes(9)).unwrap();
        let err = other.mint_with_key(&txn, 200, Some("k1")).unwrap_err();
        assert!(
            err.downcast_ref::<MintKeyOtherServerKey>().is_some(),
            "{err}"
        );
        // Another amount is still the reused key's refusal.
        let err = other.mint_with_key(&txn, 300, Some("k1")).unwrap_err();
        assert!(err.downcast_ref::<MintKeyReused>().is_some(), "{err}");
        assert_eq!(total(&txn, "minted").unwrap(), 200);
        // Under its own key, the same secret again, nothing minted.
        assert_eq!(
            l.mint_with_key(&txn, 200, Some("k1")).unwrap(),
            (secret, false)
        );
        assert_eq!(total(&txn, "minted").unwrap(), 200);
    }

    #[test]
    fn replace_conserves_and_refuses() {
        let (_d, db, l) = setup();
        let txn = db.begin_write().unwrap();
        let s = l.mint(&txn, 100).unwrap();
        let out_a = secret::secret_string(60, &hexes(1));
        let out_b = secret::secret_string(40, &hexes(2));
        assert!(
            l.replace(&txn, std::slice::from_ref(&s), std::slice::from_ref(&out_a))
                .is_err(),
            "unequal sums"
        );
        assert!(
            l.replace(
                &txn,
                &[s.clone(), s.clone()],
                &[out_a.clone(), out_b.clone()]
            )
            .is_err(),
            "dup input"
        );
        assert!(
            l.replace(
                &txn,
                std::slice::from_ref(&s),
                &[out_a.clone(), out_a.clone()]
            )
            .is_err(),
            "dup output"
        );
        l.replace(
            &txn,
            std::slice::from_ref(&s),
            &[out_a.clone(), out_b.clone()],
        )
        .unwrap();
        assert!(
            l.replace(
                &txn,
                std::slice::from_ref(&s),
                &[secret::secret_string(100, &hexes(3))]
            )
            .is_err(),
            "spent"
        );
        // An existing output cannot be created again.
        assert!(
            l.replace(
                &txn,
                std::slice::from_ref(&out_a),
                std::slice::from_ref(&out_b)
            )
            .is_err()
        );
        db.commit(txn).unwrap();
        let t = Ledger::totals(&db.begin_read().unwrap()).unwrap();
        assert_eq!((t.minted, t.unspent), (100, 100));
    }

    #[test]
    fn too_long_a_list_is_the_field_of_that_list() {
        let (_d, db, l) = setup();
        let txn = db.begin_write().unwrap();
        let s = l.mint(&txn, 101).unwrap();
        let many = |first: u8| -> Vec<String> {
            (0..=MAX_REPLACE as u8)
                .map(|i| secret::secret_string(1, &hexes(first.wrapping_add(i))))
                .collect()
        };
        let field = |r: Result<(), LedgerError>| match r {
            Err(LedgerError::Refused(field, _)) => field,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert_eq!(
            field(l.replace(&txn, std::slice::from_ref(&s), &many(0))),
            "new_webcashes"
        );
        assert_eq!(
            field(l.replace(&txn, &many(0), std::slice::from_ref(&s))),
            "webcashes"
        );
    }

    #[test]
    fn replace_bytes_replaces_every_occurrence() {
        assert_eq!(replace_bytes(b"a-xx-b-xx", b"xx", b"Y"), b"a-Y-b-Y");
        assert_eq!(replace_bytes(b"xxx", b"xx", b"Y"), b"Yx");
        assert_eq!(replace_bytes(b"abc", b"", b"Y"), b"abc");
        assert_eq!(replace_bytes(b"abc", b"zz", b"Y"), b"abc");
        assert_eq!(replace_bytes(b"", b"zz", b"Y"), b"");
    }

    proptest::proptest! {
        /// Both searchers (the scan of short texts, the finder of long
        /// ones) replace what a plain split-and-join does, on texts of few
        /// letters (many near misses and overlaps).
        #[test]
        fn both_searchers_replace_as_split_and_join(
            hay in "[ab:]{0,64}",
            from in "[ab:]{1,4}",
            long in proptest::bool::ANY,
        ) {
            let hay = hay.as_bytes();
            let expected = String::from_utf8_lossy(hay)
                .split(from.as_str())
                .collect::<Vec<_>>()
                .join("Y");
            let len = if long { SCAN_BYTES + 1 } else { hay.len() };
            let got = replace_found(&Searcher::new(from.as_bytes(), len), hay, b"Y");
            proptest::prop_assert_eq!(String::from_utf8(got).unwrap(), expected);
        }
    }

    #[test]
    fn issue_is_idempotent() {
        let (_d, db, l) = setup();
        let txn = db.begin_write().unwrap();
        let (a, new_a) = l.issue(&txn, "payout:CTR_1", 5).unwrap();
        let (b, new_b) = l.issue(&txn, "payout:CTR_1", 5).unwrap();
        assert_eq!(a, b);
        assert!(new_a && !new_b);
        assert_eq!(l.check(&txn, &a).unwrap().1, 5);
    }

    #[test]
    fn kept_answers_hold_no_secret_and_replay_whole() {
        let (_d, db, l) = setup();
        let txn = db.begin_write().unwrap();
        let (change, _) = l.issue(&txn, "change:abc", 7).unwrap();
        let d = Derivation {
            purpose: "change:abc:7".into(),
            amount: Some(7),
            public: public_hash(&secret::parse(&change).unwrap().hex),
        };
        let r = crate::reply::Reply {
            status: 201,
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("x-cash-change".into(), change.clone()),
            ],
            body: format!("{{\"payment\":{{\"change\":\"{change}\"}}}}").into_bytes(),
        };
        let key = [9u8; 32];
        Ledger::record_replay_at(&txn, &key, &r, &[(change.clone(), d)], 1_000).unwrap();
        let pointer = txn.get_in(REPLAYS, &key).unwrap().unwrap();
        assert_eq!(replay_recorded_ms(&pointer), Some(1_000));
        let raw = txn
            .get_in(REPLAYS_BY_TIME, &crate::store::time_key(1_000, &key))
            .unwrap()
            .unwrap();
        let hexpart = &change[change.len() - 64..];
        assert!(!String::from_utf8_lossy(&raw).contains(hexpart));
        assert_eq!(l.replay(&txn, &key, 0), Some(r.clone()));
        // A record of the previous layout (the reply under its key, an
        // empty index entry) still answers.
        txn.put_in(REPLAYS, &key, &raw).unwrap();
        txn.put_in(REPLAYS_BY_TIME, &crate::store::time_key(1_000, &key), b"")
            .unwrap();
        assert_eq!(replay_recorded_ms(&raw), Some(1_000));
        assert_eq!(l.replay(&txn, &key, 0), Some(r));
        // A pointer whose answer is gone answers nothing.
        txn.put_in(REPLAYS, &key, &encode_pointer(2_000)).unwrap();
        assert_eq!(l.replay(&txn, &key, 0), None);
    }

    #[test]
    fn a_paid_answer_rides_on_the_spent_output() {
        let (_d, db, l) = setup();
        let txn = db.begin_write().unwrap();
        let paid = l.mint(&txn, 10).unwrap();
        let public = public_hash(&secret::parse(&paid).unwrap().hex);
        let (change, _) = l.issue(&txn, &format!("change:{public}"), 3).unwrap();
        let d = Derivation {
            purpose: format!("change:{public}:3"),
            amount: Some(3),
            public: public_hash(&secret::parse(&change).unwrap().hex),
        };
        let r = crate::reply::Reply {
            status: 201,
            headers: vec![],
            body: format!("{{\"change\":\"{change}\"}}").into_bytes(),
        };
        let key = replay_key(&public, "POST", "/api/x", b"{}");
        let other = replay_key(&public, "POST", "/api/x", b"{ }");
        l.spend(&txn, &public).unwrap();
        Ledger::record_paid_replay_at(&txn, &public, &key, &r, &[(change.clone(), d)], 5_000)
            .unwrap();
        // No row under the retry's key; the output says when.
        assert_eq!(txn.get_in(REPLAYS, &key).unwrap(), None);
        let out = txn.get_in(OUTPUTS, public.as_bytes()).unwrap().unwrap();
        assert_eq!(kept_at(&out), Some(5_000));
        assert_eq!(
            decode(&out),
            Output {
                amount: 10,
                spent: true
            }
        );
        db.commit(txn).unwrap();

        let view = db.begin_read().unwrap();
        assert_eq!(l.replay_paid(&view, &public, &key, 0), Some(r.clone()));
        // Up to the retry horizon, not past it, swept or not.
        assert_eq!(l.replay_paid(&view, &public, &key, 5_000), Some(r.clone()));
        assert_eq!(l.replay_paid(&view, &public, &key, 5_001), None);
        // Another request with the same secret has no answer kept; nor does
        // a lookup by key alone.
        assert_eq!(l.replay_paid(&view, &public, &other, 0), None);
        assert_eq!(l.replay(&view, &key, 0), None);
        // Still spent; the ledger's sums read the longer record.
        assert!(matches!(l.check(&view, &paid), Err(SecretError::Spent)));
        let t = Ledger::totals(&view).unwrap();
        assert_eq!((t.minted, t.unspent), (10, 3));
        // The raw rows hold no secret.
        let answer = view
            .get_in(REPLAYS_BY_TIME, &crate::store::time_key(5_000, &key))
            .unwrap()
            .unwrap();
        assert!(!String::from_utf8_lossy(&answer).contains(&change[change.len() - 64..]));
    }

    #[test]
    fn a_secret_not_of_this_ledger_keeps_its_answer_under_its_key() {
        let (_d, db, l) = setup();
        let txn = db.begin_write().unwrap();
        let public = "ab".repeat(32);
        let key = replay_key(&public, "POST", "/api/x", b"");
        let r = crate::reply::Reply::json(201, &serde_json::json!({"id": "p1"}));
        Ledger::record_paid_replay_at(&txn, &public, &key, &r, &[], 7_000).unwrap();
        assert_eq!(
            replay_recorded_ms(&txn.get_in(REPLAYS, &key).unwrap().unwrap()),
            Some(7_000)
        );
        assert_eq!(l.replay_paid(&txn, &public, &key, 0), Some(r.clone()));
        assert_eq!(l.replay(&txn, &key, 0), Some(r.clone()));
        // Past the retry horizon: gone, though no sweep removed it.
        assert_eq!(l.replay(&txn, &key, 7_000), Some(r));
        assert_eq!(l.replay(&txn, &key, 7_001), None);
        assert_eq!(l.replay_paid(&txn, &public, &key, 7_001), None);
    }

    #[test]
    fn hosts_add_to_totals_of_their_own_and_read_the_sum() {
        use crate::store::pg::tests::{open, schema, url};
        let Some(url) = url() else { return };
        let schema = schema();
        let (a, b) = (open(&url, &schema), open(&url, &schema));
        let add = |s: &crate::store::Storage, name: &str, delta: i128| {
            s.write(|w| add_total(w, name, delta)).unwrap()
        };
        add(&a, "minted", 100).unwrap();
        add(&a, "escrow", 30).unwrap();
        add(&b, "fees", 5).unwrap();
        // Held through one host, released through the other.
        add(&b, "escrow", -20).unwrap();
        add(&b, "fees", 20).unwrap();
        for s in [&a, &b] {
            let r = s.begin_read().unwrap();
            assert_eq!(total(&r, "minted").unwrap(), 100);
            assert_eq!(total(&r, "escrow").unwrap(), 10);
            assert_eq!(total(&r, "fees").unwrap(), 25);
        }
        // A decrease below zero, or a mint past u64::MAX, counts every
        // host's share.
        assert!(add(&a, "escrow", -11).is_err());
        assert!(add(&b, "minted", (u64::MAX - 100) as i128 + 1).is_err());
        add(&b, "minted", (u64::MAX - 100) as i128).unwrap();
        let r = a.begin_read().unwrap();
        assert_eq!(total(&r, "minted").unwrap(), u64::MAX);
        assert_eq!(total(&r, "escrow").unwrap(), 10);
        // Each host wrote rows of its own (unless they drew the same shard).
        let rows = r.scan_in("cash:totals", b"", None, false, 100).unwrap();
        assert!(rows.iter().all(|(k, _)| k.contains(&b'#')), "{rows:?}");
        let shards = |s: &crate::store::Storage| {
            let w = s.begin_write().unwrap();
            w.counter_shard().expect("a shared store")
        };
        let same = shards(&a) == shards(&b);
        assert_eq!(rows.len(), if same { 3 } else { 5 }, "{rows:?}");
    }
}
