//! The Durable Streams protocol's model over a stream: what its platform
//! events record (creation with a content type and a lifetime, closure,
//! deletion), what a message is as an event, the idempotent producers'
//! rules, the protocol's offsets and cursors. Pure: the host reads a
//! stream's state, decides with these functions, and appends.
//!
//! A stream created through the protocol carries a
//! `durable-stream-created` event; its state's [`DurableStream`] is folded
//! from that and from every event after it. A message is one event of type
//! [`MESSAGE`]: in JSON mode its payload is the message when that is an
//! object, otherwise `{"value": message}` (marked in the metadata); in any
//! other content type `{"base64": bytes}`. Events of other types appended
//! through the native API are read through the protocol too (as the event's
//! JSON); the platform's own control events are not.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::error::Error;
use crate::event::{is_stream_control_type, types, Event, EventInput, OFFSET_MAX};

/// The type of a message appended through the protocol.
pub const MESSAGE: &str = "durable-streams/message";

/// The metadata field a message's protocol details live in.
const META: &str = "durableStreams";

/// Producers remembered per stream; past this the one that wrote least
/// recently is forgotten (the protocol lets a server expire producer state).
pub const PRODUCERS_MAX: usize = 1000;

/// Width of an offset as the protocol shows it: every offset of a stream
/// (up to [`OFFSET_MAX`], 19 digits) with leading zeros, so that the text
/// order is the offset order.
const OFFSET_WIDTH: usize = 19;

/// What the protocol knows of a stream, folded from its events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DurableStream {
    /// The content type it was created with, as given.
    pub content_type: String,
    /// `Stream-TTL`: seconds it lives after it was last read or written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// `Stream-Expires-At`, as given (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// The offset of its `durable-stream-created` event: reads start after it.
    pub created_offset: u64,
    /// When it was created (the event's time).
    pub created_at: String,
    /// The offset of the last event a reader sees (its tail).
    pub tail: u64,
    /// When an event a reader sees was last appended.
    pub last_appended_at: String,
    /// Appends are refused from now on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub closed: bool,
    /// The producer request that closed it (a retry of it is a duplicate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_by: Option<ProducerStamp>,
    /// The last `Stream-Seq` appended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_seq: Option<String>,
    /// Idempotent producers, by id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub producers: BTreeMap<String, Producer>,
    /// A fork: where it was forked from. Its readers see the source's
    /// events up to the fork offset, then its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkOrigin>,
    /// The paths of the live forks of this stream.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub forks: BTreeSet<String>,
    /// Deleted while forks still read from it: gone for its own readers
    /// (`410`), kept for theirs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
}

/// Where a fork was forked from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForkOrigin {
    /// The source stream's path (in the same project).
    pub path: String,
    /// The fork offset, in the source's offsets: the fork's own offsets
    /// start after it.
    pub offset: u64,
    /// How much of the source's next message the fork took as its own
    /// first content (bytes, or JSON messages).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sub_offset: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One producer's progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Producer {
    /// Its current epoch.
    pub epoch: u64,
    /// The last sequence number accepted in it.
    pub seq: u64,
    /// The offset of the event that moved it last.
    pub at_offset: u64,
}

/// A producer's request: `Producer-Id`, `Producer-Epoch`, `Producer-Seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProducerStamp {
    /// `Producer-Id`.
    pub id: String,
    /// `Producer-Epoch`.
    pub epoch: u64,
    /// `Producer-Seq`.
    pub seq: u64,
}

/// What the protocol's rules say of a producer's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProducerCheck {
    /// New data: append it (`200`).
    Accept,
    /// Already appended: answer success without appending (`204`), the
    /// highest sequence number accepted in this epoch.
    Duplicate {
        /// `Producer-Seq` of the answer.
        last_seq: u64,
    },
    /// Refused.
    Refused(ProducerRefusal),
}

/// Why a producer's request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProducerRefusal {
    /// An older epoch than the producer's (`403`, a zombie fenced).
    StaleEpoch {
        /// The producer's current epoch.
        current: u64,
    },
    /// A new epoch that does not start at sequence 0 (`400`).
    NewEpochNotAtZero,
    /// A sequence number past the next one (`409`).
    Gap {
        /// The next one.
        expected: u64,
        /// The one sent.
        received: u64,
    },
}

impl DurableStream {
    /// The offset readers see for one of this stream's own events: a
    /// fork's own offsets come after its fork offset.
    pub fn shown(&self, own: u64) -> u64 {
        self.base().saturating_add(own)
    }

    /// Where this stream's own offsets start (a fork's fork offset; 0).
    pub fn base(&self) -> u64 {
        self.forked_from.as_ref().map_or(0, |f| f.offset)
    }

    /// The tail as readers see it.
    pub fn shown_tail(&self) -> u64 {
        self.shown(self.tail)
    }

    /// The rules of an idempotent producer's request against this state.
    pub fn check_producer(&self, stamp: &ProducerStamp) -> ProducerCheck {
        let Some(p) = self.producers.get(&stamp.id) else {
            return if stamp.seq == 0 {
                ProducerCheck::Accept
            } else {
                ProducerCheck::Refused(ProducerRefusal::Gap {
                    expected: 0,
                    received: stamp.seq,
                })
            };
        };
        if stamp.epoch < p.epoch {
            return ProducerCheck::Refused(ProducerRefusal::StaleEpoch { current: p.epoch });
        }
        if stamp.epoch > p.epoch {
            return if stamp.seq == 0 {
                ProducerCheck::Accept
            } else {
                ProducerCheck::Refused(ProducerRefusal::NewEpochNotAtZero)
            };
        }
        if stamp.seq <= p.seq {
            return ProducerCheck::Duplicate { last_seq: p.seq };
        }
        if stamp.seq == p.seq + 1 {
            return ProducerCheck::Accept;
        }
        ProducerCheck::Refused(ProducerRefusal::Gap {
            expected: p.seq + 1,
            received: stamp.seq,
        })
    }

    /// What appending message `e` (at `events[i]`) needs of the stream as
    /// it commits: open, and for the request's first message (`first`) a
    /// producer's request that is the next of its epoch and a `Stream-Seq`
    /// after the last. The host checks these before it appends; here they
    /// hold against whatever another writer committed in between
    /// (`stream-closed`, `producer-state-moved`, `stream-seq-regression`:
    /// the host looks again).
    pub fn check_commit(&self, i: usize, e: &EventInput, first: bool) -> Result<(), Error> {
        if self.closed {
            return Err(Error::conflict(
                "stream-closed",
                format!("events[{i}]: the stream is closed: it takes no more messages"),
            ));
        }
        if !first {
            return Ok(());
        }
        let meta = e
            .metadata
            .as_ref()
            .and_then(|m| m.get(META))
            .and_then(Value::as_object);
        let Some(meta) = meta else {
            return Ok(());
        };
        if let Some(stamp) = meta
            .get("producer")
            .and_then(|p| serde_json::from_value::<ProducerStamp>(p.clone()).ok())
        {
            let check = self.check_producer(&stamp);
            if check != ProducerCheck::Accept {
                return Err(Error::conflict(
                    "producer-state-moved",
                    format!(
                        "events[{i}]: producer {:?} epoch {} seq {} is no longer the next: {check:?}",
                        stamp.id, stamp.epoch, stamp.seq
                    ),
                ));
            }
        }
        if let (Some(seq), Some(last)) = (
            meta.get("streamSeq").and_then(Value::as_str),
            &self.stream_seq,
        ) {
            if seq <= last.as_str() {
                return Err(Error::conflict(
                    "stream-seq-regression",
                    format!("Stream-Seq {seq:?} is not after the last one, {last:?}"),
                ));
            }
        }
        Ok(())
    }

    /// Whether its content is JSON messages (`application/json`).
    pub fn json_mode(&self) -> bool {
        is_json(&self.content_type)
    }

    /// When it expires (milliseconds since the epoch): its absolute expiry,
    /// or its TTL after `last_access_ms`, whichever is first; `None`: never.
    pub fn expires_at_ms(&self, last_access_ms: i64) -> Option<i64> {
        let absolute = self.expires_at.as_deref().map(|t| {
            chrono::DateTime::parse_from_rfc3339(t)
                .map(|d| d.timestamp_millis())
                // Unreadable (never accepted so): expired, failing closed.
                .unwrap_or(i64::MIN)
        });
        let sliding = self
            .ttl_seconds
            .map(|s| last_access_ms.saturating_add((s as i64).saturating_mul(1000)));
        match (absolute, sliding) {
            (Some(a), Some(s)) => Some(a.min(s)),
            (a, s) => a.or(s),
        }
    }

    /// Folds one committed (non-ephemeral) event into the state.
    pub(crate) fn reduce(&mut self, event: &Event) {
        if is_stream_control_type(&event.event_type) && !event.is_copy() {
            let path = || {
                event
                    .payload
                    .get("path")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            };
            match event.event_type.as_str() {
                types::DURABLE_STREAM_CLOSED => {
                    self.closed = true;
                    self.closed_by = event
                        .payload
                        .get("producer")
                        .and_then(|p| serde_json::from_value(p.clone()).ok());
                    if let Some(stamp) = self.closed_by.clone() {
                        self.record_producer(stamp, event.offset);
                    }
                }
                types::DURABLE_STREAM_FORKED => {
                    if let Some(p) = path() {
                        self.forks.insert(p);
                    }
                }
                types::DURABLE_STREAM_FORK_REMOVED => {
                    if let Some(p) = path() {
                        self.forks.remove(&p);
                    }
                }
                _ => {}
            }
            return;
        }
        self.tail = event.offset;
        self.last_appended_at = event.created_at.clone();
        if event.event_type != MESSAGE || event.is_copy() {
            return;
        }
        let Some(meta) = event
            .metadata
            .as_ref()
            .and_then(|m| m.get(META))
            .and_then(Value::as_object)
        else {
            return;
        };
        if let Some(seq) = meta.get("streamSeq").and_then(Value::as_str) {
            self.stream_seq = Some(seq.to_string());
        }
        if let Some(stamp) = meta
            .get("producer")
            .and_then(|p| serde_json::from_value::<ProducerStamp>(p.clone()).ok())
        {
            self.record_producer(stamp, event.offset);
        }
    }

    /// A producer's request accepted at `offset`; past [`PRODUCERS_MAX`]
    /// the producer that wrote least recently is forgotten.
    fn record_producer(&mut self, stamp: ProducerStamp, offset: u64) {
        if !self.producers.contains_key(&stamp.id) && self.producers.len() >= PRODUCERS_MAX {
            let oldest = self
                .producers
                .iter()
                .min_by_key(|(_, p)| p.at_offset)
                .map(|(id, _)| id.clone());
            if let Some(id) = oldest {
                self.producers.remove(&id);
            }
        }
        self.producers.insert(
            stamp.id,
            Producer {
                epoch: stamp.epoch,
                seq: stamp.seq,
                at_offset: offset,
            },
        );
    }

    /// The state right after its `durable-stream-created` event.
    pub(crate) fn from_created(event: &Event) -> Option<DurableStream> {
        let created: Created = serde_json::from_value(Value::Object(event.payload.clone())).ok()?;
        Some(DurableStream {
            content_type: created.content_type,
            ttl_seconds: created.ttl_seconds,
            expires_at: created.expires_at,
            created_offset: event.offset,
            created_at: event.created_at.clone(),
            tail: event.offset,
            last_appended_at: event.created_at.clone(),
            closed: false,
            closed_by: None,
            stream_seq: None,
            producers: BTreeMap::new(),
            forked_from: created.forked_from,
            forks: BTreeSet::new(),
            deleted: false,
        })
    }
}

/// The payload of a `durable-stream-created` event: the stream's
/// configuration as `PUT` gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Created {
    /// `Content-Type`.
    pub content_type: String,
    /// `Stream-TTL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// `Stream-Expires-At`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// A fork's origin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkOrigin>,
}

impl Created {
    /// Whether an existing stream was created with this configuration (a
    /// `PUT` of it again is then `200`, not `409`). Content types compare
    /// without their parameters' case or spacing.
    pub fn matches(&self, existing: &DurableStream, closed: bool) -> bool {
        normalize_content_type(&self.content_type) == normalize_content_type(&existing.content_type)
            && self.ttl_seconds == existing.ttl_seconds
            && self.expires_at == existing.expires_at
            && closed == existing.closed
            && self.forked_from == existing.forked_from
    }

    /// The event that creates the stream.
    pub fn event(&self) -> EventInput {
        let payload = serde_json::to_value(self).expect("a configuration serializes");
        EventInput::new(types::DURABLE_STREAM_CREATED).payload(payload)
    }
}

/// The event that closes a stream, `producer` the request that did.
pub fn closed_event(producer: Option<&ProducerStamp>) -> EventInput {
    let mut payload = Map::new();
    if let Some(p) = producer {
        payload.insert("producer".into(), json!(p));
    }
    EventInput::new(types::DURABLE_STREAM_CLOSED).payload(Value::Object(payload))
}

/// The event that deletes a stream (its events stay in the log; the
/// protocol no longer serves them); `soft` while forks read from it.
pub fn deleted_event(soft: bool) -> EventInput {
    let payload = if soft {
        json!({"soft": true})
    } else {
        json!({})
    };
    EventInput::new(types::DURABLE_STREAM_DELETED).payload(payload)
}

/// The event a source records a fork of itself by (`removed`: its end).
pub fn fork_event(fork_path: &str, removed: bool) -> EventInput {
    let t = if removed {
        types::DURABLE_STREAM_FORK_REMOVED
    } else {
        types::DURABLE_STREAM_FORKED
    };
    EventInput::new(t).payload(json!({"path": fork_path}))
}

/// `Stream-Fork-Offset`: an offset of this server, or the beginning
/// (`-1`, or zeros: `0000000000000000_0000000000000000` as some clients
/// write the start).
pub fn parse_fork_offset(text: &str) -> Result<u64, Error> {
    let zeros = !text.is_empty()
        && text.bytes().all(|b| b == b'0' || b == b'_')
        && text.bytes().filter(|b| *b == b'_').count() <= 1
        && !text.starts_with('_')
        && !text.ends_with('_');
    if text == "-1" || zeros {
        return Ok(0);
    }
    match parse_offset(text) {
        Ok(ReadFrom::After(n)) => Ok(n),
        _ => Err(Error::invalid(format!(
            "Stream-Fork-Offset {text:?} is not an offset of this server: send a \
             Stream-Next-Offset it answered ({OFFSET_WIDTH} digits), or -1 for the beginning"
        ))),
    }
}

/// A content type without its parameters, lower case
/// (`Application/JSON; charset=utf-8` is `application/json`).
pub fn normalize_content_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Whether a content type is JSON mode.
pub fn is_json(content_type: &str) -> bool {
    normalize_content_type(content_type) == "application/json"
}

/// Whether a content type may be read as server-sent events as text
/// (`text/*`, `application/json`); others are sent base64-encoded.
pub fn is_text(content_type: &str) -> bool {
    let t = normalize_content_type(content_type);
    t.starts_with("text/") || t == "application/json"
}

/// An offset as the protocol shows it.
pub fn format_offset(offset: u64) -> String {
    format!("{offset:0OFFSET_WIDTH$}")
}

/// Where a read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// `-1` (or no offset): the stream's beginning.
    Start,
    /// `now`: its tail.
    Now,
    /// After this offset.
    After(u64),
}

/// A read's `offset` parameter; anything not `-1`, `now` or an offset this
/// server gave is refused, naming it.
pub fn parse_offset(text: &str) -> Result<ReadFrom, Error> {
    match text {
        "-1" => return Ok(ReadFrom::Start),
        "now" => return Ok(ReadFrom::Now),
        _ => {}
    }
    let ours = text.len() == OFFSET_WIDTH && text.bytes().all(|b| b.is_ascii_digit());
    match text.parse::<u64>() {
        Ok(n) if ours && n <= OFFSET_MAX => Ok(ReadFrom::After(n)),
        _ => Err(Error::invalid(format!(
            "offset {text:?} is not an offset of this server: send -1, now, or a \
             Stream-Next-Offset it answered ({OFFSET_WIDTH} digits)"
        ))),
    }
}

/// A non-negative decimal integer as the protocol writes one: no sign,
/// no leading zeros, no fraction or exponent, at most 2^53-1 (`what` names
/// the header in the error).
pub fn parse_integer(what: &str, text: &str) -> Result<u64, Error> {
    let plain = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    match text.parse::<u64>() {
        Ok(n) if plain && n < (1u64 << 53) => Ok(n),
        _ => Err(Error::invalid(format!(
            "{what} {text:?} is not a non-negative integer without sign or leading zeros, \
             at most 2^53-1"
        ))),
    }
}

/// `Stream-Expires-At`: an RFC 3339 time, kept as given.
pub fn parse_expires_at(text: &str) -> Result<String, Error> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|_| text.to_string())
        .map_err(|e| {
            Error::invalid(format!(
                "Stream-Expires-At {text:?} is not an RFC 3339 time: {e}"
            ))
        })
}

/// The messages of an append's body in JSON mode: a top-level array is a
/// batch (one level flattened), anything else one message. An empty array
/// is refused for an append and nothing for a create (`create`).
pub fn json_messages(body: &[u8], create: bool) -> Result<Vec<Value>, Error> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| Error::invalid(format!("the body is not valid JSON: {e}")))?;
    match value {
        Value::Array(items) if items.is_empty() && !create => Err(Error::invalid(
            "an empty JSON array appends nothing: send at least one message",
        )),
        Value::Array(items) => Ok(items),
        other => Ok(vec![other]),
    }
}

/// What a message event records of the request that appended it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provenance {
    /// The producer's request.
    pub producer: Option<ProducerStamp>,
    /// `Stream-Seq`.
    pub stream_seq: Option<String>,
}

/// The events of a JSON batch: each message's, the batch's place of each
/// recorded when there are several (a fork's sub-offset counts messages
/// within a batch).
pub fn json_batch_events(messages: Vec<Value>, provenance: &Provenance) -> Vec<EventInput> {
    let n = messages.len();
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let mut e = json_message_event(m, provenance);
            if n > 1 {
                let meta = e.metadata.get_or_insert_with(Map::new);
                let ours = meta
                    .entry(META)
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(o) = ours {
                    o.insert("batch".into(), json!([i, n]));
                }
            }
            e
        })
        .collect()
}

/// How many messages of its batch start at `event` (it and those after it
/// in the same append): 1 for a message appended alone.
pub fn rest_of_batch(event: &Event) -> u64 {
    event
        .metadata
        .as_ref()
        .and_then(|m| m.get(META))
        .and_then(|m| m.get("batch"))
        .and_then(|b| Some((b.get(0)?.as_u64()?, b.get(1)?.as_u64()?)))
        .map_or(1, |(i, n)| n.saturating_sub(i).max(1))
}

/// The event of one JSON message.
pub fn json_message_event(message: Value, provenance: &Provenance) -> EventInput {
    let (payload, wrapped) = match message {
        Value::Object(m) => (m, false),
        other => {
            let mut m = Map::new();
            m.insert("value".into(), other);
            (m, true)
        }
    };
    message_event(payload, wrapped, provenance)
}

/// The event of one message of bytes.
pub fn bytes_message_event(bytes: &[u8], provenance: &Provenance) -> EventInput {
    let mut payload = Map::new();
    payload.insert(
        "base64".into(),
        Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
    );
    message_event(payload, false, provenance)
}

fn message_event(payload: Map<String, Value>, wrapped: bool, p: &Provenance) -> EventInput {
    let mut meta = Map::new();
    if wrapped {
        meta.insert("value".into(), Value::Bool(true));
    }
    if let Some(stamp) = &p.producer {
        meta.insert("producer".into(), json!(stamp));
    }
    if let Some(seq) = &p.stream_seq {
        meta.insert("streamSeq".into(), Value::String(seq.clone()));
    }
    let mut input = EventInput::new(MESSAGE).payload(Value::Object(payload));
    if !meta.is_empty() {
        let mut m = Map::new();
        m.insert(META.into(), Value::Object(meta));
        input.metadata = Some(m);
    }
    input
}

/// Whether a reader of the protocol sees `event` (not the platform's own
/// control events, not ephemeral ones).
pub fn is_visible(event: &Event) -> bool {
    !event.ephemeral && (event.is_copy() || !is_stream_control_type(&event.event_type))
}

/// One visible event as a JSON-mode message: a message event's message;
/// any other event as its JSON; a redacted message `null`.
pub fn as_json_message(event: &Event) -> Value {
    if event.event_type != MESSAGE {
        return serde_json::to_value(event).unwrap_or(Value::Null);
    }
    if event.redacted.is_some() {
        return Value::Null;
    }
    let wrapped = event
        .metadata
        .as_ref()
        .and_then(|m| m.get(META))
        .and_then(|m| m.get("value"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if wrapped {
        return event.payload.get("value").cloned().unwrap_or(Value::Null);
    }
    Value::Object(event.payload.clone())
}

/// One visible event as bytes: a message event's bytes; any other event as
/// its JSON and a newline; a redacted message nothing.
pub fn as_bytes(event: &Event) -> Vec<u8> {
    if event.event_type != MESSAGE {
        let mut text = serde_json::to_vec(event).unwrap_or_default();
        text.push(b'\n');
        return text;
    }
    if event.redacted.is_some() {
        return Vec::new();
    }
    match event.payload.get("base64").and_then(Value::as_str) {
        Some(b) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .unwrap_or_default(),
        // A JSON message read from a stream of bytes (a copy): its text.
        None => serde_json::to_vec(&as_json_message(event)).unwrap_or_default(),
    }
}

/// The time interval cursors count (seconds) and their epoch
/// (2024-10-09T00:00:00Z, milliseconds): the protocol's defaults.
const CURSOR_INTERVAL_S: i64 = 20;
const CURSOR_EPOCH_MS: i64 = 1_728_432_000_000;

/// A live answer's `Stream-Cursor`: the current interval's number, or, when
/// the client's cursor is not behind it, the client's moved on by
/// `jitter_s` seconds' worth of intervals (at least one), so cursors never
/// repeat and caches cannot loop.
pub fn response_cursor(now_ms: i64, client: Option<&str>, jitter_s: u64) -> String {
    let current = (now_ms - CURSOR_EPOCH_MS).div_euclid(CURSOR_INTERVAL_S * 1000);
    match client.and_then(|c| c.parse::<i64>().ok()) {
        Some(c) if c >= current => {
            let step = (jitter_s as i64 + CURSOR_INTERVAL_S - 1) / CURSOR_INTERVAL_S;
            let step = step.max(1);
            c.saturating_add(step).to_string()
        }
        _ => current.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream() -> DurableStream {
        DurableStream {
            content_type: "application/json".into(),
            ttl_seconds: None,
            expires_at: None,
            created_offset: 2,
            created_at: "2026-12-05T00:00:00.000Z".into(),
            tail: 2,
            last_appended_at: "2026-12-05T00:00:00.000Z".into(),
            closed: false,
            closed_by: None,
            stream_seq: None,
            producers: BTreeMap::new(),
            forked_from: None,
            forks: BTreeSet::new(),
            deleted: false,
        }
    }

    fn stamp(id: &str, epoch: u64, seq: u64) -> ProducerStamp {
        ProducerStamp {
            id: id.into(),
            epoch,
            seq,
        }
    }

    fn message(offset: u64, input: EventInput) -> Event {
        Event {
            offset,
            event_type: input.event_type,
            payload: input.payload.unwrap_or_default(),
            metadata: input.metadata,
            idempotency_key: None,
            created_at: "2026-12-05T00:00:01.000Z".into(),
            source: None,
            trace: None,
            ephemeral: false,
            redacted: None,
        }
    }

    #[test]
    fn a_producer_is_accepted_deduplicated_fenced_and_told_its_gap() {
        let mut s = stream();
        assert_eq!(s.check_producer(&stamp("p", 0, 0)), ProducerCheck::Accept);
        assert_eq!(
            s.check_producer(&stamp("p", 0, 3)),
            ProducerCheck::Refused(ProducerRefusal::Gap {
                expected: 0,
                received: 3
            })
        );
        let p = Provenance {
            producer: Some(stamp("p", 0, 0)),
            stream_seq: None,
        };
        s.reduce(&message(3, json_message_event(json!({"a": 1}), &p)));
        assert_eq!(s.tail, 3);
        assert_eq!(
            s.check_producer(&stamp("p", 0, 0)),
            ProducerCheck::Duplicate { last_seq: 0 }
        );
        assert_eq!(s.check_producer(&stamp("p", 0, 1)), ProducerCheck::Accept);
        assert_eq!(
            s.check_producer(&stamp("p", 0, 5)),
            ProducerCheck::Refused(ProducerRefusal::Gap {
                expected: 1,
                received: 5
            })
        );
        assert_eq!(s.check_producer(&stamp("p", 1, 0)), ProducerCheck::Accept);
        assert_eq!(
            s.check_producer(&stamp("p", 1, 1)),
            ProducerCheck::Refused(ProducerRefusal::NewEpochNotAtZero)
        );
        let p = Provenance {
            producer: Some(stamp("p", 2, 0)),
            stream_seq: Some("b".into()),
        };
        s.reduce(&message(4, bytes_message_event(b"x", &p)));
        assert_eq!(
            s.check_producer(&stamp("p", 1, 9)),
            ProducerCheck::Refused(ProducerRefusal::StaleEpoch { current: 2 })
        );
        assert_eq!(s.stream_seq.as_deref(), Some("b"));
    }

    #[test]
    fn a_commit_holds_what_the_host_checked_before_it() {
        let mut s = stream();
        let p = |seq| Provenance {
            producer: Some(stamp("p", 0, seq)),
            stream_seq: Some(format!("{seq}")),
        };
        let first = json_message_event(json!(1), &p(0));
        assert!(s.check_commit(0, &first, true).is_ok());
        s.reduce(&message(3, first.clone()));
        // The same request again (another writer committed it meanwhile).
        let e = s.check_commit(0, &first, true).unwrap_err();
        assert_eq!(e.code, "producer-state-moved", "{}", e.message);
        // Only a request's first message is checked against the producer.
        assert!(s.check_commit(1, &first, false).is_ok());
        let next = json_message_event(json!(2), &p(1));
        assert!(s.check_commit(0, &next, true).is_ok());
        s.closed = true;
        let e = s.check_commit(0, &next, false).unwrap_err();
        assert_eq!(e.code, "stream-closed");
    }

    #[test]
    fn the_least_recent_producer_is_forgotten_past_the_bound() {
        let mut s = stream();
        for i in 0..=PRODUCERS_MAX as u64 {
            let p = Provenance {
                producer: Some(stamp(&format!("p{i}"), 0, 0)),
                stream_seq: None,
            };
            s.reduce(&message(3 + i, json_message_event(json!(i), &p)));
        }
        assert_eq!(s.producers.len(), PRODUCERS_MAX);
        assert!(!s.producers.contains_key("p0"));
        assert!(s.producers.contains_key(&format!("p{PRODUCERS_MAX}")));
    }

    #[test]
    fn messages_read_back_as_they_were_sent() {
        let none = Provenance::default();
        for v in [
            json!({"k": [1, 2]}),
            json!([1, 2]),
            json!("s"),
            json!(null),
            json!(3.5),
        ] {
            let e = message(3, json_message_event(v.clone(), &none));
            assert_eq!(as_json_message(&e), v);
        }
        // An object that looks like a wrapped value is still the object.
        let e = message(3, json_message_event(json!({"value": 1}), &none));
        assert_eq!(as_json_message(&e), json!({"value": 1}));
        let e = message(3, bytes_message_event(&[0, 255, 10], &none));
        assert_eq!(as_bytes(&e), vec![0, 255, 10]);
        let mut redacted = e.clone();
        redacted.redacted = Some(crate::event::Redaction {
            at: "t".into(),
            reason: "r".into(),
        });
        redacted.payload.clear();
        assert_eq!(as_bytes(&redacted), Vec::<u8>::new());
        assert_eq!(as_json_message(&redacted), Value::Null);
    }

    #[test]
    fn offsets_are_fixed_width_and_only_ours_parse() {
        assert_eq!(format_offset(42), "0000000000000000042");
        assert_eq!(
            parse_offset(&format_offset(42)).unwrap(),
            ReadFrom::After(42)
        );
        assert_eq!(parse_offset("-1").unwrap(), ReadFrom::Start);
        assert_eq!(parse_offset("now").unwrap(), ReadFrom::Now);
        for bad in [
            "",
            "42",
            "0000000000000000_0000000000000000",
            "abc",
            "-2",
            "9999999999999999999",
        ] {
            let e = parse_offset(bad).unwrap_err();
            assert!(e.message.contains(&format!("{bad:?}")), "{}", e.message);
        }
        assert!(format_offset(7) < format_offset(10));
    }

    #[test]
    fn a_fork_offset_is_ours_or_the_beginning() {
        assert_eq!(parse_fork_offset(&format_offset(9)).unwrap(), 9);
        assert_eq!(parse_fork_offset("-1").unwrap(), 0);
        assert_eq!(
            parse_fork_offset("0000000000000000_0000000000000000").unwrap(),
            0
        );
        for bad in [
            "",
            "_",
            "0_",
            "0000000000000001_0000000000000000",
            "now",
            "12",
        ] {
            let e = parse_fork_offset(bad).unwrap_err();
            assert!(e.message.contains(&format!("{bad:?}")), "{}", e.message);
        }
    }

    #[test]
    fn a_batch_knows_how_many_of_its_messages_follow() {
        let events: Vec<Event> =
            json_batch_events(vec![json!(1), json!(2), json!(3)], &Provenance::default())
                .into_iter()
                .enumerate()
                .map(|(i, e)| message(3 + i as u64, e))
                .collect();
        let rest: Vec<u64> = events.iter().map(rest_of_batch).collect();
        assert_eq!(rest, vec![3, 2, 1]);
        let alone = message(9, json_message_event(json!(1), &Provenance::default()));
        assert_eq!(rest_of_batch(&alone), 1);
        assert_eq!(as_json_message(&events[1]), json!(2));
    }

    #[test]
    fn integers_are_plain_decimals() {
        assert_eq!(parse_integer("Stream-TTL", "3600").unwrap(), 3600);
        assert_eq!(parse_integer("Stream-TTL", "0").unwrap(), 0);
        for bad in [
            "+3600",
            "03600",
            "3600.0",
            "3.6e3",
            "",
            " 1",
            "-1",
            "9007199254740992",
        ] {
            assert!(parse_integer("Stream-TTL", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_bodies_flatten_one_level() {
        assert_eq!(json_messages(b"[[1,2],[3]]", false).unwrap().len(), 2);
        assert_eq!(
            json_messages(b"[[[1]]]", false).unwrap(),
            vec![json!([[1]])]
        );
        assert_eq!(json_messages(b"{\"a\":1}", false).unwrap().len(), 1);
        assert!(json_messages(b"[]", false).is_err());
        assert!(json_messages(b"[]", true).unwrap().is_empty());
        assert!(json_messages(b"{", false).is_err());
    }

    #[test]
    fn cursors_never_repeat_a_clients() {
        let now = CURSOR_EPOCH_MS + 1000 * 20 * 100 + 5;
        assert_eq!(response_cursor(now, None, 1), "100");
        assert_eq!(response_cursor(now, Some("99"), 1), "100");
        assert_eq!(response_cursor(now, Some("100"), 1), "101");
        assert_eq!(response_cursor(now, Some("100"), 3600), "280");
        assert_eq!(response_cursor(now, Some("junk"), 1), "100");
    }

    #[test]
    fn expiry_is_the_earlier_of_absolute_and_sliding() {
        let mut s = stream();
        assert_eq!(s.expires_at_ms(0), None);
        s.ttl_seconds = Some(10);
        assert_eq!(s.expires_at_ms(1000), Some(11_000));
        s.expires_at = Some("1970-01-01T00:00:05Z".into());
        assert_eq!(s.expires_at_ms(1000), Some(5000));
    }
}
