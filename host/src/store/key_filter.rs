//! Which rows a closed batch may hold: a Bloom filter over its
//! `(table, key)` pairs, built once when the batch closes.
//!
//! A read in a batch looks through every closed batch not in the database
//! yet, newest first, before the snapshot (see
//! [`super::group_commit::RedbBatch`]): two ordered-map lookups per batch,
//! and under load that is several batches (dozens while a checkpoint
//! runs), most of which never wrote the key read. The filter answers
//! "not here" for almost all of them with two bit tests on one hash of the
//! key, computed once per read. It never answers "not here" for a row the
//! batch holds, so a read sees exactly what it saw without it.

use super::Overlay;
use std::hash::BuildHasher;

/// Bits per row: with two probes, about 1.4 % of the batches that lack a
/// key still have it looked up.
const BITS_PER_ROW: usize = 16;
/// Smallest filter (64 bytes) and largest (2 MiB): a batch of millions of
/// rows gets more false positives, never a wrong answer.
const MIN_BITS: usize = 512;
const MAX_BITS: usize = 1 << 24;

/// The filter of one closed batch.
pub(super) struct KeyFilter {
    words: Box<[u64]>,
    /// Bits minus one (a power of two).
    mask: u64,
}

/// The hash of a row as every filter takes it, computed once per read.
#[derive(Clone, Copy)]
pub(super) struct RowHash(u64);

impl RowHash {
    pub(super) fn of(table: &str, key: &[u8]) -> RowHash {
        // A fixed seed: the filters and the reads of one process must
        // agree, and nothing outside chooses the keys' bits (a crafted
        // collision costs one extra map lookup, not a wrong answer).
        RowHash(foldhash::fast::FixedState::with_seed(0x6b65_795f_6669_6c74).hash_one((table, key)))
    }

    /// The two bit positions, from the hash's two halves.
    fn probes(self, mask: u64) -> [u64; 2] {
        [self.0 & mask, self.0.rotate_left(32) & mask]
    }
}

impl KeyFilter {
    /// The filter of every row `writes` holds (puts and deletes alike).
    pub(super) fn of(writes: &Overlay) -> KeyFilter {
        let rows: usize = writes.values().map(|t| t.len()).sum();
        let bits = rows
            .saturating_mul(BITS_PER_ROW)
            .clamp(MIN_BITS, MAX_BITS)
            .next_power_of_two();
        let mut filter = KeyFilter {
            words: vec![0; bits / 64].into_boxed_slice(),
            mask: bits as u64 - 1,
        };
        for (table, rows) in writes {
            for key in rows.keys() {
                for bit in RowHash::of(table, key).probes(filter.mask) {
                    filter.words[(bit / 64) as usize] |= 1 << (bit % 64);
                }
            }
        }
        filter
    }

    /// False only when the batch holds no row hashing to `row`.
    pub(super) fn may_hold(&self, row: RowHash) -> bool {
        row.probes(self.mask)
            .iter()
            .all(|bit| self.words[(bit / 64) as usize] & (1 << (bit % 64)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn overlay(rows: &[(u8, Vec<u8>)]) -> Overlay {
        let mut o = Overlay::new();
        for (table, key) in rows {
            o.entry(format!("t{}", table % 4))
                .or_default()
                .insert(key.clone(), (key.len() % 2 == 0).then(|| key.clone()));
        }
        o
    }

    proptest! {
        /// Every row a batch holds passes its filter: reading through a
        /// filter never misses a write.
        #[test]
        fn a_held_row_always_passes(rows in prop::collection::vec((any::<u8>(), prop::collection::vec(any::<u8>(), 0..40)), 0..400)) {
            let writes = overlay(&rows);
            let filter = KeyFilter::of(&writes);
            for (table, keys) in &writes {
                for key in keys.keys() {
                    prop_assert!(filter.may_hold(RowHash::of(table, key)));
                }
            }
        }
    }

    #[test]
    fn most_absent_rows_are_refused() {
        let rows: Vec<(u8, Vec<u8>)> = (0u32..300)
            .map(|i| ((i % 4) as u8, format!("ix/i/term{i}\0ffff").into_bytes()))
            .collect();
        let filter = KeyFilter::of(&overlay(&rows));
        let passed = (0u32..10_000)
            .filter(|i| filter.may_hold(RowHash::of("t1", format!("ix/df/other{i}").as_bytes())))
            .count();
        // About 1.4 % expected; a filter that passes everything fails.
        assert!(passed < 500, "{passed} of 10,000 absent rows passed");
        // The same key in another table is another row.
        assert!(filter.may_hold(RowHash::of("t1", b"ix/i/term1\0ffff")));
        let elsewhere = (0u32..300)
            .filter(|i| {
                filter.may_hold(RowHash::of(
                    &format!("t{}", (i + 1) % 4),
                    format!("ix/i/term{i}\0ffff").as_bytes(),
                ))
            })
            .count();
        assert!(
            elsewhere < 30,
            "{elsewhere} of 300 rows passed in the wrong table"
        );
    }

    #[test]
    fn an_empty_batch_holds_nothing() {
        let filter = KeyFilter::of(&Overlay::new());
        assert!(!filter.may_hold(RowHash::of("t", b"k")));
    }
}
