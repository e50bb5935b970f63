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
