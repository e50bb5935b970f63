//! What appends and reads answer, and their bounds.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::sync::Arc;

/// The default of `max-body-bytes`, the largest append request (8 MiB).
pub const MAX_BODY_BYTES_DEFAULT: usize = 8 * 1024 * 1024;

use crate::event::Event;

/// Bytes of ephemeral events kept per stream; the oldest are evicted first.
pub const EPHEMERAL_BYTES_MAX: usize = 10 * 1024 * 1024;
/// Largest page of a read.
pub const READ_LIMIT_MAX: usize = 500;

/// The answer to an append.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppendOutput {
    /// The stream's id (a new one per lifetime).
    pub stream_id: String,
    /// When the stream was created.
    pub stream_created_at: String,
    /// The committed events, one per input event (a replayed key answers its original event).
    pub events: Vec<Event>,
    /// Each of `events` as JSON text, where the host has it already (the
    /// text it stored): [`AppendOutput::to_json`] copies that text rather
    /// than serializing the event again (a 7 MB event takes milliseconds
    /// to serialize). Empty, or one entry per event; not part of the value
    /// (equality and deserialization leave it out).
    #[serde(skip)]
    pub rendered: Vec<Option<Arc<String>>>,
    /// For each of `events`, whether an earlier request committed it (its
    /// idempotency key was replayed): empty when not known (an answer
    /// that came from another host). Not part of the value either.
    #[serde(skip)]
    pub replayed: Vec<bool>,
}

impl PartialEq for AppendOutput {
    fn eq(&self, other: &Self) -> bool {
        self.stream_id == other.stream_id
            && self.stream_created_at == other.stream_created_at
            && self.events == other.events
    }
}

impl AppendOutput {
    /// The answer as the HTTP API's JSON body, with `warnings` beside its
    /// fields when there are any: the same text as serializing it (and
    /// them), with each event [`rendered`](AppendOutput::rendered) already
    /// copied rather than serialized again.
    pub fn to_json(&self, warnings: &[String]) -> Vec<u8> {
        let texts: usize = self.rendered.iter().flatten().map(|t| t.len()).sum();
        let mut out = Vec::with_capacity(texts + 256);
        out.extend_from_slice(b"{\"streamId\":");
        write_json(&mut out, &self.stream_id);
        out.extend_from_slice(b",\"streamCreatedAt\":");
        write_json(&mut out, &self.stream_created_at);
        out.extend_from_slice(b",\"events\":[");
        for (i, event) in self.events.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match self.rendered.get(i).and_then(Option::as_ref) {
                Some(text) => out.extend_from_slice(text.as_bytes()),
                None => write_json(&mut out, event),
            }
        }
        out.push(b']');
        if !warnings.is_empty() {
            out.extend_from_slice(b",\"warnings\":");
            write_json(&mut out, warnings);
        }
        out.push(b'}');
        out
    }
}

/// Appends `value`'s JSON text to `out`.
fn write_json<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing to a Vec fails only when serializing fails, and what answers
    // hold (strings, events) always serializes.
    serde_json::to_writer(out, value).expect("answers serialize");
}

/// A page of events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadQuery {
    /// Events after this offset.
    pub after_offset: u64,
    /// At most this many (1..=500).
    pub limit: usize,
    /// Include buffered ephemeral events.
    pub include_ephemeral: bool,
}

/// The answer to a read; events are the stored JSON, served as is.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadOutput {
    /// The stream's id.
    pub stream_id: String,
    /// When the stream was created.
    pub stream_created_at: String,
    /// The highest offset (ephemeral ones included).
    pub max_offset: u64,
    /// The events, as stored JSON.
    pub events: Vec<Box<RawValue>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(offset: u64, ephemeral: bool) -> Event {
        serde_json::from_value(serde_json::json!({
            "offset": offset,
            "type": "orders.example/placed",
            "payload": {"note": "line\n\"quoted\" é \u{1}", "n": offset},
            "metadata": {"by": "test"},
            "idempotencyKey": format!("k{offset}"),
            "createdAt": "2026-12-06T08:00:00.000Z",
            "ephemeral": ephemeral,
        }))
        .unwrap()
    }

    #[test]
    fn the_json_of_an_answer_is_its_serialization_with_the_rendered_text_copied() {
        let events = vec![event(4, false), event(5, false), event(5, true)];
        let text = |e: &Event| Arc::new(serde_json::to_string(e).unwrap());
        let mut output = AppendOutput {
            stream_id: "s-1".into(),
            stream_created_at: "2026-12-06T07:00:00.000Z".into(),
            events: events.clone(),
            rendered: Vec::new(),
            replayed: Vec::new(),
        };
        let serialized = serde_json::to_vec(&output).unwrap();
        // Nothing rendered, some, all: the same text as serializing it.
        assert_eq!(output.to_json(&[]), serialized);
        output.rendered = vec![Some(text(&events[0])), None, None];
        assert_eq!(output.to_json(&[]), serialized);
        output.rendered = events.iter().map(|e| Some(text(e))).collect();
        assert_eq!(output.to_json(&[]), serialized);
        // With warnings: beside the fields, as the HTTP API answers them.
        let warnings = vec!["the component \"x\" is not deployed".to_string()];
        let mut with: serde_json::Value = serde_json::from_slice(&serialized).unwrap();
        with["warnings"] = serde_json::json!(warnings);
        let answered: serde_json::Value =
            serde_json::from_slice(&output.to_json(&warnings)).unwrap();
        assert_eq!(answered, with);
        // The rendered text is what is copied (not the event serialized
        // again), and it is not part of the value.
        output.rendered[1] = Some(Arc::new(r#"{"copied":true}"#.into()));
        let answered: serde_json::Value = serde_json::from_slice(&output.to_json(&[])).unwrap();
        assert_eq!(answered["events"][1], serde_json::json!({"copied": true}));
        assert_eq!(answered["events"][2]["ephemeral"], true);
        let mut plain = output.clone();
        plain.rendered.clear();
        assert_eq!(plain, output);
    }
}
