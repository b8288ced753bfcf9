//! The memo of a loaded component (the WIT `memo` interface): bytes its
//! instances derive from what stays the same until the next load of
//! components (the OpenAPI document as YAML, the docs page), kept between
//! requests so that each does not compute them again.
//!
//! One memo per loaded component, so a swap starts the family with an
//! empty one. Entries belong to one generation of the served route table
//! and document ([`crate::runtime::api::Served::generation`]): a request
//! reads and writes the generation it began under, so a request that began
//! before another family's load can neither read nor keep a value derived
//! from the document as it was. Bounded in bytes: a value that does not fit
//! empties the memo first.

use std::collections::HashMap;
use std::sync::Mutex;

/// Longest key.
pub const MAX_KEY: usize = 256;
/// Most bytes one memo holds (keys and values, plus [`ENTRY_OVERHEAD`] per entry).
pub const MAX_BYTES: usize = 8 << 20;
/// What each entry counts beyond its key and value.
const ENTRY_OVERHEAD: usize = 64;

#[derive(Default)]
pub struct Memo {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    generation: u64,
    entries: HashMap<String, Vec<u8>>,
    bytes: usize,
}

fn cost(key: &str, value: &[u8]) -> usize {
    key.len() + value.len() + ENTRY_OVERHEAD
}

impl Memo {
    /// The value under `key` kept in `generation`.
    pub fn get(&self, generation: u64, key: &str) -> Option<Vec<u8>> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.generation != generation {
            return None;
        }
        inner.entries.get(key).cloned()
    }

    /// Keep `value` under `key` for `generation`. A newer generation empties
    /// the memo; an older one keeps nothing. False when nothing was kept.
    pub fn put(&self, generation: u64, key: String, value: Vec<u8>) -> bool {
        let size = cost(&key, &value);
        if key.len() > MAX_KEY || size > MAX_BYTES {
            return false;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if generation < inner.generation {
            return false;
        }
        if generation > inner.generation {
            *inner = Inner {
                generation,
                ..Inner::default()
            };
        }
        if let Some(old) = inner.entries.remove(&key) {
            inner.bytes -= cost(&key, &old);
        }
        if inner.bytes + size > MAX_BYTES {
            inner.entries.clear();
            inner.bytes = 0;
        }
        inner.bytes += size;
        inner.entries.insert(key, value);
        true
    }

    /// Bytes held (keys, values and per-entry overhead).
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.inner.lock().unwrap().bytes
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
        assert!(m.put(2, "b".into(), b"2".to_vec()));
        assert_eq!(m.get(2, "a"), None, "the older generation's entry is gone");
        assert!(!m.put(1, "a".into(), b"late".to_vec()));
        assert_eq!(m.get(1, "a"), None);
        assert_eq!(m.get(2, "b").as_deref(), Some(&b"2"[..]));
        assert_eq!(m.bytes(), cost("b", b"2"));
    }

    #[test]
    fn replacing_a_value_counts_its_bytes_once() {
        let m = Memo::default();
        assert!(m.put(0, "k".into(), vec![0; 1000]));
        assert!(m.put(0, "k".into(), vec![1; 10]));
        assert_eq!(m.bytes(), cost("k", &[0; 10]));
        assert_eq!(m.get(0, "k"), Some(vec![1; 10]));
    }

    #[test]
    fn it_stays_within_its_budget() {
        let m = Memo::default();
        let big = MAX_BYTES / 3;
        for i in 0..10 {
            assert!(m.put(0, format!("k{i}"), vec![0; big]));
            assert!(m.bytes() <= MAX_BYTES, "{} bytes after {i}", m.bytes());
            assert!(m.get(0, &format!("k{i}")).is_some(), "the newest is kept");
        }
        assert!(!m.put(0, "huge".into(), vec![0; MAX_BYTES]));
        assert!(!m.put(0, "k".repeat(MAX_KEY + 1), vec![]));
        assert!(m.put(0, "k".repeat(MAX_KEY), vec![]));
    }
}
