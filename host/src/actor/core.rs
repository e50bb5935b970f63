//! The stream actor's logic as a step function: [`ActorCore::handle`] takes
//! one [`Input`] (a command, a load, a lookup, the reactors' answer, a
//! commit's result, a tick of the timer) and returns the [`Output`]s the
//! runtime carries out (load, look up, react, submit a write, read a page,
//! spawn delivery jobs, hand over a connection's feed). It never waits and
//! does no I/O: time, the lease and fresh ids come from its
//! [`Environment`], so `simulation.rs` drives cores with a seeded schedule
//! of failures, and the tokio task in `mod.rs` only feeds it.
//!
//! Answers go straight into the reply channel each request carries (a
//! oneshot send never blocks); live connections are bounded channels the
//! core `try_send`s to.
//!
//! **Architecture Invariant:** an append is acknowledged only after its
//! commit. A round that fails to commit answers every request with an error
//! and makes the core load its state from the log again, at once (retried
//! with backoff while storage keeps failing), before the next round.
//!
//! **Architecture Invariant:** at most one I/O request the core waits for
//! is outstanding (a load, a lookup or the reactors' run), and at most one
//! write is in flight. Inputs that arrive while it waits are held and
//! taken in order once it has its answer.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;

use super::reload::Reload;
use super::tenure::Tenure;
use super::{recent_keys, Command, Reply};
use crate::clock::format_timestamp;
use crate::config::DeliveryConfig;
use crate::delivery::copy::{plan_copy, CopyBatch, CopyOutcome};
use crate::delivery::schedule::Deliveries;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::storage::{
    CommitError, CursorRow, NewStream, StoredEvent, StreamCommit, StreamRef, WriteOp,
};
use crate::stream::{
    event_at, lookup_offsets, plan_append, AppendContext, AppendInput, AppendOutput, AppendPlan,
    Authority, CoreState, Event, ReadOutput, ReadQuery, RoundKeys, StreamAddress,
    EPHEMERAL_BYTES_MAX,
};

/// Seconds a caller waits after `503 storage-full` before retrying.
const STORAGE_FULL_RETRY_AFTER_S: u32 = 5;
/// Most append requests planned into one round.
pub const ROUND_REQUESTS_MAX: usize = 1024;
/// Commit instants kept for latency measurement, at most.
const RECENT_COMMITS_MAX: usize = 65_536;

/// What the core asks of the host it runs in, besides its inputs.
pub trait Environment: Send + Sync {
    /// The injected clock, in milliseconds since the epoch.
    fn now_ms(&self) -> i64;
    /// The same clock in microseconds (delivery latency).
    fn now_us(&self) -> i64;
    /// Whether this host's leases are surely its own (always on SQLite).
    fn lease_valid(&self) -> bool;
    /// How often the database let this host's leases lapse.
    fn lease_lapses(&self) -> u64;
    /// A fresh unique id (stream ids, connection keys).
    fn new_id(&self) -> String;
    /// Backoff jitter in `[-1, 1]`.
    fn jitter(&self) -> f64;
}

/// The fixed settings of a core.
#[derive(Clone)]
pub struct CoreConfig {
    pub metrics: Metrics,
    pub delivery: DeliveryConfig,
    /// Idle time after which an actor releases itself.
    pub idle_stream_ms: u64,
    /// The ephemeral events all streams hold in memory.
    pub ephemeral: Arc<crate::quota::EphemeralMemory>,
    /// The bytes each project's stored events take, against its bound.
    pub stored: Arc<crate::quota::StoredBytes>,
    /// What the configuration bounds in deliveries' evaluations.
    pub bounds: crate::delivery::Bounds,
}

/// What a load found: the stream (if it exists), its delivery cursors and
/// processor checkpoints, and committed events live connections were never
/// sent.
pub struct LoadedStream {
    pub stream: Loaded,
    pub cursors: Vec<CursorRow>,
    /// Checkpoint offsets of the processors woken by the stream's
    /// subscriptions, for this source lifetime.
    pub checkpoints: HashMap<String, u64>,
    /// Stored events live connections were never sent (see [`Output::Load`]).
    pub unseen: Vec<Event>,
}

/// The committed stream a core holds.
pub struct Loaded {
    pub row_id: i64,
    pub state: CoreState,
    /// The last committed (durable) offset folded into `state`.
    pub state_offset: u64,
}

/// Why a load failed.
#[derive(Debug, Clone)]
pub enum LoadError {
    /// Another host owns the stream (several hosts).
    OwnedElsewhere {
        path: String,
        url: String,
        owner: String,
    },
    /// This host cannot renew its leases now.
    LeaseLost,
    /// Storage failed.
    Failed(String),
}

/// The result of [`Output::Load`].
pub struct LoadResult {
    /// The host's lease lapse count read before the lease was taken.
    pub lapses: u64,
    pub result: Result<(Option<crate::storage::Fence>, Option<LoadedStream>), LoadError>,
}

/// Committed events a round names: by idempotency key and by offset.
pub type Found = (HashMap<String, Event>, HashMap<u64, Event>);

/// The reactors' answer to [`Output::React`]: their effects and how many
/// calls they made, or the request one of them refused.
pub type Reacted = Result<(Vec<crate::reactor::Reaction>, u64), crate::reactor::Refusal>;

/// One step's input.
pub enum Input {
    /// A message from the actor's channel.
    Command(Command),
    /// The answer to [`Output::Load`].
    Loaded(Box<LoadResult>),
    /// The answer to [`Output::Lookup`].
    LookedUp(Result<Found, String>),
    /// The answer to [`Output::React`].
    Reacted(Reacted),
    /// The result of the write in flight ([`Output::Submit`]).
    Committed(Result<i64, CommitError>),
    /// The timer the core asked for ([`ActorCore::next_timer_ms`]) fired.
    Tick,
}

/// What the runtime does for the core.
pub enum Output {
    /// Take the stream's lease (several hosts) and load it; answer with
    /// [`Input::Loaded`]. `known` is what live connections were sent up to
    /// (row, stream id, head): a commit reported as failed may have reached
    /// the log, and the load reads its events for them.
    Load { known: Option<(i64, String, u64)> },
    /// Read committed events by idempotency key and by offset; answer with
    /// [`Input::LookedUp`].
    Lookup {
        row_id: i64,
        keys: Vec<String>,
        offsets: Vec<u64>,
    },
    /// Run the stream's reactors over a round's events; answer with
    /// [`Input::Reacted`].
    React {
        reactors: Arc<Vec<crate::reactor::Reactor>>,
        events: Vec<crate::reactor::Appended>,
        project: String,
        stream_id: String,
    },
    /// Submit a write; its result comes back as [`Input::Committed`].
    Submit(Box<WriteOp>),
    /// Read a page of committed events and answer `reply`.
    Read(Box<ReadPage>),
    /// Start delivery jobs; each reports back as `Command::DeliveryDone`.
    Spawn {
        jobs: Vec<crate::delivery::schedule::Job>,
        source: Arc<crate::executor::Source>,
    },
    /// A connection was registered (or refused): hand its feed over.
    Connected {
        reply: Reply<crate::connection::feed::Feed>,
        result: Result<super::connections::NewConnection, Error>,
    },
    /// Reactors' effects committed: the outbox's worker looks at once.
    RingEffects,
}

/// A read the runtime serves from storage.
pub struct ReadPage {
    pub row_id: i64,
    pub query: ReadQuery,
    pub head: u64,
    pub stream_id: String,
    pub created_at: String,
    /// Buffered ephemeral events after the query's offset.
    pub ephemeral: Vec<Event>,
    pub reply: Reply<ReadOutput>,
}

pub(super) enum Pending {
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

/// A round planned up to its commit.
struct Round {
    outcomes: Vec<(Answer, Result<AppendPlan, Error>)>,
    requests: Vec<Request>,
    /// Whether the round's keys were read from the log before planning
    /// (after the index refused it once).
    keys_read: bool,
    next_state: Box<CoreState>,
    state_offset: u64,
    durable: Vec<StoredEvent>,
    /// Committed events the round redacts, as stored from its commit on.
    redactions: Vec<StoredEvent>,
    /// Retention's removal: the stored events through this offset go.
    removed_through: Option<u64>,
    stream_ref: StreamRef,
}

/// A write waiting for its commit.
enum InFlight {
    Round {
        round: Box<Round>,
        cursors: Vec<CursorRow>,
        /// Whether reactors' effects commit with it.
        effects: bool,
        /// Whether it settles append effects (their new status is visible
        /// in the outbox once it commits, before this core has its result).
        settles: bool,
    },
    Reset {
        reply: Reply<()>,
    },
    Cursors {
        cursors: Vec<CursorRow>,
    },
}

/// What the core waits for (one at a time).
enum Waiting {
    /// A load; then this continues.
    Load(AfterLoad),
    /// The round's committed keys and configure events.
    Lookup {
        round: Vec<Pending>,
        keys_read: bool,
    },
    /// The reactors' effects for a planned round.
    React(Round),
}

enum AfterLoad {
    /// Serve a command that needs the stream.
    Serve(Command),
    /// Go on with the next queued request.
    Start(Pending),
    /// A reload after a failure, due by the timer.
    Reload,
}

pub(super) struct EphemeralBuffer {
    events: VecDeque<(Event, usize)>,
    bytes: usize,
    /// What all buffers hold, counted with this stream's project.
    pub(super) memory: Arc<crate::quota::EphemeralMemory>,
    pub(super) project: String,
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

    pub(super) fn after(&self, offset: u64, limit: usize) -> Vec<Event> {
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

/// The state and logic of one stream's actor, without a runtime.
pub struct ActorCore {
    pub(super) address: StreamAddress,
    pub(super) config: CoreConfig,
    pub(super) env: Arc<dyn Environment>,
    pub(super) stream: Option<Loaded>,
    pub(super) ephemeral: EphemeralBuffer,
    pub(super) queue: VecDeque<Pending>,
    in_flight: Option<InFlight>,
    waiting: Option<Waiting>,
    /// Inputs that arrived while the core waited.
    held: VecDeque<Input>,
    /// Reads that arrived while a round whose commit shows outside the
    /// stream (effects it inserts or settles) was in flight: answered once
    /// its result is in, so that a caller who saw an effect of the round in
    /// the outbox reads the round's events too.
    after_commit: Vec<Command>,
    out: Vec<Output>,
    /// Whether and when the stream is loaded again.
    pub(super) reload: Reload,
    /// When the last request arrived (for idle release), ms.
    last_request_ms: i64,
    /// Delivery runs of the subscriptions of this (source) stream.
    pub(super) deliveries: Deliveries,
    /// Commit instants (µs) of recent durable events, for delivery latency.
    pub(super) recent_commits: VecDeque<(u64, i64)>,
    /// Idempotency keys committed lately, with their events.
    recent_keys: recent_keys::RecentKeys,
    /// The next round reads its idempotency keys from the log before
    /// planning (the log's index refused the round as planned without).
    read_keys: bool,
    /// Live connections by key.
    pub(super) connections: HashMap<String, super::connections::Conn>,
    pub(super) next_connection_id: u64,
    /// What this actor holds of the stream's lease (several hosts on
    /// PostgreSQL): the fence its writes carry.
    pub(super) tenure: Tenure,
    /// The stream's reactors, compiled, with what identifies them (their
    /// names and configure offsets): compiled again when that changes.
    reactors: (Vec<(String, u64)>, Arc<Vec<crate::reactor::Reactor>>),
}

/// Commit instants worth keeping: those of offsets some run has not
/// delivered yet (none without runs), newest [`RECENT_COMMITS_MAX`].
fn prune_recent<T>(recent: &mut VecDeque<(u64, T)>, lowest_cursor: Option<u64>) {
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

impl ActorCore {
    /// A core for `address` that has loaded nothing yet.
    pub fn new(address: StreamAddress, config: CoreConfig, env: Arc<dyn Environment>) -> ActorCore {
        let ephemeral = EphemeralBuffer {
            events: VecDeque::new(),
            bytes: 0,
            memory: Arc::clone(&config.ephemeral),
            project: address.namespace.project_id().unwrap_or("").to_string(),
        };
        let now = env.now_ms();
        ActorCore {
            address,
            config,
            env,
            stream: None,
            ephemeral,
            queue: VecDeque::new(),
            in_flight: None,
            waiting: None,
            held: VecDeque::new(),
            after_commit: Vec::new(),
            out: Vec::new(),
            reload: Reload::new(),
            last_request_ms: now,
            deliveries: Deliveries::default(),
            recent_commits: VecDeque::new(),
            recent_keys: recent_keys::RecentKeys::default(),
            read_keys: false,
            connections: HashMap::new(),
            next_connection_id: 0,
            tenure: Tenure::default(),
            reactors: Default::default(),
        }
    }

    /// Takes one input; returns what the runtime must do now.
    pub fn handle(&mut self, input: Input) -> Vec<Output> {
        if self.waiting.is_some() && !self.answers_wait(&input) {
            self.held.push_back(input);
            return std::mem::take(&mut self.out);
        }
        self.apply(input);
        self.settle();
        while self.waiting.is_none() {
            let Some(input) = self.held.pop_front() else {
                break;
            };
            self.apply(input);
            self.settle();
        }
        std::mem::take(&mut self.out)
    }

    /// Whether `input` is the answer the core waits for.
    fn answers_wait(&self, input: &Input) -> bool {
        matches!(
            (&self.waiting, input),
            (Some(Waiting::Load(_)), Input::Loaded(_))
                | (Some(Waiting::Lookup { .. }), Input::LookedUp(_))
                | (Some(Waiting::React(_)), Input::Reacted(_))
        )
    }

    fn apply(&mut self, input: Input) {
        match input {
            Input::Command(cmd) => {
                if !matches!(
                    cmd,
                    Command::DeliveryDone(_)
                        | Command::DeliveryPlaced(_)
                        | Command::ConnectionEnded { .. }
                        | Command::IdleCheck
                        | Command::LeaseChanged
                        | Command::Lags { .. }
                ) {
                    self.last_request_ms = self.env.now_ms();
                }
                self.accept(cmd)
            }
            Input::Loaded(loaded) => {
                let Some(Waiting::Load(then)) = self.waiting.take() else {
                    unreachable!("checked by answers_wait")
                };
                let result = self.apply_load_result(*loaded);
                match (then, result) {
                    (AfterLoad::Serve(cmd), Ok(())) => self.serve(cmd),
                    (AfterLoad::Serve(cmd), Err(e)) => self.refuse(cmd, e),
                    (AfterLoad::Start(front), Ok(())) => self.begin(front),
                    (AfterLoad::Start(front), Err(err)) => {
                        self.fail_pending(front, err.clone());
                        while let Some(p) = self.queue.pop_front() {
                            self.fail_pending(p, err.clone());
                        }
                    }
                    (AfterLoad::Reload, _) => {}
                }
            }
            Input::LookedUp(found) => {
                let Some(Waiting::Lookup { round, keys_read }) = self.waiting.take() else {
                    unreachable!("checked by answers_wait")
                };
                match found {
                    Ok(found) => self.plan(round, keys_read, found),
                    Err(e) => {
                        let err = Error::internal(format!("reading the stream failed: {e}"));
                        for p in round {
                            self.fail_pending(p, err.clone());
                        }
                    }
                }
            }
            Input::Reacted(reacted) => {
                let Some(Waiting::React(round)) = self.waiting.take() else {
                    unreachable!("checked by answers_wait")
                };
                self.reacted(round, reacted);
            }
            Input::Committed(result) => {
                let in_flight = self.in_flight.take().expect("a commit was in flight");
                self.finish(in_flight, result);
                let mut reads = std::mem::take(&mut self.after_commit).into_iter();
                while self.waiting.is_none() {
                    let Some(cmd) = reads.next() else { break };
                    self.serving(cmd);
                }
                for cmd in reads.rev() {
                    self.held.push_front(Input::Command(cmd));
                }
            }
            Input::Tick => {}
        }
    }

    /// After an input: a due reload, the next write, due deliveries.
    fn settle(&mut self) {
        if self.waiting.is_some() {
            return;
        }
        if self.reload.due(self.env.now_ms()) {
            self.begin_load(AfterLoad::Reload);
            return;
        }
        if self.in_flight.is_none() {
            self.start_next();
            if self.waiting.is_some() {
                return;
            }
        }
        self.pump_deliveries();
    }

    /// Whether a write is in flight or the core waits for an answer.
    pub fn busy(&self) -> bool {
        self.in_flight.is_some() || self.waiting.is_some()
    }

    /// Whether every accepted request has been answered or written.
    pub fn drained(&self) -> bool {
        !self.busy() && self.queue.is_empty() && self.held.is_empty()
    }

    /// Whether the actor may leave memory now: idle for the configured time
    /// (or its stream missing or owned elsewhere) with nothing that keeps it.
    pub fn releasable(&self) -> bool {
        if self.busy() || !self.may_release() {
            return false;
        }
        let idle_for = self.env.now_ms().saturating_sub(self.last_request_ms);
        let missing = (!self.reload.needed() || self.tenure.elsewhere()) && self.stream.is_none();
        missing || idle_for >= self.config.idle_stream_ms as i64
    }

    /// When the core must get [`Input::Tick`] with no message: the next
    /// delivery retry or deadline, or a reload after a failure, in ms
    /// since the epoch. (Idleness is the registry's sweep: no timer.)
    pub fn next_timer_ms(&self) -> Option<i64> {
        let now_ms = self.env.now_ms();
        let delivery = self.next_delivery_at_ms().map(|at| at.max(now_ms + 1));
        [delivery, self.reload.timer_ms()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether nothing keeps the actor in memory but recent use: no queued
    /// work, no live connection, no delivery in flight, due, scheduled or
    /// with a cursor to write, and a loaded (or missing) stream.
    fn may_release(&self) -> bool {
        // A load still owed keeps the actor: one after a failure (its
        // timer resumes stalled deliveries) or of a stream it holds. An
        // actor that never loaded and has nothing to do does not wait for
        // a use (a message that raced into a released actor's mailbox
        // starts one such).
        let owes_load = self.reload.needed()
            && !self.tenure.elsewhere()
            && (self.stream.is_some() || self.reload.timer_ms().is_some());
        if owes_load
            || !self.queue.is_empty()
            || !self.held.is_empty()
            || !self.connections.is_empty()
        {
            return false;
        }
        match &self.stream {
            None => true,
            Some(s) => self.deliveries.is_quiet(s.state_offset),
        }
    }

    pub(super) fn prune_recent_commits(&mut self) {
        prune_recent(&mut self.recent_commits, self.deliveries.lowest_cursor());
    }

    fn accept(&mut self, cmd: Command) {
        // Several hosts: the database let this host's leases lapse since
        // this fence was taken, so another host may have written the
        // stream; it is loaded (and its lease taken) again first.
        if self.tenure.lapsed(self.env.lease_lapses()) {
            self.reload.request();
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
                    .map(|e| object_bytes(e.payload.as_ref()) + e.event_type.len() + 64)
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
                // A project's stored bytes are bounded: what callers, copies
                // and effects add, not the platform's own facts.
                if counts_against_storage(authority) {
                    if let Err(e) = self.admit_stored(|| durable_bytes(&input)) {
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
                // A copy into a project at its storage bound is refused (the
                // run retries it, then halts naming the bound).
                if let Err(e) = self.admit_stored(|| copy_bytes(&batch)) {
                    let _ = reply.send(Err(e));
                    return;
                }
                self.queue.push_back(Pending::Deliver { batch, reply })
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
            Command::DeliveryDone(done) => self.delivery_done(*done),
            Command::DeliveryPlaced(placement) => {
                let now_ms = self.env.now_ms();
                self.deliveries.placed(&placement, now_ms);
            }
            // The runtime decides (idle long enough, nothing pending).
            Command::IdleCheck => {}
            Command::LeaseChanged => {
                if !self.env.lease_valid() {
                    self.end_connections_lease_lost();
                } else if self.reload.needed() && (self.stream.is_some() || self.tenure.fenced()) {
                    // Taken again (or found owned elsewhere: connections end).
                    self.serving(Command::LeaseChanged);
                }
            }
            Command::ConnectionEnded {
                key,
                id,
                reason,
                error,
            } => self.connection_ended(&key, id, reason, error),
            cmd @ (Command::State { .. } | Command::Read { .. })
                if self.commit_shows_elsewhere() =>
            {
                self.after_commit.push(cmd)
            }
            cmd @ (Command::Retry { .. }
            | Command::Runtime { .. }
            | Command::Wake
            | Command::Fence { .. }
            | Command::Connect { .. }
            | Command::State { .. }
            | Command::Read { .. }) => self.serving(cmd),
        }
    }

    /// Whether the write in flight is a round whose commit others can see
    /// before this core has its result: the outbox shows the effects it
    /// inserts or settles.
    fn commit_shows_elsewhere(&self) -> bool {
        matches!(
            self.in_flight,
            Some(InFlight::Round { effects, settles, .. }) if effects || settles
        )
    }

    /// Serves `cmd` once the stream is loaded: with several hosts, only
    /// while this host's leases are surely its own (`503 lease-lost`
    /// otherwise, and its live connections end).
    fn serving(&mut self, cmd: Command) {
        if !self.env.lease_valid() {
            self.end_connections_lease_lost();
            let err = Error::lease_lost(&self.address.path);
            self.refuse(cmd, err);
            return;
        }
        // Read after the validity: a renewal that found the leases lapsed
        // counts the lapse before it makes them valid again, so a renewal
        // that landed since `accept` looked is seen here.
        if self.tenure.lapsed(self.env.lease_lapses()) {
            self.reload.request();
        }
        if self.reload.needed() {
            self.begin_load(AfterLoad::Serve(cmd));
        } else {
            self.serve(cmd);
        }
    }

    /// Serves a command with the stream loaded.
    fn serve(&mut self, cmd: Command) {
        match cmd {
            Command::Retry {
                key,
                component,
                reply,
            } => {
                let result = match &self.stream {
                    Some(_) => Ok(self
                        .deliveries
                        .retry_now(key.as_deref(), component.as_deref())),
                    None => Err(self.not_found()),
                };
                if result.as_ref().is_ok_and(|k| !k.is_empty()) {
                    self.pump_deliveries();
                }
                let _ = reply.send(result);
            }
            Command::Runtime { reply } => {
                let result = match &self.stream {
                    Some(_) => Ok(self.runtime_view()),
                    None => Err(self.not_found()),
                };
                let _ = reply.send(result);
            }
            Command::Wake | Command::LeaseChanged => {}
            Command::Fence { reply } => {
                let _ = reply.send(Ok(self.tenure.fence()));
            }
            Command::Connect { params, reply } => self.connect(*params, reply),
            Command::State { reply } => {
                let result = self
                    .stream
                    .as_ref()
                    .map(|s| s.state.clone())
                    .ok_or_else(|| self.not_found());
                let _ = reply.send(result);
            }
            Command::Read { query, reply } => self.read(query, reply),
            _ => unreachable!("only commands that need the stream are served"),
        }
    }

    /// Answers a command that needed the stream with why it cannot have it.
    fn refuse(&mut self, cmd: Command, err: Error) {
        match cmd {
            Command::Retry { reply, .. } => {
                let _ = reply.send(Err(err));
            }
            Command::Runtime { reply } => {
                let _ = reply.send(Err(err));
            }
            Command::Fence { reply } => {
                let _ = reply.send(Err(err));
            }
            Command::Connect { reply, .. } => self.out.push(Output::Connected {
                reply,
                result: Err(err),
            }),
            Command::State { reply } => {
                let _ = reply.send(Err(err));
            }
            Command::Read { reply, .. } => {
                let _ = reply.send(Err(err));
            }
            // Another host took it first (several hosts): its work runs
            // there; or this host cannot renew its leases now.
            Command::Wake if err.owner_url.is_some() || err.code == "lease-lost" => {
                tracing::debug!(stream = %self.address, error = %err, "not woken here")
            }
            Command::Wake => {
                tracing::error!(stream = %self.address, error = %err, "waking stream failed")
            }
            _ => {}
        }
    }

    /// Asks for the stream to be loaded; `then` goes on once it is.
    fn begin_load(&mut self, then: AfterLoad) {
        // What live connections were sent up to: a commit that reported a
        // failure may have reached the log all the same (an I/O error during
        // fsync), and its events must reach them too.
        let known = self
            .stream
            .as_ref()
            .filter(|_| !self.connections.is_empty())
            .map(|s| (s.row_id, s.state.stream_id.clone(), s.state.max_offset));
        self.out.push(Output::Load { known });
        self.waiting = Some(Waiting::Load(then));
        self.reload.started();
    }

    /// Takes over a load's result. A failure schedules the next attempt with
    /// backoff, so stalled deliveries resume without a request.
    fn apply_load_result(&mut self, loaded: LoadResult) -> Result<(), Error> {
        self.config.metrics.stream_loaded(loaded.result.is_ok());
        match loaded.result {
            Ok((fence, stream)) => {
                self.tenure.taken(fence, loaded.lapses);
                self.apply_load(stream);
                Ok(())
            }
            Err(LoadError::OwnedElsewhere { path, url, owner }) => {
                // Another host owns the stream: nothing of it stays here
                // (live connections end, their clients reconnect through
                // the owner), and the next request asks again.
                if self.stream.is_some() {
                    tracing::warn!(stream = %self.address, owner = %owner, "the stream is owned by another host now");
                }
                self.apply_load(None);
                self.connections.clear();
                self.tenure.owned_elsewhere();
                self.reload.request();
                Err(Error::owned_elsewhere(&path, &url))
            }
            Err(LoadError::LeaseLost) => {
                // This host cannot renew its leases: nothing is served until
                // it can (`LeaseChanged` then loads again).
                self.end_connections_lease_lost();
                self.tenure.lost(self.stream.is_some());
                Err(Error::lease_lost(&self.address.path))
            }
            Err(LoadError::Failed(e)) => {
                let wait = self.storage_failed();
                tracing::error!(stream = %self.address, error = %e, retry_in_ms = wait, "loading stream failed");
                Err(Error::internal(format!("loading the stream failed: {e}")))
            }
        }
    }

    /// A load or write failed: the stream is loaded again after the
    /// backoff (at once after a first failure). Returns the wait in ms.
    fn storage_failed(&mut self) -> u64 {
        self.reload.failed(self.env.now_ms())
    }

    /// A write failed to commit: the core's state may be ahead of the log.
    fn reload_soon(&mut self) {
        let wait = self.storage_failed();
        tracing::warn!(stream = %self.address, retry_in_ms = wait, "reloading the stream after a failed write");
    }

    pub(super) fn not_found(&self) -> Error {
        let where_ = match self.address.namespace.project_id() {
            Some(p) => format!("in project {p:?}"),
            None => "in the global namespace".to_string(),
        };
        Error::not_found(
            "stream-not-found",
            format!("stream {:?} does not exist {where_}", self.address.path),
        )
    }

    /// Takes over what a load read: the stream, and its delivery runs.
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
        self.reload.loaded();
    }

    fn read(&mut self, query: ReadQuery, reply: Reply<ReadOutput>) {
        let Some(stream) = &self.stream else {
            let _ = reply.send(Err(self.not_found()));
            return;
        };
        if let Err(e) =
            crate::stream::retention::check_read(stream.state.first_offset, query.after_offset)
        {
            let _ = reply.send(Err(e));
            return;
        }
        let ephemeral = if query.include_ephemeral {
            self.ephemeral.after(query.after_offset, query.limit)
        } else {
            Vec::new()
        };
        self.out.push(Output::Read(Box::new(ReadPage {
            row_id: stream.row_id,
            query,
            head: stream.state.max_offset,
            stream_id: stream.state.stream_id.clone(),
            created_at: stream.state.created_at.clone(),
            ephemeral,
            reply,
        })));
    }

    /// Starts the next write, answering queued work that needs none.
    fn start_next(&mut self) {
        while !self.busy() {
            let Some(front) = self.queue.pop_front() else {
                self.start_cursor_write();
                return;
            };
            // The leases lapsed since the fence was taken (another host may
            // have written): load again before planning on this state.
            if self.tenure.lapsed(self.env.lease_lapses()) {
                self.reload.request();
            }
            if self.reload.needed() {
                self.begin_load(AfterLoad::Start(front));
                return;
            }
            self.begin(front);
        }
    }

    /// Starts the write of `front` (and of the appends queued behind it).
    fn begin(&mut self, front: Pending) {
        match front {
            Pending::Reset { reply } => match &self.stream {
                None => {
                    self.ephemeral.clear();
                    let _ = reply.send(Ok(()));
                }
                Some(s) => {
                    self.out.push(Output::Submit(Box::new(WriteOp::Reset {
                        row_id: s.row_id,
                        fence: self.tenure.fence(),
                    })));
                    self.in_flight = Some(InFlight::Reset { reply });
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
                self.start_round(round);
            }
        }
    }

    pub(super) fn fail_pending(&mut self, p: Pending, err: Error) {
        match p {
            Pending::Append { reply, run, .. } => {
                self.config.metrics.append_answered(err.code);
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

    /// Committed events the round's planning needs: those holding its
    /// idempotency keys, and the configure events it refers to; asked of
    /// storage only when the round names any.
    ///
    /// Keys are read from the log only when `read_keys` (the log's index
    /// refused the round planned without) or when the stream's recent keys
    /// may hold them (a retry): otherwise a key is taken as new, and the
    /// commit's insert checks it against the whole log.
    fn start_round(&mut self, round: Vec<Pending>) {
        let keys_read = std::mem::take(&mut self.read_keys);
        let Some(stream) = &self.stream else {
            return self.plan(round, keys_read, Default::default());
        };
        // A key with a NUL byte is refused by planning; storage (PostgreSQL)
        // cannot even look it up. (A key not read, or a displaced platform
        // key, is taken as new; the commit's insert tells otherwise.)
        let recent = &self.recent_keys;
        let read = |k: &str| !k.contains('\0') && (keys_read || recent.may_hold(k));
        let mut keys: Vec<String> = Vec::new();
        let mut offsets: Vec<u64> = Vec::new();
        for p in &round {
            match p {
                Pending::Append { input, .. } => {
                    keys.extend(
                        input
                            .events
                            .iter()
                            .filter_map(|e| e.idempotency_key.as_deref())
                            .filter(|k| read(k))
                            .map(str::to_string),
                    );
                    offsets.extend(lookup_offsets(Some(&stream.state), input));
                }
                Pending::Deliver { batch, .. } => keys.extend(
                    crate::delivery::copy::batch_keys(batch, &self.address)
                        .into_iter()
                        .filter(|k| read(k)),
                ),
                Pending::Reset { .. } => {}
            }
        }
        if keys.is_empty() && offsets.is_empty() {
            return self.plan(round, keys_read, Default::default());
        }
        offsets.sort_unstable();
        offsets.dedup();
        self.out.push(Output::Lookup {
            row_id: stream.row_id,
            keys,
            offsets,
        });
        self.waiting = Some(Waiting::Lookup { round, keys_read });
    }

    /// Plans a round of appends with what it names of the log, and submits
    /// its commit (after the reactors, if any run) or answers it at once.
    fn plan(&mut self, round: Vec<Pending>, keys_read: bool, found: Found) {
        let (committed_by_key, committed_by_offset) = found;
        let span = tracing::debug_span!("append", stream = %self.address, requests = round.len())
            .entered();
        let now = format_timestamp(self.env.now_ms());
        let project_id = self.address.namespace.project_id().map(str::to_string);
        let path = self.address.path.clone();
        let env = Arc::clone(&self.env);
        let (state, outcomes, requests) = {
            let mut new_stream_id = || env.new_id();
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
            let mut round_keys = RoundKeys::default();
            let mut outcomes: Vec<(Answer, Result<AppendPlan, Error>)> =
                Vec::with_capacity(round.len());
            let mut requests = Vec::with_capacity(round.len());
            for p in round {
                // An event an earlier request of the round planned (a key
                // repeated within the round).
                let earlier = |offset| {
                    outcomes
                        .iter()
                        .filter_map(|(_, o)| o.as_ref().ok())
                        .find_map(|p| event_at(&p.new_events, offset))
                };
                let (answer, outcome) = match p {
                    Pending::Append {
                        input,
                        authority,
                        reply,
                        run,
                    } => {
                        let outcome = plan_append(
                            &mut state,
                            &mut round_keys,
                            &earlier,
                            &input,
                            authority,
                            &mut ctx,
                        );
                        requests.push(Request::Append { input, authority });
                        (Answer::Append(reply, run), outcome)
                    }
                    Pending::Deliver { batch, reply } => {
                        let planned = plan_copy(
                            &mut state,
                            &mut round_keys,
                            &earlier,
                            &self.address,
                            &batch,
                            &mut ctx,
                            self.config.bounds,
                        );
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
                outcomes.push((answer, outcome));
            }
            (state, outcomes, requests)
        };
        // The round's new events, in order (each plan's, request by
        // request): borrowed, never copied.
        let new_events = || {
            outcomes
                .iter()
                .filter_map(|(_, o)| o.as_ref().ok())
                .flat_map(|p| p.new_events.iter())
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
            return;
        }
        let next_state = match state {
            Some(s) if new_events().next().is_some() => s,
            _ => {
                // Nothing to commit: rejections and replays of committed
                // events. No fenced commit proves the state current, so
                // with several hosts they are answered only while the
                // lease is surely this host's (as reads are).
                // (The lapse count read after the validity: see `serving`.
                // A renewal that found the leases lapsed after this round
                // was planned makes its refusals stale too.)
                let stale = self.tenure.fenced()
                    && (!self.env.lease_valid() || self.tenure.lapsed(self.env.lease_lapses()));
                let failed: Vec<_> = outcomes
                    .into_iter()
                    .filter_map(|(reply, outcome)| {
                        let outcome = match stale {
                            true => Err(Error::lease_lost(&self.address.path)),
                            false => outcome,
                        };
                        let state = self.stream.as_ref().map(|s| &s.state);
                        self.answer(reply, outcome, state, &[])
                    })
                    .collect();
                for run in &failed {
                    self.run_fact_failed(run);
                }
                return;
            }
        };
        let stored = |e: &Event| StoredEvent {
            offset: e.offset,
            event_type: e.event_type.clone(),
            idempotency_key: e.idempotency_key.clone(),
            body: Arc::new(stored_text(e)),
        };
        let durable: Vec<StoredEvent> = new_events().filter(|e| !e.ephemeral).map(stored).collect();
        let redactions: Vec<StoredEvent> = outcomes
            .iter()
            .filter_map(|(_, o)| o.as_ref().ok())
            .flat_map(|p| p.redactions.iter())
            .map(stored)
            .collect();
        let removed_through = outcomes
            .iter()
            .filter_map(|(_, o)| o.as_ref().ok())
            .filter_map(|p| p.removed_through)
            .max();
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
        drop(span);
        let round = Round {
            outcomes,
            requests,
            keys_read,
            next_state: Box::new(next_state),
            state_offset,
            durable,
            redactions,
            removed_through,
            stream_ref,
        };
        match self.reactor_work(&round) {
            Some(react) => {
                self.out.push(react);
                self.waiting = Some(Waiting::React(round));
            }
            None => self.submit(round, Vec::new()),
        }
    }

    /// What the stream's reactors must see of a round, if anything.
    fn reactor_work(&mut self, round: &Round) -> Option<Output> {
        let state = &round.next_state;
        let identities = crate::reactor::identities(state);
        if identities.is_empty() {
            return None;
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
                Arc::new(crate::reactor::configured(
                    state,
                    self.config.bounds.jsonata,
                )),
            );
        }
        let reactors = Arc::clone(&self.reactors.1);
        let first = reactors
            .iter()
            .map(|r| r.configured_at_offset)
            .min()
            .unwrap_or(0);
        let bodies: HashMap<u64, &str> = round
            .durable
            .iter()
            .map(|e| (e.offset, e.body.as_str()))
            .collect();
        let mut events = Vec::new();
        for (request, (_, outcome)) in round.outcomes.iter().enumerate() {
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
            return None;
        }
        Some(Output::React {
            reactors,
            events,
            project: self.address.namespace.storage_key().to_string(),
            stream_id: state.stream_id.clone(),
        })
    }

    /// The reactors answered: the round commits with their effects, or the
    /// refused request is answered and the others are planned again.
    fn reacted(&mut self, round: Round, reacted: Reacted) {
        let reactions = match reacted {
            Ok((reactions, calls)) => {
                self.config.metrics.reactor_called("ok", calls);
                reactions
            }
            Err(refusal) => {
                self.config.metrics.reactor_called("refused", 1);
                let mut failed = Vec::new();
                let mut rest = Vec::new();
                for (i, ((answer, _), request)) in
                    round.outcomes.into_iter().zip(round.requests).enumerate()
                {
                    if i == refusal.request {
                        failed.extend(self.answer(answer, Err(refusal.error.clone()), None, &[]));
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
                return;
            }
        };
        let now_ms = self.env.now_ms();
        let created_at = format_timestamp(now_ms);
        let effects = reactions
            .into_iter()
            .map(|r| crate::storage::EffectInsert {
                source: crate::storage::EffectSource {
                    project: self.address.namespace.storage_key().to_string(),
                    path: self.address.path.clone(),
                    stream_id: round.next_state.stream_id.clone(),
                    component: r.component,
                },
                effects: r.effects,
                now_ms,
                created_at: created_at.clone(),
            })
            .collect();
        self.submit(round, effects);
    }

    /// Submits a planned round's commit.
    fn submit(&mut self, mut round: Round, effects: Vec<crate::storage::EffectInsert>) {
        let has_effects = !effects.is_empty();
        let settled = self.settled_effects(&round);
        let settles = settled.is_some();
        let (cursors, removed_cursors) = self.cursor_rows_for(&round.next_state);
        let commit = StreamCommit {
            stream: round.stream_ref.clone(),
            // (The bodies are shared: the round keeps them for its answers.)
            events: round.durable.clone(),
            head_offset: round.next_state.max_offset,
            state_json: round.next_state.serialized(),
            state_offset: round.state_offset,
            cursors: cursors.clone(),
            removed_cursors,
            fence: self.tenure.fence(),
            effects,
            settled,
            redactions: std::mem::take(&mut round.redactions),
            removed_through: round.removed_through,
            staged: Vec::new(),
        };
        commit.assert_invariants();
        self.out
            .push(Output::Submit(Box::new(WriteOp::Commit(commit))));
        self.in_flight = Some(InFlight::Round {
            round: Box::new(round),
            cursors,
            effects: has_effects,
            settles,
        });
    }

    /// The append effects whose events `round` stores: their settlement
    /// commits with the events (an effect's executor then has nothing left
    /// to write). Only an effect's own append names one (the executor
    /// appends with `Authority::Effect` and its id; a replayed event
    /// stores nothing, and settles nothing).
    fn settled_effects(&self, round: &Round) -> Option<crate::storage::AppendSettled> {
        let ids: Vec<i64> = round
            .outcomes
            .iter()
            .zip(&round.requests)
            .filter_map(|((_, outcome), request)| match (outcome, request) {
                (
                    Ok(plan),
                    Request::Append {
                        authority: Authority::Effect(id),
                        ..
                    },
                ) if plan.new_events.iter().any(|e| !e.ephemeral) => Some(*id),
                _ => None,
            })
            .collect();
        let now_ms = self.env.now_ms();
        (!ids.is_empty()).then(|| crate::storage::AppendSettled {
            ids,
            now_ms,
            settled_at: format_timestamp(now_ms),
        })
    }

    /// Answers one planned request; returns the delivery run whose fact
    /// did not make it, if any. `stored`: the round's events as it
    /// committed them (by offset), whose text the answer copies rather than
    /// serializing each event again.
    #[must_use]
    fn answer(
        &self,
        answer: Answer,
        outcome: Result<AppendPlan, Error>,
        state: Option<&CoreState>,
        stored: &[StoredEvent],
    ) -> Option<(String, u64)> {
        match answer {
            Answer::Append(reply, run) => {
                let result = outcome.and_then(|plan| {
                    let state = state
                        .ok_or_else(|| Error::internal("a planned append without a stream"))?;
                    // Only this round's stored events have a text here:
                    // an ephemeral one, or the original a key replays, is
                    // serialized.
                    let rendered = plan
                        .events
                        .iter()
                        .map(|e| {
                            let at = stored.binary_search_by_key(&e.offset, |s| s.offset);
                            at.ok()
                                .map(|i| &stored[i])
                                .filter(|s| !e.ephemeral && s.event_type == e.event_type)
                                .map(|s| Arc::clone(&s.body))
                        })
                        .collect();
                    // (The round's new events are in offset order.)
                    let replayed = plan
                        .events
                        .iter()
                        .map(|e| {
                            plan.new_events
                                .binary_search_by_key(&e.offset, |n| n.offset)
                                .is_err()
                        })
                        .collect();
                    Ok(AppendOutput {
                        stream_id: state.stream_id.clone(),
                        stream_created_at: state.created_at.clone(),
                        events: plan.events,
                        rendered,
                        replayed,
                    })
                });
                self.config.metrics.append_answered(match &result {
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
            self.reload.committed();
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
                round,
                cursors,
                effects,
                settles: _,
            } => match result {
                Ok(row_id) => {
                    if effects {
                        self.out.push(Output::RingEffects);
                    }
                    let now = self.env.now_us();
                    for (_, outcome) in &round.outcomes {
                        if let Ok(plan) = outcome {
                            for e in &plan.new_events {
                                if e.ephemeral {
                                    self.ephemeral.push(e.clone());
                                } else {
                                    self.recent_commits.push_back((e.offset, now));
                                    if let Some(key) = &e.idempotency_key {
                                        self.recent_keys.insert(key);
                                    }
                                }
                            }
                        }
                    }
                    self.prune_recent_commits();
                    self.stream = Some(Loaded {
                        row_id,
                        state: *round.next_state,
                        state_offset: round.state_offset,
                    });
                    let state = self.stream.as_ref().map(|s| s.state.clone());
                    if let Some(state) = &state {
                        self.repair_deliveries(state, &cursors, &HashMap::new());
                    }
                    // (Copied only for live connections: a 7 MB event's
                    // copy is not free.)
                    if !self.connections.is_empty() {
                        let committed: Vec<Event> = round
                            .outcomes
                            .iter()
                            .filter_map(|(_, o)| o.as_ref().ok())
                            .flat_map(|p| p.new_events.iter().cloned())
                            .collect();
                        self.fan_out(&committed);
                    }
                    for (answer, outcome) in round.outcomes {
                        failed.extend(self.answer(answer, outcome, state.as_ref(), &round.durable));
                    }
                }
                Err(e) if e.duplicate_key() && !round.keys_read => {
                    // Planned with its keys taken as new, and one was not:
                    // nothing of the round committed; plan it again, first
                    // in line, with its keys read from the log.
                    tracing::debug!(stream = %self.address, error = %e, "a round repeats an idempotency key: planning it again");
                    self.read_keys = true;
                    for ((answer, _), request) in
                        round.outcomes.into_iter().zip(round.requests).rev()
                    {
                        self.queue.push_front(request.into_pending(answer));
                    }
                }
                Err(e) => {
                    tracing::error!(stream = %self.address, error = %e, "append round failed to commit");
                    self.reload_soon();
                    let err = if e.full() {
                        Error::unavailable(
                            "storage-full",
                            format!(
                                "commit failed: {e}; nothing more is written until room is \
                                 made (retry later with the same idempotency keys)"
                            ),
                            STORAGE_FULL_RETRY_AFTER_S,
                        )
                    } else {
                        Error::internal(format!("commit failed: {e}"))
                    };
                    for (answer, _) in round.outcomes {
                        failed.extend(self.answer(answer, Err(err.clone()), None, &[]));
                    }
                }
            },
            InFlight::Cursors { cursors } => match result {
                Ok(_) => {
                    for c in cursors {
                        if let Some(rt) = self.deliveries.runs.get_mut(&c.subscription_key) {
                            if rt.generation == c.generation {
                                rt.durable_cursor = rt.durable_cursor.max(c.acknowledged_offset);
                                if super::delivery::cursor_row(&c.subscription_key, rt)
                                    .same_counters(&c)
                                {
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

    /// A write of advanced cursors, when there is nothing else to commit.
    fn start_cursor_write(&mut self) {
        let Some(stream) = self.stream.as_ref() else {
            return;
        };
        if self.reload.needed() {
            return;
        }
        let cursors: Vec<CursorRow> = self
            .deliveries
            .runs
            .iter()
            .filter(|(_, rt)| {
                // A processor's cursor is its checkpoint: only its counters
                // are written here.
                rt.counters_dirty || (rt.processor.is_none() && rt.cursor != rt.durable_cursor)
            })
            .map(|(k, rt)| super::delivery::cursor_row(k, rt))
            .collect();
        if cursors.is_empty() {
            return;
        }
        self.out.push(Output::Submit(Box::new(WriteOp::Cursors {
            row_id: stream.row_id,
            cursors: cursors.clone(),
            fence: self.tenure.fence(),
        })));
        self.in_flight = Some(InFlight::Cursors { cursors });
    }

    /// Queues a platform-authored event on this stream (`run`: the delivery
    /// run it is a fact of, told if it does not commit).
    pub(super) fn queue_fact(
        &mut self,
        event_type: &str,
        payload: Value,
        run: Option<(String, u64)>,
    ) {
        let input = AppendInput {
            events: vec![crate::stream::EventInput {
                event_type: event_type.to_string(),
                payload: payload.as_object().cloned(),
                metadata: None,
                idempotency_key: None,
                ephemeral: None,
                offset: None,
                source: None,
                trace: None,
                redacted: None,
            }],
            expected_stream_id: None,
        };
        self.queue.push_back(Pending::Append {
            input,
            authority: Authority::Platform,
            reply: None,
            run,
        });
    }

    /// Admits (and counts) the bytes of a write against the project's
    /// `max-project-bytes`; `bytes` is estimated only when a bound is set.
    fn admit_stored(&self, bytes: impl FnOnce() -> u64) -> Result<(), Error> {
        if self.config.stored.max().is_none() {
            return Ok(());
        }
        self.config.stored.admit(&self.ephemeral.project, bytes())
    }

    /// Adds an output of this step.
    pub(super) fn push_output(&mut self, output: Output) {
        self.out.push(output);
    }
}

/// Whether an append counts against its project's `max-project-bytes`:
/// a caller's or an effect's (copies arrive as deliveries, counted there);
/// not the platform's own facts (halts, resumes, audit lines), which
/// always land.
fn counts_against_storage(authority: Authority) -> bool {
    matches!(authority, Authority::Public | Authority::Effect(_))
}

/// About the bytes a copy batch's events take as stored (the source's
/// events with their provenance).
fn copy_bytes(batch: &crate::delivery::copy::CopyBatch) -> u64 {
    batch
        .events
        .iter()
        .filter(|e| !e.ephemeral)
        .map(|e| {
            (2 * e.event_type.len()
                + object_bytes(Some(&e.payload))
                + object_bytes(e.metadata.as_ref())
                + 192) as u64
        })
        .sum()
}

/// About the bytes an append's durable events take as stored (type, key,
/// payload and metadata as JSON, and the envelope); storage's own count
/// replaces the estimate within seconds.
fn durable_bytes(input: &AppendInput) -> u64 {
    input
        .events
        .iter()
        .filter(|e| e.ephemeral != Some(true))
        .map(|e| {
            (2 * e.event_type.len()
                + 2 * e.idempotency_key.as_deref().map_or(0, str::len)
                + object_bytes(e.payload.as_ref())
                + object_bytes(e.metadata.as_ref())
                + 96) as u64
        })
        .sum()
}

/// An event as it is stored and served (JSON text), written into a buffer
/// sized from an estimate of its length: a large event's text is not
/// copied again and again as its buffer doubles.
fn stored_text(e: &Event) -> String {
    let estimate = 256
        + e.event_type.len()
        + e.idempotency_key.as_deref().map_or(0, str::len)
        + object_bytes(Some(&e.payload))
        + object_bytes(e.metadata.as_ref());
    let mut text = Vec::with_capacity(estimate);
    serde_json::to_writer(&mut text, e).expect("events serialize");
    String::from_utf8(text).expect("JSON text is UTF-8")
}

/// About the bytes of an object's members as JSON text (see [`json_bytes`]).
fn object_bytes(map: Option<&serde_json::Map<String, Value>>) -> usize {
    map.map_or(0, |m| {
        m.iter().map(|(k, v)| k.len() + 4 + json_bytes(v)).sum()
    })
}

/// About the bytes of `v` as JSON text, without writing it (an estimate for
/// the ephemeral bound: strings by their length, numbers as 8).
fn json_bytes(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len() + 2,
        Value::Array(items) => 2 + items.iter().map(|i| json_bytes(i) + 1).sum::<usize>(),
        Value::Object(map) => 2 + object_bytes(Some(map)),
        _ => 8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_instants_are_kept_only_for_offsets_not_yet_delivered() {
        let mut recent: VecDeque<_> = (1..=10u64).map(|o| (o, 0i64)).collect();
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
            .map(|o| (o, 0i64))
            .collect();
        prune_recent(&mut long, Some(0));
        assert_eq!(long.len(), RECENT_COMMITS_MAX);
        assert_eq!(long.front().map(|(o, _)| *o), Some(6));
    }
}
