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

/// The body of `POST {stream}:append`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AppendInput {
    pub events: Vec<EventInput>,
    #[serde(default)]
    pub expected_stream_id: Option<String>,
}
