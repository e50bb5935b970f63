//! Live connections and waits: a stream's committed events (replayed, then
//! as they commit) as a [`futures_util::Stream`] of batches, filtered per
//! connection off the stream's actor; and waiting for the first event that
//! matches. `GET {stream}:connect` (server-sent events) and
//! `POST {stream}:waitForEvent` over HTTP.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::mpsc;

use super::request::{StreamAnswer, StreamRequest};
use super::Host;
use crate::connection::feed::FeedItem;
use crate::connection::{
    match_events, split_batches, try_condition, wait_timeout_message, CloseReason, ConnectParams,
    LiveEvent, WAIT_RECENT_TYPES_MAX,
};
use crate::error::{Error, ErrorKind};
use crate::stream::{types, Event, StreamAddress};

pub use crate::connection::Batch;

/// Messages buffered between a connection's feed and its consumer.
const LIVE_BUFFER_MESSAGES: usize = 16;
/// Longest wait for an event.
pub const WAIT_TIMEOUT_MS_MAX: u64 = 300_000;

/// A live connection to open: which events, from where, in what batches.
/// Build with [`Connect::new`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Connect {
    /// The connection's key: a new connection with the same key replaces it.
    pub connection_key: Option<String>,
    /// Replays the committed events after this offset first.
    pub replay_after_offset: Option<u64>,
    /// Refuses to connect to another lifetime of the stream.
    pub expected_stream_id: Option<String>,
    /// Refuses a replay longer than this many offsets.
    pub max_replay_offset_gap: Option<u64>,
    /// Only events of these types.
    pub event_types: Option<Vec<String>>,
    /// Only events for which this JSONata expression is truthy.
    pub jsonata_condition: Option<String>,
    /// Send events (default).
    pub events: bool,
    /// Send the reduced state with each batch (default).
    pub state: bool,
    /// Most events in one batch.
    pub max_delivery_events: usize,
    /// Most bytes of events in one batch.
    pub max_delivery_bytes: usize,
}

impl Default for Connect {
    fn default() -> Self {
        let p = ConnectParams::default();
        Connect {
            connection_key: None,
            replay_after_offset: None,
            expected_stream_id: None,
            max_replay_offset_gap: None,
            event_types: None,
            jsonata_condition: None,
            events: p.events,
            state: p.state,
            max_delivery_events: p.max_delivery_events,
            max_delivery_bytes: p.max_delivery_bytes,
        }
    }
}

impl Connect {
    /// Events and state as they commit from now on.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replays the committed events after `offset` first.
    pub fn after(mut self, offset: u64) -> Self {
        self.replay_after_offset = Some(offset);
        self
    }

    /// Names the connection (a later one with this key replaces it).
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.connection_key = Some(key.into());
        self
    }

    selection_setters!();

    /// Events only, without the state.
    pub fn events_only(mut self) -> Self {
        self.state = false;
        self
    }

    /// The state only (coalesced to the newest), without events.
    pub fn state_only(mut self) -> Self {
        self.events = false;
        self
    }

    /// The parameters the stream's actor takes, the condition bounded by
    /// `limits`; a bad filter or an empty selection is an error naming it.
    pub(crate) fn params(self, limits: crate::jsonata::Limits) -> Result<ConnectParams, Error> {
        if !self.events && !self.state {
            return Err(Error::invalid(
                "events=false with state=false would send nothing: ask for events, state or both",
            ));
        }
        if self.max_delivery_events == 0 || self.max_delivery_bytes == 0 {
            return Err(Error::invalid(
                "maxDeliveryEvents and maxDeliveryBytes must be positive",
            ));
        }
        Ok(ConnectParams {
            connection_key: self.connection_key,
            replay_after_offset: self.replay_after_offset,
            expected_stream_id: self.expected_stream_id,
            max_replay_offset_gap: self.max_replay_offset_gap,
            filter: super::selection(self.event_types, self.jsonata_condition, limits)?,
            events: self.events,
            state: self.state,
            max_delivery_events: self.max_delivery_events,
            max_delivery_bytes: self.max_delivery_bytes,
        })
    }
}

/// What a live connection receives.
#[derive(Debug, Clone)]
pub enum Live {
    /// Events (and the state) in commit order.
    Batch(Batch),
    /// The connection ended; nothing follows.
    Closed {
        /// Why (`replaced`, `closed-by-owner`, `delivery-failed`,
        /// `subscription-removed`, `idle`, `lease-lost`, ...).
        reason: &'static str,
        /// What failed, for `delivery-failed`.
        error: Option<String>,
    },
}

/// An open live connection: a stream of [`Live`] messages. Dropping it
/// closes the connection.
pub struct LiveConnection {
    rx: mpsc::Receiver<Live>,
}

impl futures_util::Stream for LiveConnection {
    type Item = Live;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Live>> {
        self.rx.poll_recv(cx)
    }
}

impl LiveConnection {
    /// The next message; `None` once the connection has ended.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::{Connect, EventInput, Live};
    ///
    /// let orders = host.stream("acme", "/orders/eu")?;
    /// host.append(&orders, [EventInput::new("events.example/order-placed")]).await?;
    /// let mut live = host.connect(&orders, Connect::new().events_only()).await?;
    /// host.append(&orders, [EventInput::new("events.example/order-created")]).await?;
    /// while let Some(Live::Batch(batch)) = live.next().await {
    ///     if batch.parsed_events()?.iter().any(|e| e.event_type == "events.example/order-created") {
    ///         break;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn next(&mut self) -> Option<Live> {
        self.rx.recv().await
    }
}

/// An event to wait for. Build with [`WaitFor::new`]; it is also the body
/// of `:waitForEvent`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitFor {
    /// Looks at the events after this offset (`None`: from now on).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::stream::bounded::optional_offset"
    )]
    pub after_offset: Option<u64>,
    /// Only events of these types.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
    /// Only events for which this JSONata expression is truthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jsonata_condition: Option<String>,
    /// Gives up after this long (1 to [`WAIT_TIMEOUT_MS_MAX`] ms).
    pub timeout_ms: u64,
}

impl WaitFor {
    /// Waits up to `timeout_ms` for the next event.
    pub fn new(timeout_ms: u64) -> Self {
        WaitFor {
            after_offset: None,
            event_types: None,
            jsonata_condition: None,
            timeout_ms,
        }
    }

    /// Looks at the events after `offset` (history included).
    pub fn after(mut self, offset: u64) -> Self {
        self.after_offset = Some(offset);
        self
    }

    selection_setters!();
}

impl Host {
    /// Opens a live connection to `stream`.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::{Connect, EventInput, Live};
    ///
    /// let orders = host.stream("acme", "/orders/eu")?;
    /// host.append(&orders, [EventInput::new("events.example/order-created")]).await?;
    /// let mut live = host.connect(&orders, Connect::new().after(0).events_only()).await?;
    /// let Some(Live::Batch(batch)) = live.next().await else { panic!("a batch") };
    /// let events = batch.parsed_events()?;
    /// assert_eq!(events.last().map(|e| e.offset), Some(2));
    /// # Ok(()) }
    /// ```
    pub async fn connect(
        &self,
        stream: &StreamAddress,
        connect: Connect,
    ) -> Result<LiveConnection, Error> {
        match self.apply(stream, StreamRequest::Connect(connect)).await? {
            StreamAnswer::Live(x) => Ok(x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::connect`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn connect_here(
        &self,
        stream: &StreamAddress,
        connect: Connect,
    ) -> Result<LiveConnection, Error> {
        let params = connect.params(self.config.jsonata_limits())?;
        let project = stream.namespace.storage_key().to_string();
        try_condition(&project, &params.filter)
            .await
            .map_err(|m| Error::unprocessable("jsonata-limit-exceeded", m))?;
        let mut feed = self.streams.connect(stream, params.clone()).await?;
        let (tx, rx) = mpsc::channel::<Live>(LIVE_BUFFER_MESSAGES);
        tokio::spawn(async move {
            loop {
                let item = tokio::select! {
                    item = feed.next() => item,
                    _ = tx.closed() => return, // the consumer left: the guard closes it
                };
                let Some(item) = item else {
                    return;
                };
                let out: Vec<Live> = match item {
                    FeedItem::Closed { reason, error } => {
                        let _ = tx
                            .send(Live::Closed {
                                reason: reason.as_str(),
                                error,
                            })
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
                            vec![Live::Batch(Batch {
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
                                        let _ = tx
                                            .send(Live::Closed {
                                                reason: CloseReason::DeliveryFailed.as_str(),
                                                error: Some(error.clone()),
                                            })
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
                            batches.into_iter().map(Live::Batch).collect()
                        }
                    }
                };
                for message in out {
                    if tx.send(message).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(LiveConnection { rx })
    }

    /// The first event of `stream` that matches `wait` after its offset
    /// (history, the ephemeral buffer, or live), or `timeout` naming what
    /// it saw.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::{EventInput, WaitFor};
    ///
    /// let orders = host.stream("acme", "/orders/eu")?;
    /// host.append(&orders, [EventInput::new("events.example/order-shipped")]).await?;
    /// let wait = WaitFor::new(5_000).after(0).event_types(["events.example/order-shipped"]);
    /// let shipped = host.wait_for_event(&orders, wait).await?;
    /// assert_eq!(shipped.offset, 2);
    /// let cancelled = WaitFor::new(50).event_types(["events.example/order-cancelled"]);
    /// let none = host.wait_for_event(&orders, cancelled).await.unwrap_err();
    /// assert_eq!(none.code, "timeout");
    /// # Ok(()) }
    /// ```
    pub async fn wait_for_event(
        &self,
        stream: &StreamAddress,
        wait: WaitFor,
    ) -> Result<Event, Error> {
        match self
            .apply(stream, StreamRequest::WaitForEvent(wait))
            .await?
        {
            StreamAnswer::Event(x) => Ok(*x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::wait_for_event`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn wait_for_event_here(
        &self,
        stream: &StreamAddress,
        wait: WaitFor,
    ) -> Result<Event, Error> {
        if wait.timeout_ms == 0 || wait.timeout_ms > WAIT_TIMEOUT_MS_MAX {
            return Err(Error::invalid(format!(
                "timeoutMs {} must be from 1 to {WAIT_TIMEOUT_MS_MAX}",
                wait.timeout_ms
            )));
        }
        let filter = self.selection(wait.event_types.clone(), wait.jsonata_condition.clone())?;
        let project = stream.namespace.storage_key();
        try_condition(project, &filter)
            .await
            .map_err(|m| Error::unprocessable("jsonata-limit-exceeded", m))?;
        let key = format!("wait:{}", uuid::Uuid::new_v4());
        let params = ConnectParams {
            connection_key: Some(key.clone()),
            replay_after_offset: wait.after_offset,
            state: false,
            ..ConnectParams::default()
        };
        let mut feed = self.streams.connect(stream, params).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait.timeout_ms);
        let mut seen = 0u64;
        let mut recent: VecDeque<String> = VecDeque::new();
        loop {
            let item = tokio::select! {
                item = feed.next() => item,
                _ = tokio::time::sleep_until(deadline) => {
                    feed.guard.end(CloseReason::ClosedByOwner, None);
                    return Err(wait_timed_out(wait.timeout_ms, seen, recent));
                }
            };
            match item {
                Some(FeedItem::Events { events, .. }) => {
                    let own = key.clone();
                    let matching =
                        match_events(project, &filter, &events, move |e| is_own_audit(e, &own));
                    // The wait's own timeout holds while its condition runs.
                    let Ok(found) = tokio::time::timeout_at(deadline, matching).await else {
                        feed.guard.end(CloseReason::ClosedByOwner, None);
                        return Err(wait_timed_out(wait.timeout_ms, seen, recent));
                    };
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
                                return serde_json::from_value((*e.value).clone()).map_err(|err| {
                                    Error::internal(format!("parsing a live event: {err}"))
                                });
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
                                return Err(Error::unprocessable(code, error));
                            }
                        }
                    }
                }
                Some(FeedItem::Closed {
                    reason: CloseReason::LeaseLost,
                    ..
                }) => return Err(Error::lease_lost(&stream.path)),
                Some(FeedItem::Closed { reason, error }) => {
                    return Err(Error::unavailable(
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
                    return Err(Error::unavailable(
                        "connection-closed",
                        "the stream closed the wait",
                        1,
                    ))
                }
            }
        }
    }
}

/// The wait's own connection-opened / connection-closed events.
fn is_own_audit(e: &LiveEvent, key: &str) -> bool {
    (e.event_type == types::CONNECTION_OPENED || e.event_type == types::CONNECTION_CLOSED)
        && e.value["payload"]["connectionKey"] == key
}

/// The timeout of a wait that saw `seen` events (the latest types in
/// `recent`).
fn wait_timed_out(timeout_ms: u64, seen: u64, recent: VecDeque<String>) -> Error {
    let recent: Vec<String> = recent.into_iter().collect();
    Error::new(
        ErrorKind::Timeout,
        "timeout",
        wait_timeout_message(timeout_ms, seen, &recent),
    )
}
