//! `GET {stream}:connect` (server-sent events) and `POST {stream}:waitForEvent`.
//! Both consume a connection's feed; the filter is applied here, per
//! connection, off the stream's actor.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::error::ApiError;
use crate::connection::feed::{Feed, FeedItem};
use crate::connection::{
    match_events, split_batches, try_condition, wait_timeout_message, Batch, CloseReason,
    ConnectParams, LiveEvent, WAIT_RECENT_TYPES_MAX,
};
use crate::filter::CompiledFilter;
use crate::stream::{types, StreamAddress, Streams};
use crate::subscription::Filter;

/// SSE messages buffered between the feed and the client's socket.
const SSE_BUFFER_MESSAGES: usize = 16;
/// Longest waitForEvent.
pub const WAIT_TIMEOUT_MS_MAX: u64 = 300_000;

fn batch_event(b: &Batch) -> SseEvent {
    SseEvent::default().event("batch").data(b.render())
}

/// Streams a connection's feed as SSE until the client leaves or the
/// connection closes.
pub fn sse(feed: Feed, params: ConnectParams, project: &str) -> Response {
    let project = project.to_string();
    let (tx, mut rx) = mpsc::channel::<Result<SseEvent, Infallible>>(SSE_BUFFER_MESSAGES);
    tokio::spawn(async move {
        let mut feed = feed;
        loop {
            let item = tokio::select! {
                item = feed.next() => item,
                _ = tx.closed() => return, // the client left: the guard closes it
            };
            let Some(item) = item else {
                return;
            };
            let out: Vec<SseEvent> = match item {
                FeedItem::Closed { reason, error } => {
                    let closed = json!({"reason": reason.as_str(), "error": error});
                    let _ = tx
                        .send(Ok(SseEvent::default()
                            .event("closed")
                            .data(closed.to_string())))
                        .await;
                    return;
                }
                FeedItem::Events {
                    events,
                    state,
                    stream_max_offset,
                    first,
                } => {
                    if !params.events {
                        // State only: coalesce to the newest state.
                        if !first && feed.pending() {
                            continue;
                        }
                        vec![batch_event(&Batch {
                            events: Vec::new(),
                            state,
                            stream_max_offset,
                        })]
                    } else {
                        let mut selected: Vec<LiveEvent> = Vec::new();
                        let found =
                            match_events(&project, &params.filter, &events, |_| false).await;
                        for (e, m) in events.iter().zip(found) {
                            match m {
                                Ok(true) => selected.push(e.clone()),
                                Ok(false) => {}
                                Err(error) => {
                                    let closed =
                                        json!({"reason": "delivery-failed", "error": error});
                                    let _ = tx
                                        .send(Ok(SseEvent::default()
                                            .event("closed")
                                            .data(closed.to_string())))
                                        .await;
                                    feed.guard.end(CloseReason::DeliveryFailed, Some(error));
                                    return;
                                }
                            }
                        }
                        let mut batches = split_batches(
                            &selected,
                            params.max_delivery_events,
                            params.max_delivery_bytes,
                            state.clone(),
                            stream_max_offset,
                        );
                        if batches.is_empty() && first {
                            batches.push(Batch {
                                events: Vec::new(),
                                state,
                                stream_max_offset,
                            });
                        }
                        batches.iter().map(batch_event).collect()
                    }
                }
            };
            for event in out {
                if tx.send(Ok(event)).await.is_err() {
                    return;
                }
            }
        }
    });
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// The body of `:waitForEvent`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitInput {
    #[serde(default, deserialize_with = "crate::stream::bounded::optional_offset")]
    pub after_offset: Option<u64>,
    #[serde(default)]
    pub event_types: Option<Vec<String>>,
    #[serde(default)]
    pub jsonata_condition: Option<String>,
    pub timeout_ms: u64,
}

/// `POST {stream}:waitForEvent`: the first matching event after
/// `afterOffset` (history, ephemeral buffer, or live), or `408 timeout`.
pub async fn wait_for_event(
    streams: &Streams,
    address: &StreamAddress,
    input: WaitInput,
) -> Result<Value, ApiError> {
    if input.timeout_ms == 0 || input.timeout_ms > WAIT_TIMEOUT_MS_MAX {
        return Err(ApiError::invalid(format!(
            "timeoutMs {} must be from 1 to {WAIT_TIMEOUT_MS_MAX}",
            input.timeout_ms
        )));
    }
    let filter = CompiledFilter::new(
        Some(&Filter {
            event_types: input.event_types.clone(),
            jsonata_condition: input.jsonata_condition.clone(),
        }),
        false,
    )
    .map_err(|m| ApiError::new(400, "invalid-jsonata", format!("jsonataCondition: {m}")))?;
    try_condition(address.namespace.storage_key(), &filter)
        .await
        .map_err(|m| ApiError::new(422, "jsonata-limit-exceeded", m))?;
    let key = format!("wait:{}", uuid::Uuid::new_v4());
    let params = ConnectParams {
        connection_key: Some(key.clone()),
        replay_after_offset: input.after_offset,
        state: false,
        ..ConnectParams::default()
    };
    let mut feed = streams.connect(address, params).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(input.timeout_ms);
    let mut seen = 0u64;
    let mut recent: VecDeque<String> = VecDeque::new();
    loop {
        let item = tokio::select! {
            item = feed.next() => item,
            _ = tokio::time::sleep_until(deadline) => {
                feed.guard.end(CloseReason::ClosedByOwner, None);
                let recent: Vec<String> = recent.into_iter().collect();
                return Err(ApiError::new(408, "timeout", wait_timeout_message(input.timeout_ms, seen, &recent)));
            }
        };
        match item {
            Some(FeedItem::Events { events, .. }) => {
                let own = key.clone();
                let found = match_events(
                    address.namespace.storage_key(),
                    &filter,
                    &events,
                    move |e| is_own_audit(e, &own),
                )
                .await;
                for (e, m) in events.iter().zip(found) {
                    if is_own_audit(e, &key) {
                        continue;
                    }
                    seen += 1;
                    recent.retain(|t| *t != e.event_type);
                    recent.push_back(e.event_type.clone());
                    if recent.len() > WAIT_RECENT_TYPES_MAX {
                        recent.pop_front();
                    }
                    match m {
                        Ok(true) => {
                            feed.guard.end(CloseReason::ClosedByOwner, None);
                            return Ok(json!({"event": *e.value}));
                        }
                        Ok(false) => {}
                        Err(error) => {
                            feed.guard
                                .end(CloseReason::DeliveryFailed, Some(error.clone()));
                            let code = if crate::jsonata::is_limit_exceeded(&error) {
                                "jsonata-limit-exceeded"
                            } else {
                                "condition-failed"
                            };
                            return Err(ApiError::new(422, code, error));
                        }
                    }
                }
            }
            Some(FeedItem::Closed {
                reason: CloseReason::LeaseLost,
                ..
            }) => return Err(crate::error::Error::lease_lost(&address.path).into()),
            Some(FeedItem::Closed { reason, error }) => {
                return Err(ApiError::unavailable(
                    "connection-closed",
                    format!(
                        "the stream closed the wait ({}){}",
                        reason.as_str(),
                        error.map(|e| format!(": {e}")).unwrap_or_default()
                    ),
                    1,
                ))
            }
            None => {
                return Err(ApiError::unavailable(
                    "connection-closed",
                    "the stream closed the wait",
                    1,
                ))
            }
        }
    }
}

/// The wait's own connection-opened / connection-closed events.
fn is_own_audit(e: &LiveEvent, key: &str) -> bool {
    (e.event_type == types::CONNECTION_OPENED || e.event_type == types::CONNECTION_CLOSED)
        && e.value["payload"]["connectionKey"] == key
}
