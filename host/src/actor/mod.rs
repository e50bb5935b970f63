//! The stream actor: the one writer of one stream; the registry of a
//! host's actors (`registry.rs`, [`Streams`]), the calls to the host that
//! owns a stream (`remote.rs`) and the runtime views (`runtime.rs`).
//!
//! Its logic is [`core::ActorCore`], a step function without a runtime:
//! this module's tokio task only feeds it (commands from its channel, the
//! result of the write in flight, its timer) and carries out what it asks
//! for: loads, lookups and reactor runs on blocking threads (whose answers
//! go straight back to it), writes submitted to the group-commit writer,
//! reads, delivery jobs, connection feeds.
//!
//! Append requests that arrive while a commit is in flight queue up and are
//! planned together as the next round, submitted as one write; every
//! request of the round is answered once that write has committed. Reads
//! are answered from committed state at any time.
//!
//! **Architecture Invariant:** the actor never blocks an async worker: its
//! SQLite reads (load, idempotency and configure lookups) and its reactors
//! run on blocking threads, which the actor awaits.
//!
//! Lifecycle: the registry starts an actor on first use; the actor loads
//! its stream, serves, and releases itself (see `Streams::release`) once it
//! has been idle for `[limits] idle-stream-ms` with no live connection, no
//! delivery in flight, due or scheduled, and nothing to write (the
//! registry's sweep sends `IdleCheck` to wake it for that); an actor whose
//! stream does not exist releases itself as soon as it has answered.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};

use crate::clock::Clock;
use crate::config::DeliveryConfig;
use crate::delivery::copy::{CopyBatch, CopyOutcome};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::storage::{CommitError, Storage, StreamRow};
use crate::stream::{
    AppendInput, AppendOutput, Authority, CoreState, Event, ReadOutput, ReadQuery, StreamAddress,
};

use self::core::{ActorCore, Input, LoadError, LoadResult, Loaded, LoadedStream, Output};

mod connections;
mod registry;
mod runtime;
internal! {
    remote;
}
internal_use!(registry::{StreamSettings, Streams, StreamsRef});
pub use runtime::{ConnectionView, DeliveryView, Latency, RuntimeView};
pub(crate) mod core;
mod delivery;
mod recent_keys;
mod reload;
#[cfg(test)]
mod simulation;
mod tenure;
use crate::delivery::schedule::DeliveryDone;

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
        reply: Reply<crate::actor::RuntimeView>,
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
    /// A delivery this actor started waits for a place, or got one.
    DeliveryPlaced(Box<crate::delivery::schedule::Placement>),
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

pub(crate) type Reply<T> = oneshot::Sender<Result<T, Error>>;

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
    pub ephemeral: Arc<crate::quota::EphemeralMemory>,
    /// The bytes each project's stored events take, against its bound.
    pub stored: Arc<crate::quota::StoredBytes>,
    /// The reactor versions that rest after timing out again and again.
    pub reactor_rests: Arc<std::sync::Mutex<crate::reactor::rest::Rests>>,
}

/// What a stream actor's core may ask of the host: the injected clock and
/// this host's leases (several hosts).
struct HostEnvironment {
    clock: Arc<dyn Clock>,
    storage: Storage,
}

impl From<crate::executor::Report> for Command {
    fn from(report: crate::executor::Report) -> Command {
        match report {
            crate::executor::Report::Placement(p) => Command::DeliveryPlaced(Box::new(p)),
            crate::executor::Report::Done(done) => Command::DeliveryDone(Box::new(done)),
        }
    }
}

impl core::Environment for HostEnvironment {
    fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    fn now_us(&self) -> i64 {
        self.clock.now_us()
    }

    fn lease_valid(&self) -> bool {
        self.storage.lease_valid()
    }

    fn lease_lapses(&self) -> u64 {
        self.storage.lease_lapses()
    }

    fn new_id(&self) -> String {
        uuid::Uuid::new_v4().to_string()
    }

    fn jitter(&self) -> f64 {
        crate::clock::jitter()
    }
}

/// Starts the actor of `address`; it runs until every sender is dropped.
pub fn spawn(
    address: StreamAddress,
    ctx: ActorContext,
    tx: &mpsc::Sender<Command>,
    rx: mpsc::Receiver<Command>,
) {
    let env = Arc::new(HostEnvironment {
        clock: Arc::clone(&ctx.clock),
        storage: ctx.storage.clone(),
    });
    let config = core::CoreConfig {
        metrics: ctx.metrics.clone(),
        delivery: ctx.delivery.clone(),
        idle_stream_ms: ctx.idle_stream_ms,
        ephemeral: Arc::clone(&ctx.ephemeral),
        stored: Arc::clone(&ctx.stored),
        bounds: ctx.executors.bounds,
    };
    let actor = Actor {
        core: ActorCore::new(address.clone(), config, env),
        address,
        ctx,
        self_tx: tx.downgrade(),
        commit: None,
    };
    tokio::spawn(actor.run(rx));
}

/// The runtime around a core: its channel, its write in flight, its timer.
struct Actor {
    core: ActorCore,
    address: StreamAddress,
    ctx: ActorContext,
    self_tx: mpsc::WeakSender<Command>,
    /// The result of the write in flight.
    commit: Option<oneshot::Receiver<Result<i64, CommitError>>>,
}

enum Wake {
    Command(Option<Command>),
    Committed(Result<Result<i64, CommitError>, oneshot::error::RecvError>),
    Timer,
}

impl Actor {
    async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let mut closed = false;
        let mut input = Some(Input::Tick);
        loop {
            if let Some(input) = input.take() {
                let outputs = self.core.handle(input);
                self.carry_out(outputs).await;
            }
            if closed && self.core.drained() {
                return;
            }
            if self.core.releasable() && self.release(&mut rx) {
                return;
            }
            let timer = self.core.next_timer_ms().map(|at| {
                let wait = (at - self.ctx.clock.now_ms()).max(0) as u64;
                tokio::time::Instant::now() + std::time::Duration::from_millis(wait)
            });
            let wake = {
                let commit = async {
                    match self.commit.as_mut() {
                        Some(rx) => rx.await,
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
            input = match wake {
                Wake::Command(Some(cmd)) => Some(Input::Command(cmd)),
                Wake::Command(None) => {
                    closed = true;
                    None
                }
                Wake::Committed(result) => {
                    self.commit = None;
                    Some(Input::Committed(result.unwrap_or_else(|_| {
                        Err(CommitError::new("the storage writer dropped the commit"))
                    })))
                }
                Wake::Timer => Some(Input::Tick),
            };
        }
    }

    /// Carries out a step's outputs; the answers of loads, lookups and
    /// reactor runs go back to the core at once, with their own outputs.
    async fn carry_out(&mut self, outputs: Vec<Output>) {
        let mut work: std::collections::VecDeque<Output> = outputs.into();
        while let Some(output) = work.pop_front() {
            let answer = match output {
                Output::Load { known } => Some(Input::Loaded(Box::new(self.load(known).await))),
                Output::Lookup {
                    row_id,
                    keys,
                    offsets,
                } => {
                    let storage = self.ctx.storage.clone();
                    let found = tokio::task::spawn_blocking(move || {
                        lookup(&storage, row_id, &keys, offsets)
                    })
                    .await
                    .map_err(|e| anyhow::anyhow!("the lookup task failed: {e}"))
                    .and_then(|r| r)
                    .map_err(|e| format!("{e:#}"));
                    Some(Input::LookedUp(found))
                }
                Output::React {
                    reactors,
                    events,
                    project,
                    stream_id,
                } => Some(Input::Reacted(
                    self.react(reactors, events, project, stream_id).await,
                )),
                Output::Submit(op) => {
                    assert!(
                        self.commit.is_none(),
                        "invariant one-write-in-flight: {} submitted a write while one was in flight",
                        self.address
                    );
                    self.commit = Some(self.ctx.storage.submit(*op));
                    None
                }
                Output::Read(page) => {
                    self.read(*page);
                    None
                }
                Output::Spawn { jobs, source } => {
                    for job in jobs {
                        let self_tx = self.self_tx.clone();
                        crate::executor::spawn(
                            &self.ctx.executors,
                            job,
                            source.clone(),
                            move |report| {
                                let self_tx = self_tx.clone();
                                async move {
                                    if let Some(tx) = self_tx.upgrade() {
                                        let _ = tx.send(Command::from(report)).await;
                                    }
                                }
                            },
                        );
                    }
                    None
                }
                Output::Connected { reply, result } => {
                    let _ = reply.send(result.map(|c| self.feed(c)));
                    None
                }
                Output::RingEffects => {
                    self.ctx.executors.effects.ring();
                    None
                }
            };
            if let Some(answer) = answer {
                work.extend(self.core.handle(answer));
            }
        }
    }

    /// Takes the stream's lease (several hosts) and loads it, on a blocking
    /// thread.
    async fn load(&self, known: Option<(i64, String, u64)>) -> LoadResult {
        let storage = self.ctx.storage.clone();
        let address = self.address.clone();
        // Read before the lease is taken: a lapse after it reloads again.
        let lapses = self.ctx.storage.lease_lapses();
        let loaded = tokio::task::spawn_blocking(move || {
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
        let result = loaded.map_err(|e| {
            if let Some(owner) = e.downcast_ref::<crate::storage::OwnedElsewhere>() {
                LoadError::OwnedElsewhere {
                    path: owner.path.clone(),
                    url: owner.url.clone(),
                    owner: owner.owner.clone(),
                }
            } else if e.downcast_ref::<crate::storage::LeaseLost>().is_some() {
                LoadError::LeaseLost
            } else {
                LoadError::Failed(format!("{e:#}"))
            }
        });
        LoadResult { lapses, result }
    }

    /// Runs the stream's reactors (guests) off the async workers.
    async fn react(
        &self,
        reactors: Arc<Vec<crate::reactor::Reactor>>,
        events: Vec<crate::reactor::Appended>,
        project: String,
        stream_id: String,
    ) -> core::Reacted {
        let storage = self.ctx.storage.clone();
        let runtime = Arc::clone(&self.ctx.runtime);
        let rests = Arc::clone(&self.ctx.reactor_rests);
        let clock = Arc::clone(&self.ctx.clock);
        let calls = Arc::clone(&self.ctx.executors.calls);
        let telemetry = self.ctx.executors.telemetry.clone();
        let handle = tokio::runtime::Handle::current();
        let run = move || {
            // The round's first call takes a place of the project's share
            // of guest calls (here, off the async workers), waiting at most
            // a reactor call's time for it: a project whose reactors loop
            // holds up its own appends, never another project's.
            let enter = || match calls.try_enter(&project) {
                Some(place) => Ok(place),
                None => handle
                    .block_on(calls.enter_within(
                        &project,
                        std::time::Duration::from_millis(crate::reactor::REACT_TIMEOUT_MS),
                    ))
                    .map_err(|e| e.message),
            };
            crate::reactor::Reacting {
                storage: &storage,
                runtime: &runtime,
                project: &project,
                stream_id: &stream_id,
                rests: Some((&rests, &*clock)),
                enter: Some(&enter),
                telemetry: Some(&telemetry),
            }
            .react(&reactors, &events)
        };
        // On a multi-thread runtime this worker becomes a blocking thread
        // for the call (its other tasks move to another worker), which
        // spares the append two thread hand-offs; elsewhere the call goes
        // to the blocking pool.
        match tokio::runtime::Handle::current().runtime_flavor() {
            tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(run),
            _ => tokio::task::spawn_blocking(run).await.unwrap_or_else(|e| {
                Err(crate::reactor::Refusal {
                    request: 0,
                    error: Error::internal(format!("the reactors' task failed: {e}")),
                })
            }),
        }
    }

    /// Serves a page of events on a blocking thread.
    fn read(&self, page: core::ReadPage) {
        let storage = self.ctx.storage.clone();
        tokio::task::spawn_blocking(move || {
            let core::ReadPage {
                row_id,
                query,
                head,
                stream_id,
                created_at,
                ephemeral,
                reply,
            } = page;
            let result = storage
                .events_after(row_id, query.after_offset, query.limit, head)
                .map_err(|e| Error::internal(format!("reading events failed: {e:#}")))
                .and_then(|durable| {
                    // A page its bytes cut short ends at its last stored
                    // event: the next page (after it) has what follows.
                    let bytes: usize = durable.iter().map(|(_, body)| body.len()).sum();
                    let ephemeral = match durable.last() {
                        Some((last, _)) if bytes >= storage.bounds().read_bytes_max => ephemeral
                            .into_iter()
                            .filter(|e| e.offset <= *last)
                            .collect(),
                        _ => ephemeral,
                    };
                    merge_page(durable, ephemeral, query.limit)
                })
                .map(|events| ReadOutput {
                    stream_id,
                    stream_created_at: created_at,
                    max_offset: head,
                    events,
                });
            let _ = reply.send(result);
        });
    }

    /// A registered connection's feed: its replay reads storage, and its
    /// guard tells this actor when its consumer ends it.
    fn feed(&self, c: connections::NewConnection) -> crate::connection::feed::Feed {
        let replay = c.replay.map(|r| crate::connection::feed::Replay {
            storage: self.ctx.storage.clone(),
            row_id: r.row_id,
            after: r.after,
            head: r.head,
            ephemeral: r.ephemeral,
        });
        let notify = self.self_tx.clone();
        let (key, id) = (c.key, c.id);
        let guard = crate::connection::feed::Guard::new(Box::new(move |reason, error| {
            if let Some(tx) = notify.upgrade() {
                let _ = tx.try_send(Command::ConnectionEnded {
                    key,
                    id,
                    reason,
                    error,
                });
            }
        }));
        crate::connection::feed::Feed::new(replay, c.initial_state, c.head, c.rx, guard)
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
            match cmd {
                // Questions for this actor, not the stream: a successor
                // would only be started to answer them.
                Command::IdleCheck | Command::LeaseChanged => {}
                Command::Lags { reply } => {
                    let _ = reply.send(Vec::new());
                }
                cmd => late.push(cmd),
            }
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
}

/// Committed events a round names (blocking: run it on a blocking thread):
/// those holding `keys` (a platform key an older caller's event holds is
/// looked up under its displaced key too) and the configure events at
/// `offsets`.
fn lookup(
    storage: &Storage,
    row_id: i64,
    keys: &[String],
    offsets: Vec<u64>,
) -> Result<core::Found> {
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
    // A platform key an older caller's event holds: the platform's event is
    // under the displaced key (rare: a second look).
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
}

/// The stored events of `row_id` in `(after, up_to]`, parsed.
fn unseen_events(storage: &Storage, row_id: i64, after: u64, up_to: u64) -> Result<Vec<Event>> {
    let bodies =
        storage.events_within(row_id, after, (up_to - after) as usize, up_to, usize::MAX)?;
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
        let page =
            storage.events_after(row.row_id, after, crate::stream::READ_LIMIT_MAX, u64::MAX)?;
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
