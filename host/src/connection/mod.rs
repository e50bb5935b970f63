//! Live connections: a retained callback that receives batches of a stream's
//! events (replay, then live), served as server-sent events. This module
//! holds the pure parts: parameters, coordinate validation, batch splitting
//! and rendering, and the waitForEvent timeout text. The actor keeps the
//! registered connections (`actor/connections.rs`); `http` streams
//! their batches.

pub mod feed;

use std::sync::Arc;

use serde_json::Value;

use crate::error::Error;
use crate::filter::CompiledFilter;
use crate::stream::CoreState;

/// Batches queued per connection; a client that lets them pile up is closed.
pub const CONNECTION_BUFFER_BATCHES: usize = 256;
/// Default `maxDeliveryEvents`.
pub const DELIVERY_EVENTS_DEFAULT: usize = 500;
/// Default `maxDeliveryBytes`.
pub const DELIVERY_BYTES_DEFAULT: usize = 1024 * 1024;
/// Recent event types named in a waitForEvent timeout.
pub const WAIT_RECENT_TYPES_MAX: usize = 5;

/// Why a connection closed (the `connection-closed` reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    Replaced,
    ClosedByOwner,
    DeliveryFailed,
    /// This host could not renew its lease on the stream in time (several
    /// hosts): the client reconnects and reaches the stream's owner.
    LeaseLost,
}

impl CloseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::Replaced => "replaced",
            CloseReason::ClosedByOwner => "closed-by-owner",
            CloseReason::DeliveryFailed => "delivery-failed",
            CloseReason::LeaseLost => "lease-lost",
        }
    }
}

/// The parameters of `:connect` (and of the connection behind waitForEvent).
#[derive(Debug, Clone)]
pub struct ConnectParams {
    pub connection_key: Option<String>,
    pub replay_after_offset: Option<u64>,
    pub expected_stream_id: Option<String>,
    pub max_replay_offset_gap: Option<u64>,
    pub filter: CompiledFilter,
    pub events: bool,
    pub state: bool,
    pub max_delivery_events: usize,
    pub max_delivery_bytes: usize,
}

impl Default for ConnectParams {
    fn default() -> Self {
        ConnectParams {
            connection_key: None,
            replay_after_offset: None,
            expected_stream_id: None,
            max_replay_offset_gap: None,
            filter: CompiledFilter::default(),
            events: true,
            state: true,
            max_delivery_events: DELIVERY_EVENTS_DEFAULT,
            max_delivery_bytes: DELIVERY_BYTES_DEFAULT,
        }
    }
}

/// Checks a connection's coordinates against the stream; runs before an
/// existing connection with the same key is replaced.
pub fn validate_coordinates(params: &ConnectParams, state: &CoreState) -> Result<(), Error> {
    if let Some(expected) = &params.expected_stream_id {
        if *expected != state.stream_id {
            return Err(Error::conflict(
                "stream-id-changed",
                format!(
                    "expectedStreamId {expected:?} does not match this stream's streamId {:?}",
                    state.stream_id
                ),
            ));
        }
    }
    if let Some(after) = params.replay_after_offset {
        if after > state.max_offset {
            return Err(Error::invalid(format!(
                "replayAfterOffset {after} is beyond this stream's current maximum offset {}",
                state.max_offset
            )));
        }
        if let Some(gap_max) = params.max_replay_offset_gap {
            let gap = state.max_offset - after;
            if gap > gap_max {
                return Err(Error::invalid(format!(
                    "the replay gap of {gap} offsets (after {after}, head {}) is over maxReplayOffsetGap {gap_max}",
                    state.max_offset
                )));
            }
        }
    }
    Ok(())
}

/// One event ready to send: its JSON text, offset, type and parsed form.
#[derive(Debug, Clone)]
pub struct LiveEvent {
    pub offset: u64,
    pub event_type: String,
    pub json: Arc<str>,
    pub value: Arc<Value>,
}

/// One batch of a live connection (one SSE message: `{"events": [...],
/// "state": {...} | null, "streamMaxOffset": n}`). Events and state are kept
/// as the JSON text they are sent as; [`Batch::parsed_events`] and
/// [`Batch::parsed_state`] read them.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Each event's JSON text, in offset order.
    pub events: Vec<Arc<str>>,
    /// The reduced state's JSON text after the batch, when asked for.
    pub state: Option<Arc<str>>,
    /// The stream's head offset when the batch was sent.
    pub stream_max_offset: u64,
}

impl Batch {
    /// The batch's events.
    pub fn parsed_events(&self) -> Result<Vec<crate::stream::Event>, serde_json::Error> {
        self.events
            .iter()
            .map(|e| serde_json::from_str(e))
            .collect()
    }

    /// The reduced state after the batch, when the connection asked for it.
    pub fn parsed_state(&self) -> Option<Result<CoreState, serde_json::Error>> {
        self.state.as_deref().map(serde_json::from_str)
    }

    /// The message's JSON text, spliced from already-serialized parts.
    pub fn render(&self) -> String {
        let events_len: usize = self.events.iter().map(|e| e.len() + 1).sum();
        let mut out =
            String::with_capacity(events_len + self.state.as_ref().map_or(4, |s| s.len()) + 64);
        out.push_str("{\"events\":[");
        for (i, e) in self.events.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(e);
        }
        out.push_str("],\"state\":");
        out.push_str(self.state.as_deref().unwrap_or("null"));
        out.push_str(",\"streamMaxOffset\":");
        out.push_str(&self.stream_max_offset.to_string());
        out.push('}');
        out
    }
}

/// Splits matching events into batches of at most `max_events` events and
/// about `max_bytes` bytes (a single larger event still goes alone).
pub fn split_batches(
    events: &[LiveEvent],
    max_events: usize,
    max_bytes: usize,
    state: Option<Arc<str>>,
    stream_max_offset: u64,
) -> Vec<Batch> {
    let mut batches = Vec::new();
    let mut current: Vec<Arc<str>> = Vec::new();
    let mut bytes = 0;
    for e in events {
        if !current.is_empty() && (current.len() >= max_events || bytes + e.json.len() > max_bytes)
        {
            batches.push(std::mem::take(&mut current));
            bytes = 0;
        }
        bytes += e.json.len();
        current.push(e.json.clone());
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
        .into_iter()
        .map(|events| Batch {
            events,
            state: state.clone(),
            stream_max_offset,
        })
        .collect()
}

/// Whether `e` passes `filter`; an error is the condition's failure.
pub fn matches(filter: &CompiledFilter, e: &LiveEvent) -> Result<bool, String> {
    if let Some(types) = &filter.event_types {
        if !types.contains(&e.event_type) {
            return Ok(false);
        }
    }
    match &filter.condition {
        Some(c) => c
            .matches(&crate::jsonata::Input::new(&e.value))
            .map_err(|m| format!("jsonataCondition failed on offset {}: {m}", e.offset)),
        None => Ok(true),
    }
}

/// Each event's match against `filter`, in order, up to and including the
/// first error. With a condition, the evaluations run on a JSONata thread
/// (never on the threads that serve HTTP); `skip` events are answered
/// `Ok(false)` without evaluating.
pub async fn match_events(
    project: &str,
    filter: &CompiledFilter,
    events: &Arc<Vec<LiveEvent>>,
    skip: impl Fn(&LiveEvent) -> bool + Send + 'static,
) -> Vec<Result<bool, String>> {
    let run = move |filter: &CompiledFilter, events: &[LiveEvent]| {
        let mut out = Vec::with_capacity(events.len());
        for e in events {
            let m = if skip(e) {
                Ok(false)
            } else {
                matches(filter, e)
            };
            let failed = m.is_err();
            out.push(m);
            if failed {
                break;
            }
        }
        out
    };
    if filter.condition.is_none() {
        return run(filter, events);
    }
    let (filter, events) = (filter.clone(), Arc::clone(events));
    crate::jsonata::pool::run(project, move || run(&filter, &events)).await
}

/// A condition tried once, when a connection or a wait opens, on an event
/// with no fields: an expression that exceeds a bound whatever the event
/// (`$count([1..9999999]) > 0`) is refused before anything streams. Other
/// errors are left for the events themselves.
pub async fn try_condition(project: &str, filter: &CompiledFilter) -> Result<(), String> {
    let Some(condition) = filter.condition.clone() else {
        return Ok(());
    };
    let outcome = crate::jsonata::pool::run(project, move || {
        let empty = serde_json::json!({"offset": 0, "type": "", "payload": {}});
        condition.matches(&crate::jsonata::Input::new(&empty))
    })
    .await;
    match outcome {
        Err(e) if crate::jsonata::is_limit_exceeded(&e) => Err(format!("jsonataCondition: {e}")),
        _ => Ok(()),
    }
}

/// The text of a waitForEvent timeout.
pub fn wait_timeout_message(timeout_ms: u64, seen: u64, recent_types: &[String]) -> String {
    let recent = if recent_types.is_empty() {
        "none".to_string()
    } else {
        recent_types.join(", ")
    };
    format!("Timed out waiting for stream event after {timeout_ms}ms (saw {seen} events; recent types: {recent})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn live(offset: u64, t: &str, size: usize) -> LiveEvent {
        let v = json!({"offset": offset, "type": t, "payload": {"pad": "x".repeat(size)}});
        LiveEvent {
            offset,
            event_type: t.into(),
            json: v.to_string().into(),
            value: Arc::new(v),
        }
    }

    #[test]
    fn batches_split_by_count_and_bytes() {
        let events: Vec<_> = (1..=5).map(|i| live(i, "a", 10)).collect();
        let b = split_batches(&events, 2, usize::MAX, None, 5);
        assert_eq!(
            b.iter().map(|b| b.events.len()).collect::<Vec<_>>(),
            vec![2, 2, 1]
        );
        let one = events[0].json.len();
        let b = split_batches(&events, 100, one * 3, None, 5);
        assert_eq!(
            b.iter().map(|b| b.events.len()).collect::<Vec<_>>(),
            vec![3, 2]
        );
        let big = vec![live(1, "a", 5000)];
        assert_eq!(
            split_batches(&big, 10, 10, None, 1).len(),
            1,
            "a large event goes alone"
        );
    }

    #[test]
    fn render_splices_json() {
        let b = Batch {
            events: vec![Arc::from("{\"offset\":1}")],
            state: None,
            stream_max_offset: 7,
        };
        let v: Value = serde_json::from_str(&b.render()).unwrap();
        assert_eq!(
            v,
            json!({"events": [{"offset": 1}], "state": null, "streamMaxOffset": 7})
        );
    }

    #[test]
    fn timeout_text() {
        assert_eq!(
            wait_timeout_message(100, 3, &["a".into(), "b".into()]),
            "Timed out waiting for stream event after 100ms (saw 3 events; recent types: a, b)"
        );
    }
}
