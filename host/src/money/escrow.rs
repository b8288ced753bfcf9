//! Escrow held per contract, and the record of every issuance.
//!
//! An account is named by the family that holds it and a contract id
//! (`{family}/{contract}`), so a family reaches only its own accounts. A
//! payout or refund can never exceed what its account holds. Each issued
//! payout, refund, fee and certificate is recorded once per contract and
//! kind, by public hash and amount, never by secret: a repeat returns the
//! recorded issuance, re-derived under the server key and checked against
//! the record, and a host whose key changed refuses rather than pay twice.
//!
//! The global `escrow` total of the ledger is the sum of all accounts: the
//! payment gate adds a `buy` charge to it, and the request must
//! [`hold`] that charge in a contract's account before it may commit.

use crate::money::ledger::{Derivation, Ledger, add_total, certificate_public, public_hash};
use crate::reply::Reply;
use crate::store::{Kv, WriteTxn};
use marketplace_common::{amount, secret};
use serde::{Deserialize, Serialize};

/// account -> held units (u64 BE).
pub const ACCOUNTS: &str = "escrow:accounts";
/// account/kind -> [`Issuance`] (JSON).
pub const ISSUED: &str = "escrow:issued";

/// Kinds of issuance.
pub const KINDS: &[&str] = &["payout", "refund", "fee", "certificate"];

/// One recorded issuance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Issuance {
    pub family: String,
    pub contract: String,
    pub kind: String,
    /// Units (0 for a certificate).
    pub amount: u64,
    /// Public hash: sha256 of the secret's hex for cash, sha256 of the
    /// certificate's 32 bytes; empty for a fee (no secret).
    pub public: String,
}

impl Issuance {
    pub fn new(family: &str, contract: &str, kind: &str, amount: u64, public: String) -> Self {
        Issuance {
            family: family.into(),
            contract: contract.into(),
            kind: kind.into(),
            amount,
            public,
        }
    }

    /// A fee (no secret).
    pub fn fee(family: &str, contract: &str, amount: u64) -> Self {
        Issuance::new(family, contract, "fee", amount, String::new())
    }
}

/// The account of `contract` held by `family`: `{family}/{contract}`.
pub(crate) fn account(family: &str, contract: &str) -> Result<String, Reply> {
    if contract.is_empty()
        || contract.len() > 128
        || !contract
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(Reply::error(
            400,
            "invalid_request",
            "a contract id is 1 to 128 of A-Z, a-z, 0-9, _ and -",
        ));
    }
    Ok(format!("{family}/{contract}"))
}

fn internal(e: impl std::fmt::Display) -> Reply {
    crate::store::log_failure("escrow", &e);
    Reply::error(500, "internal", "internal error")
}

fn conflict(message: String) -> Reply {
    Reply::error(409, "conflict", message)
}

/// What the account of `contract` holds.
pub fn held(kv: &impl Kv, family: &str, contract: &str) -> Result<u64, Reply> {
    let key = account(family, contract)?;
    Ok(
        match kv.get_in(ACCOUNTS, key.as_bytes()).map_err(internal)? {
            Some(v) => u64::from_be_bytes(v.as_slice().try_into().map_err(internal)?),
            None => 0,
        },
    )
}

/// Set what the account `key` (`{family}/{contract}`) holds.
pub(crate) fn set_held(txn: &WriteTxn, key: &str, units: u64) -> Result<(), Reply> {
    txn.put_in(ACCOUNTS, key.as_bytes(), &units.to_be_bytes())
        .map_err(internal)
}

/// The recorded issuance of `kind` for `contract`, if any.
pub fn issuance(
    kv: &impl Kv,
    family: &str,
    contract: &str,
    kind: &str,
) -> Result<Option<Issuance>, Reply> {
    let key = format!("{}/{kind}", account(family, contract)?);
    match kv.get_in(ISSUED, key.as_bytes()).map_err(internal)? {
        Some(v) => serde_json::from_slice(&v).map(Some).map_err(internal),
        None => Ok(None),
    }
}

/// Record an issuance (once per contract and kind; a later record of the
/// same kind replaces it).
pub(crate) fn record(txn: &WriteTxn, i: &Issuance) -> Result<(), Reply> {
    let key = format!("{}/{}/{}", i.family, i.contract, i.kind);
    let value = serde_json::to_vec(i).map_err(internal)?;
    txn.put_in(ISSUED, key.as_bytes(), &value).map_err(internal)
}

/// Hold `units` (this request's escrow charge) in the account of `contract`.
pub fn hold(txn: &WriteTxn, family: &str, contract: &str, units: u64) -> Result<u64, Reply> {
    let key = account(family, contract)?;
    let now = held(txn, family, contract)?
        .checked_add(units)
        .ok_or_else(|| internal("account overflow"))?;
    set_held(txn, &key, now)?;
    Ok(now)
}

/// Pay `units` out of the account of `contract` as a cash secret of `kind`
/// ("payout" or "refund"). Returns the secret and how to derive it again.
pub fn payout(
    ledger: &Ledger,
    txn: &WriteTxn,
    family: &str,
    contract: &str,
    kind: &str,
    units: u64,
) -> Result<(String, Derivation), Reply> {
    if !matches!(kind, "payout" | "refund") {
        return Err(Reply::error(
            400,
            "invalid_request",
            "kind must be payout or refund",
        ));
    }
    if units == 0 {
        return Err(Reply::error(
            400,
            "invalid_request",
            "amount must be positive",
        ));
    }
    let key = account(family, contract)?;
    // `Ledger::issue` derives from "{base}:{units}".
    let base = format!("{family}:{kind}:{contract}");
    let derivation = Derivation {
        purpose: format!("{base}:{units}"),
        amount: Some(units),
        public: String::new(),
    };
    if let Some(done) = issuance(txn, family, contract, kind)? {
        if done.amount != units {
            return Err(conflict(format!(
                "the {kind} of {contract} was issued already, for {}",
                amount::format(done.amount)
            )));
        }
        let derivation = Derivation {
            public: done.public,
            ..derivation
        };
        return match derivation.derive(ledger) {
            Some(s) => Ok((s, derivation)),
            None => {
                tracing::error!(
                    family,
                    contract,
                    kind,
                    "issued already and cannot be re-derived: the server key changed; not paying again"
                );
                Err(conflict(format!(
                    "the {kind} of {contract} was issued already and this host can no longer show it; it is never paid twice"
                )))
            }
        };
    }
    let holds = held(txn, family, contract)?;
    if units > holds {
        tracing::warn!(
            family,
            contract,
            kind,
            asked = units,
            holds,
            "payout over the contract's escrow refused"
        );
        return Err(conflict(format!(
            "{} exceeds what contract {contract} holds in escrow ({})",
            amount::format(units),
            amount::format(holds)
        )));
    }
    let (secret_str, created) = ledger.issue(txn, &base, units).map_err(internal)?;
    if !created {
        return Err(internal(format!(
            "{kind} output of {contract} exists without an issuance record"
        )));
    }
    set_held(txn, &key, holds - units)?;
    add_total(txn, "escrow", -(units as i128)).map_err(internal)?;
    let parsed = secret::parse(&secret_str).map_err(internal)?;
    let public = public_hash(&parsed.hex);
    record(
        txn,
        &Issuance::new(family, contract, kind, units, public.clone()),
    )?;
    Ok((
        secret_str,
        Derivation {
            public,
            ..derivation
        },
    ))
}

/// Move `units` of the account of `contract` to earned fees, once.
pub fn earn(txn: &WriteTxn, family: &str, contract: &str, units: u64) -> Result<(), Reply> {
    if issuance(txn, family, contract, "fee")?.is_some() {
        return Ok(());
    }
    let key = account(family, contract)?;
    let holds = held(txn, family, contract)?;
    if units > holds {
        return Err(conflict(format!(
            "a fee of {} exceeds what contract {contract} holds in escrow ({})",
            amount::format(units),
            amount::format(holds)
        )));
    }
    set_held(txn, &key, holds - units)?;
    add_total(txn, "escrow", -(units as i128))
        .and_then(|_| add_total(txn, "fees", units as i128))
        .map_err(internal)?;
    record(txn, &Issuance::fee(family, contract, units))
}

/// Record a fee charged from the caller (not from escrow) as the fee of
/// `contract`, once.
pub fn note_fee(txn: &WriteTxn, family: &str, contract: &str, units: u64) -> Result<(), Reply> {
    account(family, contract)?;
    if issuance(txn, family, contract, "fee")?.is_some() {
        return Ok(());
    }
    record(txn, &Issuance::fee(family, contract, units))
}

/// The certificate secret of `contract`: made and recorded on first call,
/// re-derived and checked after.
pub fn certificate(
    ledger: &Ledger,
    txn: &WriteTxn,
    family: &str,
    contract: &str,
) -> Result<(String, Derivation), Reply> {
    account(family, contract)?;
    let purpose = format!("{family}:certificate:{contract}");
    match issuance(txn, family, contract, "certificate")? {
        Some(done) => {
            let d = Derivation {
                purpose,
                amount: None,
                public: done.public,
            };
            match d.derive(ledger) {
                Some(s) => Ok((s, d)),
                None => Err(conflict(format!(
                    "the certificate of {contract} was issued already and this host can no longer show it"
                ))),
            }
        }
        None => {
            let secret_hex = ledger.derive(purpose.as_bytes());
            let public = certificate_public(&secret_hex);
            record(
                txn,
                &Issuance::new(family, contract, "certificate", 0, public.clone()),
            )?;
            Ok((
                secret_hex,
                Derivation {
                    purpose,
                    amount: None,
                    public,
                },
            ))
        }
    }
}

/// Sum of every account (equals the ledger's `escrow` total at rest).
pub fn total_held(kv: &impl Kv) -> Result<u64, Reply> {
    let mut sum = 0u64;
    for (_, v) in kv
        .scan_in(ACCOUNTS, b"", None, false, usize::MAX)
        .map_err(internal)?
    {
        sum += u64::from_be_bytes(v.as_slice().try_into().map_err(internal)?);
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, crate::store::Storage, Ledger) {
        let (dir, db) = crate::store::temp_storage();
        let l = Ledger::open(dir.path()).unwrap();
        (dir, db, l)
    }

    #[test]
    fn an_account_pays_at_most_what_it_holds_and_each_kind_once() {
        let (_d, db, l) = setup();
        let txn = db.begin_write().unwrap();
        add_total(&txn, "escrow", 100).unwrap();
        hold(&txn, "contracts", "CTR_1", 100).unwrap();
        assert_eq!(
            payout(&l, &txn, "contracts", "CTR_1", "payout", 101)
                .unwrap_err()
                .status,
            409
        );
        // Another family's account of the same contract id holds nothing.
        assert_eq!(
            payout(&l, &txn, "rogue", "CTR_1", "payout", 1)
                .unwrap_err()
                .status,
            409
        );
        earn(&txn, "contracts", "CTR_1", 3).unwrap();
        earn(&txn, "contracts", "CTR_1", 3).unwrap();
        let (a, d) = payout(&l, &txn, "contracts", "CTR_1", "payout", 97).unwrap();
        let (b, _) = payout(&l, &txn, "contracts", "CTR_1", "payout", 97).unwrap();
        assert_eq!(a, b);
        assert_eq!(d.derive(&l), Some(a.clone()));
        assert_eq!(held(&txn, "contracts", "CTR_1").unwrap(), 0);
        assert_eq!(
            payout(&l, &txn, "contracts", "CTR_1", "refund", 1)
                .unwrap_err()
                .status,
            409
        );
        assert_eq!(crate::money::ledger::total(&txn, "escrow").unwrap(), 0);
        assert_eq!(crate::money::ledger::total(&txn, "fees").unwrap(), 3);
        let rec = issuance(&txn, "contracts", "CTR_1", "payout")
            .unwrap()
            .unwrap();
        assert_eq!(rec.amount, 97);
        assert!(!String::from_utf8_lossy(&serde_json::to_vec(&rec).unwrap()).contains(&a[14..]));
    }

    #[test]
    fn a_new_server_key_never_pays_twice() {
        let (dir, db, l) = setup();
        let txn = db.begin_write().unwrap();
        add_total(&txn, "escrow", 50).unwrap();
        hold(&txn, "contracts", "CTR_2", 50).unwrap();
        payout(&l, &txn, "contracts", "CTR_2", "refund", 50).unwrap();
        let (cert, _) = certificate(&l, &txn, "contracts", "CTR_2").unwrap();
        assert_eq!(certificate(&l, &txn, "contracts", "CTR_2").unwrap().0, cert);
        std::fs::remove_file(dir.path().join("server.key")).unwrap();
        let other = Ledger::open(dir.path()).unwrap();
        assert_eq!(
            payout(&other, &txn, "contracts", "CTR_2", "refund", 50)
                .unwrap_err()
                .status,
            409
        );
        assert_eq!(
            certificate(&other, &txn, "contracts", "CTR_2")
                .unwrap_err()
                .status,
            409
        );
    }
}
