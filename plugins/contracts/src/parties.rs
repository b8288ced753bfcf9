//! The index of contracts by party (`marketplace_common::parties`): written
//! at buy for both parties, and for the contracts bought before it existed
//! a page at a time by this family's later writes, so that finding a
//! party's contracts never means reading every contract.

use marketplace_common::parties;
use marketplace_guest::prelude::*;
use serde::Deserialize;

/// Contracts one write indexes at most while the index catches up (few:
/// each is read into the write's transaction, and on a shared store every
/// catching-up write also writes the progress, so concurrent contract
/// writes conflict until it is complete).
const CATCH_UP_PAGE: u32 = 20;

/// Index the contract `contract_id` under both its parties.
pub fn index(contract_id: &str, buyer: &str, seller: &str) -> Result<(), ApiError> {
    kv::put_raw(&parties::key(buyer, contract_id), b"")?;
    if seller != buyer {
        kv::put_raw(&parties::key(seller, contract_id), b"")?;
    }
    Ok(())
}

/// The parties of a stored contract (the rest is skipped unread).
#[derive(Deserialize)]
struct Parties {
    contract_id: String,
    buyer_fingerprint: String,
    target_seller_fingerprint: String,
}

/// Index the next page of the contracts from before the index, until
/// every one is (then [`parties::COMPLETE`] is recorded and this costs
/// one read). Called by every write of the family, before it saves.
pub fn catch_up() -> Result<(), ApiError> {
    let progress = kv::get_raw(None, parties::PROGRESS)?;
    if progress.as_deref() == Some(parties::COMPLETE) {
        return Ok(());
    }
    let start = match progress {
        Some(mut last) => {
            last.push(0);
            last
        }
        None => b"c/".to_vec(),
    };
    let end = kv::prefix_end(b"c/");
    let mut limit = CATCH_UP_PAGE;
    let page = kv::scan_fitting(None, &start, end.as_deref(), false, &mut limit)?;
    let mut read = 0u32;
    let mut last = None;
    for (key, value) in page.entries() {
        read += 1;
        last = Some(key.to_vec());
        // A record that does not parse is indexed by nobody, as the
        // recovery scan's reading of every contract skipped it.
        if let Ok(p) = serde_json::from_slice::<Parties>(value) {
            index(
                &p.contract_id,
                &p.buyer_fingerprint,
                &p.target_seller_fingerprint,
            )?;
        }
    }
    match last {
        Some(last) if read == limit => kv::put_raw(parties::PROGRESS, &last),
        _ => kv::put_raw(parties::PROGRESS, parties::COMPLETE),
    }
}
