//! The reduced core state of a stream and the pure reducer that folds every
//! committed event into it.
//!
//! **Invariant:** the core state equals the fold of the stream's committed
//! events, except `maxOffset`, which also counts the offsets that ephemeral
//! events consumed (offsets are never reused, so the head is part of the state).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::event::{types, Event};
use crate::subscription::{
    parse_payload, CursorSet, DeliveryHalted, InboundRecord, OutboundSubscription,
    SubscriptionConfig, SubscriptionCursorSet, SubscriptionDeliveryHalted,
    SubscriptionDeliveryResumed, SubscriptionRemoved, GENERATED_KEY_PREFIX, INBOUND_RECORDS_MAX,
};

/// Largest serialized core state, in bytes. An append that would grow the
/// state past this is rejected before it commits.
pub const STATE_BYTES_MAX: usize = 1024 * 1024;

/// The reduced core state (`GET {stream}:state`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CoreState {
    /// The stream's project, if any.
    pub project_id: Option<String>,
    /// Its canonical path.
    pub path: String,
    /// Its id (a new one per lifetime).
    pub stream_id: String,
    /// When it was created.
    pub created_at: String,
    /// Committed events.
    pub event_count: u64,
    /// The highest offset (ephemeral ones included).
    pub max_offset: u64,
    /// Whether appends are refused.
    pub paused: bool,
    /// Why it was paused.
    pub pause_reason: Option<String>,
    /// Its subscriptions, both ways.
    pub subscriptions: Subscriptions,
    /// What the Durable Streams protocol knows of it, once created through
    /// the protocol (and until deleted through it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable_stream: Option<super::durable::DurableStream>,
    /// Its retention bounds (`:configureRetention`), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<super::retention::Retention>,
    /// The lowest offset that may still hold a stored event: 1 until
    /// retention removes events from the front of the log.
    #[serde(default = "first_offset")]
    pub first_offset: u64,
    /// Stored events retention removed, and the digest chained over them
    /// (the last `events-removed` event's).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub removed_events: u64,
    /// The last `events-removed` event's digest.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub removed_digest: String,
}

fn first_offset() -> u64 {
    1
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Subscription state: inbound fence records and outbound subscriptions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subscriptions {
    /// Subscriptions delivering to this stream, by source path.
    pub inbound: Inbound,
    /// Subscriptions of this stream, by key.
    pub outbound: Outbound,
}

/// Passive fence records kept by a receiving stream, by source path and key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inbound {
    /// By source path, then subscription key.
    pub by_source_path: BTreeMap<String, BTreeMap<String, InboundRecord>>,
}

/// Durable subscriptions stored on a source stream, by key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outbound {
    /// By subscription key.
    pub by_key: BTreeMap<String, OutboundSubscription>,
}

impl CoreState {
    /// The state right after the `created` event at offset 1.
    pub fn from_created(created: &Event) -> CoreState {
        let text = |key: &str| {
            created
                .payload
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        CoreState {
            project_id: text("projectId"),
            path: text("path").unwrap_or_default(),
            stream_id: text("streamId").unwrap_or_default(),
            created_at: created.created_at.clone(),
            event_count: 1,
            max_offset: created.offset,
            paused: false,
            pause_reason: None,
            subscriptions: Subscriptions::default(),
            durable_stream: None,
            retention: None,
            first_offset: 1,
            removed_events: 0,
            removed_digest: String::new(),
        }
    }

    /// Stored events still in the log (ephemeral ones are never stored).
    pub fn stored_events(&self) -> u64 {
        self.event_count.saturating_sub(self.removed_events)
    }

    /// The stored events retention's `maxEvents` counts: all but the
    /// newest `events-removed` line (which a removal never removes, so a
    /// log at its bound does not remove one event a second to record the
    /// last removal).
    pub fn retained_events(&self) -> u64 {
        self.stored_events()
            .saturating_sub(u64::from(self.removed_events > 0))
    }

    /// Folds one event into the state. Ephemeral events only move the head;
    /// copied events are inert data (no control behaviour on this stream).
    pub fn reduce(&mut self, event: &Event) {
        self.max_offset = self.max_offset.max(event.offset);
        if event.ephemeral {
            return;
        }
        self.event_count += 1;
        if let Some(d) = &mut self.durable_stream {
            d.reduce(event);
        }
        if event.is_copy() {
            self.record_inbound(event);
            return;
        }
        let p = &event.payload;
        match event.event_type.as_str() {
            types::SUBSCRIPTION_CONFIGURED => {
                let Ok(mut config) = parse_payload::<SubscriptionConfig>("payload", p) else {
                    return;
                };
                let explicit = config
                    .subscription_key
                    .as_ref()
                    .map(|k| k.trim().to_string());
                let generated = match &explicit {
                    None => true,
                    Some(k) => {
                        k.starts_with(GENERATED_KEY_PREFIX)
                            && self
                                .subscriptions
                                .outbound
                                .by_key
                                .get(k)
                                .is_some_and(|s| s.subscription_key_was_generated == Some(true))
                    }
                };
                let key =
                    explicit.unwrap_or_else(|| format!("{GENERATED_KEY_PREFIX}{}", event.offset));
                config.subscription_key = Some(key.clone());
                if let crate::subscription::Receiver::CopyToStream {
                    receiving_stream_path,
                    ..
                } = &mut config.receiver
                {
                    if let Ok(c) = super::address::canonicalize_path(receiving_stream_path) {
                        *receiving_stream_path = c;
                    }
                }
                self.subscriptions.outbound.by_key.insert(
                    key,
                    OutboundSubscription {
                        configuration: config,
                        configured_at_offset: event.offset,
                        configured_at: event.created_at.clone(),
                        subscription_key_was_generated: generated.then_some(true),
                        cursor_set: None,
                        delivery_halted: None,
                    },
                );
            }
            types::SUBSCRIPTION_REMOVED => {
                if let Ok(r) = parse_payload::<SubscriptionRemoved>("payload", p) {
                    self.subscriptions
                        .outbound
                        .by_key
                        .remove(&r.subscription_key);
                }
            }
            types::SUBSCRIPTION_CURSOR_SET => {
                if let Ok(c) = parse_payload::<SubscriptionCursorSet>("payload", p) {
                    if let Some(s) = self
                        .subscriptions
                        .outbound
                        .by_key
                        .get_mut(&c.subscription_key)
                    {
                        s.cursor_set = Some(CursorSet {
                            after_offset: c.after_offset,
                            set_at_source_offset: event.offset,
                        });
                    }
                }
            }
            types::SUBSCRIPTION_DELIVERY_HALTED => {
                if let Ok(h) = parse_payload::<SubscriptionDeliveryHalted>("payload", p) {
                    if let Some(s) = self
                        .subscriptions
                        .outbound
                        .by_key
                        .get_mut(&h.subscription_key)
                    {
                        s.delivery_halted = Some(DeliveryHalted {
                            reason: "delivery-failed".into(),
                            after_offset: h.after_offset,
                            attempts: h.attempts,
                            error: h.error,
                        });
                    }
                }
            }
            types::SUBSCRIPTION_DELIVERY_RESUMED => {
                if let Ok(r) = parse_payload::<SubscriptionDeliveryResumed>("payload", p) {
                    if let Some(s) = self
                        .subscriptions
                        .outbound
                        .by_key
                        .get_mut(&r.subscription_key)
                    {
                        s.delivery_halted = None;
                    }
                }
            }
            types::PAUSED => {
                self.paused = true;
                self.pause_reason = Some(pause_reason(&event.payload));
            }
            types::RESUMED => {
                self.paused = false;
                self.pause_reason = None;
            }
            types::DURABLE_STREAM_CREATED => {
                self.durable_stream = super::durable::DurableStream::from_created(event);
            }
            types::RETENTION_CONFIGURED => {
                if let Ok(r) = super::retention::Retention::from_payload("payload", p) {
                    self.retention = r;
                }
            }
            types::EVENTS_REMOVED => {
                if let Ok(r) = super::retention::EventsRemoved::from_payload("payload", p) {
                    self.first_offset = self.first_offset.max(r.through_offset + 1);
                    self.removed_events += r.count;
                    self.removed_digest = r.digest;
                }
            }
            types::DURABLE_STREAM_DELETED => {
                let soft = p.get("soft").and_then(Value::as_bool).unwrap_or(false);
                match &mut self.durable_stream {
                    Some(d) if soft => d.deleted = true,
                    _ => self.durable_stream = None,
                }
            }
            _ => {}
        }
    }

    /// Updates the passive fence record from a committed copy's last hop.
    fn record_inbound(&mut self, event: &Event) {
        let Some(hop) = event.source.as_ref().and_then(|s| s.copied_from.last()) else {
            return;
        };
        let inbound = &mut self.subscriptions.inbound.by_source_path;
        let exists = inbound
            .get(&hop.path)
            .is_some_and(|m| m.contains_key(&hop.subscription_key));
        if !exists {
            let records: usize = inbound.values().map(|m| m.len()).sum();
            if records >= INBOUND_RECORDS_MAX {
                evict_oldest(inbound);
            }
        }
        let record = inbound
            .entry(hop.path.clone())
            .or_default()
            .entry(hop.subscription_key.clone())
            .or_insert_with(|| InboundRecord {
                stream_id: hop.stream_id.clone(),
                stream_created_at: hop.stream_created_at.clone(),
                cursor_changed_at_source_offset: hop.cursor_changed_at_source_offset,
                num_events_received: 0,
                last_event_received_at: None,
            });
        let stamp = crate::subscription::Stamp {
            stream_created_at: hop.stream_created_at.clone(),
            stream_id: hop.stream_id.clone(),
            cursor_changed_at_source_offset: hop.cursor_changed_at_source_offset,
        };
        if stamp.compare(&record.stamp()) == std::cmp::Ordering::Greater {
            record.stream_id = stamp.stream_id;
            record.stream_created_at = stamp.stream_created_at;
            record.cursor_changed_at_source_offset = stamp.cursor_changed_at_source_offset;
        }
        record.num_events_received += 1;
        record.last_event_received_at = Some(event.created_at.clone());
    }

    /// The state as JSON, as it is stored.
    pub fn serialized(&self) -> String {
        serde_json::to_string(self).expect("core state serializes")
    }

    /// The length in bytes of [`CoreState::serialized`], counted as it is
    /// written (no string is built: every append request checks it).
    pub fn serialized_len(&self) -> usize {
        /// Counts the bytes written to it and keeps none.
        struct Counter(usize);
        impl std::io::Write for Counter {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0 += buf.len();
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut counter = Counter(0);
        serde_json::to_writer(&mut counter, self).expect("core state serializes");
        counter.0
    }
}

/// Drops the inbound record with the oldest `lastEventReceivedAt`.
fn evict_oldest(inbound: &mut BTreeMap<String, BTreeMap<String, InboundRecord>>) {
    let oldest = inbound
        .iter()
        .flat_map(|(path, m)| {
            m.iter()
                .map(move |(k, r)| (r.last_event_received_at.clone(), path.clone(), k.clone()))
        })
        .min();
    if let Some((_, path, key)) = oldest {
        if let Some(m) = inbound.get_mut(&path) {
            m.remove(&key);
            if m.is_empty() {
                inbound.remove(&path);
            }
        }
    }
}

/// The reason recorded by a `paused` event (`payload.reason`, or a default).
pub fn pause_reason(payload: &Map<String, Value>) -> String {
    payload
        .get("reason")
        .and_then(Value::as_str)
        .unwrap_or("paused by request")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(offset: u64, event_type: &str, payload: Value) -> Event {
        Event {
            offset,
            event_type: event_type.into(),
            payload: payload.as_object().cloned().unwrap(),
            metadata: None,
            idempotency_key: None,
            created_at: "2026-11-30T00:00:00.000Z".into(),
            source: None,
            ephemeral: false,
            trace: None,
            redacted: None,
        }
    }

    fn created() -> CoreState {
        CoreState::from_created(&event(
            1,
            types::CREATED,
            json!({"projectId": "acme", "path": "/a", "streamId": "sid"}),
        ))
    }

    #[test]
    fn created_sets_identity_and_empty_subscriptions() {
        let s = created();
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["projectId"], "acme");
        assert_eq!(v["path"], "/a");
        assert_eq!(v["streamId"], "sid");
        assert_eq!(v["eventCount"], 1);
        assert_eq!(v["maxOffset"], 1);
        assert_eq!(v["paused"], false);
        assert_eq!(v["pauseReason"], Value::Null);
        assert_eq!(
            v["subscriptions"],
            json!({"inbound": {"bySourcePath": {}}, "outbound": {"byKey": {}}})
        );
    }

    #[test]
    fn pause_and_resume() {
        let mut s = created();
        s.reduce(&event(2, types::PAUSED, json!({"reason": "maintenance"})));
        assert!(s.paused);
        assert_eq!(s.pause_reason.as_deref(), Some("maintenance"));
        s.reduce(&event(3, types::RESUMED, json!({})));
        assert!(!s.paused);
        assert_eq!(s.pause_reason, None);
        assert_eq!((s.event_count, s.max_offset), (3, 3));
    }

    #[test]
    fn ephemeral_moves_only_the_head() {
        let mut s = created();
        let mut e = event(2, "x.y/z", json!({}));
        e.ephemeral = true;
        s.reduce(&e);
        assert_eq!((s.event_count, s.max_offset), (1, 2));
    }

    #[test]
    fn copied_control_events_are_inert() {
        let mut s = created();
        let mut e = event(2, types::PAUSED, json!({"reason": "r"}));
        e.source = Some(crate::event::EventSource::copied(vec![
            crate::event::CopiedFrom {
                project_id: Some("acme".into()),
                path: "/src".into(),
                stream_id: "other".into(),
                stream_created_at: "t".into(),
                offset: 9,
                event_type: types::PAUSED.into(),
                created_at: "t".into(),
                subscription_key: "k".into(),
                cursor_changed_at_source_offset: 3,
            },
        ]));
        s.reduce(&e);
        assert!(!s.paused);
        assert_eq!(s.event_count, 2);
    }

    #[test]
    fn serialized_len_counts_the_bytes_serialized_writes() {
        let mut s = created();
        assert_eq!(s.serialized_len(), s.serialized().len());
        s.reduce(&event(
            2,
            types::PAUSED,
            json!({"reason": "naïve \"quoted\" ünïcödé"}),
        ));
        s.reduce(&configure(
            3,
            json!({"subscriptionKey": "k", "receiver": copy_receiver()}),
        ));
        let text = s.serialized();
        assert!(text.contains("ünïcödé") && text.contains("\"k\""), "{text}");
        assert_eq!(s.serialized_len(), text.len());
    }

    fn configure(offset: u64, payload: Value) -> Event {
        event(offset, types::SUBSCRIPTION_CONFIGURED, payload)
    }

    fn copy_receiver() -> Value {
        json!({"action": "copy-to-stream", "receivingStreamPath": "/r/./x",
               "delivery": {"start": "now", "onFailingEvent": "halt"}})
    }

    #[test]
    fn subscription_configure_keys_and_generation_flags() {
        let mut s = created();
        s.reduce(&configure(2, json!({"receiver": copy_receiver()})));
        s.reduce(&configure(
            3,
            json!({"subscriptionKey": " k ", "receiver": copy_receiver()}),
        ));
        let by_key = &s.subscriptions.outbound.by_key;
        let generated = &by_key["subscription:2"];
        assert_eq!(generated.subscription_key_was_generated, Some(true));
        assert_eq!(
            generated.configuration.subscription_key.as_deref(),
            Some("subscription:2")
        );
        assert_eq!(
            (
                generated.configured_at_offset,
                generated.configured_at.as_str()
            ),
            (2, "2026-11-30T00:00:00.000Z")
        );
        let explicit = &by_key["k"];
        assert_eq!(explicit.subscription_key_was_generated, None);
        let v = serde_json::to_value(explicit).unwrap();
        assert_eq!(
            v["configuration"]["receiver"]["receivingStreamPath"],
            "/r/x"
        );
        assert!(v.get("subscriptionKeyWasGenerated").is_none());
        // Replacing a generated key keeps the flag; the entry is replaced whole.
        s.reduce(&event(
            4,
            types::SUBSCRIPTION_CURSOR_SET,
            json!({"subscriptionKey": "subscription:2", "afterOffset": 1}),
        ));
        s.reduce(&configure(5, json!({"subscriptionKey": "subscription:2", "description": "d", "receiver": copy_receiver()})));
        let replaced = &s.subscriptions.outbound.by_key["subscription:2"];
        assert_eq!(replaced.subscription_key_was_generated, Some(true));
        assert_eq!(replaced.cursor_set, None, "configure clears cursorSet");
        assert_eq!(replaced.configured_at_offset, 5);
    }

    #[test]
    fn cursor_set_halt_resume_and_remove() {
        let mut s = created();
        s.reduce(&configure(
            2,
            json!({"subscriptionKey": "k", "receiver": copy_receiver()}),
        ));
        s.reduce(&event(
            3,
            types::SUBSCRIPTION_CURSOR_SET,
            json!({"subscriptionKey": "k", "afterOffset": 1}),
        ));
        let k = &s.subscriptions.outbound.by_key["k"];
        assert_eq!(
            k.cursor_set,
            Some(crate::subscription::CursorSet {
                after_offset: 1,
                set_at_source_offset: 3
            })
        );
        assert_eq!((k.generation(), k.start_cursor()), (3, 1));
        s.reduce(&event(
            4,
            types::SUBSCRIPTION_DELIVERY_HALTED,
            json!({"subscriptionKey": "k",
            "reason": "delivery-failed", "afterOffset": 2, "attempts": 15, "error": "boom"}),
        ));
        let halted = s.subscriptions.outbound.by_key["k"]
            .delivery_halted
            .clone()
            .unwrap();
        assert_eq!(
            (
                halted.after_offset,
                halted.attempts,
                halted.error.as_deref()
            ),
            (2, 15, Some("boom"))
        );
        s.reduce(&event(
            5,
            types::SUBSCRIPTION_DELIVERY_RESUMED,
            json!({"subscriptionKey": "k"}),
        ));
        assert_eq!(s.subscriptions.outbound.by_key["k"].delivery_halted, None);
        assert_eq!(
            s.subscriptions.outbound.by_key["k"].generation(),
            3,
            "resume keeps the run"
        );
        s.reduce(&event(
            6,
            types::SUBSCRIPTION_REMOVED,
            json!({"subscriptionKey": "k", "reason": "requested"}),
        ));
        assert!(s.subscriptions.outbound.by_key.is_empty());
    }

    fn copied(offset: u64, path: &str, key: &str, generation: u64, at: &str) -> Event {
        let mut e = event(offset, "x.y/a", json!({}));
        e.created_at = at.into();
        e.source = Some(crate::event::EventSource::copied(vec![
            crate::event::CopiedFrom {
                project_id: Some("acme".into()),
                path: path.into(),
                stream_id: "sid".into(),
                stream_created_at: "2026-11-30T00:00:00.000Z".into(),
                offset: 9,
                event_type: "x.y/a".into(),
                created_at: "t".into(),
                subscription_key: key.into(),
                cursor_changed_at_source_offset: generation,
            },
        ]));
        e
    }

    #[test]
    fn inbound_records_follow_the_newest_stamp_and_count() {
        let mut s = created();
        s.reduce(&copied(2, "/src", "k", 5, "2026-11-30T00:00:01.000Z"));
        s.reduce(&copied(3, "/src", "k", 7, "2026-11-30T00:00:02.000Z"));
        s.reduce(&copied(4, "/src", "k", 5, "2026-11-30T00:00:03.000Z"));
        let r = &s.subscriptions.inbound.by_source_path["/src"]["k"];
        assert_eq!(
            r.cursor_changed_at_source_offset, 7,
            "an older stamp never moves the record back"
        );
        assert_eq!(r.num_events_received, 3);
        assert_eq!(
            r.last_event_received_at.as_deref(),
            Some("2026-11-30T00:00:03.000Z")
        );
    }

    #[test]
    fn inbound_records_are_bounded_evicting_the_oldest() {
        let mut s = created();
        for i in 0..crate::subscription::INBOUND_RECORDS_MAX as u64 {
            s.reduce(&copied(
                2 + i,
                "/src",
                &format!("k{i}"),
                1,
                &format!("2026-11-30T00:00:00.{:03}Z", 999 - (i % 1000)),
            ));
        }
        let total = |s: &CoreState| {
            s.subscriptions
                .inbound
                .by_source_path
                .values()
                .map(|m| m.len())
                .sum::<usize>()
        };
        assert_eq!(total(&s), 1000);
        // k999 has the oldest lastEventReceivedAt (…00.000Z).
        s.reduce(&copied(
            5000,
            "/other",
            "new",
            1,
            "2026-11-30T00:00:09.000Z",
        ));
        assert_eq!(total(&s), 1000);
        assert!(!s.subscriptions.inbound.by_source_path["/src"].contains_key("k999"));
        assert!(s.subscriptions.inbound.by_source_path["/other"].contains_key("new"));
    }
}
