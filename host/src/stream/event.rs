//! Events: what callers send (`EventInput`), what the log holds (`Event`), and
//! the platform's own event types under `events.iterate.com/stream/`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Prefix of the platform's stream control types.
pub const STREAM_TYPE_PREFIX: &str = "events.iterate.com/stream/";

/// The platform's event types, by their suffix after [`STREAM_TYPE_PREFIX`].
pub mod types {
    pub const CREATED: &str = "events.iterate.com/stream/created";
    pub const CONFIGURED: &str = "events.iterate.com/stream/configured";
    pub const PAUSED: &str = "events.iterate.com/stream/paused";
    pub const RESUMED: &str = "events.iterate.com/stream/resumed";
    pub const ERROR_OCCURRED: &str = "events.iterate.com/stream/error-occurred";
    pub const SUBSCRIPTION_CONFIGURED: &str = "events.iterate.com/stream/subscription-configured";
    pub const SUBSCRIPTION_REMOVED: &str = "events.iterate.com/stream/subscription-removed";
    pub const SUBSCRIPTION_CURSOR_SET: &str = "events.iterate.com/stream/subscription-cursor-set";
    pub const SUBSCRIPTION_DELIVERY_HALTED: &str =
        "events.iterate.com/stream/subscription-delivery-halted";
    pub const SUBSCRIPTION_DELIVERY_RESUMED: &str =
        "events.iterate.com/stream/subscription-delivery-resumed";
    pub const CONNECTION_OPENED: &str = "events.iterate.com/stream/connection-opened";
    pub const CONNECTION_CLOSED: &str = "events.iterate.com/stream/connection-closed";

    /// Types only the platform may append.
    pub const PLATFORM_AUTHORED: &[&str] = &[
        CREATED,
        SUBSCRIPTION_DELIVERY_HALTED,
        CONNECTION_OPENED,
        CONNECTION_CLOSED,
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
    pub project_id: Option<String>,
    pub path: String,
    pub stream_id: String,
    pub stream_created_at: String,
    pub offset: u64,
    #[serde(rename = "type")]
    pub event_type: String,
    pub created_at: String,
    pub subscription_key: String,
    pub cursor_changed_at_source_offset: u64,
}

/// The processor effect that appended an event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EffectOrigin {
    /// The processor's source stream.
    pub path: String,
    pub stream_id: String,
    pub component: String,
    pub key: String,
    pub checkpoint_offset: u64,
}

/// Where an event came from, when the platform copied it or a processor
/// effect appended it. Only the platform sets it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventSource {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copied_from: Vec<CopiedFrom>,
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

/// A committed (or ephemeral) event as stored and served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub offset: u64,
    #[serde(rename = "type")]
    pub event_type: String,
    pub payload: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<EventSource>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ephemeral: bool,
}

impl Event {
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
    #[serde(rename = "type")]
    pub event_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<bool>,
    /// Compare-and-append: the offset this event must get.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Copy provenance; only the platform may set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<EventSource>,
}

impl EventInput {
    /// An event of type `event_type` with an empty payload; add to it with
    /// the builder methods:
    ///
    /// ```
    /// use serde_json::json;
    /// use streamhost::stream::EventInput;
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
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AppendInput {
    pub events: Vec<EventInput>,
    #[serde(default)]
    pub expected_stream_id: Option<String>,
}
