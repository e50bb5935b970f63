//! `GET {stream}:connect` (server-sent events) and `POST
//! {stream}:waitForEvent` over HTTP: parse, call the host
//! ([`crate::host::live`]), render (each [`Live`] message is one SSE event).

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::json;

use crate::host::live::{Live, LiveConnection};

/// Streams a live connection as SSE until the client leaves (dropping the
/// connection closes it) or the connection closes.
pub fn sse(live: LiveConnection) -> Response {
    let stream = live.map(|message| {
        Ok::<_, Infallible>(match message {
            Live::Batch(b) => SseEvent::default().event("batch").data(b.render()),
            Live::Closed { reason, error } => SseEvent::default()
                .event("closed")
                .data(json!({"reason": reason, "error": error}).to_string()),
        })
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}
