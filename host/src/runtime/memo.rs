//! The memo of a loaded component (the WIT `memo` interface): bytes its
//! instances derive from what stays the same until the next load of
//! components (the OpenAPI document as YAML, the docs page), kept between
//! requests so that each does not compute them again.
//!
//! One memo per loaded component, so a swap starts the family with an
//! empty one. Entries belong to one generation of the served route table
//! and document ([`crate::runtime::api::Served::generation`]): a request
//! reads and writes under the generation it began under, and the first
//! call under a newer generation empties the memo. So a request that
//! began after a load never reads what was kept before it. (One that began
//! before it may still read and keep text of its own generation until a
//! later request calls.) Bounded in bytes and entries: an entry that does
//! not fit empties the memo first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Longest key.
pub const MAX_KEY: usize = 256;
/// Most bytes one memo holds (keys and values, plus [`ENTRY_OVERHEAD`] per entry).
pub const MAX_BYTES: usize = 8 << 20;
/// Most entries one memo holds.
pub const MAX_ENTRIES: usize = 1024;
/// What each entry counts beyond its key and value.
const ENTRY_OVERHEAD: usize = 64;

#[derive(Default)]
pub struct Memo {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    generation: u64,
    entries: HashMap<String, Arc<[u8]>>,
    bytes: usize,
}

impl Inner {
    /// Nothing kept, for `generation`; the allocations freed (`clear`
    /// would keep the table's).
    fn empty(&mut self, generation: u64) {
        *self = Inner {
            generation,
            ..Inner::default()
        };
    }
}

fn cost(key: &str, value: &[u8]) -> usize {
    key.len() + value.len() + ENTRY_OVERHEAD
}

impl Memo {
    /// The memo as `generation` sees it: emptied (its allocations freed)
    /// when `generation` is newer than what it holds; `None` when it is
    /// older.
    fn at(&self, generation: u64) -> Option<MutexGuard<'_, Inner>> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if generation < inner.generation {
            return None;
        }
        if generation > inner.generation {
            inner.empty(generation);
        }
        Some(inner)
    }

    /// The value under `key` kept in `generation`.
    pub fn get(&self, generation: u64, key: &str) -> Option<Vec<u8>> {
        let value = self.at(generation)?.entries.get(key).cloned()?;
        // Copied once the lock is released.
        Some(value.to_vec())
    }

    /// Keep `value` under `key` for `generation`. False when nothing was
    /// kept (a key or value over the bounds, or an older generation).
    pub fn put(&self, generation: u64, key: String, value: Vec<u8>) -> bool {
        let size = cost(&key, &value);
        if key.len() > MAX_KEY || size > MAX_BYTES {
            return false;
        }
        let Some(mut inner) = self.at(generation) else {
            return false;
        };
        if let Some(old) = inner.entries.remove(&key) {
            inner.bytes -= cost(&key, &old);
        }
        if inner.bytes + size > MAX_BYTES || inner.entries.len() >= MAX_ENTRIES {
            inner.empty(generation);
        }
        inner.bytes += size;
        inner.entries.insert(key, value.into());
        true
    }

    /// Bytes and entries held.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let inner = self.inner.lock().unwrap();
        (inner.bytes, inner.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_read_back_in_its_generation_only() {
        let m = Memo::default();
        assert!(m.put(3, "yaml".into(), b"doc".to_vec()));
        assert_eq!(m.get(3, "yaml").as_deref(), Some(&b"doc"[..]));
        assert_eq!(m.get(2, "yaml"), None);
        assert_eq!(m.get(4, "yaml"), None);
        assert_eq!(m.get(3, "other"), None);
    }

    #[test]
    fn a_newer_generation_empties_it_and_an_older_one_keeps_nothing() {
        let m = Memo::default();
        assert!(m.put(1, "a".into(), b"1".to_vec()));
        assert_eq!(m.get(2, "a"), None, "a newer generation does not read it");
        assert_eq!(m.held(), (0, 0), "and emptied it");
        assert!(
            !m.put(1, "a".into(), b"late".to_vec()),
            "an older one keeps nothing"
        );
        assert!(m.put(2, "b".into(), b"2".to_vec()));
        assert_eq!(m.get(1, "a"), None);
        assert_eq!(m.get(2, "b").as_deref(), Some(&b"2"[..]));
        assert_eq!(m.held().0, cost("b", b"2"));
    }

    #[test]
    fn replacing_a_value_counts_its_bytes_once() {
        let m = Memo::default();
        assert!(m.put(0, "k".into(), vec![0; 1000]));
        assert!(m.put(0, "k".into(), vec![1; 10]));
        assert_eq!(m.held().0, cost("k", &[0; 10]));
        assert_eq!(m.get(0, "k"), Some(vec![1; 10]));
    }

    #[test]
    fn it_stays_within_its_budget() {
        let m = Memo::default();
        let big = MAX_BYTES / 3;
        for i in 0..10 {
            assert!(m.put(0, format!("k{i}"), vec![0; big]));
            assert!(m.held().0 <= MAX_BYTES, "{} bytes after {i}", m.held().0);
            assert!(m.get(0, &format!("k{i}")).is_some(), "the newest is kept");
        }
        assert!(!m.put(0, "huge".into(), vec![0; MAX_BYTES]));
        assert!(m.held().1 > 0, "a value refused alone empties nothing");
        assert!(!m.put(0, "k".repeat(MAX_KEY + 1), vec![]));
        assert!(m.put(0, "k".repeat(MAX_KEY), vec![]));
    }

    #[test]
    fn it_holds_at_most_max_entries() {
        let m = Memo::default();
        for i in 0..MAX_ENTRIES * 3 {
            assert!(m.put(7, i.to_string(), vec![]));
            assert!(m.held().1 <= MAX_ENTRIES);
        }
        assert!(m.get(7, &(MAX_ENTRIES * 3 - 1).to_string()).is_some());
    }
}
