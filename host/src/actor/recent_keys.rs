//! The idempotency keys a stream committed most recently, with their events,
//! so that a client's retry is answered from memory.
//!
//! The duplicate check itself costs no read: a round is planned as if its
//! keys were new and the log's unique index on `(stream, idempotency_key)`
//! checks them inside the commit's own insert; a round that the index
//! refuses is planned again with its keys read from storage (see the actor's
//! `start_round`). Every key is still checked against the whole history.
//! This map only spares a retry of a recent request that refused commit.
//!
//! Bounded by the bytes of the events it holds; the oldest go first.

use std::collections::{HashMap, VecDeque};

use crate::stream::Event;

/// Bytes of stored events kept per stream.
pub const RECENT_KEYS_BYTES_MAX: usize = 64 * 1024;
/// Events larger than this are not kept (a retry of one reads storage).
pub const RECENT_KEY_EVENT_BYTES_MAX: usize = 4 * 1024;

#[derive(Default)]
pub(super) struct RecentKeys {
    by_key: HashMap<String, (Event, usize)>,
    order: VecDeque<String>,
    bytes: usize,
}

impl RecentKeys {
    /// Remembers `event` (committed under `key`, stored as `bytes` bytes).
    pub(super) fn insert(&mut self, key: &str, event: &Event, bytes: usize) {
        if bytes > RECENT_KEY_EVENT_BYTES_MAX || self.by_key.contains_key(key) {
            return;
        }
        self.by_key.insert(key.to_string(), (event.clone(), bytes));
        self.order.push_back(key.to_string());
        self.bytes += bytes;
        while self.bytes > RECENT_KEYS_BYTES_MAX {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some((_, b)) = self.by_key.remove(&oldest) {
                self.bytes -= b;
            }
        }
    }

    /// Remembers a round's committed keyed events, in commit order, as
    /// [`RecentKeys::insert`] of each would, without copying the older
    /// ones that the newer would evict before the round ends (a round of
    /// many batches holds more than the bound).
    pub(super) fn insert_newest(&mut self, committed: &[(&str, &Event, usize)]) {
        let kept = |(key, _, bytes): &&(&str, &Event, usize)| {
            *bytes <= RECENT_KEY_EVENT_BYTES_MAX && !self.by_key.contains_key(*key)
        };
        // The newest that fit in the bound together: each older one
        // would be evicted by them.
        let mut bytes = 0;
        let mut first = committed.len();
        for (i, c) in committed.iter().enumerate().rev() {
            if !kept(&c) {
                continue;
            }
            if bytes + c.2 > RECENT_KEYS_BYTES_MAX {
                // This one would be evicted, and every event kept before
                // it.
                self.clear();
                break;
            }
            bytes += c.2;
            first = i;
        }
        for (key, event, bytes) in &committed[first..] {
            self.insert(key, event, *bytes);
        }
    }

    /// Replaces the event kept under `key`, if any (it was redacted).
    pub(super) fn replace(&mut self, key: &str, event: &Event) {
        if let Some((kept, _)) = self.by_key.get_mut(key) {
            *kept = event.clone();
        }
    }

    /// Forgets the events at or before `offset` (retention removed them: a
    /// retry of their keys appends again, as after they left this map).
    pub(super) fn forget_through(&mut self, offset: u64) {
        let by_key = &mut self.by_key;
        let mut freed = 0;
        self.order.retain(|k| match by_key.get(k) {
            Some((e, b)) if e.offset <= offset => {
                freed += *b;
                by_key.remove(k);
                false
            }
            _ => true,
        });
        self.bytes -= freed;
    }

    /// The committed event of `key`, if it is among the recent ones.
    pub(super) fn get(&self, key: &str) -> Option<&Event> {
        self.by_key.get(key).map(|(e, _)| e)
    }

    /// Forgets everything (the stream was reset or loaded again).
    pub(super) fn clear(&mut self) {
        self.by_key.clear();
        self.order.clear();
        self.bytes = 0;
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_key.len()
    }

    /// The keys kept, oldest first, with the bytes counted.
    #[cfg(test)]
    fn kept(&self) -> (Vec<String>, usize) {
        (self.order.iter().cloned().collect(), self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(offset: u64, key: &str) -> Event {
        Event {
            offset,
            event_type: "t".into(),
            payload: Default::default(),
            metadata: None,
            idempotency_key: Some(key.into()),
            created_at: "2026-01-01T00:00:00.000Z".into(),
            source: None,
            ephemeral: false,
            trace: None,
            redacted: None,
        }
    }

    #[test]
    fn a_recent_key_is_found_and_an_unknown_one_is_not() {
        let mut keys = RecentKeys::default();
        keys.insert("a", &event(1, "a"), 100);
        assert_eq!(keys.get("a").map(|e| e.offset), Some(1));
        assert!(keys.get("b").is_none());
    }

    #[test]
    fn the_oldest_keys_go_first_once_the_bytes_are_spent() {
        let mut keys = RecentKeys::default();
        let each = 1024;
        let fit = RECENT_KEYS_BYTES_MAX / each;
        for i in 0..fit as u64 + 3 {
            keys.insert(&format!("k{i}"), &event(i + 1, "k"), each);
        }
        assert_eq!(keys.len(), fit);
        assert!(keys.get("k0").is_none() && keys.get("k2").is_none());
        assert!(keys.get("k3").is_some());
        assert!(keys.get(&format!("k{}", fit + 2)).is_some());
    }

    #[test]
    fn keys_of_removed_events_are_forgotten_and_their_bytes_given_back() {
        let mut keys = RecentKeys::default();
        for i in 1..=4u64 {
            keys.insert(&format!("k{i}"), &event(i, "k"), 100);
        }
        keys.forget_through(2);
        assert!(keys.get("k1").is_none() && keys.get("k2").is_none());
        assert_eq!(keys.get("k3").map(|e| e.offset), Some(3));
        assert_eq!((keys.len(), keys.bytes, keys.order.len()), (2, 200, 2));
    }

    /// A round's newest events inserted together keep exactly what
    /// inserting each in turn keeps, over rounds of every size (some
    /// larger than the bound, some events too large to keep).
    #[test]
    fn a_rounds_newest_keep_what_inserting_each_would() {
        let (mut each, mut together) = (RecentKeys::default(), RecentKeys::default());
        // A fixed linear congruential sequence: the same rounds every run.
        let mut seed: u64 = 7;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        let mut offset = 0;
        for round in 0..300 {
            let len = next(if round % 10 == 0 { 400 } else { 40 });
            let events: Vec<(String, Event, usize)> = (0..len)
                .map(|_| {
                    offset += 1;
                    let key = format!("k{offset}");
                    let bytes = match next(20) {
                        0 => RECENT_KEY_EVENT_BYTES_MAX + 1 + next(100) as usize,
                        _ => 1 + next(RECENT_KEY_EVENT_BYTES_MAX as u64) as usize,
                    };
                    (key.clone(), event(offset, &key), bytes)
                })
                .collect();
            for (key, e, bytes) in &events {
                each.insert(key, e, *bytes);
            }
            let committed: Vec<(&str, &Event, usize)> =
                events.iter().map(|(k, e, b)| (k.as_str(), e, *b)).collect();
            together.insert_newest(&committed);
            assert_eq!(together.kept(), each.kept(), "round {round} of {len}");
        }
        assert!(each.len() > 10, "the bound was reached and kept events");
    }

    #[test]
    fn a_large_event_is_not_kept_and_the_first_holder_of_a_key_stays() {
        let mut keys = RecentKeys::default();
        keys.insert("big", &event(1, "big"), RECENT_KEY_EVENT_BYTES_MAX + 1);
        assert!(keys.get("big").is_none());
        keys.insert("a", &event(2, "a"), 10);
        keys.insert("a", &event(3, "a"), 10);
        assert_eq!(keys.get("a").map(|e| e.offset), Some(2));
        keys.clear();
        assert!(keys.get("a").is_none());
    }
}
