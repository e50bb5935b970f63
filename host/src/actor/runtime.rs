//! A stream's runtime view (`:runtime`): what its actor holds that is not
//! replayed from the log (deliveries in progress, live connections).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::delivery::runtime::{DeliveryView, Latency};

/// The runtime of one stream: its subscriptions' deliveries and its live
/// connections, by key.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeView {
    /// Each push subscription's delivery, by subscription key.
    pub subscriptions: BTreeMap<String, DeliveryView>,
    /// Each live connection, by connection key.
    pub connections: BTreeMap<String, ConnectionView>,
}

/// One live connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionView {
    /// When it opened (ms since the epoch).
    pub opened_at: i64,
    /// The offset its replay started after.
    pub replay_after_offset: Option<u64>,
    /// Whether it receives events.
    pub events: bool,
    /// Whether it receives the reduced state.
    pub state: bool,
    /// Its event-type filter.
    pub event_types: Option<Vec<String>>,
    /// Its JSONata condition.
    pub jsonata_condition: Option<String>,
    /// Commits sent to it.
    pub delivered_commits: u64,
    /// Batches waiting in its buffer (a slow client's backlog).
    pub queued_batches: usize,
}
