//! The embedded cash ledger (webcash-compatible).
//!
//! Only public hashes are stored: `sha256(hex string of the secret)` ->
//! (amount, spent). Secrets the server makes (change, payouts, refunds) are
//! derived with HMAC-SHA256 under a server key kept in the data dir, so a
//! repeat returns the same secret without storing it.
//!
//! Value accounting, kept in `cash:totals`: `minted` (operator mints),
//! `fees` (earned), `escrow` (held for contracts). Invariant:
//! `minted = sum(unspent outputs) + fees + escrow`.

use crate::runtime::hex;
use anyhow::{Context, Result};
use hmac::{Hmac, Mac};
use marketplace_common::{amount, secret};
use redb::{ReadableTable, TableDefinition, WriteTransaction};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::path::Path;

const OUTPUTS: TableDefinition<&str, &[u8]> = TableDefinition::new("cash:outputs");
const TOTALS: TableDefinition<&str, u64> = TableDefinition::new("cash:totals");
const REPLAYS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("cash:replays");

/// Most inputs or outputs of one replace.
pub const MAX_REPLACE: usize = 100;

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
    hex(&Sha256::digest(secret_hex.as_bytes()))
}

/// Why a secret was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretError {
    Malformed(String),
    Unknown,
    Spent,
    /// The amount written in the secret differs from the ledger's.
    AmountMismatch,
}

pub struct Ledger {
    key: [u8; 32],
}

impl Ledger {
    /// Load the server key from `<data_dir>/server.key`, creating it (mode
    /// 0600) on first start, and make sure the tables exist.
    pub fn open(data_dir: &Path, db: &redb::Database) -> Result<Ledger> {
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
        let txn = db.begin_write()?;
        txn.open_table(OUTPUTS)?;
        txn.open_table(TOTALS)?;
        txn.open_table(REPLAYS)?;
        txn.commit()?;
        Ok(Ledger { key })
    }

    /// The secret hex derived from `purpose`.
    pub fn derive(&self, purpose: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        mac.update(purpose);
        hex(&mac.finalize().into_bytes())
    }

    /// Mint a new random secret worth `units` (operator action).
    pub fn mint(&self, txn: &WriteTransaction, units: u64) -> Result<String> {
        anyhow::ensure!(units > 0, "amount must be positive");
        let mut raw = [0u8; 32];
        crate::ids::fill_random(&mut raw);
        let secret_hex = hex(&raw);
        self.create(txn, &public_hash(&secret_hex), units)?;
        add_total(txn, "minted", units as i128)?;
        Ok(secret::secret_string(units, &secret_hex))
    }

    /// Create an unspent output; false when it already exists.
    fn create(&self, txn: &WriteTransaction, public: &str, units: u64) -> Result<bool> {
        let mut t = txn.open_table(OUTPUTS)?;
        if t.get(public)?.is_some() {
            return Ok(false);
        }
        t.insert(
            public,
            encode(Output {
                amount: units,
                spent: false,
            })
            .as_slice(),
        )?;
        Ok(true)
    }

    /// Issue a server-derived secret worth `units` for `purpose`; a repeat
    /// returns the same secret. Returns (secret, newly created).
    pub fn issue(
        &self,
        txn: &WriteTransaction,
        purpose: &str,
        units: u64,
    ) -> Result<(String, bool)> {
        let secret_hex = self.derive(format!("{purpose}:{units}").as_bytes());
        let created = self.create(txn, &public_hash(&secret_hex), units)?;
        Ok((secret::secret_string(units, &secret_hex), created))
    }

    /// Check a secret string against the ledger (not spending it).
    pub fn check(
        &self,
        table: &impl ReadableTable<&'static str, &'static [u8]>,
        secret_str: &str,
    ) -> Result<(String, u64), SecretError> {
        let parsed = secret::parse(secret_str).map_err(SecretError::Malformed)?;
        if parsed.kind != secret::Kind::Secret {
            return Err(SecretError::Malformed(
                "a public hash cannot pay; send the secret".into(),
            ));
        }
        let public = public_hash(&parsed.hex);
        let out = table
            .get(public.as_str())
            .map_err(|e| SecretError::Malformed(e.to_string()))?
            .map(|v| decode(v.value()))
            .ok_or(SecretError::Unknown)?;
        if out.amount != parsed.amount {
            return Err(SecretError::AmountMismatch);
        }
        if out.spent {
            return Err(SecretError::Spent);
        }
        Ok((public, out.amount))
    }

    /// Check a secret inside a write transaction.
    pub fn check_in(
        &self,
        txn: &WriteTransaction,
        secret_str: &str,
    ) -> Result<(String, u64), SecretError> {
        let t = txn
            .open_table(OUTPUTS)
            .map_err(|e| SecretError::Malformed(e.to_string()))?;
        self.check(&t, secret_str)
    }

    /// Mark an output spent.
    pub fn spend(&self, txn: &WriteTransaction, public: &str) -> Result<()> {
        let mut t = txn.open_table(OUTPUTS)?;
        let out = t
            .get(public)?
            .map(|v| decode(v.value()))
            .context("spending an unknown output")?;
        t.insert(public, encode(Output { spent: true, ..out }).as_slice())?;
        Ok(())
    }

    /// Webcash `replace`: spend every input, create every output, atomically.
    /// Refusals are the 400 message.
    pub fn replace(
        &self,
        txn: &WriteTransaction,
        inputs: &[String],
        outputs: &[String],
    ) -> Result<(), String> {
        if inputs.is_empty() || outputs.is_empty() {
            return Err("webcashes and new_webcashes must both be non-empty".into());
        }
        if inputs.len() > MAX_REPLACE || outputs.len() > MAX_REPLACE {
            return Err(format!(
                "at most {MAX_REPLACE} inputs and {MAX_REPLACE} outputs"
            ));
        }
        let internal = |e: &dyn std::fmt::Display| format!("ledger error: {e}");
        let mut seen = HashSet::new();
        let mut total_in: u128 = 0;
        let mut spend = Vec::new();
        {
            let t = txn.open_table(OUTPUTS).map_err(|e| internal(&e))?;
            for s in inputs {
                let (public, units) = self.check(&t, s).map_err(|e| match e {
                    SecretError::Malformed(m) => format!("input {s:.20}...: {m}"),
                    SecretError::Unknown => "an input is not known to this ledger".into(),
                    SecretError::Spent => "an input is already spent".into(),
                    SecretError::AmountMismatch => {
                        "an input's amount does not match the ledger".into()
                    }
                })?;
                if !seen.insert(public.clone()) {
                    return Err("duplicate input".into());
                }
                total_in += units as u128;
                spend.push(public);
            }
        }
        let mut total_out: u128 = 0;
        let mut create = Vec::new();
        let mut seen_out = HashSet::new();
        {
            let t = txn.open_table(OUTPUTS).map_err(|e| internal(&e))?;
            for s in outputs {
                let parsed = secret::parse(s).map_err(|m| format!("output: {m}"))?;
                if parsed.kind != secret::Kind::Secret {
                    return Err("outputs must be secrets".into());
                }
                let public = public_hash(&parsed.hex);
                if !seen_out.insert(public.clone()) || seen.contains(&public) {
                    return Err("duplicate output".into());
                }
                if t.get(public.as_str()).map_err(|e| internal(&e))?.is_some() {
                    return Err("an output already exists".into());
                }
                total_out += parsed.amount as u128;
                create.push((public, parsed.amount));
            }
        }
        if total_in != total_out {
            return Err(format!(
                "input total {} does not equal output total {}",
                amount::format(total_in.min(u64::MAX as u128) as u64),
                amount::format(total_out.min(u64::MAX as u128) as u64)
            ));
        }
        for public in &spend {
            self.spend(txn, public).map_err(|e| internal(&e))?;
        }
        for (public, units) in &create {
            self.create(txn, public, *units).map_err(|e| internal(&e))?;
        }
        Ok(())
    }

    /// Webcash `health_check`: state of each public string.
    pub fn health_check(
        &self,
        table: &impl ReadableTable<&'static str, &'static [u8]>,
        publics: &[String],
    ) -> Result<Value, String> {
        if publics.len() > MAX_REPLACE {
            return Err(format!("at most {MAX_REPLACE} entries"));
        }
        let mut results = serde_json::Map::new();
        for p in publics {
            let parsed = secret::parse(p).map_err(|m| format!("{p:.24}: {m}"))?;
            let public = match parsed.kind {
                secret::Kind::Public => parsed.hex.clone(),
                secret::Kind::Secret => public_hash(&parsed.hex),
            };
            let state = table
                .get(public.as_str())
                .map_err(|e| e.to_string())?
                .map(|v| decode(v.value()));
            let key = secret::public_string(parsed.amount, &public);
            results.insert(
                key,
                match state {
                    Some(o) => json!({"spent": o.spent, "amount": amount::format(o.amount)}),
                    None => json!({"spent": null, "amount": null}),
                },
            );
        }
        Ok(json!({"status": "success", "results": results}))
    }

    /// The stored response of an identical earlier paid request.
    pub fn replay(
        table: &impl ReadableTable<&'static [u8], &'static [u8]>,
        key: &[u8; 32],
    ) -> Option<crate::app::Reply> {
        let v = table.get(key.as_slice()).ok()??;
        decode_reply(v.value())
    }

    /// Record the response of a paid request for identical retries.
    pub fn record_replay(
        txn: &WriteTransaction,
        key: &[u8; 32],
        reply: &crate::app::Reply,
    ) -> Result<()> {
        let mut t = txn.open_table(REPLAYS)?;
        t.insert(key.as_slice(), encode_reply(reply).as_slice())?;
        Ok(())
    }

    /// Open the outputs table of a read transaction.
    pub fn outputs_read(
        txn: &redb::ReadTransaction,
    ) -> Result<redb::ReadOnlyTable<&'static str, &'static [u8]>> {
        Ok(txn.open_table(OUTPUTS)?)
    }

    /// Open the replay table of a read transaction.
    pub fn replays_read(
        txn: &redb::ReadTransaction,
    ) -> Result<redb::ReadOnlyTable<&'static [u8], &'static [u8]>> {
        Ok(txn.open_table(REPLAYS)?)
    }

    /// Totals for the conservation invariant (scans every output).
    pub fn totals(txn: &redb::ReadTransaction) -> Result<Totals> {
        let totals = txn.open_table(TOTALS)?;
        let get = |k: &str| -> Result<u64> { Ok(totals.get(k)?.map(|v| v.value()).unwrap_or(0)) };
        let mut unspent = 0u64;
        for item in txn.open_table(OUTPUTS)?.iter()? {
            let (_, v) = item?;
            let o = decode(v.value());
            if !o.spent {
                unspent += o.amount;
            }
        }
        Ok(Totals {
            minted: get("minted")?,
            fees: get("fees")?,
            escrow: get("escrow")?,
            unspent,
        })
    }
}

/// Add `delta` to a named total (refusing to go below zero).
pub fn add_total(txn: &WriteTransaction, name: &str, delta: i128) -> Result<()> {
    let mut t = txn.open_table(TOTALS)?;
    let current = t.get(name)?.map(|v| v.value()).unwrap_or(0) as i128;
    let next = current + delta;
    anyhow::ensure!(
        next >= 0 && next <= u64::MAX as i128,
        "{name} would become {next}"
    );
    t.insert(name, next as u64)?;
    Ok(())
}

/// Read a named total in a write transaction.
pub fn total(txn: &WriteTransaction, name: &str) -> Result<u64> {
    let t = txn.open_table(TOTALS)?;
    Ok(t.get(name)?.map(|v| v.value()).unwrap_or(0))
}

fn encode_reply(r: &crate::app::Reply) -> Vec<u8> {
    let headers = serde_json::to_vec(&r.headers).unwrap_or_default();
    let mut out = Vec::with_capacity(6 + headers.len() + r.body.len());
    out.extend_from_slice(&r.status.to_be_bytes());
    out.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    out.extend_from_slice(&headers);
    out.extend_from_slice(&r.body);
    out
}

fn decode_reply(b: &[u8]) -> Option<crate::app::Reply> {
    let status = u16::from_be_bytes(b.get(..2)?.try_into().ok()?);
    let hlen = u32::from_be_bytes(b.get(2..6)?.try_into().ok()?) as usize;
    let headers = serde_json::from_slice(b.get(6..6 + hlen)?).ok()?;
    Some(crate::app::Reply {
        status,
        headers,
        body: b.get(6 + hlen..)?.to_vec(),
    })
}

/// Decode lower- or upper-case hex.
pub fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use redb::ReadableDatabase;

    fn setup() -> (tempfile::TempDir, redb::Database, Ledger) {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("db")).unwrap();
        let l = Ledger::open(dir.path(), &db).unwrap();
        (dir, db, l)
    }

    fn hexes(seed: u8) -> String {
        format!("{seed:02x}").repeat(32)
    }

    #[test]
    fn server_key_is_private_and_stable() {
        let (dir, db, l) = setup();
        let again = Ledger::open(dir.path(), &db).unwrap();
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
        txn.commit().unwrap();
        let t = Ledger::totals(&db.begin_read().unwrap()).unwrap();
        assert_eq!((t.minted, t.unspent), (100, 100));
    }

    #[test]
    fn issue_is_idempotent() {
        let (_d, db, l) = setup();
        let txn = db.begin_write().unwrap();
        let (a, new_a) = l.issue(&txn, "payout:CTR_1", 5).unwrap();
        let (b, new_b) = l.issue(&txn, "payout:CTR_1", 5).unwrap();
        assert_eq!(a, b);
        assert!(new_a && !new_b);
        assert_eq!(l.check_in(&txn, &a).unwrap().1, 5);
    }

    #[test]
    fn replies_round_trip() {
        let r = crate::app::Reply {
            status: 201,
            headers: vec![("x-cash-change".into(), "e1:secret:ab".into())],
            body: b"{\"a\":1}".to_vec(),
        };
        assert_eq!(decode_reply(&encode_reply(&r)), Some(r));
    }
}
