//! The idempotency keys a stream committed most recently, as a filter in
//! front of the log's index, so that a client's retry is read from the log
//! rather than refused by a commit.
//!
//! The duplicate check itself costs no read: a round is planned as if its
//! keys were new and the log's unique index on `(stream, idempotency_key)`
//! checks them inside the commit's own insert; a round that the index
//! refuses is planned again with its keys read from storage (see the actor's
//! `start_round`). Every key is still checked against the whole history.
//!
//! A key this filter holds is read from the log before its round is
//! planned, so a retry of a recent request is answered from what committed
//! (as it is stored now: redacted, or gone with retention) without a refused
//! commit. It keeps a 64-bit hash of each key, not the key or its event:
//! remembering a key costs a hash, not a copy. Two keys may share a hash;
//! the read then finds nothing and the key is taken as new, as without the
//! filter.
//!
//! Bounded by count: the newest [`RECENT_KEYS_MAX`] keys; the oldest go
//! first.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, RandomState};

/// Keys remembered per stream (about 52 KiB at most: 36 KiB of hash
/// table, 16 KiB of order).
pub const RECENT_KEYS_MAX: usize = 2048;

#[derive(Default)]
pub(super) struct RecentKeys {
    hashes: HashSet<u64>,
    order: VecDeque<u64>,
    /// Seeded per stream: which keys share a hash cannot be chosen.
    state: RandomState,
}

impl RecentKeys {
    fn hash(&self, key: &str) -> u64 {
        self.state.hash_one(key)
    }

    /// Remembers a committed key.
    pub(super) fn insert(&mut self, key: &str) {
        let h = self.hash(key);
        if self.hashes.contains(&h) {
            return;
        }
        // The oldest goes first, so neither grows past the bound.
        if self.order.len() >= RECENT_KEYS_MAX {
            if let Some(oldest) = self.order.pop_front() {
                self.hashes.remove(&oldest);
            }
        }
        self.hashes.insert(h);
        self.order.push_back(h);
    }

    /// Whether `key` may be among the recent ones (`false`: it surely is
    /// not).
    pub(super) fn may_hold(&self, key: &str) -> bool {
        !self.hashes.is_empty() && self.hashes.contains(&self.hash(key))
    }

    /// Forgets everything (the stream was reset or loaded again).
    pub(super) fn clear(&mut self) {
        self.hashes.clear();
        self.order.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.hashes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recent_key_is_held_and_an_unknown_one_is_not() {
        let mut keys = RecentKeys::default();
        keys.insert("a");
        assert!(keys.may_hold("a"));
        assert!(!keys.may_hold("b"));
        keys.clear();
        assert!(!keys.may_hold("a"));
    }

    #[test]
    fn the_oldest_keys_go_first_once_the_count_is_reached() {
        let mut keys = RecentKeys::default();
        for i in 0..RECENT_KEYS_MAX + 3 {
            keys.insert(&format!("k{i}"));
        }
        assert_eq!(
            (keys.len(), keys.order.len()),
            (RECENT_KEYS_MAX, RECENT_KEYS_MAX)
        );
        assert!(!keys.may_hold("k0") && !keys.may_hold("k2"));
        assert!(keys.may_hold("k3"));
        assert!(keys.may_hold(&format!("k{}", RECENT_KEYS_MAX + 2)));
    }

    #[test]
    fn a_key_inserted_twice_is_counted_once() {
        let mut keys = RecentKeys::default();
        keys.insert("a");
        keys.insert("a");
        assert_eq!((keys.len(), keys.order.len()), (1, 1));
        // Evicting it once forgets it, with nothing left over.
        for i in 0..RECENT_KEYS_MAX {
            keys.insert(&format!("k{i}"));
        }
        assert!(!keys.may_hold("a"));
        assert_eq!(keys.order.len(), RECENT_KEYS_MAX);
    }
}
