//! The `webhook-post` receiver's envelope: one event per POST, the lean
//! envelope of API.md. At-least-once: receivers deduplicate by (streamId,
//! event.offset). The POST itself is `executor/webhook.rs`.

use serde_json::{json, Value};

use super::Failure;
use crate::jsonata::Expression;
use crate::stream::Event;

/// Everything one POST carries besides the event.
pub struct Envelope<'a> {
    pub project_id: Option<&'a str>,
    pub path: &'a str,
    pub stream_id: &'a str,
    pub stream_created_at: &'a str,
    pub subscription_key: &'a str,
    pub generation: u64,
    pub attempt: u32,
    pub configured_event: &'a Value,
}

/// A webhook's destination, as its places are counted (deliveries and
/// effects alike): the URL's host name, lowercase (`None`: not a URL,
/// refused when it is sent).
pub fn destination(url: &str) -> Option<String> {
    let url = url::Url::parse(url).ok()?;
    Some(url.host_str()?.to_ascii_lowercase())
}

/// The stable id of one event's delivery in one run (the same across retries).
pub fn delivery_id(stream_id: &str, key: &str, generation: u64, offset: u64) -> String {
    format!("{stream_id}:{key}:{generation}:{offset}")
}

/// The POST body.
pub fn body(envelope: &Envelope<'_>, event: &Value, offset: u64) -> Value {
    json!({
        "projectId": envelope.project_id,
        "path": envelope.path,
        "streamId": envelope.stream_id,
        "streamCreatedAt": envelope.stream_created_at,
        "event": event,
        "subscriptionKey": envelope.subscription_key,
        "cursorChangedAtSourceOffset": envelope.generation,
        "deliveryId": delivery_id(envelope.stream_id, envelope.subscription_key, envelope.generation, offset),
        "attempt": envelope.attempt,
        "configuredEvent": envelope.configured_event,
    })
}

/// The event as posted: the transform's output over the stored event, the
/// coordinates (offset, createdAt) kept.
pub fn posted_event(
    event: &Event,
    transform: Option<&Expression>,
    key: &str,
    event_bytes_max: usize,
) -> Result<Value, Failure> {
    let mut value = serde_json::to_value(event).expect("events serialize");
    if let Some(t) = transform {
        let (event_type, payload, metadata) =
            super::copy::transformed(t, event, key, event_bytes_max).map_err(|e| Failure {
                // The same transform of the same event fails again (an
                // evaluation is deterministic): halt at once.
                retryable: false,
                message: e.message,
                single_offset: Some(event.offset),
                at_offset: None,
                detail: None,
                filter: false,
                retry_after_ms: None,
            })?;
        value["type"] = json!(event_type);
        value["payload"] = Value::Object(payload);
        match metadata {
            Some(m) => value["metadata"] = Value::Object(m),
            None => {
                if let Some(o) = value.as_object_mut() {
                    o.remove("metadata");
                }
            }
        }
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_webhooks_destination_is_its_host_name() {
        assert_eq!(
            super::destination("https://Hooks.Example.com:8443/a?b").as_deref(),
            Some("hooks.example.com")
        );
        assert_eq!(
            super::destination("http://127.0.0.1:9/x").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(super::destination("not a url"), None);
    }
}
