//! What appends and reads answer, and their bounds.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The default of `max-body-bytes`, the largest append request (8 MiB).
pub const MAX_BODY_BYTES_DEFAULT: usize = 8 * 1024 * 1024;

use crate::event::Event;

/// Bytes of ephemeral events kept per stream; the oldest are evicted first.
pub const EPHEMERAL_BYTES_MAX: usize = 10 * 1024 * 1024;
/// Largest page of a read.
pub const READ_LIMIT_MAX: usize = 500;

/// The answer to an append.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppendOutput {
    /// The stream's id (a new one per lifetime).
    pub stream_id: String,
    /// When the stream was created.
    pub stream_created_at: String,
    /// The committed events, one per input event (a replayed key answers its original event).
    pub events: Vec<Event>,
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
