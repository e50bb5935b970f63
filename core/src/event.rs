//! Events: what callers send (`EventInput`), what the log holds (`Event`), and
//! the platform's own event types under `events.iterate.com/stream/`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Prefix of the platform's stream control types.
pub const STREAM_TYPE_PREFIX: &str = "events.iterate.com/stream/";

/// The largest offset (or id) a request may name: 2^63-1, what storage
/// holds. Larger values are refused, never wrapped.
pub const OFFSET_MAX: u64 = i64::MAX as u64;

/// Deserializers that refuse an offset above [`OFFSET_MAX`] (the error, with
/// its JSON path, names the field).
pub mod bounded {
    use serde::{Deserialize, Deserializer};

    use super::OFFSET_MAX;

    fn check<E: serde::de::Error>(v: u64) -> Result<u64, E> {
        if v > OFFSET_MAX {
            return Err(E::custom(format!(
                "{v} is above {OFFSET_MAX}, the largest offset"
            )));
        }
        Ok(v)
    }

    /// An offset.
    pub fn offset<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        check(u64::deserialize(d)?)
    }

    /// An optional offset.
    pub fn optional_offset<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        Option::<u64>::deserialize(d)?.map(check).transpose()
    }
}

/// The platform's event types, by their suffix after [`STREAM_TYPE_PREFIX`].
pub mod types {
    /// Offset 1 of every stream.
    pub const CREATED: &str = "events.iterate.com/stream/created";
    /// Stream configuration.
    pub const CONFIGURED: &str = "events.iterate.com/stream/configured";
    /// Appends are refused until resumed.
    pub const PAUSED: &str = "events.iterate.com/stream/paused";
    /// The stream takes appends again.
    pub const RESUMED: &str = "events.iterate.com/stream/resumed";
    /// A failure worth recording in the stream (an effect failed, a delivery skipped).
    pub const ERROR_OCCURRED: &str = "events.iterate.com/stream/error-occurred";
    /// A subscription's configuration (durable, on its source).
    pub const SUBSCRIPTION_CONFIGURED: &str = "events.iterate.com/stream/subscription-configured";
    /// A subscription removed.
    pub const SUBSCRIPTION_REMOVED: &str = "events.iterate.com/stream/subscription-removed";
    /// A subscription's cursor moved.
    pub const SUBSCRIPTION_CURSOR_SET: &str = "events.iterate.com/stream/subscription-cursor-set";
    /// A subscription stopped delivering.
    pub const SUBSCRIPTION_DELIVERY_HALTED: &str =
        "events.iterate.com/stream/subscription-delivery-halted";
    /// A halted subscription delivers again.
    pub const SUBSCRIPTION_DELIVERY_RESUMED: &str =
        "events.iterate.com/stream/subscription-delivery-resumed";
    /// A live connection opened (ephemeral).
    pub const CONNECTION_OPENED: &str = "events.iterate.com/stream/connection-opened";
    /// A live connection closed (ephemeral).
    pub const CONNECTION_CLOSED: &str = "events.iterate.com/stream/connection-closed";

    /// An event's payload and metadata were erased (`:redact`); its
    /// payload names the offset and the reason.
    pub const EVENT_REDACTED: &str = "events.iterate.com/stream/event-redacted";

    /// The stream's retention bounds (`:configureRetention`): `maxAgeMs`
    /// and `maxEvents`, either or both; neither removes retention.
    pub const RETENTION_CONFIGURED: &str = "events.iterate.com/stream/retention-configured";
    /// Retention removed the stored events through `throughOffset`
    /// (`count` of them; `digest` chains over their bodies).
    pub const EVENTS_REMOVED: &str = "events.iterate.com/stream/events-removed";

    /// A Durable Streams stream was created here (`PUT /ds/...`): its
    /// content type and lifetime.
    pub const DURABLE_STREAM_CREATED: &str = "events.iterate.com/stream/durable-stream-created";
    /// The Durable Streams stream takes no more appends.
    pub const DURABLE_STREAM_CLOSED: &str = "events.iterate.com/stream/durable-stream-closed";
    /// The Durable Streams stream was deleted (`DELETE /ds/...`); with
    /// `soft: true` its forks still read what they inherited from it.
    pub const DURABLE_STREAM_DELETED: &str = "events.iterate.com/stream/durable-stream-deleted";
    /// A fork of this Durable Streams stream was created (its path).
    pub const DURABLE_STREAM_FORKED: &str = "events.iterate.com/stream/durable-stream-forked";
    /// A fork of this Durable Streams stream is gone (its path).
    pub const DURABLE_STREAM_FORK_REMOVED: &str =
        "events.iterate.com/stream/durable-stream-fork-removed";

    /// Types only the platform may append.
    pub const PLATFORM_AUTHORED: &[&str] = &[
        CREATED,
        SUBSCRIPTION_DELIVERY_HALTED,
        CONNECTION_OPENED,
        CONNECTION_CLOSED,
        EVENT_REDACTED,
        RETENTION_CONFIGURED,
        EVENTS_REMOVED,
        DURABLE_STREAM_CREATED,
        DURABLE_STREAM_CLOSED,
        DURABLE_STREAM_DELETED,
        DURABLE_STREAM_FORKED,
        DURABLE_STREAM_FORK_REMOVED,
    ];

    /// Control types public callers may append.
    pub const PUBLIC_CONTROL: &[&str] = &[
        CONFIGURED,
        SUBSCRIPTION_CONFIGURED,
        SUBSCRIPTION_REMOVED,
        SUBSCRIPTION_CURSOR_SET,
        SUBSCRIPTION_DELIVERY_RESUMED,
        ERROR_OCCURRED,
        PAUSED,
        RESUMED,
    ];
}

/// Whether `event_type` is in the platform's `events.iterate.com/stream/` family.
pub fn is_stream_control_type(event_type: &str) -> bool {
    event_type.starts_with(STREAM_TYPE_PREFIX)
}

/// One hop of copy provenance: the immediate source event of a copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CopiedFrom {
    /// The source's project, if any.
    pub project_id: Option<String>,
    /// The source stream's path.
    pub path: String,
    /// The source stream's id.
    pub stream_id: String,
    /// When the source stream was created.
    pub stream_created_at: String,
    /// The event's offset in the source.
    pub offset: u64,
    /// The event's type.
    #[serde(rename = "type")]
    pub event_type: String,
    /// When the source event was committed.
    pub created_at: String,
    /// The subscription that copied it.
    pub subscription_key: String,
    /// The start of the subscription run that copied it.
    pub cursor_changed_at_source_offset: u64,
}

/// The processor effect that appended an event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EffectOrigin {
    /// The processor's source stream.
    pub path: String,
    /// The source stream's id.
    pub stream_id: String,
    /// The processor component.
    pub component: String,
    /// The effect's key.
    pub key: String,
    /// The checkpoint the effect was committed with.
    pub checkpoint_offset: u64,
}

/// Where an event came from, when the platform copied it or a processor
/// effect appended it. Only the platform sets it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventSource {
    /// The copies this event went through, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copied_from: Vec<CopiedFrom>,
    /// The processor effect that appended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<EffectOrigin>,
}

impl EventSource {
    /// Copy provenance only.
    pub fn copied(copied_from: Vec<CopiedFrom>) -> EventSource {
        EventSource {
            copied_from,
            effect: None,
        }
    }

    /// Whether it says anything.
    pub fn is_empty(&self) -> bool {
        self.copied_from.is_empty() && self.effect.is_none()
    }
}

/// A committed (or ephemeral) event as stored and served. A redacted
/// event serializes its payload and metadata as `null`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Dense, from 1.
    pub offset: u64,
    /// The event's type.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The payload, an object (`{}` when none was given; empty, and `null`
    /// when serialized, once redacted).
    #[serde(deserialize_with = "null_as_empty")]
    pub payload: Map<String, Value>,
    /// Metadata, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// The idempotency key, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// When it was committed (RFC 3339, milliseconds).
    pub created_at: String,
    /// Provenance (platform-authored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<EventSource>,
    /// The W3C trace context it was appended in, carried by what it causes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::trace::Trace>,
    /// Delivered live, never stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ephemeral: bool,
    /// Its payload and metadata were erased (`:redact`): when and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redacted: Option<Redaction>,
}

/// When and why an event's payload and metadata were erased.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Redaction {
    /// When (RFC 3339, milliseconds).
    pub at: String,
    /// Why, as the caller said.
    pub reason: String,
}

/// A payload of `null` (a redacted event's) reads as an empty object.
fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Map<String, Value>, D::Error> {
    Ok(Option::<Map<String, Value>>::deserialize(d)?.unwrap_or_default())
}

impl Serialize for Event {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let redacted = self.redacted.is_some();
        let mut out = s.serialize_struct("Event", 10)?;
        out.serialize_field("offset", &self.offset)?;
        out.serialize_field("type", &self.event_type)?;
        if redacted {
            out.serialize_field("payload", &Value::Null)?;
            out.serialize_field("metadata", &Value::Null)?;
        } else {
            out.serialize_field("payload", &self.payload)?;
            if let Some(m) = &self.metadata {
                out.serialize_field("metadata", m)?;
            }
        }
        if let Some(k) = &self.idempotency_key {
            out.serialize_field("idempotencyKey", k)?;
        }
        out.serialize_field("createdAt", &self.created_at)?;
        if let Some(source) = &self.source {
            out.serialize_field("source", source)?;
        }
        if let Some(trace) = &self.trace {
            out.serialize_field("trace", trace)?;
        }
        if self.ephemeral {
            out.serialize_field("ephemeral", &true)?;
        }
        if let Some(r) = &self.redacted {
            out.serialize_field("redacted", r)?;
        }
        out.end()
    }
}

impl Event {
    /// This event with its payload and metadata erased, `redacted` saying
    /// when and why; its offset, type, idempotency key, time, provenance
    /// and trace stay.
    pub fn redacted(&self, at: &str, reason: &str) -> Event {
        Event {
            payload: Map::new(),
            metadata: None,
            redacted: Some(Redaction {
                at: at.to_string(),
                reason: reason.to_string(),
            }),
            ..self.clone()
        }
    }

    /// Whether the event carries copy provenance (and so is inert data here).
    pub fn is_copy(&self) -> bool {
        self.source
            .as_ref()
            .is_some_and(|s| !s.copied_from.is_empty())
    }
}

/// One event as a caller sends it to `:append`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventInput {
    /// The event's type.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The payload, an object (default `{}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Map<String, Value>>,
    /// Metadata, an object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// A retry with the same key answers the original event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Delivered live, never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<bool>,
    /// Compare-and-append: the offset this event must get.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "bounded::optional_offset"
    )]
    pub offset: Option<u64>,
    /// Copy provenance; only the platform may set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<EventSource>,
    /// The W3C trace context (an append's `traceparent` header sets it on
    /// every event without one); a malformed one is dropped, never refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::trace::Trace>,
    /// A copy of a redacted event is redacted: its source's redaction (its
    /// payload and metadata are not kept). Only the platform may set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redacted: Option<Redaction>,
}

impl EventInput {
    /// The `paused` event: appends are refused (`503 stream-paused`) and
    /// deliveries stop until the stream is resumed.
    ///
    /// ```
    /// use streamhost_core::stream::EventInput;
    ///
    /// let paused = EventInput::paused("maintenance");
    /// assert_eq!(paused.event_type, "events.iterate.com/stream/paused");
    /// assert_eq!(paused.payload.unwrap()["reason"], "maintenance");
    /// assert_eq!(EventInput::resumed().event_type, "events.iterate.com/stream/resumed");
    /// ```
    pub fn paused(reason: impl Into<String>) -> EventInput {
        EventInput::new(types::PAUSED).payload(serde_json::json!({"reason": reason.into()}))
    }

    /// The `resumed` event: the stream takes appends again.
    pub fn resumed() -> EventInput {
        EventInput::new(types::RESUMED)
    }

    /// An event of type `event_type` with an empty payload; add to it with
    /// the builder methods:
    ///
    /// ```
    /// use serde_json::json;
    /// use streamhost_core::stream::EventInput;
    ///
    /// let e = EventInput::new("events.example/order-created")
    ///     .payload(json!({"total": 120}))
    ///     .idempotency_key("order-7");
    /// assert_eq!(e.payload.unwrap()["total"], 120);
    /// ```
    pub fn new(event_type: impl Into<String>) -> EventInput {
        EventInput {
            event_type: event_type.into(),
            payload: None,
            metadata: None,
            idempotency_key: None,
            ephemeral: None,
            offset: None,
            source: None,
            trace: None,
            redacted: None,
        }
    }

    /// Sets the payload. A JSON value that is not an object is kept under
    /// `"value"`, since payloads are objects.
    pub fn payload(mut self, payload: Value) -> EventInput {
        self.payload = Some(as_object(payload));
        self
    }

    /// Sets the metadata (an object; anything else is kept under `"value"`).
    pub fn metadata(mut self, metadata: Value) -> EventInput {
        self.metadata = Some(as_object(metadata));
        self
    }

    /// Sets the idempotency key: a retry with it answers the original event.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> EventInput {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Makes the event ephemeral: delivered live, never stored.
    pub fn ephemeral(mut self) -> EventInput {
        self.ephemeral = Some(true);
        self
    }

    /// Compare-and-append: the event must get this offset.
    pub fn at_offset(mut self, offset: u64) -> EventInput {
        self.offset = Some(offset);
        self
    }
}

fn as_object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => {
            let mut m = Map::new();
            m.insert("value".into(), other);
            m
        }
    }
}

impl AppendInput {
    /// An append of `events`.
    pub fn new(events: impl IntoIterator<Item = EventInput>) -> AppendInput {
        AppendInput {
            events: events.into_iter().collect(),
            expected_stream_id: None,
        }
    }
}

/// The body of `POST {stream}:append`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AppendInput {
    /// The events, committed together or not at all (at most 1000).
    pub events: Vec<EventInput>,
    /// Refused with `stream-id-changed` when the stream's id differs.
    #[serde(default)]
    pub expected_stream_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Doubles the default `serde_json` parser reads one unit in the last
    /// place off (found by drawing bit patterns at random): with the
    /// `float_roundtrip` feature the core turns on, each reads back as
    /// written. (Within the workspace's test build a test-only dependency
    /// turns the feature on too; `cargo test -p streamhost-core` tests the
    /// core's own manifest.)
    #[test]
    fn a_number_in_an_appended_payload_reads_back_as_the_double_it_was() {
        for text in [
            "1.0715660391465826e-75",
            "-1.81996730402717e-179",
            "-1.603964615428183e143",
            "2.638344616030823e-256",
        ] {
            let body =
                format!(r#"{{"events": [{{"type": "x.y/z", "payload": {{"n": {text}}}}}]}}"#);
            let input: AppendInput = serde_json::from_str(&body).unwrap();
            let n = &input.events[0].payload.as_ref().unwrap()["n"];
            let expected: f64 = text.parse().unwrap();
            assert_eq!(
                n.as_f64().unwrap().to_bits(),
                expected.to_bits(),
                "{text} read back as {n}"
            );
            assert_eq!(
                serde_json::to_string(n).unwrap(),
                serde_json::to_string(&expected).unwrap()
            );
        }
    }
}
