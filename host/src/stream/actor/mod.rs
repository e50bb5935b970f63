//! The stream actor: the one writer of one stream.
//!
//! It owns the stream's committed core state and its ephemeral buffer. Append
//! requests that arrive while a commit is in flight queue up and are planned
//! together as the next round, which is submitted as one write to the
//! group-commit writer; every request of the round is answered once that write
//! has committed. Reads are answered from committed state at any time.
//!
//! **Architecture Invariant:** an append is acknowledged only after its
//! commit. A round that fails to commit answers every request with an error
//! and makes the actor reload its state from the log before the next round.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};

use super::address::StreamAddress;
use super::append::{configure_offsets, plan_append, AppendContext, AppendPlan, Authority};
use super::event::{AppendInput, Event};
use super::registry::StreamsRef;
use super::state::CoreState;
use crate::clock::{format_timestamp, Clock};
use crate::config::DeliveryConfig;
use crate::delivery::copy::{plan_copy, CopyBatch, CopyOutcome};
use crate::delivery::runtime::SubscriptionRuntime;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::storage::{
    CommitError, CursorRow, NewStream, Storage, StoredEvent, StreamCommit, StreamRef, StreamRow,
    WriteOp,
};

mod connections;
mod delivery;
pub use delivery::DeliveryDone;

/// Bytes of ephemeral events kept per stream; the oldest are evicted first.
pub const EPHEMERAL_BYTES_MAX: usize = 10 * 1024 * 1024;
/// Most append requests planned into one round.
pub const ROUND_REQUESTS_MAX: usize = 1024;
/// Largest page of a read.
pub const READ_LIMIT_MAX: usize = 500;

/// The answer to an append.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AppendOutput {
    pub stream_id: String,
    pub stream_created_at: String,
    pub events: Vec<Event>,
}

/// A page of events.
#[derive(Debug, Clone, Copy)]
pub struct ReadQuery {
    pub after_offset: u64,
    pub limit: usize,
    pub include_ephemeral: bool,
}

/// The answer to a read; events are the stored JSON, served as is.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadOutput {
    pub stream_id: String,
    pub stream_created_at: String,
    pub max_offset: u64,
    pub events: Vec<Box<RawValue>>,
}

type Reply<T> = oneshot::Sender<Result<T, ApiError>>;

/// A message to a stream actor.
pub enum Command {
    Append {
        input: AppendInput,
        authority: Authority,
        reply: Reply<AppendOutput>,
    },
    Read {
        query: ReadQuery,
        reply: Reply<ReadOutput>,
    },
    State {
        reply: Reply<CoreState>,
    },
    Reset {
        reply: Reply<()>,
    },
    /// A copy batch from a source's subscription (platform authority).
    Deliver {
        batch: Box<CopyBatch>,
        reply: Reply<CopyOutcome>,
    },
    /// Runtime state (`:runtime`).
    Runtime {
        reply: Reply<serde_json::Value>,
    },
    /// Load the stream and resume its deliveries (sent at startup).
    Wake,
    /// The result of a delivery this actor started.
    DeliveryDone(Box<DeliveryDone>),
    /// Open a live connection.
    Connect {
        params: Box<crate::connection::ConnectParams>,
        reply: Reply<crate::connection::feed::Feed>,
    },
    /// A connection's consumer ended it.
    ConnectionEnded {
        key: String,
        id: u64,
        reason: crate::connection::CloseReason,
        error: Option<String>,
    },
}

enum Pending {
    Append {
        input: AppendInput,
        authority: Authority,
        reply: Option<Reply<AppendOutput>>,
    },
    Deliver {
        batch: Box<CopyBatch>,
        reply: Reply<CopyOutcome>,
    },
    Reset {
        reply: Reply<()>,
    },
}

/// Who waits for the outcome of one planned request.
enum Answer {
    Append(Option<Reply<AppendOutput>>),
    Deliver(Reply<CopyOutcome>, CopyOutcome),
}

struct Loaded {
    row_id: i64,
    state: CoreState,
    /// The last committed (durable) offset folded into `state`.
    state_offset: u64,
}

/// A write waiting for its commit.
enum InFlight {
    Round {
        outcomes: Vec<(Answer, Result<AppendPlan, ApiError>)>,
        next_state: Box<CoreState>,
        state_offset: u64,
        cursors: Vec<CursorRow>,
    },
    Reset {
        reply: Reply<()>,
    },
    Cursors {
        cursors: Vec<CursorRow>,
    },
}

struct EphemeralBuffer {
    events: VecDeque<(Event, usize)>,
    bytes: usize,
}

impl EphemeralBuffer {
    fn push(&mut self, event: Event) {
        let size = serde_json::to_string(&event).map(|s| s.len()).unwrap_or(0);
        self.events.push_back((event, size));
        self.bytes += size;
        while self.bytes > EPHEMERAL_BYTES_MAX {
            match self.events.pop_front() {
                Some((_, s)) => self.bytes -= s,
                None => break,
            }
        }
    }

    fn after(&self, offset: u64, limit: usize) -> Vec<Event> {
        self.events
            .iter()
            .map(|(e, _)| e)
            .filter(|e| e.offset > offset)
            .take(limit)
            .cloned()
            .collect()
    }

    fn clear(&mut self) {
        self.events.clear();
        self.bytes = 0;
    }
}

/// Everything an actor needs from the host.
#[derive(Clone)]
pub struct ActorContext {
    pub storage: Storage,
    pub clock: Arc<dyn Clock>,
    pub metrics: Metrics,
    pub delivery: DeliveryConfig,
    /// The registry, to deliver to other streams (weak: no ownership cycle).
    pub streams: StreamsRef,
    /// The wasm runtime that processor-wake subscriptions call.
    pub runtime: Arc<crate::processor::runtime::Runtime>,
}

/// Starts the actor of `address`; it runs until every sender is dropped.
pub fn spawn(
    address: StreamAddress,
    ctx: ActorContext,
    tx: &mpsc::Sender<Command>,
    rx: mpsc::Receiver<Command>,
) {
    let actor = Actor {
        address,
        ctx,
        stream: None,
        ephemeral: EphemeralBuffer {
            events: VecDeque::new(),
            bytes: 0,
        },
        queue: VecDeque::new(),
        reload_needed: true,
        deliveries: HashMap::new(),
        self_tx: tx.downgrade(),
        next_delivery_id: 0,
        recent_commits: VecDeque::new(),
        connections: HashMap::new(),
        next_connection_id: 0,
    };
    tokio::spawn(actor.run(rx));
}

struct Actor {
    address: StreamAddress,
    ctx: ActorContext,
    stream: Option<Loaded>,
    ephemeral: EphemeralBuffer,
    queue: VecDeque<Pending>,
    reload_needed: bool,
    /// Delivery state of the push subscriptions of this (source) stream.
    deliveries: HashMap<String, SubscriptionRuntime>,
    self_tx: mpsc::WeakSender<Command>,
    next_delivery_id: u64,
    /// Commit instants of recent durable events, for delivery latency.
    recent_commits: VecDeque<(u64, std::time::Instant)>,
    /// Live connections by key.
    connections: HashMap<String, connections::Conn>,
    next_connection_id: u64,
}

/// Commit instants kept for latency measurement.
const RECENT_COMMITS_MAX: usize = 65_536;

enum Wake {
    Command(Option<Command>),
    Committed(Result<Result<i64, CommitError>, oneshot::error::RecvError>),
    Timer,
}

impl Actor {
    async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let mut in_flight: Option<(InFlight, oneshot::Receiver<Result<i64, CommitError>>)> = None;
        let mut closed = false;
        loop {
            if in_flight.is_none() {
                in_flight = self.start_next();
            }
            self.pump_deliveries();
            if closed && in_flight.is_none() && self.queue.is_empty() {
                return;
            }
            let timer = self.next_delivery_timer();
            let wake = {
                let commit = async {
                    match in_flight.as_mut() {
                        Some((_, rx)) => rx.await,
                        None => std::future::pending().await,
                    }
                };
                let sleep = async {
                    match timer {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    cmd = rx.recv(), if !closed => Wake::Command(cmd),
                    result = commit => Wake::Committed(result),
                    _ = sleep => Wake::Timer,
                }
            };
            match wake {
                Wake::Command(Some(cmd)) => self.accept(cmd),
                Wake::Command(None) => closed = true,
                Wake::Committed(result) => {
                    let (round, _) = in_flight.take().expect("a commit was in flight");
                    let result = result.unwrap_or_else(|_| {
                        Err(CommitError("the storage writer dropped the commit".into()))
                    });
                    self.finish(round, result);
                }
                Wake::Timer => {}
            }
        }
    }

    fn accept(&mut self, cmd: Command) {
        match cmd {
            Command::Append {
                input,
                authority,
                reply,
            } => self.queue.push_back(Pending::Append {
                input,
                authority,
                reply: Some(reply),
            }),
            Command::Reset { reply } => self.queue.push_back(Pending::Reset { reply }),
            Command::Deliver { batch, reply } => {
                self.queue.push_back(Pending::Deliver { batch, reply })
            }
            Command::Runtime { reply } => {
                let result = self.ensure_loaded().and_then(|()| match &self.stream {
                    Some(_) => Ok(self.runtime_json()),
                    None => Err(self.not_found()),
                });
                let _ = reply.send(result);
            }
            Command::Wake => {
                if let Err(e) = self.ensure_loaded() {
                    tracing::error!(stream = %self.address, error = %e, "waking stream failed");
                }
            }
            Command::DeliveryDone(done) => self.delivery_done(*done),
            Command::Connect { params, reply } => self.connect(*params, reply),
            Command::ConnectionEnded {
                key,
                id,
                reason,
                error,
            } => self.connection_ended(&key, id, reason, error),
            Command::State { reply } => {
                let result = self.ensure_loaded().and_then(|()| {
                    self.stream
                        .as_ref()
                        .map(|s| s.state.clone())
                        .ok_or_else(|| self.not_found())
                });
                let _ = reply.send(result);
            }
            Command::Read { query, reply } => match self.ensure_loaded() {
                Ok(()) => self.read(query, reply),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
        }
    }

    /// Loads the stream when it is not loaded (first use, or after a failed commit).
    fn ensure_loaded(&mut self) -> Result<(), ApiError> {
        if !self.reload_needed {
            return Ok(());
        }
        self.reload().map_err(|e| {
            tracing::error!(stream = %self.address, error = %format!("{e:#}"), "loading stream failed");
            ApiError::internal(format!("loading the stream failed: {e:#}"))
        })
    }

    fn not_found(&self) -> ApiError {
        let where_ = match self.address.namespace.project_id() {
            Some(p) => format!("in project {p:?}"),
            None => "in the global namespace".to_string(),
        };
        ApiError::not_found(
            "stream-not-found",
            format!("stream {:?} does not exist {where_}", self.address.path),
        )
    }

    /// (Re)loads the stream from storage: the cached state is used when it
    /// matches the log's head, otherwise the log is folded again.
    fn reload(&mut self) -> Result<()> {
        let ns = self.address.namespace.storage_key().to_string();
        let row = self.ctx.storage.load_stream(&ns, &self.address.path)?;
        self.stream = match row {
            None => None,
            Some(row) => Some(self.load_row(row)?),
        };
        self.deliveries.clear();
        if let Some(stream) = &self.stream {
            let rows = self.ctx.storage.load_cursors(stream.row_id)?;
            let state = stream.state.clone();
            self.repair_deliveries(&state, &rows);
        }
        self.reload_needed = false;
        Ok(())
    }

    fn load_row(&self, row: StreamRow) -> Result<Loaded> {
        if row.state_offset == row.log_head {
            if let Ok(state) = serde_json::from_str::<CoreState>(&row.state_json) {
                if state.stream_id == row.stream_id {
                    return Ok(Loaded {
                        row_id: row.row_id,
                        state: CoreState {
                            max_offset: state.max_offset.max(row.head_offset),
                            ..state
                        },
                        state_offset: row.state_offset,
                    });
                }
            }
        }
        tracing::warn!(stream = %self.address, "cached state does not match the log; folding the log again");
        let mut state: Option<CoreState> = None;
        let mut after = 0;
        loop {
            let page =
                self.ctx
                    .storage
                    .events_after(row.row_id, after, READ_LIMIT_MAX, u64::MAX)?;
            let Some((last, _)) = page.last() else { break };
            after = *last;
            for (offset, body) in &page {
                let event: Event = serde_json::from_str(body)
                    .with_context(|| format!("parsing the stored event at offset {offset}"))?;
                match &mut state {
                    None => state = Some(CoreState::from_created(&event)),
                    Some(s) => s.reduce(&event),
                }
            }
        }
        let mut state = state.context("a stream row without a created event")?;
        state.max_offset = state.max_offset.max(row.head_offset);
        Ok(Loaded {
            row_id: row.row_id,
            state,
            state_offset: row.log_head,
        })
    }

    fn read(&self, query: ReadQuery, reply: Reply<ReadOutput>) {
        let Some(stream) = &self.stream else {
            let _ = reply.send(Err(self.not_found()));
            return;
        };
        let storage = self.ctx.storage.clone();
        let row_id = stream.row_id;
        let head = stream.state.max_offset;
        let stream_id = stream.state.stream_id.clone();
        let created_at = stream.state.created_at.clone();
        let ephemeral = if query.include_ephemeral {
            self.ephemeral.after(query.after_offset, query.limit)
        } else {
            Vec::new()
        };
        tokio::task::spawn_blocking(move || {
            let result = storage
                .events_after(row_id, query.after_offset, query.limit, head)
                .map_err(|e| ApiError::internal(format!("reading events failed: {e:#}")))
                .and_then(|durable| merge_page(durable, ephemeral, query.limit))
                .map(|events| ReadOutput {
                    stream_id,
                    stream_created_at: created_at,
                    max_offset: head,
                    events,
                });
            let _ = reply.send(result);
        });
    }

    /// Starts the next write, answering queued work that needs none.
    fn start_next(&mut self) -> Option<(InFlight, oneshot::Receiver<Result<i64, CommitError>>)> {
        loop {
            let Some(front) = self.queue.pop_front() else {
                return self.start_cursor_write();
            };
            if self.reload_needed {
                if let Err(e) = self.reload() {
                    let err = ApiError::internal(format!("loading the stream failed: {e:#}"));
                    self.fail_pending(front, err.clone());
                    while let Some(p) = self.queue.pop_front() {
                        self.fail_pending(p, err.clone());
                    }
                    return None;
                }
            }
            match front {
                Pending::Reset { reply } => match &self.stream {
                    None => {
                        self.ephemeral.clear();
                        let _ = reply.send(Ok(()));
                    }
                    Some(s) => {
                        let rx = self.ctx.storage.submit(WriteOp::Reset { row_id: s.row_id });
                        return Some((InFlight::Reset { reply }, rx));
                    }
                },
                first @ (Pending::Append { .. } | Pending::Deliver { .. }) => {
                    let mut round = vec![first];
                    while round.len() < ROUND_REQUESTS_MAX {
                        match self.queue.front() {
                            Some(Pending::Append { .. } | Pending::Deliver { .. }) => {
                                round.push(self.queue.pop_front().expect("front exists"))
                            }
                            _ => break,
                        }
                    }
                    if let Some(started) = self.start_round(round) {
                        return Some(started);
                    }
                }
            }
        }
    }

    fn fail_pending(&self, p: Pending, err: ApiError) {
        match p {
            Pending::Append { reply, .. } => {
                self.ctx.metrics.append_answered(err.code);
                if let Some(reply) = reply {
                    let _ = reply.send(Err(err));
                }
            }
            Pending::Deliver { reply, .. } => {
                let _ = reply.send(Err(err));
            }
            Pending::Reset { reply } => {
                let _ = reply.send(Err(err));
            }
        }
    }

    /// Plans a round of appends; returns the commit to wait for, or `None`
    /// when every request was answered without one.
    fn start_round(
        &mut self,
        round: Vec<Pending>,
    ) -> Option<(InFlight, oneshot::Receiver<Result<i64, CommitError>>)> {
        let _span = tracing::debug_span!("append", stream = %self.address, requests = round.len())
            .entered();
        let committed_by_key = match self.lookup_keys(&round) {
            Ok(found) => found,
            Err(e) => {
                let err = ApiError::internal(format!("reading idempotency keys failed: {e:#}"));
                for p in round {
                    self.fail_pending(p, err.clone());
                }
                return None;
            }
        };
        let committed_by_offset = match self.lookup_configures(&round) {
            Ok(found) => found,
            Err(e) => {
                let err = ApiError::internal(format!("reading configure events failed: {e:#}"));
                for p in round {
                    self.fail_pending(p, err.clone());
                }
                return None;
            }
        };
        let now = format_timestamp(self.ctx.clock.now_ms());
        let project_id = self.address.namespace.project_id().map(str::to_string);
        let path = self.address.path.clone();
        let mut new_stream_id = || uuid::Uuid::new_v4().to_string();
        let connection_keys = self.connection_keys();
        let mut ctx = AppendContext {
            connection_keys: &connection_keys,
            namespace: &self.address.namespace,
            committed_by_offset: &committed_by_offset,
            project_id: project_id.as_deref(),
            path: &path,
            now: &now,
            new_stream_id: &mut new_stream_id,
            committed_by_key: &committed_by_key,
        };
        let mut state = self.stream.as_ref().map(|s| s.state.clone());
        let mut round_keys = HashMap::new();
        let mut outcomes = Vec::with_capacity(round.len());
        let mut new_events: Vec<Event> = Vec::new();
        for p in round {
            let (answer, outcome) = match p {
                Pending::Append {
                    input,
                    authority,
                    reply,
                } => (
                    Answer::Append(reply),
                    plan_append(&mut state, &mut round_keys, &input, authority, &mut ctx),
                ),
                Pending::Deliver { batch, reply } => {
                    match plan_copy(&mut state, &mut round_keys, &self.address, &batch, &mut ctx) {
                        Ok((plan, outcome)) => (Answer::Deliver(reply, outcome), Ok(plan)),
                        Err(e) => (Answer::Deliver(reply, CopyOutcome::default()), Err(e)),
                    }
                }
                Pending::Reset { .. } => unreachable!("a round holds appends and deliveries only"),
            };
            if let Ok(plan) = &outcome {
                new_events.extend(plan.new_events.iter().cloned());
            }
            outcomes.push((answer, outcome));
        }
        let next_state = match state {
            Some(s) if !new_events.is_empty() => s,
            _ => {
                // Nothing to commit: rejections and replays of committed events.
                let state = self.stream.as_ref().map(|s| &s.state);
                for (reply, outcome) in outcomes {
                    self.answer(reply, outcome, state);
                }
                return None;
            }
        };
        let durable: Vec<StoredEvent> = new_events
            .iter()
            .filter(|e| !e.ephemeral)
            .map(|e| StoredEvent {
                offset: e.offset,
                event_type: e.event_type.clone(),
                idempotency_key: e.idempotency_key.clone(),
                body: serde_json::to_string(e).expect("events serialize"),
            })
            .collect();
        let state_offset = durable
            .last()
            .map(|e| e.offset)
            .or(self.stream.as_ref().map(|s| s.state_offset))
            .unwrap_or(0);
        let stream_ref = match &self.stream {
            Some(s) => StreamRef::Existing {
                row_id: s.row_id,
                expected_head: s.state.max_offset,
            },
            None => StreamRef::New(NewStream {
                project: self.address.namespace.storage_key().to_string(),
                path: self.address.path.clone(),
                stream_id: next_state.stream_id.clone(),
                created_at: next_state.created_at.clone(),
            }),
        };
        let (cursors, removed_cursors) = self.cursor_rows_for(&next_state);
        let rx = self.ctx.storage.submit(WriteOp::Commit(StreamCommit {
            stream: stream_ref,
            events: durable,
            head_offset: next_state.max_offset,
            state_json: next_state.serialized(),
            state_offset,
            cursors: cursors.clone(),
            removed_cursors,
        }));
        Some((
            InFlight::Round {
                outcomes,
                next_state: Box::new(next_state),
                state_offset,
                cursors,
            },
            rx,
        ))
    }

    fn lookup_keys(&self, round: &[Pending]) -> Result<HashMap<String, Event>> {
        let Some(stream) = &self.stream else {
            return Ok(HashMap::new());
        };
        let mut keys: Vec<String> = Vec::new();
        for p in round {
            match p {
                Pending::Append { input, .. } => keys.extend(
                    input
                        .events
                        .iter()
                        .filter_map(|e| e.idempotency_key.clone()),
                ),
                Pending::Deliver { batch, .. } => {
                    keys.extend(crate::delivery::copy::batch_keys(batch, &self.address))
                }
                Pending::Reset { .. } => {}
            }
        }
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let bodies = self.ctx.storage.events_by_keys(stream.row_id, &keys)?;
        bodies
            .into_iter()
            .map(|(k, body)| {
                let event: Event = serde_json::from_str(&body)
                    .with_context(|| format!("parsing the stored event of key {k:?}"))?;
                Ok((k, event))
            })
            .collect()
    }

    fn lookup_configures(&self, round: &[Pending]) -> Result<HashMap<u64, Event>> {
        let Some(stream) = &self.stream else {
            return Ok(HashMap::new());
        };
        let mut found = HashMap::new();
        for p in round {
            if let Pending::Append { input, .. } = p {
                for offset in configure_offsets(Some(&stream.state), input) {
                    if found.contains_key(&offset) {
                        continue;
                    }
                    if let Some((_, body)) = self
                        .ctx
                        .storage
                        .events_after(stream.row_id, offset - 1, 1, offset)?
                        .into_iter()
                        .next()
                    {
                        found.insert(offset, serde_json::from_str(&body)?);
                    }
                }
            }
        }
        Ok(found)
    }

    fn answer(
        &self,
        answer: Answer,
        outcome: Result<AppendPlan, ApiError>,
        state: Option<&CoreState>,
    ) {
        match answer {
            Answer::Append(reply) => {
                let result = outcome.and_then(|plan| {
                    let state = state
                        .ok_or_else(|| ApiError::internal("a planned append without a stream"))?;
                    Ok(AppendOutput {
                        stream_id: state.stream_id.clone(),
                        stream_created_at: state.created_at.clone(),
                        events: plan.events,
                    })
                });
                self.ctx.metrics.append_answered(match &result {
                    Ok(_) => "ok",
                    Err(e) => e.code,
                });
                match (reply, result) {
                    (Some(reply), result) => {
                        let _ = reply.send(result);
                    }
                    (None, Err(e)) => {
                        tracing::warn!(stream = %self.address, error = %e, "platform append rejected");
                    }
                    (None, Ok(_)) => {}
                }
            }
            Answer::Deliver(reply, copy_outcome) => {
                let _ = reply.send(outcome.map(|_| copy_outcome));
            }
        }
    }

    fn finish(&mut self, in_flight: InFlight, result: Result<i64, CommitError>) {
        match in_flight {
            InFlight::Round {
                outcomes,
                next_state,
                state_offset,
                cursors,
            } => match result {
                Ok(row_id) => {
                    let now = std::time::Instant::now();
                    for (_, outcome) in &outcomes {
                        if let Ok(plan) = outcome {
                            for e in &plan.new_events {
                                if e.ephemeral {
                                    self.ephemeral.push(e.clone());
                                } else {
                                    self.recent_commits.push_back((e.offset, now));
                                }
                            }
                        }
                    }
                    while self.recent_commits.len() > RECENT_COMMITS_MAX {
                        self.recent_commits.pop_front();
                    }
                    self.stream = Some(Loaded {
                        row_id,
                        state: *next_state,
                        state_offset,
                    });
                    let state = self.stream.as_ref().map(|s| s.state.clone());
                    if let Some(state) = &state {
                        self.repair_deliveries(state, &cursors);
                    }
                    let committed: Vec<Event> = outcomes
                        .iter()
                        .filter_map(|(_, o)| o.as_ref().ok())
                        .flat_map(|p| p.new_events.iter().cloned())
                        .collect();
                    self.fan_out(&committed);
                    for (answer, outcome) in outcomes {
                        self.answer(answer, outcome, state.as_ref());
                    }
                }
                Err(e) => {
                    tracing::error!(stream = %self.address, error = %e, "append round failed to commit");
                    self.reload_needed = true;
                    let err = ApiError::internal(format!("commit failed: {e}"));
                    for (answer, _) in outcomes {
                        self.answer(answer, Err(err.clone()), None);
                    }
                }
            },
            InFlight::Cursors { cursors } => match result {
                Ok(_) => {
                    for c in cursors {
                        if let Some(rt) = self.deliveries.get_mut(&c.subscription_key) {
                            if rt.generation == c.generation {
                                rt.durable_cursor = rt.durable_cursor.max(c.acknowledged_offset);
                                if rt.run.failing_event
                                    == c.failing_offset.map(|o| (o, c.failing_attempts))
                                    && rt.run.skips_since_success == c.skips
                                {
                                    rt.counters_dirty = false;
                                }
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(stream = %self.address, error = %e, "cursor write failed");
                    self.reload_needed = true;
                }
            },
            InFlight::Reset { reply } => match result {
                Ok(_) => {
                    self.drop_connections();
                    self.stream = None;
                    self.deliveries.clear();
                    self.recent_commits.clear();
                    self.ephemeral.clear();
                    let _ = reply.send(Ok(()));
                }
                Err(e) => {
                    self.reload_needed = true;
                    let _ = reply.send(Err(ApiError::internal(format!("reset failed: {e}"))));
                }
            },
        }
    }
}

/// Merges a page of stored events with buffered ephemeral ones, by offset.
fn merge_page(
    durable: Vec<(u64, String)>,
    ephemeral: Vec<Event>,
    limit: usize,
) -> Result<Vec<Box<RawValue>>, ApiError> {
    let mut out = Vec::with_capacity(limit.min(durable.len() + ephemeral.len()));
    let mut durable = durable.into_iter().peekable();
    let mut ephemeral = ephemeral.into_iter().peekable();
    while out.len() < limit {
        let take_durable = match (durable.peek(), ephemeral.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some((d, _)), Some(e)) => *d < e.offset,
        };
        let raw = if take_durable {
            let (_, body) = durable.next().expect("peeked");
            RawValue::from_string(body)
        } else {
            let e = ephemeral.next().expect("peeked");
            RawValue::from_string(serde_json::to_string(&e).expect("events serialize"))
        };
        out.push(raw.map_err(|e| ApiError::internal(format!("a stored event is not JSON: {e}")))?);
    }
    Ok(out)
}
