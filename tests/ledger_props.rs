//! Property test: over random sequences of mint / replace / pay (committed
//! or failed) / double-spend / payout / earn, value is conserved:
//! minted = unspent outputs + earned fees + escrow, and every secret's state
//! matches a simple model. Drives the host's real ledger and payment gate
//! on a real redb file, through the storage layer's request transactions
//! (a dropped transaction is a failed request).

use marketplace::money::ledger::{Ledger, add_total, total};
use marketplace::money::payments;
use marketplace::money::payments::PaymentHeaders;
use marketplace::store::Storage;
use marketplace_common::secret;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Mint(u64),
    /// Split wallet entry `idx` into `parts` outputs.
    Replace {
        idx: usize,
        parts: usize,
    },
    /// Pay `price` for `action` with wallet entry `idx`; `commit` or abort.
    Pay {
        idx: usize,
        price: u64,
        buy: bool,
        commit: bool,
    },
    /// Try to pay with an already spent secret.
    Respend {
        idx: usize,
    },
    /// Pay out of escrow (a contract payout).
    Payout(u64),
    /// Move escrow to fees (an arbitration fee).
    Earn(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..2_000_000_000).prop_map(Op::Mint),
        (0usize..64, 1usize..5).prop_map(|(idx, parts)| Op::Replace { idx, parts }),
        (
            0usize..64,
            0u64..1_500_000_000,
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(idx, price, buy, commit)| Op::Pay {
                idx,
                price,
                buy,
                commit
            }),
        (0usize..64).prop_map(|idx| Op::Respend { idx }),
        (1u64..500_000_000).prop_map(Op::Payout),
        (1u64..500_000_000).prop_map(Op::Earn),
    ]
}

struct Entry {
    secret: String,
    amount: u64,
    spent: bool,
}

fn check(db: &Storage, wallet: &[Entry]) {
    let t = Ledger::totals(&db.begin_read().unwrap()).unwrap();
    assert_eq!(
        t.minted,
        t.unspent + t.fees + t.escrow,
        "value not conserved: {t:?}"
    );
    let model_unspent: u64 = wallet.iter().filter(|e| !e.spent).map(|e| e.amount).sum();
    assert_eq!(t.unspent, model_unspent, "ledger and model disagree");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn value_is_conserved(ops in proptest::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let db = Storage::open(&dir.path().join("db"), Default::default()).unwrap();
        let ledger = Ledger::open(dir.path()).unwrap();
        let mut wallet: Vec<Entry> = Vec::new();
        let mut n = 0u64;
        for op in ops {
            let txn = db.begin_write().unwrap();
            match op {
                Op::Mint(amount) => {
                    let s = ledger.mint(&txn, amount).unwrap();
                    db.commit(txn).unwrap();
                    wallet.push(Entry { secret: s, amount, spent: false });
                }
                Op::Replace { idx, parts } => {
                    let Some(e) = wallet.get(idx % wallet.len().max(1)).filter(|_| !wallet.is_empty()) else { continue };
                    let (input, amount, spent) = (e.secret.clone(), e.amount, e.spent);
                    let parts = (parts as u64).min(amount) as usize;
                    let mut outs = Vec::new();
                    for p in 0..parts {
                        n += 1;
                        let share = if p + 1 == parts { amount - (amount / parts as u64) * (parts as u64 - 1) } else { amount / parts as u64 };
                        outs.push((secret::secret_string(share, &format!("{n:064x}")), share));
                    }
                    let strings: Vec<String> = outs.iter().map(|(s, _)| s.clone()).collect();
                    let result = ledger.replace(&txn, std::slice::from_ref(&input), &strings);
                    prop_assert_eq!(result.is_ok(), !spent, "replace of spent={} input", spent);
                    if result.is_ok() {
                        db.commit(txn).unwrap();
                        let i = idx % wallet.len();
                        wallet[i].spent = true;
                        wallet.extend(outs.into_iter().map(|(secret, amount)| Entry { secret, amount, spent: false }));
                    }
                }
                Op::Pay { idx, price, buy, commit } => {
                    if wallet.is_empty() { continue }
                    let i = idx % wallet.len();
                    let headers = PaymentHeaders { cash: Some(wallet[i].secret.clone()), bitcoin: None, ..Default::default() };
                    let action = if buy { "buy" } else { "post" };
                    let result = payments::charge(&ledger, &txn, &headers, action, price);
                    let should_pass = price == 0 || (!wallet[i].spent && wallet[i].amount >= price);
                    prop_assert_eq!(result.is_ok(), should_pass);
                    if let Ok(charge) = result
                        && commit
                    {
                        db.commit(txn).unwrap();
                        if price > 0 {
                            wallet[i].spent = true;
                            if let Some(change) = charge.change {
                                wallet.push(Entry { secret: change, amount: charge.paid - price, spent: false });
                            }
                        }
                    }
                    // Not committed: the transaction is dropped, nothing happened.
                }
                Op::Respend { idx } => {
                    let Some(e) = wallet.iter().filter(|e| e.spent).nth(idx % wallet.len().max(1)) else { continue };
                    let headers = PaymentHeaders { cash: Some(e.secret.clone()), bitcoin: None, ..Default::default() };
                    let r = payments::charge(&ledger, &txn, &headers, "post", 1);
                    prop_assert!(r.is_err());
                    prop_assert_eq!(r.unwrap_err().status, 402);
                }
                Op::Payout(amount) => {
                    if total(&txn, "escrow").unwrap() < amount { continue }
                    n += 1;
                    let (s, created) = ledger.issue(&txn, &format!("payout:{n}"), amount).unwrap();
                    prop_assert!(created);
                    add_total(&txn, "escrow", -(amount as i128)).unwrap();
                    db.commit(txn).unwrap();
                    wallet.push(Entry { secret: s, amount, spent: false });
                }
                Op::Earn(amount) => {
                    if total(&txn, "escrow").unwrap() < amount { continue }
                    add_total(&txn, "escrow", -(amount as i128)).unwrap();
                    add_total(&txn, "fees", amount as i128).unwrap();
                    db.commit(txn).unwrap();
                }
            }
            check(&db, &wallet);
        }
    }
}
