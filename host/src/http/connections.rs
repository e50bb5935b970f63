//! `GET {stream}:connect` (server-sent events) and `POST
//! {stream}:waitForEvent` over HTTP: parse, call the host
//! ([`crate::host::live`]), render (each [`Live`] message is one SSE event).

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;

use crate::host::live::{Live, LiveConnection, WaitFor};

pub use crate::host::live::WAIT_TIMEOUT_MS_MAX;

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

impl From<WaitInput> for WaitFor {
    fn from(i: WaitInput) -> Self {
        WaitFor {
            after_offset: i.after_offset,
            event_types: i.event_types,
            jsonata_condition: i.jsonata_condition,
            timeout_ms: i.timeout_ms,
        }
    }
}
