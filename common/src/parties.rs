//! The `contracts` keyspace's index of contracts by party, which the
//! contracts family writes and the identity family's recovery scan reads
//! (with `read = ["contracts"]`): `by/{fingerprint}/{contract_id}` (empty
//! value) for the buyer and the seller of every contract, so a party's
//! contracts are found without reading every contract.

/// The index row of `contract_id` for the party `fingerprint`.
pub fn key(fingerprint: &str, contract_id: &str) -> String {
    format!("by/{fingerprint}/{contract_id}")
}

/// The prefix of every index row of the party `fingerprint`.
pub fn prefix(fingerprint: &str) -> String {
    format!("by/{fingerprint}/")
}

/// How far the index covers the contracts bought before it existed: the
/// last `c/` key indexed so far, or [`COMPLETE`] once every contract is.
/// Absent: not begun (a database from before the index).
pub const PROGRESS: &str = "meta/by-party";

/// [`PROGRESS`]'s value once every contract is indexed.
pub const COMPLETE: &[u8] = b"complete";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partys_rows_share_its_prefix_and_no_other_partys() {
        let a = "ab".repeat(32);
        let b = format!("{a}0");
        assert!(key(&a, "CTR_1").starts_with(&prefix(&a)));
        assert!(!key(&b, "CTR_1").starts_with(&prefix(&a)));
        assert_eq!(&key(&a, "CTR_1")[prefix(&a).len()..], "CTR_1");
    }
}
