//! Live connections inside the stream's actor core: registering (after the
//! coordinates are checked, replacing an older connection with the same
//! key; the runtime builds the consumer's feed from [`NewConnection`]),
//! fanning out each commit's events, closing with an audit event.
//!
//! **Architecture Invariant:** a slow connection never blocks appends or
//! other connections: each has a bounded queue, and a full queue closes it.

use std::sync::Arc;

use serde_json::json;
use tokio::sync::mpsc;

use super::core::{ActorCore, Output};
use super::Reply;
use crate::connection::feed::{ConnMsg, Feed};
use crate::connection::{
    validate_coordinates, CloseReason, ConnectParams, LiveEvent, CONNECTION_BUFFER_BATCHES,
};
use crate::error::Error;
use crate::stream::{types, Event};
use crate::subscription::KEY_CHARS_MAX;

/// A connection the core registered, for the runtime to hand its feed
/// over (with storage for its replay and a guard that reports its end).
pub struct NewConnection {
    pub key: String,
    pub id: u64,
    pub replay: Option<ReplayFrom>,
    pub initial_state: Option<Arc<str>>,
    pub head: u64,
    pub rx: mpsc::Receiver<ConnMsg>,
}

/// Where a new connection's replay starts and ends.
pub struct ReplayFrom {
    pub row_id: i64,
    pub after: u64,
    pub head: u64,
    /// Buffered ephemeral events in `(after, head]`, in order.
    pub ephemeral: Vec<LiveEvent>,
}

/// A registered connection.
pub(super) struct Conn {
    id: u64,
    params: ConnectParams,
    tx: mpsc::Sender<ConnMsg>,
    opened_at_ms: i64,
    delivered_commits: u64,
}

impl ActorCore {
    pub(super) fn connect(&mut self, params: ConnectParams, reply: Reply<Feed>) {
        let result = self.try_connect(params);
        self.push_output(Output::Connected { reply, result });
    }

    /// Registers a connection; the stream is loaded already.
    fn try_connect(&mut self, params: ConnectParams) -> Result<NewConnection, Error> {
        let Some(stream) = &self.stream else {
            return Err(self.not_found());
        };
        validate_coordinates(&params, &stream.state)?;
        if let Some(after) = params.replay_after_offset {
            crate::stream::retention::check_read(stream.state.first_offset, after)?;
        }
        let key = match &params.connection_key {
            Some(k) => {
                let k = k.trim().to_string();
                if k.is_empty() || k.chars().count() > KEY_CHARS_MAX {
                    return Err(Error::invalid(format!(
                        "connectionKey {k:?} must be 1 to {KEY_CHARS_MAX} characters"
                    )));
                }
                k
            }
            None => format!("connection:{}", self.env.new_id()),
        };
        if stream
            .state
            .subscriptions
            .outbound
            .by_key
            .contains_key(&key)
        {
            return Err(Error::invalid(format!(
                "connection key {key:?} is already used by a durable subscription"
            )));
        }
        // Every check passed: now the old connection may be replaced.
        if self.connections.contains_key(&key) {
            self.close_connection(&key, CloseReason::Replaced, None);
        }
        let stream = self.stream.as_ref().expect("checked above");
        let head = stream.state.max_offset;
        let replay = params.replay_after_offset.map(|after| ReplayFrom {
            row_id: stream.row_id,
            after,
            head,
            ephemeral: self
                .ephemeral
                .after(after, usize::MAX)
                .into_iter()
                .filter(|e| e.offset <= head)
                .map(|e| live_event(&e))
                .collect(),
        });
        let initial_state: Option<Arc<str>> =
            params.state.then(|| stream.state.serialized().into());
        self.next_connection_id += 1;
        let id = self.next_connection_id;
        let (tx, rx) = mpsc::channel(CONNECTION_BUFFER_BATCHES);
        let audit = json!({
            "connectionKey": key,
            "replayAfterOffset": params.replay_after_offset,
            "events": params.events,
            "state": params.state,
        });
        self.connections.insert(
            key.clone(),
            Conn {
                id,
                params,
                tx,
                opened_at_ms: self.env.now_ms(),
                delivered_commits: 0,
            },
        );
        self.append_fact(types::CONNECTION_OPENED, audit);
        Ok(NewConnection {
            key,
            id,
            replay,
            initial_state,
            head,
            rx,
        })
    }

    /// A consumer ended its connection (client gone, or its filter failed).
    pub(super) fn connection_ended(
        &mut self,
        key: &str,
        id: u64,
        reason: CloseReason,
        error: Option<String>,
    ) {
        if self.connections.get(key).is_some_and(|c| c.id == id) {
            self.close_connection(key, reason, error);
        }
    }

    /// Removes a connection, tells its consumer, and records the close.
    pub(super) fn close_connection(
        &mut self,
        key: &str,
        reason: CloseReason,
        error: Option<String>,
    ) {
        let Some(conn) = self.connections.remove(key) else {
            return;
        };
        let _ = conn.tx.try_send(ConnMsg::Close {
            reason,
            error: error.clone(),
        });
        if self.stream.is_some() {
            let mut payload = json!({"connectionKey": key, "reason": reason.as_str()});
            if let Some(e) = error {
                payload["error"] = json!(e);
            }
            self.append_fact(types::CONNECTION_CLOSED, payload);
        }
    }

    /// Drops every connection without audit (the stream was wiped).
    pub(super) fn drop_connections(&mut self) {
        for (_, conn) in self.connections.drain() {
            let _ = conn.tx.try_send(ConnMsg::Close {
                reason: CloseReason::ClosedByOwner,
                error: Some("the stream was reset".into()),
            });
        }
    }

    /// Ends every connection without audit: this host may not serve the
    /// stream now (several hosts), and nothing it appends would be sure
    /// to commit. Clients reconnect and reach the stream's owner.
    pub(super) fn end_connections_lease_lost(&mut self) {
        for (_, conn) in self.connections.drain() {
            let _ = conn.tx.try_send(ConnMsg::Close {
                reason: CloseReason::LeaseLost,
                error: Some(Error::lease_lost(&self.address.path).message),
            });
        }
    }

    /// Sends a commit's events to every connection.
    pub(super) fn fan_out(&mut self, events: &[Event]) {
        if self.connections.is_empty() || events.is_empty() {
            return;
        }
        let Some(stream) = &self.stream else { return };
        let head = stream.state.max_offset;
        let live: Arc<Vec<LiveEvent>> = Arc::new(events.iter().map(live_event).collect());
        let state: Option<Arc<str>> = self
            .connections
            .values()
            .any(|c| c.params.state)
            .then(|| stream.state.serialized().into());
        let mut closing = Vec::new();
        for (key, conn) in &mut self.connections {
            let msg = ConnMsg::Events {
                events: live.clone(),
                state: if conn.params.state {
                    state.clone()
                } else {
                    None
                },
                stream_max_offset: head,
            };
            match conn.tx.try_send(msg) {
                Ok(()) => conn.delivered_commits += 1,
                Err(mpsc::error::TrySendError::Full(_)) => closing.push((
                    key.clone(),
                    CloseReason::DeliveryFailed,
                    Some(format!(
                        "the client fell behind: its buffer of {CONNECTION_BUFFER_BATCHES} batches is full"
                    )),
                )),
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    closing.push((key.clone(), CloseReason::ClosedByOwner, None))
                }
            }
        }
        for (key, reason, error) in closing {
            self.close_connection(&key, reason, error);
        }
    }

    /// Keys of live connections (subscription keys may not collide with them).
    pub(super) fn connection_keys(&self) -> Vec<String> {
        self.connections.keys().cloned().collect()
    }

    /// The `connections` part of `:runtime`.
    pub(super) fn connections_view(
        &self,
    ) -> std::collections::BTreeMap<String, crate::actor::ConnectionView> {
        self.connections
            .iter()
            .map(|(k, c)| {
                let view = crate::actor::ConnectionView {
                    opened_at: c.opened_at_ms,
                    replay_after_offset: c.params.replay_after_offset,
                    events: c.params.events,
                    state: c.params.state,
                    event_types: c.params.filter.event_types.clone(),
                    jsonata_condition: c
                        .params
                        .filter
                        .condition
                        .as_ref()
                        .map(|e| e.source().to_string()),
                    delivered_commits: c.delivered_commits,
                    queued_batches: CONNECTION_BUFFER_BATCHES - c.tx.capacity(),
                };
                (k.clone(), view)
            })
            .collect()
    }
}

fn live_event(e: &Event) -> LiveEvent {
    let value = serde_json::to_value(e).expect("events serialize");
    LiveEvent {
        offset: e.offset,
        event_type: e.event_type.clone(),
        json: value.to_string().into(),
        value: Arc::new(value),
    }
}
