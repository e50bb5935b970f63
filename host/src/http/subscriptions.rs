//! The subscription endpoints: `:subscribeToEventsFrom` and
//! `:unsubscribeFromEvents` on the receiving stream; `:setSubscriptionCursor`,
//! `:resumeSubscription` and `:setSubscriptionCursorAndResume` on the source.
//! Each appends control events to the source; the rules live in
//! `subscription` and run when those events are planned.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::error::ApiError;
use crate::stream::{types, AppendInput, Authority, Event, EventInput, StreamAddress, Streams};
use crate::subscription::{Filter, Receiver, Start, GENERATED_KEY_PREFIX};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubscribeInput {
    pub source_stream_path: String,
    #[serde(default)]
    pub subscription_key: Option<String>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub filter: Option<Filter>,
    #[serde(default)]
    pub jsonata_transform: Option<String>,
    #[serde(default)]
    pub start: Option<Start>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UnsubscribeInput {
    pub source_stream_path: String,
    pub subscription_key: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CursorInput {
    pub subscription_key: String,
    #[serde(deserialize_with = "crate::stream::bounded::offset")]
    pub after_offset: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeyInput {
    pub subscription_key: String,
}

fn event(event_type: &str, payload: Value, idempotency_key: Option<String>) -> EventInput {
    EventInput {
        event_type: event_type.to_string(),
        payload: payload.as_object().cloned(),
        metadata: None,
        idempotency_key,
        ephemeral: None,
        offset: None,
        source: None,
    }
}

async fn append(
    streams: &Streams,
    to: &StreamAddress,
    events: Vec<EventInput>,
) -> Result<Vec<Event>, ApiError> {
    let out = streams
        .append(
            to,
            AppendInput {
                events,
                expected_stream_id: None,
            },
            Authority::Public,
        )
        .await?;
    Ok(out.events)
}

/// The effective key of a committed configure event.
fn key_of(configured: &Event) -> String {
    configured
        .payload
        .get("subscriptionKey")
        .and_then(Value::as_str)
        .map(|k| k.trim().to_string())
        .unwrap_or_else(|| format!("{GENERATED_KEY_PREFIX}{}", configured.offset))
}

/// `POST {receiver}:subscribeToEventsFrom`.
pub async fn subscribe(
    streams: &Streams,
    receiver: &StreamAddress,
    input: SubscribeInput,
) -> Result<Value, ApiError> {
    let source = StreamAddress::new(receiver.namespace.clone(), &input.source_stream_path)
        .map_err(|e| ApiError::invalid(format!("sourceStreamPath: {}", e.message)))?;
    if source.path == receiver.path {
        return Err(ApiError::invalid(format!(
            "a stream cannot receive events from itself: sourceStreamPath {:?} is {:?}",
            input.source_stream_path, receiver.path
        )));
    }
    if input.subscription_key.is_none() && input.idempotency_key.is_none() {
        return Err(ApiError::invalid(
            "a keyless copy subscription requires idempotencyKey so setup is safe to retry",
        ));
    }
    let mut payload = Map::new();
    if let Some(k) = &input.subscription_key {
        payload.insert("subscriptionKey".into(), json!(k));
    }
    if let Some(d) = &input.description {
        payload.insert("description".into(), json!(d));
    }
    if let Some(f) = &input.filter {
        payload.insert(
            "filter".into(),
            serde_json::to_value(f).expect("filter serializes"),
        );
    }
    let receiver_config = json!({
        "action": "copy-to-stream",
        "receivingStreamPath": receiver.path,
        "jsonataTransform": input.jsonata_transform,
        "delivery": {"start": input.start.unwrap_or(Start::Now), "onFailingEvent": "halt"},
    });
    let mut receiver_config = receiver_config.as_object().cloned().expect("object");
    if input.jsonata_transform.is_none() {
        receiver_config.remove("jsonataTransform");
    }
    payload.insert("receiver".into(), Value::Object(receiver_config));
    let events = append(
        streams,
        &source,
        vec![event(
            types::SUBSCRIPTION_CONFIGURED,
            Value::Object(payload),
            input.idempotency_key,
        )],
    )
    .await?;
    let configured = events.into_iter().next().expect("one event");
    Ok(json!({"subscriptionKey": key_of(&configured), "subscriptionConfiguredEvent": configured}))
}

/// `POST {receiver}:unsubscribeFromEvents`.
pub async fn unsubscribe(
    streams: &Streams,
    receiver: &StreamAddress,
    input: UnsubscribeInput,
) -> Result<Value, ApiError> {
    let source = StreamAddress::new(receiver.namespace.clone(), &input.source_stream_path)
        .map_err(|e| ApiError::invalid(format!("sourceStreamPath: {}", e.message)))?;
    let absent = json!({"status": "already-absent"});
    let state = match streams.state(&source).await {
        Ok(s) => s,
        Err(e) if e.code == "stream-not-found" => return Ok(absent),
        Err(e) => return Err(e.into()),
    };
    let key = input.subscription_key.trim();
    let Some(sub) = state.subscriptions.outbound.by_key.get(key) else {
        return Ok(absent);
    };
    match &sub.configuration.receiver {
        Receiver::CopyToStream {
            receiving_stream_path,
            ..
        } if *receiving_stream_path == receiver.path => {}
        other => {
            return Err(ApiError::invalid(format!(
                "subscription {key:?} of {:?} is not a copy to {:?} (it is {} {})",
                source.path,
                receiver.path,
                other.action(),
                match other {
                    Receiver::CopyToStream {
                        receiving_stream_path,
                        ..
                    } => format!("to {receiving_stream_path:?}"),
                    _ => String::new(),
                }
            )))
        }
    }
    let removed = append(
        streams,
        &source,
        vec![event(
            types::SUBSCRIPTION_REMOVED,
            json!({"subscriptionKey": key, "reason": "requested"}),
            None,
        )],
    )
    .await;
    match removed {
        Ok(events) => Ok(json!({"status": "removed", "subscriptionRemovedEvent": events[0]})),
        Err(e) if e.code == "subscription-not-found" => Ok(absent),
        Err(e) => Err(e),
    }
}

fn cursor_set(input: &CursorInput) -> EventInput {
    event(
        types::SUBSCRIPTION_CURSOR_SET,
        json!({"subscriptionKey": input.subscription_key, "afterOffset": input.after_offset}),
        None,
    )
}

fn resumed(subscription_key: &str) -> EventInput {
    event(
        types::SUBSCRIPTION_DELIVERY_RESUMED,
        json!({"subscriptionKey": subscription_key}),
        None,
    )
}

/// `POST {source}:setSubscriptionCursor`.
pub async fn set_cursor(
    streams: &Streams,
    source: &StreamAddress,
    input: CursorInput,
) -> Result<Value, ApiError> {
    let events = append(streams, source, vec![cursor_set(&input)]).await?;
    Ok(json!({"subscriptionCursorSetEvent": events[0]}))
}

/// `POST {source}:resumeSubscription`.
pub async fn resume(
    streams: &Streams,
    source: &StreamAddress,
    input: KeyInput,
) -> Result<Value, ApiError> {
    // Failing, not halted: nothing to resume, but the wait ends now.
    let key = input.subscription_key.as_str();
    match streams.retry(source, Some(key), None).await {
        Ok(keys) if !keys.is_empty() => return Ok(json!({"retrying": true})),
        // A stream another host owns: that host answers (HTTP forwarding).
        Err(e) if e.owner_url.is_some() => return Err(e.into()),
        _ => {}
    }
    let events = append(streams, source, vec![resumed(key)]).await?;
    Ok(json!({"subscriptionDeliveryResumedEvent": events[0]}))
}

/// `POST {source}:setSubscriptionCursorAndResume`: both events in one append.
pub async fn set_cursor_and_resume(
    streams: &Streams,
    source: &StreamAddress,
    input: CursorInput,
) -> Result<Value, ApiError> {
    let events = append(
        streams,
        source,
        vec![cursor_set(&input), resumed(&input.subscription_key)],
    )
    .await?;
    Ok(json!({"cursorSet": events[0], "resumed": events[1]}))
}
