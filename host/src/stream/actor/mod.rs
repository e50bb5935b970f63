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
//! and makes the actor reload its state from the log, at once (retried with
//! backoff while storage keeps failing), before the next round.
//!
//! **Architecture Invariant:** the actor never blocks an async worker: its
//! SQLite reads (load, refold, idempotency and configure lookups) run on
//! blocking threads, which the actor awaits.
//!
//! Lifecycle: the registry starts an actor on first use; the actor loads
//! its stream, serves, and releases itself (see `Streams::release`) once it
//! has been idle for `[limits] idle-stream-ms` with no live connection, no
//! delivery in flight, due or scheduled, and nothing to write (the
//! registry's sweep sends `IdleCheck` to wake it for that); an actor whose
//! stream does not exist releases itself as soon as it has answered.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::address::StreamAddress;
use super::append::{configure_offsets, plan_append, AppendContext, AppendPlan, Authority};
use super::event::{AppendInput, Event};
use super::registry::StreamsRef;
use super::state::CoreState;
use crate::clock::{format_timestamp, Clock};
use crate::config::DeliveryConfig;
use crate::delivery::copy::{plan_copy, CopyBatch, CopyOutcome};
use crate::delivery::schedule::Deliveries;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::storage::{
    CommitError, CursorRow, NewStream, Storage, StoredEvent, StreamCommit, StreamRef, StreamRow,
    WriteOp,
};

mod connections;
mod delivery;
mod recent_keys;
use crate::delivery::schedule::DeliveryDone;

/// Bytes of ephemeral events kept per stream; the oldest are evicted first.
pub const EPHEMERAL_BYTES_MAX: usize = 10 * 1024 * 1024;
/// Most append requests planned into one round.
pub const ROUND_REQUESTS_MAX: usize = 1024;
/// Largest page of a read.
pub const READ_LIMIT_MAX: usize = 500;
/// Wait before loading again after the second storage failure in a row (the
/// first reloads at once); doubles up to [`RELOAD_BACKOFF_MAX_MS`].
const RELOAD_BACKOFF_BASE_MS: u64 = 50;
const RELOAD_BACKOFF_MAX_MS: u64 = 5_000;

/// Wait before the next load after `failures` storage failures (failed
/// loads or writes) in a row: 0, 50, 100, 200 ... 5000 ms.
fn reload_backoff_ms(failures: u32) -> u64 {
    match failures {
        0 | 1 => 0,
        n => RELOAD_BACKOFF_BASE_MS
            .saturating_mul(1 << (n - 2).min(16))
            .min(RELOAD_BACKOFF_MAX_MS),
    }
}

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
#[derive(Debug, Serialize)]
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

type Reply<T> = oneshot::Sender<Result<T, Error>>;

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
    /// Retry at once the failing (not halted) runs of subscription `key`
    /// or of those calling `component`; answers the keys that retry.
    Retry {
        key: Option<String>,
        component: Option<String>,
        reply: Reply<Vec<String>>,
    },
    /// Runtime state (`:runtime`).
    Runtime {
        reply: Reply<crate::stream::RuntimeView>,
    },
    /// Each delivery run's lag (events after its cursor), as this actor
    /// holds it now, for `/metrics`: loads nothing, and is no request (the
    /// actor may still go idle).
    Lags {
        reply: tokio::sync::oneshot::Sender<Vec<(String, u64)>>,
    },
    /// Load the stream and resume its deliveries (sent at startup).
    Wake,
    /// This host's lease on the stream, once it is loaded (a write made
    /// outside the actor carries it).
    Fence {
        reply: Reply<Option<crate::storage::Fence>>,
    },
    /// This host's right to serve its streams changed (several hosts): it
    /// lapsed (connections end, deliveries pause) or came back (loads
    /// again if the database let it lapse, deliveries resume).
    LeaseChanged,
    /// The registry saw no request for the idle period: release the actor
    /// if nothing else keeps it.
    IdleCheck,
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
        /// For a platform fact of a delivery run: the run (key, generation),
        /// told when the fact does not commit.
        run: Option<(String, u64)>,
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
    Append(Option<Reply<AppendOutput>>, Option<(String, u64)>),
    Deliver(Reply<CopyOutcome>, CopyOutcome),
}

struct Loaded {
    row_id: i64,
    state: CoreState,
    /// The last committed (durable) offset folded into `state`.
    state_offset: u64,
}

/// A planned request, kept until its round commits: a round the log's
/// idempotency index refuses is planned again from these.
enum Request {
    Append {
        input: AppendInput,
        authority: Authority,
    },
    Deliver {
        batch: Box<CopyBatch>,
    },
}

impl Request {
    fn into_pending(self, answer: Answer) -> Pending {
        match (self, answer) {
            (Request::Append { input, authority }, Answer::Append(reply, run)) => Pending::Append {
                input,
                authority,
                reply,
                run,
            },
            (Request::Deliver { batch }, Answer::Deliver(reply, _)) => {
                Pending::Deliver { batch, reply }
            }
            _ => unreachable!("a request is answered by its own kind"),
        }
    }

    /// Whether it names idempotency keys (its own, or a copy's).
    fn has_keys(&self, receiver: &StreamAddress) -> bool {
        match self {
            Request::Append { input, .. } => {
                input.events.iter().any(|e| e.idempotency_key.is_some())
            }
            Request::Deliver { batch } => {
                !crate::delivery::copy::batch_keys(batch, receiver).is_empty()
            }
        }
    }
}

/// A write waiting for its commit.
enum InFlight {
    Round {
        outcomes: Vec<(Answer, Result<AppendPlan, Error>)>,
        requests: Vec<Request>,
        /// Whether the round's keys were read from the log before planning
        /// (after the index refused it once).
        keys_read: bool,
        /// The stored size of each durable event with a key, by offset.
        keyed_bytes: HashMap<u64, usize>,
        next_state: Box<CoreState>,
        state_offset: u64,
        cursors: Vec<CursorRow>,
        /// Whether reactors' effects commit with it (the outbox's worker
        /// looks at once).
        effects: bool,
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
    /// What all buffers hold, counted with this stream's project.
    memory: Arc<crate::stream::quota::EphemeralMemory>,
    project: String,
}

impl EphemeralBuffer {
    fn push(&mut self, event: Event) {
        let size = serde_json::to_string(&event).map(|s| s.len()).unwrap_or(0);
        self.events.push_back((event, size));
        self.bytes += size;
        self.memory.add(&self.project, size);
        while self.bytes > EPHEMERAL_BYTES_MAX {
            match self.events.pop_front() {
                Some((_, s)) => {
                    self.bytes -= s;
                    self.memory.remove(&self.project, s);
                }
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
        self.memory.remove(&self.project, self.bytes);
        self.bytes = 0;
    }
}

impl Drop for EphemeralBuffer {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Everything an actor needs from the host.
#[derive(Clone)]
pub struct ActorContext {
    /// The database.
    pub storage: Storage,
    /// The injected clock.
    pub clock: Arc<dyn Clock>,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// Delivery settings.
    pub delivery: DeliveryConfig,
    /// The registry, to deliver to other streams (weak: no ownership cycle).
    pub streams: StreamsRef,
    /// The wasm runtime that processor-wake subscriptions call.
    pub runtime: Arc<crate::processor::runtime::Runtime>,
    /// What runs delivery jobs.
    pub executors: crate::executor::Executors,
    /// Idle time after which an actor releases itself.
    pub idle_stream_ms: u64,
    /// The ephemeral events all streams hold in memory.
    pub ephemeral: Arc<crate::stream::quota::EphemeralMemory>,
}

/// Starts the actor of `address`; it runs until every sender is dropped.
pub fn spawn(
    address: StreamAddress,
    ctx: ActorContext,
    tx: &mpsc::Sender<Command>,
    rx: mpsc::Receiver<Command>,
) {
    let ephemeral = EphemeralBuffer {
        events: VecDeque::new(),
        bytes: 0,
        memory: Arc::clone(&ctx.ephemeral),
        project: address.namespace.project_id().unwrap_or("").to_string(),
    };
    let actor = Actor {
        address,
        ctx,
        stream: None,
        ephemeral,
        queue: VecDeque::new(),
        reload_needed: true,
        storage_failures: 0,
        reload_at: None,
        last_request: tokio::time::Instant::now(),
        deliveries: Deliveries::default(),
        self_tx: tx.downgrade(),
        recent_commits: VecDeque::new(),
        recent_keys: recent_keys::RecentKeys::default(),
        read_keys: false,
        connections: HashMap::new(),
        next_connection_id: 0,
        fence: None,
        lease_lapses: 0,
        not_here: false,
        reactors: Default::default(),
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
    /// Storage failures (loads or writes) since the last committed write,
    /// for the reload backoff.
    storage_failures: u32,
    /// When to load again after a failure (`None`: at the next use).
    reload_at: Option<tokio::time::Instant>,
    /// When the last request arrived (for idle release).
    last_request: tokio::time::Instant,
    /// Delivery runs of the subscriptions of this (source) stream.
    deliveries: Deliveries,
    self_tx: mpsc::WeakSender<Command>,
    /// Commit instants of recent durable events, for delivery latency.
    recent_commits: VecDeque<(u64, std::time::Instant)>,
    /// Idempotency keys committed lately, with their events.
    recent_keys: recent_keys::RecentKeys,
    /// The next round reads its idempotency keys from the log before
    /// planning (the log's index refused the round as planned without).
    read_keys: bool,
    /// Live connections by key.
    connections: HashMap<String, connections::Conn>,
    next_connection_id: u64,
    /// This host's lease on the stream, carried by every write (several
    /// hosts on PostgreSQL; `None` on SQLite).
    fence: Option<crate::storage::Fence>,
    /// The host's lapse count when the fence was taken: after a renewal
    /// that found the lease expired, the stream is loaded again.
    lease_lapses: u64,
    /// Its last load found the stream owned by another host (or this host
    /// unable to serve it) with nothing of it held here: the actor goes as
    /// soon as it has answered, like one of a missing stream.
    not_here: bool,
    /// The stream's reactors, compiled, with what identifies them (their
    /// names and configure offsets): compiled again when that changes.
    reactors: (Vec<(String, u64)>, Arc<Vec<crate::reactor::Reactor>>),
}

/// Commit instants kept for latency measurement, at most.
const RECENT_COMMITS_MAX: usize = 65_536;

/// Commit instants worth keeping: those of offsets some run has not
/// delivered yet (none without runs), newest [`RECENT_COMMITS_MAX`].
fn prune_recent(recent: &mut VecDeque<(u64, std::time::Instant)>, lowest_cursor: Option<u64>) {
    let below = lowest_cursor.unwrap_or(u64::MAX);
    while recent
        .front()
        .is_some_and(|(o, _)| *o <= below || recent.len() > RECENT_COMMITS_MAX)
    {
        recent.pop_front();
    }
    // A backlog that drained gives its memory back.
    if recent.capacity() > 4096 && recent.len() < recent.capacity() / 4 {
        recent.shrink_to(recent.len() * 2);
    }
}

enum Wake {
    Command(Option<Command>),
    Committed(Result<Result<i64, CommitError>, oneshot::error::RecvError>),
    Timer,
}

impl Actor {
    fn prune_recent_commits(&mut self) {
        prune_recent(&mut self.recent_commits, self.deliveries.lowest_cursor());
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let mut in_flight: Option<(InFlight, oneshot::Receiver<Result<i64, CommitError>>)> = None;
        let mut closed = false;
        loop {
            if self.reload_needed
                && self
                    .reload_at
                    .is_some_and(|at| at <= tokio::time::Instant::now())
            {
                let _ = self.ensure_loaded().await;
            }
            if in_flight.is_none() {
                in_flight = self.start_next().await;
            }
            self.pump_deliveries();
            if closed && in_flight.is_none() && self.queue.is_empty() {
                return;
            }
            if in_flight.is_none() && self.may_release() {
                let idle_for = self.last_request.elapsed().as_millis() as u64;
                let missing = (!self.reload_needed || self.not_here) && self.stream.is_none();
                if (missing || idle_for >= self.ctx.idle_stream_ms) && self.release(&mut rx) {
                    return;
                }
            }
            let timer = self.next_timer();
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
                Wake::Command(Some(cmd)) => {
                    if !matches!(
                        cmd,
                        Command::DeliveryDone(_)
                            | Command::ConnectionEnded { .. }
                            | Command::IdleCheck
                            | Command::LeaseChanged
                            | Command::Lags { .. }
                    ) {
                        self.last_request = tokio::time::Instant::now();
                    }
                    self.accept(cmd).await
                }
                Wake::Command(None) => closed = true,
                Wake::Committed(result) => {
                    let (round, _) = in_flight.take().expect("a commit was in flight");
                    let result = result.unwrap_or_else(|_| {
                        Err(CommitError::new("the storage writer dropped the commit"))
                    });
                    self.finish(round, result);
                }
                Wake::Timer => {}
            }
        }
    }

    /// When the actor must wake with no message: the next delivery retry or
    /// deadline, or a reload after a failure. (Idleness is the registry's
    /// sweep: no timer per actor.)
    fn next_timer(&self) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        let now_ms = self.ctx.clock.now_ms();
        let delivery = self
            .next_delivery_at_ms()
            .map(|at| now + std::time::Duration::from_millis((at - now_ms).max(1) as u64));
        let reload = if self.reload_needed {
            self.reload_at
        } else {
            None
        };
        [delivery, reload].into_iter().flatten().min()
    }

    /// Whether nothing keeps the actor in memory but recent use: no queued
    /// work, no live connection, no delivery in flight, due, scheduled or
    /// with a cursor to write, and a loaded (or missing) stream.
    fn may_release(&self) -> bool {
        if (self.reload_needed && !self.not_here)
            || !self.queue.is_empty()
            || !self.connections.is_empty()
        {
            return false;
        }
        match &self.stream {
            None => true,
            Some(s) => self.deliveries.is_quiet(s.state_offset),
        }
    }

    /// Leaves the registry; messages that raced in are handed on to the
    /// stream's next actor. `false` when the registry is gone or a message
    /// is waiting.
    fn release(&mut self, rx: &mut mpsc::Receiver<Command>) -> bool {
        let Some(streams) = self.ctx.streams.upgrade() else {
            return false;
        };
        let Some(me) = self.self_tx.upgrade() else {
            return false;
        };
        if !streams.release(&self.address, &me, rx) {
            return false;
        }
        drop(me);
        rx.close();
        let mut late = Vec::new();
        while let Ok(cmd) = rx.try_recv() {
            late.push(cmd);
        }
        if !late.is_empty() {
            let address = self.address.clone();
            tokio::spawn(async move {
                for cmd in late {
                    streams.forward(&address, cmd).await;
                }
            });
        }
        true
    }

    async fn accept(&mut self, cmd: Command) {
        // Several hosts: the database let this host's leases lapse since
        // this fence was taken, so another host may have written the
        // stream; it is loaded (and its lease taken) again first.
        if self.fence.is_some() && self.ctx.storage.lease_lapses() != self.lease_lapses {
            self.reload_needed = true;
        }
        match cmd {
            Command::Append {
                input,
                authority,
                reply,
            } => {
                // Ephemeral events are held in memory: within the bounds, or
                // refused before anything is planned.
                let ephemeral: usize = input
                    .events
                    .iter()
                    .filter(|e| e.ephemeral == Some(true))
                    .map(|e| {
                        let payload = e.payload.as_ref().map_or(0, |p| {
                            p.iter().map(|(k, v)| k.len() + 4 + json_bytes(v)).sum()
                        });
                        payload + e.event_type.len() + 64
                    })
                    .sum();
                if ephemeral > 0 {
                    if let Err(e) = self
                        .ephemeral
                        .memory
                        .admit(&self.ephemeral.project, ephemeral)
                    {
                        let _ = reply.send(Err(e));
                        return;
                    }
                }
                self.queue.push_back(Pending::Append {
                    input,
                    authority,
                    reply: Some(reply),
                    run: None,
                })
            }
            Command::Reset { reply } => self.queue.push_back(Pending::Reset { reply }),
            Command::Deliver { batch, reply } => {
                self.queue.push_back(Pending::Deliver { batch, reply })
            }
            Command::Retry {
                key,
                component,
                reply,
            } => {
                let result = self
                    .ensure_serving()
                    .await
                    .and_then(|()| match &self.stream {
                        Some(_) => Ok(self
                            .deliveries
                            .retry_now(key.as_deref(), component.as_deref())),
                        None => Err(self.not_found()),
                    });
                if result.as_ref().is_ok_and(|k| !k.is_empty()) {
                    self.pump_deliveries();
                }
                let _ = reply.send(result);
            }
            Command::Lags { reply } => {
                let head = self.stream.as_ref().map(|s| s.state_offset);
                let lags = match head {
                    Some(head) => self
                        .deliveries
                        .runs
                        .iter()
                        .map(|(key, rt)| (key.clone(), head.saturating_sub(rt.cursor)))
                        .collect(),
                    None => Vec::new(),
                };
                let _ = reply.send(lags);
            }
            Command::Runtime { reply } => {
                let result = self
                    .ensure_serving()
                    .await
                    .and_then(|()| match &self.stream {
                        Some(_) => Ok(self.runtime_view()),
                        None => Err(self.not_found()),
                    });
                let _ = reply.send(result);
            }
            Command::Wake => match self.ensure_serving().await {
                // Another host took it first (several hosts): its work runs
                // there; or this host cannot renew its leases now.
                Err(e) if e.owner_url.is_some() || e.code == "lease-lost" => {
                    tracing::debug!(stream = %self.address, error = %e, "not woken here")
                }
                Err(e) => {
                    tracing::error!(stream = %self.address, error = %e, "waking stream failed")
                }
                Ok(()) => {}
            },
            Command::DeliveryDone(done) => self.delivery_done(*done),
            // The loop's top decides (idle long enough, nothing pending).
            Command::IdleCheck => {}
            Command::Fence { reply } => {
                let result = self.ensure_serving().await.map(|()| self.fence.clone());
                let _ = reply.send(result);
            }
            Command::LeaseChanged => {
                if !self.ctx.storage.lease_valid() {
                    self.end_connections_lease_lost();
                } else if self.reload_needed && (self.stream.is_some() || self.fence.is_some()) {
                    // Taken again (or found owned elsewhere: connections end).
                    let _ = self.ensure_serving().await;
                }
            }
            Command::Connect { params, reply } => {
                let loaded = self.ensure_serving().await;
                match loaded {
                    Ok(()) => self.connect(*params, reply),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Command::ConnectionEnded {
                key,
                id,
                reason,
                error,
            } => self.connection_ended(&key, id, reason, error),
            Command::State { reply } => {
                let result = self.ensure_serving().await.and_then(|()| {
                    self.stream
                        .as_ref()
                        .map(|s| s.state.clone())
                        .ok_or_else(|| self.not_found())
                });
                let _ = reply.send(result);
            }
            Command::Read { query, reply } => match self.ensure_serving().await {
                Ok(()) => self.read(query, reply),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
        }
    }

    /// As [`Actor::ensure_loaded`], for requests that serve what the stream
    /// holds (reads, state, live connections, deliveries): with several
    /// hosts, only while this host's leases are surely its own
    /// (`503 lease-lost` otherwise, and its live connections end).
    async fn ensure_serving(&mut self) -> Result<(), Error> {
        if !self.ctx.storage.lease_valid() {
            self.end_connections_lease_lost();
            return Err(Error::lease_lost(&self.address.path));
        }
        self.ensure_loaded().await
    }

    /// Loads the stream when it is not loaded (first use, or after a failed
    /// commit), on a blocking thread. A failure schedules the next attempt
    /// with backoff, so stalled deliveries resume without a request.
    async fn ensure_loaded(&mut self) -> Result<(), Error> {
        if !self.reload_needed {
            return Ok(());
        }
        let storage = self.ctx.storage.clone();
        let address = self.address.clone();
        // What live connections were sent up to: a commit that reported a
        // failure may have reached the log all the same (an I/O error during
        // fsync), and its events must reach them too.
        let known = self
            .stream
            .as_ref()
            .filter(|_| !self.connections.is_empty())
            .map(|s| (s.row_id, s.state.stream_id.clone(), s.state.max_offset));
        // Read before the lease is taken: a lapse after it reloads again.
        let lapses = self.ctx.storage.lease_lapses();
        let loaded = tokio::task::spawn_blocking(move || {
            // Several hosts: this one must own the stream first.
            let fence = storage.acquire_lease(address.namespace.storage_key(), &address.path)?;
            let mut loaded = load(&storage, &address)?;
            if let (Some(l), Some((row_id, stream_id, head))) = (&mut loaded, known) {
                let now = l.stream.state.max_offset;
                if l.stream.row_id == row_id && l.stream.state.stream_id == stream_id && now > head
                {
                    l.unseen = unseen_events(&storage, row_id, head, now)?;
                }
            }
            Ok((fence, loaded))
        })
        .await
        .map_err(|e| anyhow::anyhow!("the load task failed: {e}"))
        .and_then(|r| r);
        self.ctx.metrics.stream_loaded(loaded.is_ok());
        match loaded {
            Ok((fence, loaded)) => {
                self.fence = fence;
                self.lease_lapses = lapses;
                self.not_here = false;
                self.apply_load(loaded);
                self.reload_at = None;
                Ok(())
            }
            Err(e) if e.downcast_ref::<crate::storage::OwnedElsewhere>().is_some() => {
                let owner = e
                    .downcast::<crate::storage::OwnedElsewhere>()
                    .expect("checked");
                // Another host owns the stream: nothing of it stays here
                // (live connections end, their clients reconnect through
                // the owner), and the next request asks again.
                if self.stream.is_some() {
                    tracing::warn!(stream = %self.address, owner = %owner.owner, "the stream is owned by another host now");
                }
                self.apply_load(None);
                self.connections.clear();
                self.fence = None;
                self.reload_needed = true;
                self.not_here = true;
                Err(Error::owned_elsewhere(&owner.path, &owner.url))
            }
            Err(e) if e.downcast_ref::<crate::storage::LeaseLost>().is_some() => {
                // This host cannot renew its leases: nothing is served until
                // it can (`LeaseChanged` then loads again).
                self.end_connections_lease_lost();
                self.not_here = self.stream.is_none();
                Err(Error::lease_lost(&self.address.path))
            }
            Err(e) => {
                let wait = self.storage_failed();
                tracing::error!(stream = %self.address, error = %format!("{e:#}"), retry_in_ms = wait, "loading stream failed");
                Err(Error::internal(format!("loading the stream failed: {e:#}")))
            }
        }
    }

    /// A load or write failed: the stream is loaded again after the
    /// backoff (at once after a first failure). Returns the wait in ms.
    fn storage_failed(&mut self) -> u64 {
        self.storage_failures = self.storage_failures.saturating_add(1);
        let wait = reload_backoff_ms(self.storage_failures);
        self.reload_needed = true;
        self.reload_at = Some(tokio::time::Instant::now() + std::time::Duration::from_millis(wait));
        wait
    }

    /// A write failed to commit: the actor's state may be ahead of the log.
    fn reload_soon(&mut self) {
        let wait = self.storage_failed();
        tracing::warn!(stream = %self.address, retry_in_ms = wait, "reloading the stream after a failed write");
    }

    fn not_found(&self) -> Error {
        let where_ = match self.address.namespace.project_id() {
            Some(p) => format!("in project {p:?}"),
            None => "in the global namespace".to_string(),
        };
        Error::not_found(
            "stream-not-found",
            format!("stream {:?} does not exist {where_}", self.address.path),
        )
    }

    /// Takes over what [`load`] read: the stream, and its delivery runs.
    fn apply_load(&mut self, loaded: Option<LoadedStream>) {
        self.deliveries.runs.clear();
        self.stream = None;
        self.recent_keys.clear();
        // A reset stream may configure another reactor under the same name
        // at the same offset.
        self.reactors = Default::default();
        if let Some(l) = loaded {
            let state = l.stream.state.clone();
            self.stream = Some(l.stream);
            self.repair_deliveries(&state, &l.cursors, &l.checkpoints);
            if !l.unseen.is_empty() {
                tracing::warn!(stream = %self.address, events = l.unseen.len(),
                    "a commit reported as failed reached the log: its events go to live connections now");
                self.fan_out(&l.unseen);
            }
        }
        self.reload_needed = false;
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
                .map_err(|e| Error::internal(format!("reading events failed: {e:#}")))
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
    async fn start_next(
        &mut self,
    ) -> Option<(InFlight, oneshot::Receiver<Result<i64, CommitError>>)> {
        loop {
            let Some(front) = self.queue.pop_front() else {
                return self.start_cursor_write();
            };
            // The leases lapsed since the fence was taken (another host may
            // have written): load again before planning on this state.
            if self.fence.is_some() && self.ctx.storage.lease_lapses() != self.lease_lapses {
                self.reload_needed = true;
            }
            if self.reload_needed {
                if let Err(err) = self.ensure_loaded().await {
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
                        let rx = self.ctx.storage.submit(WriteOp::Reset {
                            row_id: s.row_id,
                            fence: self.fence.clone(),
                        });
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
                    if let Some(started) = self.start_round(round).await {
                        return Some(started);
                    }
                }
            }
        }
    }

    fn fail_pending(&mut self, p: Pending, err: Error) {
        match p {
            Pending::Append { reply, run, .. } => {
                self.ctx.metrics.append_answered(err.code);
                if let Some(run) = &run {
                    self.run_fact_failed(run);
                }
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
    async fn start_round(
        &mut self,
        round: Vec<Pending>,
    ) -> Option<(InFlight, oneshot::Receiver<Result<i64, CommitError>>)> {
        let keys_read = std::mem::take(&mut self.read_keys);
        let (committed_by_key, committed_by_offset) = match self.lookups(&round, keys_read).await {
            Ok(found) => found,
            Err(e) => {
                let err = Error::internal(format!("reading the stream failed: {e:#}"));
                for p in round {
                    self.fail_pending(p, err.clone());
                }
                return None;
            }
        };
        let span = tracing::debug_span!("append", stream = %self.address, requests = round.len())
            .entered();
        let now = format_timestamp(self.ctx.clock.now_ms());
        let project_id = self.address.namespace.project_id().map(str::to_string);
        let path = self.address.path.clone();
        let (state, outcomes, requests, new_events) = {
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
            let mut requests = Vec::with_capacity(round.len());
            let mut new_events: Vec<Event> = Vec::new();
            for p in round {
                let (answer, outcome) = match p {
                    Pending::Append {
                        input,
                        authority,
                        reply,
                        run,
                    } => {
                        let outcome =
                            plan_append(&mut state, &mut round_keys, &input, authority, &mut ctx);
                        requests.push(Request::Append { input, authority });
                        (Answer::Append(reply, run), outcome)
                    }
                    Pending::Deliver { batch, reply } => {
                        let planned =
                            plan_copy(&mut state, &mut round_keys, &self.address, &batch, &mut ctx);
                        requests.push(Request::Deliver { batch });
                        match planned {
                            Ok((plan, outcome)) => (Answer::Deliver(reply, outcome), Ok(plan)),
                            Err(e) => (Answer::Deliver(reply, CopyOutcome::default()), Err(e)),
                        }
                    }
                    Pending::Reset { .. } => {
                        unreachable!("a round holds appends and deliveries only")
                    }
                };
                if let Ok(plan) = &outcome {
                    new_events.extend(plan.new_events.iter().cloned());
                }
                outcomes.push((answer, outcome));
            }
            (state, outcomes, requests, new_events)
        };
        // A refusal in planning (an offset conflict, a paused stream, ...)
        // may be wrong for a request whose keys were taken as new: if a key
        // is in the log, the request is a replay of what committed, which no
        // such check refuses. Such a round is planned again with its keys
        // read (only rounds with a refusal pay the read).
        if !keys_read
            && outcomes
                .iter()
                .zip(&requests)
                .any(|((_, outcome), request)| outcome.is_err() && request.has_keys(&self.address))
        {
            self.read_keys = true;
            for ((answer, _), request) in outcomes.into_iter().zip(requests).rev() {
                self.queue.push_front(request.into_pending(answer));
            }
            return None;
        }
        let next_state = match state {
            Some(s) if !new_events.is_empty() => s,
            _ => {
                // Nothing to commit: rejections and replays of committed
                // events. No fenced commit proves the state current, so
                // with several hosts they are answered only while the
                // lease is surely this host's (as reads are).
                let stale = self.fence.is_some() && !self.ctx.storage.lease_valid();
                let state = self.stream.as_ref().map(|s| &s.state);
                let failed: Vec<_> = outcomes
                    .into_iter()
                    .filter_map(|(reply, outcome)| {
                        let outcome = match stale {
                            true => Err(Error::lease_lost(&self.address.path)),
                            false => outcome,
                        };
                        self.answer(reply, outcome, state)
                    })
                    .collect();
                for run in &failed {
                    self.run_fact_failed(run);
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
        let keyed_bytes = durable
            .iter()
            .filter(|e| e.idempotency_key.is_some())
            .map(|e| (e.offset, e.body.len()))
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
        // (The span does not live across an await.)
        drop(span);
        let effects = match self.react(&outcomes, &durable, &next_state).await {
            Ok(effects) => effects,
            Err(refusal) => {
                // Nothing of the round commits: the refused request is
                // answered, the others are planned again without it.
                let mut failed = Vec::new();
                let mut rest = Vec::new();
                for (i, ((answer, _), request)) in outcomes.into_iter().zip(requests).enumerate() {
                    if i == refusal.request {
                        failed.extend(self.answer(answer, Err(refusal.error.clone()), None));
                    } else {
                        rest.push(request.into_pending(answer));
                    }
                }
                for p in rest.into_iter().rev() {
                    self.queue.push_front(p);
                }
                for run in &failed {
                    self.run_fact_failed(run);
                }
                return None;
            }
        };
        let has_effects = !effects.is_empty();
        let (cursors, removed_cursors) = self.cursor_rows_for(&next_state);
        let commit = StreamCommit {
            stream: stream_ref,
            events: durable,
            head_offset: next_state.max_offset,
            state_json: next_state.serialized(),
            state_offset,
            cursors: cursors.clone(),
            removed_cursors,
            fence: self.fence.clone(),
            effects,
        };
        commit.assert_invariants();
        let rx = self.ctx.storage.submit(WriteOp::Commit(commit));
        Some((
            InFlight::Round {
                outcomes,
                requests,
                keys_read,
                keyed_bytes,
                next_state: Box::new(next_state),
                state_offset,
                cursors,
                effects: has_effects,
            },
            rx,
        ))
    }

    /// Runs the stream's reactors over the round's durable events (on a
    /// blocking thread: guests run there); answers their effects for the
    /// round's transaction, or the request one of them refused.
    async fn react(
        &mut self,
        outcomes: &[(Answer, Result<AppendPlan, Error>)],
        durable: &[StoredEvent],
        state: &CoreState,
    ) -> Result<Vec<crate::storage::EffectInsert>, crate::reactor::Refusal> {
        let identities = crate::reactor::identities(state);
        if identities.is_empty() {
            return Ok(Vec::new());
        }
        let same = identities.len() == self.reactors.0.len()
            && identities
                .iter()
                .zip(&self.reactors.0)
                .all(|((n, o), (m, p))| *n == m.as_str() && o == p);
        if !same {
            self.reactors = (
                identities
                    .iter()
                    .map(|(n, o)| (n.to_string(), *o))
                    .collect(),
                Arc::new(crate::reactor::configured(state)),
            );
        }
        let reactors = Arc::clone(&self.reactors.1);
        let first = reactors
            .iter()
            .map(|r| r.configured_at_offset)
            .min()
            .unwrap_or(0);
        let bodies: HashMap<u64, &str> = durable
            .iter()
            .map(|e| (e.offset, e.body.as_str()))
            .collect();
        let mut events = Vec::new();
        for (request, (_, outcome)) in outcomes.iter().enumerate() {
            let Ok(plan) = outcome else { continue };
            for e in plan
                .new_events
                .iter()
                .filter(|e| !e.ephemeral && e.offset > first)
            {
                let Some(body) = bodies.get(&e.offset) else {
                    continue;
                };
                events.push(crate::reactor::Appended {
                    request,
                    index: plan.events.iter().position(|x| x.offset == e.offset),
                    event: e.clone(),
                    body: body.to_string(),
                });
            }
        }
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let storage = self.ctx.storage.clone();
        let runtime = Arc::clone(&self.ctx.runtime);
        let project = self.address.namespace.storage_key().to_string();
        let stream_id = state.stream_id.clone();
        let run = move || {
            crate::reactor::Reacting {
                storage: &storage,
                runtime: &runtime,
                project: &project,
                stream_id: &stream_id,
            }
            .react(&reactors, &events)
        };
        // Guests run off the async workers: on a multi-thread runtime this
        // worker becomes a blocking thread for the call (its other tasks
        // move to another worker), which spares the append two thread
        // hand-offs; elsewhere the call goes to the blocking pool.
        let reacted = match tokio::runtime::Handle::current().runtime_flavor() {
            tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(run),
            _ => tokio::task::spawn_blocking(run).await.unwrap_or_else(|e| {
                Err(crate::reactor::Refusal {
                    request: 0,
                    error: Error::internal(format!("the reactors' task failed: {e}")),
                })
            }),
        };
        let reacted = match reacted {
            Ok((reactions, calls)) => {
                self.ctx.metrics.reactor_called("ok", calls);
                reactions
            }
            Err(refusal) => {
                self.ctx.metrics.reactor_called("refused", 1);
                return Err(refusal);
            }
        };
        let now_ms = self.ctx.clock.now_ms();
        let created_at = format_timestamp(now_ms);
        Ok(reacted
            .into_iter()
            .map(|r| crate::storage::EffectInsert {
                source: crate::storage::EffectSource {
                    project: self.address.namespace.storage_key().to_string(),
                    path: self.address.path.clone(),
                    stream_id: state.stream_id.clone(),
                    component: r.component,
                },
                effects: r.effects,
                now_ms,
                created_at: created_at.clone(),
            })
            .collect())
    }

    /// Committed events the round's planning needs: those holding its
    /// idempotency keys, and the configure events it refers to. Read on a
    /// blocking thread, and only when the round names any.
    ///
    /// Keys are read from the log only when `read_keys` (the log's index
    /// refused the round planned without): otherwise a key is taken as new
    /// unless it is among the recent ones, and the commit's insert checks it
    /// against the whole log.
    async fn lookups(
        &self,
        round: &[Pending],
        read_keys: bool,
    ) -> Result<(HashMap<String, Event>, HashMap<u64, Event>)> {
        let Some(stream) = &self.stream else {
            return Ok((HashMap::new(), HashMap::new()));
        };
        let mut keys: Vec<String> = Vec::new();
        let mut offsets: Vec<u64> = Vec::new();
        for p in round {
            match p {
                Pending::Append { input, .. } => {
                    keys.extend(
                        input
                            .events
                            .iter()
                            .filter_map(|e| e.idempotency_key.clone()),
                    );
                    offsets.extend(configure_offsets(Some(&stream.state), input));
                }
                Pending::Deliver { batch, .. } => {
                    keys.extend(crate::delivery::copy::batch_keys(batch, &self.address))
                }
                Pending::Reset { .. } => {}
            }
        }
        // A key with a NUL byte is refused by planning; storage (PostgreSQL)
        // cannot even look it up.
        keys.retain(|k| !k.contains('\0'));
        let mut recent = HashMap::new();
        if !read_keys {
            // (A key missing here, or a displaced platform key, is taken as
            // new; the commit's insert tells otherwise.)
            recent = keys
                .drain(..)
                .filter_map(|k| {
                    let event = self.recent_keys.get(&k)?.clone();
                    Some((k, event))
                })
                .collect();
        }
        if keys.is_empty() && offsets.is_empty() {
            return Ok((recent, HashMap::new()));
        }
        offsets.sort_unstable();
        offsets.dedup();
        let storage = self.ctx.storage.clone();
        let row_id = stream.row_id;
        tokio::task::spawn_blocking(move || {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let mut by_key = storage
                .events_by_keys(row_id, &keys)
                .context("reading idempotency keys")?
                .into_iter()
                .map(|(k, body)| {
                    let event: Event = serde_json::from_str(&body)
                        .with_context(|| format!("parsing the stored event of key {k:?}"))?;
                    Ok((k, event))
                })
                .collect::<Result<HashMap<_, _>>>()?;
            // A platform key an older caller's event holds: the platform's
            // event is under the displaced key (rare: a second look).
            let displaced: Vec<String> = by_key
                .iter()
                .filter(|(k, e)| crate::stream::held_by_a_caller(k, e))
                .map(|(k, _)| crate::stream::displaced_key(k))
                .collect();
            if !displaced.is_empty() {
                let displaced: Vec<&str> = displaced.iter().map(String::as_str).collect();
                for (k, body) in storage
                    .events_by_keys(row_id, &displaced)
                    .context("reading displaced idempotency keys")?
                {
                    let event: Event = serde_json::from_str(&body)
                        .with_context(|| format!("parsing the stored event of key {k:?}"))?;
                    by_key.insert(k, event);
                }
            }
            let mut by_offset = HashMap::new();
            for offset in offsets {
                let found = storage
                    .events_after(row_id, offset - 1, 1, offset)
                    .context("reading configure events")?;
                if let Some((_, body)) = found.into_iter().next() {
                    by_offset.insert(offset, serde_json::from_str(&body)?);
                }
            }
            Ok((by_key, by_offset))
        })
        .await
        .map_err(|e| anyhow::anyhow!("the lookup task failed: {e}"))?
        .map(|(mut by_key, by_offset)| {
            by_key.extend(recent);
            (by_key, by_offset)
        })
    }

    /// Answers one planned request; returns the delivery run whose fact
    /// did not make it, if any.
    #[must_use]
    fn answer(
        &self,
        answer: Answer,
        outcome: Result<AppendPlan, Error>,
        state: Option<&CoreState>,
    ) -> Option<(String, u64)> {
        match answer {
            Answer::Append(reply, run) => {
                let result = outcome.and_then(|plan| {
                    let state = state
                        .ok_or_else(|| Error::internal("a planned append without a stream"))?;
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
                        return run;
                    }
                    (None, Ok(out)) => {
                        if let Some((key, _)) = &run {
                            self.count_run_facts(key, &out.events);
                        }
                    }
                }
                None
            }
            Answer::Deliver(reply, copy_outcome) => {
                let _ = reply.send(outcome.map(|_| copy_outcome));
                None
            }
        }
    }

    fn finish(&mut self, in_flight: InFlight, result: Result<i64, CommitError>) {
        if result.is_ok() {
            self.storage_failures = 0;
        }
        let mut failed = Vec::new();
        self.finish_write(in_flight, result, &mut failed);
        for run in &failed {
            self.run_fact_failed(run);
        }
    }

    fn finish_write(
        &mut self,
        in_flight: InFlight,
        result: Result<i64, CommitError>,
        failed: &mut Vec<(String, u64)>,
    ) {
        match in_flight {
            InFlight::Round {
                outcomes,
                requests,
                keys_read,
                keyed_bytes,
                next_state,
                state_offset,
                cursors,
                effects,
            } => match result {
                Ok(row_id) => {
                    if effects {
                        self.ctx.executors.effects.ring();
                    }
                    let now = std::time::Instant::now();
                    for (_, outcome) in &outcomes {
                        if let Ok(plan) = outcome {
                            for e in &plan.new_events {
                                if e.ephemeral {
                                    self.ephemeral.push(e.clone());
                                } else {
                                    self.recent_commits.push_back((e.offset, now));
                                    if let (Some(key), Some(bytes)) =
                                        (&e.idempotency_key, keyed_bytes.get(&e.offset))
                                    {
                                        self.recent_keys.insert(key, e, *bytes);
                                    }
                                }
                            }
                        }
                    }
                    self.prune_recent_commits();
                    self.stream = Some(Loaded {
                        row_id,
                        state: *next_state,
                        state_offset,
                    });
                    let state = self.stream.as_ref().map(|s| s.state.clone());
                    if let Some(state) = &state {
                        self.repair_deliveries(state, &cursors, &HashMap::new());
                    }
                    let committed: Vec<Event> = outcomes
                        .iter()
                        .filter_map(|(_, o)| o.as_ref().ok())
                        .flat_map(|p| p.new_events.iter().cloned())
                        .collect();
                    self.fan_out(&committed);
                    for (answer, outcome) in outcomes {
                        failed.extend(self.answer(answer, outcome, state.as_ref()));
                    }
                }
                Err(e) if e.duplicate_key() && !keys_read => {
                    // Planned with its keys taken as new, and one was not:
                    // nothing of the round committed; plan it again, first
                    // in line, with its keys read from the log.
                    tracing::debug!(stream = %self.address, error = %e, "a round repeats an idempotency key: planning it again");
                    self.read_keys = true;
                    for ((answer, _), request) in outcomes.into_iter().zip(requests).rev() {
                        self.queue.push_front(request.into_pending(answer));
                    }
                }
                Err(e) => {
                    tracing::error!(stream = %self.address, error = %e, "append round failed to commit");
                    self.reload_soon();
                    let err = Error::internal(format!("commit failed: {e}"));
                    for (answer, _) in outcomes {
                        failed.extend(self.answer(answer, Err(err.clone()), None));
                    }
                }
            },
            InFlight::Cursors { cursors } => match result {
                Ok(_) => {
                    for c in cursors {
                        if let Some(rt) = self.deliveries.runs.get_mut(&c.subscription_key) {
                            if rt.generation == c.generation {
                                rt.durable_cursor = rt.durable_cursor.max(c.acknowledged_offset);
                                if delivery::cursor_row(&c.subscription_key, rt).same_counters(&c) {
                                    rt.counters_dirty = false;
                                }
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(stream = %self.address, error = %e, "cursor write failed");
                    self.reload_soon();
                }
            },
            InFlight::Reset { reply } => match result {
                Ok(_) => {
                    self.drop_connections();
                    self.stream = None;
                    self.deliveries.runs.clear();
                    self.recent_commits.clear();
                    self.recent_keys.clear();
                    self.reactors = Default::default();
                    self.ephemeral.clear();
                    let _ = reply.send(Ok(()));
                }
                Err(e) => {
                    self.reload_soon();
                    let _ = reply.send(Err(Error::internal(format!("reset failed: {e}"))));
                }
            },
        }
    }
}

/// What [`load`] reads for an actor.
struct LoadedStream {
    stream: Loaded,
    cursors: Vec<CursorRow>,
    /// Checkpoint offsets of the processors woken by the stream's
    /// subscriptions, for this source lifetime.
    checkpoints: HashMap<String, u64>,
    /// Stored events live connections were never sent (see `ensure_loaded`).
    unseen: Vec<Event>,
}

/// The stored events of `row_id` in `(after, up_to]`, parsed.
fn unseen_events(storage: &Storage, row_id: i64, after: u64, up_to: u64) -> Result<Vec<Event>> {
    let bodies = storage.events_after(row_id, after, (up_to - after) as usize, up_to)?;
    bodies
        .iter()
        .map(|(offset, body)| {
            serde_json::from_str(body)
                .with_context(|| format!("stored event {offset} does not parse"))
        })
        .collect()
}

/// Loads a stream from storage (blocking: run it on a blocking thread): the
/// cached state is used when it matches the log's head, otherwise the log is
/// folded again; then its cursor rows and processor checkpoints.
fn load(storage: &Storage, address: &StreamAddress) -> Result<Option<LoadedStream>> {
    let ns = address.namespace.storage_key().to_string();
    let Some(row) = storage.load_stream(&ns, &address.path)? else {
        return Ok(None);
    };
    let stream = load_row(storage, address, row)?;
    let cursors = storage.load_cursors(stream.row_id)?;
    let mut checkpoints = HashMap::new();
    for sub in stream.state.subscriptions.outbound.by_key.values() {
        if let Some(component) = delivery::woken_component(sub) {
            if let Some(c) = storage.checkpoint(stream.row_id, &component)? {
                if c.stream_id == stream.state.stream_id {
                    checkpoints.insert(component, c.checkpoint_offset);
                }
            }
        }
    }
    Ok(Some(LoadedStream {
        stream,
        cursors,
        checkpoints,
        unseen: Vec::new(),
    }))
}

fn load_row(storage: &Storage, address: &StreamAddress, row: StreamRow) -> Result<Loaded> {
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
    tracing::warn!(stream = %address, "cached state does not match the log; folding the log again");
    let mut state: Option<CoreState> = None;
    let mut after = 0;
    loop {
        let page = storage.events_after(row.row_id, after, READ_LIMIT_MAX, u64::MAX)?;
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

/// About the bytes of `v` as JSON text, without writing it (an estimate for
/// the ephemeral bound: strings by their length, numbers as 8).
fn json_bytes(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len() + 2,
        Value::Array(items) => 2 + items.iter().map(|i| json_bytes(i) + 1).sum::<usize>(),
        Value::Object(map) => {
            2 + map
                .iter()
                .map(|(k, v)| k.len() + 4 + json_bytes(v))
                .sum::<usize>()
        }
        _ => 8,
    }
}

/// Merges a page of stored events with buffered ephemeral ones, by offset.
fn merge_page(
    durable: Vec<(u64, String)>,
    ephemeral: Vec<Event>,
    limit: usize,
) -> Result<Vec<Box<RawValue>>, Error> {
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
        out.push(raw.map_err(|e| Error::internal(format!("a stored event is not JSON: {e}")))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reloads_start_at_once_then_back_off_to_a_bound() {
        let waits: Vec<u64> = (1..=10).map(reload_backoff_ms).collect();
        assert_eq!(
            waits,
            vec![0, 50, 100, 200, 400, 800, 1600, 3200, 5000, 5000]
        );
        assert_eq!(reload_backoff_ms(u32::MAX), RELOAD_BACKOFF_MAX_MS);
    }

    #[test]
    fn commit_instants_are_kept_only_for_offsets_not_yet_delivered() {
        let now = std::time::Instant::now();
        let mut recent: VecDeque<_> = (1..=10u64).map(|o| (o, now)).collect();
        prune_recent(&mut recent, Some(6));
        assert_eq!(
            recent.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
            vec![7, 8, 9, 10]
        );
        // No subscription runs: nobody asks for a latency.
        prune_recent(&mut recent, None);
        assert!(recent.is_empty());
        // A run far behind: the newest RECENT_COMMITS_MAX are kept.
        let mut long: VecDeque<_> = (1..=RECENT_COMMITS_MAX as u64 + 5)
            .map(|o| (o, now))
            .collect();
        prune_recent(&mut long, Some(0));
        assert_eq!(long.len(), RECENT_COMMITS_MAX);
        assert_eq!(long.front().map(|(o, _)| *o), Some(6));
    }
}
