//! One-time upgrade of a database written before escrow was kept per
//! contract and before secrets were kept out of storage.
//!
//! Then, escrow was one global total; payouts and refunds were secrets
//! derived from `contracts:{payout|refund}:{contract}:{units}` (the same
//! derivation escrow uses now); contract records held their certificate
//! secret in plain text; kept answers of paid requests held change and
//! payout secrets. The upgrade, in one transaction, marked done in
//! `host:meta`:
//!
//! - gives every contract of the `contracts` keyspace the account its state
//!   still owes, and records the payouts and refunds already issued (found
//!   by their derived public hash in the ledger) and the fees earned;
//! - removes certificate secrets from contract records, recording the
//!   certificate by its proof (a repeat pickup of such a contract answers
//!   409: the secret was shown when it settled and is no longer kept);
//! - drops every kept answer (an identical retry of an old paid request is
//!   then refused as a spent payment instead of replayed).
//!
//! It reads the contracts family's record layout: it is the one place the
//! host knows it, and only for data written before this version.

use crate::money::escrow::{self, Issuance};
use crate::money::ledger::{Ledger, public_hash};
use crate::store::{Kv, Storage, WriteTxn};
use anyhow::{Context, Result};
use serde_json::Value;

/// Host bookkeeping: upgrade markers.
pub const META: &str = crate::store::META_TABLE;
const MARK: &[u8] = b"upgrade:escrow-per-contract";
const FAMILY: &str = "contracts";

/// Run the upgrade once; returns how many contracts it gave an account.
pub fn run(storage: &Storage, ledger: &Ledger) -> Result<usize> {
    if storage
        .begin_read()
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .get_in(META, MARK)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .is_some()
    {
        return Ok(0);
    }
    // Hosts sharing a store may start together: one of them upgrades,
    // the others (running again after the conflict) find the mark.
    let n = storage
        .write(|txn| {
            if txn
                .get_in(META, MARK)
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .is_some()
            {
                return Ok(0);
            }
            let n = upgrade(txn, ledger)?;
            txn.put_in(META, MARK, b"1")
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok::<_, anyhow::Error>(n)
        })
        .map_err(|e| anyhow::anyhow!("{e}"))??;
    if n > 0 {
        tracing::info!(contracts = n, "upgraded: escrow is now held per contract");
    }
    Ok(n)
}

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// An escrow refusal as an error (the upgrade stops on any).
fn reply(r: crate::reply::Reply) -> anyhow::Error {
    anyhow::anyhow!("{}", String::from_utf8_lossy(&r.body))
}

fn upgrade(txn: &WriteTxn, ledger: &Ledger) -> Result<usize> {
    let table = format!("kv:{FAMILY}");
    let rows = txn
        .scan_in(&table, b"c/", Some(b"c0"), false, usize::MAX)
        .map_err(err)?;
    let mut held_total = 0u64;
    for (key, value) in &rows {
        let mut c: Value = serde_json::from_slice(value)
            .with_context(|| format!("contract record {}", String::from_utf8_lossy(key)))?;
        let id = c["contract_id"].as_str().unwrap_or_default().to_string();
        let amount = c["amount"].as_u64().unwrap_or(0);
        let fee = c["fee"].as_u64().unwrap_or(0);
        let bid_inclusive = c["fee_policy"] == "bid-inclusive";
        let issued = |kind: &str, units: u64| -> Option<String> {
            let h = ledger.derive(format!("{FAMILY}:{kind}:{id}:{units}").as_bytes());
            let public = public_hash(&h);
            txn.get_in("cash:outputs", public.as_bytes())
                .ok()
                .flatten()
                .map(|_| public)
        };
        let record = |kind: &str, units: u64, public: String| -> Result<()> {
            escrow::record(txn, &Issuance::new(FAMILY, &id, kind, units, public)).map_err(reply)
        };
        let owed = match c["status"].as_str().unwrap_or_default() {
            "settled" => {
                if bid_inclusive && fee > 0 {
                    record("fee", fee, String::new())?;
                }
                let out = if bid_inclusive {
                    amount.saturating_sub(fee)
                } else {
                    amount
                };
                match issued("payout", out) {
                    Some(public) => {
                        record("payout", out, public)?;
                        0
                    }
                    None => out,
                }
            }
            "refunded" => match issued("refund", amount) {
                Some(public) => {
                    record("refund", amount, public)?;
                    0
                }
                None => amount,
            },
            _ => amount,
        };
        held_total += owed;
        let account = escrow::account(FAMILY, &id).map_err(reply)?;
        escrow::set_held(txn, &account, owed).map_err(reply)?;
        if let Some(cert) = c.get_mut("certificate").and_then(Value::as_object_mut)
            && cert.remove("certificate_secret").is_some()
        {
            let proof = cert
                .get("certificate_proof")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            record("certificate", 0, proof)?;
            txn.put_in(&table, key, &serde_json::to_vec(&c)?)
                .map_err(err)?;
        }
    }
    let escrow = crate::money::ledger::total(txn, "escrow")?;
    if held_total != escrow {
        tracing::warn!(
            accounts = held_total,
            escrow,
            "upgrade: the contracts' accounts do not add up to the escrow total"
        );
    }
    for table in ["cash:replays", "cash:replays-by-time"] {
        for (key, _) in txn
            .scan_in(table, b"", None, false, usize::MAX)
            .map_err(err)?
        {
            txn.delete_in(table, &key).map_err(err)?;
        }
    }
    Ok(rows.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::money::escrow;
    use crate::money::ledger::add_total;
    use serde_json::json;

    #[test]
    fn old_contracts_get_their_accounts_and_lose_their_secrets() {
        let (dir, db) = crate::store::temp_storage();
        let l = Ledger::open(dir.path()).unwrap();
        let txn = db.begin_write().unwrap();
        let put = |id: &str, doc: Value| {
            txn.put_in(
                "kv:contracts",
                format!("c/{id}").as_bytes(),
                doc.to_string().as_bytes(),
            )
            .unwrap()
        };
        let c = |id: &str, status: &str| {
            json!({"contract_id": id, "status": status, "amount": 100, "fee": 3,
                   "fee_policy": "bid-inclusive"})
        };
        put("CTR_open", c("CTR_open", "active"));
        let mut settled = c("CTR_paid", "settled");
        settled["certificate"] = json!({"certificate_id": "CRT_1", "certificate_secret": "ab".repeat(32), "certificate_proof": "cd".repeat(32)});
        put("CTR_paid", settled);
        put("CTR_unpaid", c("CTR_unpaid", "settled"));
        put("CTR_back", c("CTR_back", "refunded"));
        // Before: 400 taken in, 6 earned, one payout (97) issued the old way.
        add_total(&txn, "minted", 400).unwrap();
        add_total(&txn, "escrow", 400 - 6 - 97).unwrap();
        add_total(&txn, "fees", 6).unwrap();
        let (old_payout, _) = l.issue(&txn, "contracts:payout:CTR_paid", 97).unwrap();
        txn.put_in("cash:replays", b"k", b"old answer with a secret")
            .unwrap();
        db.commit(txn).unwrap();

        assert_eq!(run(&db, &l).unwrap(), 4);
        assert_eq!(run(&db, &l).unwrap(), 0, "once");
        let r = db.begin_read().unwrap();
        let held = |id| escrow::held(&r, "contracts", id).unwrap();
        assert_eq!(
            (
                held("CTR_open"),
                held("CTR_paid"),
                held("CTR_unpaid"),
                held("CTR_back")
            ),
            (100, 0, 97, 100)
        );
        assert_eq!(escrow::total_held(&r).unwrap(), 400 - 6 - 97);
        let raw = r.get_in("kv:contracts", b"c/CTR_paid").unwrap().unwrap();
        assert!(!String::from_utf8_lossy(&raw).contains(&"ab".repeat(32)));
        assert!(
            r.scan_in("cash:replays", b"", None, false, 10)
                .unwrap()
                .is_empty()
        );
        drop(r);
        // The payout issued before is the recorded one: a repeat shows it.
        let txn = db.begin_write().unwrap();
        let (again, _) = escrow::payout(&l, &txn, "contracts", "CTR_paid", "payout", 97).unwrap();
        assert_eq!(again, old_payout);
        let (unpaid, _) =
            escrow::payout(&l, &txn, "contracts", "CTR_unpaid", "payout", 97).unwrap();
        assert_ne!(unpaid, old_payout);
        assert_eq!(
            escrow::certificate(&l, &txn, "contracts", "CTR_paid")
                .unwrap_err()
                .status,
            409
        );
    }
}
