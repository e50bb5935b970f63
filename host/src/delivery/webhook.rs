//! The `webhook-post` receiver: one event per POST, the lean envelope of
//! API.md, any 2xx acknowledges. At-least-once: receivers deduplicate by
//! (streamId, event.offset).

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{json, Value};

use super::Failure;
use crate::stream::Event;

/// Bytes of a failing receiver's answer quoted in the error.
const RESPONSE_QUOTE_BYTES_MAX: usize = 200;

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .user_agent(concat!("streamhost/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("building the webhook client")
    })
}

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
pub fn posted_event(event: &Event, transform: Option<&str>, key: &str) -> Result<Value, Failure> {
    let mut value = serde_json::to_value(event).expect("events serialize");
    if let Some(t) = transform {
        let t = crate::jsonata::compile(t).map_err(|m| Failure {
            message: m,
            retryable: false,
            single_offset: Some(event.offset),
        })?;
        let (event_type, payload, metadata) =
            super::copy::transformed(&t, event, key).map_err(|e| Failure {
                message: e.message,
                retryable: true,
                single_offset: Some(event.offset),
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

/// POSTs one body; any 2xx acknowledges.
pub async fn post(url: &str, body: &Value, timeout_ms: u64, offset: u64) -> Result<(), Failure> {
    let fail = |message: String| Failure {
        message,
        retryable: true,
        single_offset: Some(offset),
    };
    let response = client()
        .post(url)
        .timeout(Duration::from_millis(timeout_ms))
        .json(body)
        .send()
        .await
        .map_err(|e| {
            if e.is_timeout() {
                fail(format!(
                    "webhook POST to {url} timed out after {timeout_ms}ms"
                ))
            } else {
                fail(format!("webhook POST to {url} failed: {e}"))
            }
        })?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let mut text = response.text().await.unwrap_or_default();
    if text.len() > RESPONSE_QUOTE_BYTES_MAX {
        let mut end = RESPONSE_QUOTE_BYTES_MAX;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    Err(fail(format!(
        "webhook responded {} {}",
        status.as_u16(),
        text.trim()
    )))
}
