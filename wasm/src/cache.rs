//! The bounded cache of prepared (compiled and linked) components: least
//! recently used entries go first once either bound (entries or bytes) is
//! passed. Pure bookkeeping; the runtime keeps one behind a mutex.

use std::collections::HashMap;
use std::hash::Hash;

/// Prepared components kept in memory.
pub const PREPARED_COMPONENTS_MAX: usize = 64;
/// Bytes of compiled code kept in memory (the sum of the entries' images).
pub const PREPARED_BYTES_MAX: usize = 512 * 1024 * 1024;

/// A least-recently-used map bounded by entry count and total bytes. The
/// most recent entry is kept even when it alone passes the byte bound.
#[derive(Debug)]
pub struct Lru<K, V> {
    entries: HashMap<K, Entry<V>>,
    bytes: usize,
    tick: u64,
    count_max: usize,
    bytes_max: usize,
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    bytes: usize,
    used: u64,
}

impl<K: Hash + Eq + Clone, V: Clone> Lru<K, V> {
    pub fn new(count_max: usize, bytes_max: usize) -> Self {
        Lru {
            entries: HashMap::new(),
            bytes: 0,
            tick: 0,
            count_max: count_max.max(1),
            bytes_max,
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The bytes of the entries held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether `key` is held (its use is not marked).
    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// The value of `key`, marked as just used.
    pub fn get(&mut self, key: &K) -> Option<V> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(key).map(|e| {
            e.used = tick;
            e.value.clone()
        })
    }

    /// Inserts (or replaces) `key`, then evicts the least recently used
    /// entries until both bounds hold; returns the evicted keys.
    pub fn insert(&mut self, key: K, value: V, bytes: usize) -> Vec<K> {
        self.tick += 1;
        let entry = Entry {
            value,
            bytes,
            used: self.tick,
        };
        if let Some(old) = self.entries.insert(key, entry) {
            self.bytes -= old.bytes;
        }
        self.bytes += bytes;
        let mut evicted = Vec::new();
        while self.entries.len() > self.count_max
            || (self.bytes > self.bytes_max && self.entries.len() > 1)
        {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = self.entries.remove(&oldest) {
                self.bytes -= e.bytes;
            }
            evicted.push(oldest);
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_entry_goes_when_the_count_is_passed() {
        let mut lru = Lru::new(2, usize::MAX);
        lru.insert("a", 1, 10);
        lru.insert("b", 2, 10);
        assert_eq!(lru.get(&"a"), Some(1), "a is now more recent than b");
        assert_eq!(lru.insert("c", 3, 10), vec!["b"]);
        assert_eq!(lru.get(&"b"), None);
        assert_eq!((lru.len(), lru.bytes()), (2, 20));
    }

    #[test]
    fn bytes_are_bounded_but_the_newest_entry_always_stays() {
        let mut lru = Lru::new(100, 100);
        lru.insert("a", 1, 60);
        lru.insert("b", 2, 30);
        assert_eq!(lru.insert("c", 3, 50), vec!["a"]);
        assert_eq!(lru.bytes(), 80);
        let evicted = lru.insert("huge", 4, 1000);
        assert_eq!(evicted.len(), 2);
        assert_eq!(lru.get(&"huge"), Some(4));
        assert_eq!(lru.bytes(), 1000);
    }

    #[test]
    fn replacing_an_entry_counts_its_bytes_once() {
        let mut lru = Lru::new(10, 100);
        lru.insert("a", 1, 40);
        lru.insert("a", 2, 50);
        assert_eq!((lru.len(), lru.bytes()), (1, 50));
        assert_eq!(lru.get(&"a"), Some(2));
    }

    #[test]
    fn many_random_uses_never_pass_either_bound() {
        let mut lru = Lru::new(8, 1000);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = x % 32;
            if lru.get(&key).is_none() {
                lru.insert(key, key, (x % 300) as usize);
            }
            assert!(lru.len() <= 8);
            assert!(lru.bytes() <= 1000 || lru.len() == 1);
        }
    }
}
