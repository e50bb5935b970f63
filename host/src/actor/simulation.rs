//! A seeded, deterministic simulation of stream actors: three
//! [`ActorCore`]s (one per stream), each with a webhook subscription and
//! /a copying to /b (the copy batches go to /b's core as the copy executor
//! sends them), driven through their step function against a simulated log
//! whose commits fail
//! before or after they reach it and complete in any order across streams,
//! whose loads and lookups fail or answer late (inputs arriving meanwhile
//! are held), a simulated receiver that fails, times out and loses its
//! reports, and a clock that only moves when the schedule says so.
//!
//! After every step it checks the log's invariants:
//! - **dense-offsets**: each stream's log holds offsets `1..=n`, no gap;
//! - **acknowledged-means-committed**: every event an append was answered
//!   with is in the log at that offset, when answered and at the end; a
//!   replayed idempotency key answers its first offset;
//! - **no-delivery-past-head**: no delivery job reaches past the log's
//!   committed head, and every delivered offset is committed;
//! - **cursor-monotonic**: a run's stored cursor never moves back, and
//!   within one load of the stream its jobs' cursors never move back;
//! - **copies-exactly-once**: /b never holds a copy of an /a event twice;
//! - every request is answered exactly once, and once the failures stop,
//!   every matching event of a run that did not halt reaches the receiver
//!   (and /b).
//!
//! It catches planted off-by-ones (and a lost key). Each was checked by hand, by making
//! the change and running `cargo test -p streamhost --lib simulation`:
//! - a job's `head: head + 1` in `Deliveries::due` (`delivery/schedule.rs`):
//!   "seed 1: invariant no-delivery-past-head: /a: job for \"hook\" reaches
//!   offset 3, the log's head is 2";
//! - `current.max_offset + 2` for the next offset in `plan_append`
//!   (`stream/append.rs`): "seed 1: invariant dense-offsets: /a: offset 3
//!   follows 1" (the production assertion only sees offsets increase: a
//!   gap is legal there, ephemeral events leave them);
//! - `d.through + 1` for the cursor after a delivery in
//!   `Deliveries::complete`: "seed 1: invariant no-delivery-past-head: /a:
//!   \"hook\" cursor 3 past head 2";
//! - a failed commit's requests answered with their plans in
//!   `ActorCore::finish_write` instead of the error: "seed 1: invariant
//!   acknowledged-means-committed: /c: offset 3 was acknowledged, the log
//!   ends at 2";
//! - a copy without its idempotency key in `plan_copy`
//!   (`delivery/copy.rs`): "seed 1: invariant copies-exactly-once: /b holds
//!   /a@4 twice".
//!
//! `STREAMHOST_SIM_SEEDS=N` runs more (or fewer) seeds than the 300 of CI.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio::sync::oneshot;

use super::core::{
    ActorCore, CoreConfig, Environment, Found, Input, LoadError, LoadResult, Loaded, LoadedStream,
    Output,
};
use super::Command;
use crate::config::DeliveryConfig;
use crate::delivery::copy::{CopyBatch, CopyOutcome, SourceInfo};
use crate::delivery::schedule::{Delivered, DeliveryDone, Job};
use crate::delivery::Failure;
use crate::error::Error;
use crate::seeded::Rng;
use crate::storage::{CommitError, CursorRow, StoredEvent, StreamRef, WriteOp};
use crate::stream::{AppendOutput, ReadOutput, ReadQuery};
use crate::stream::{Authority, CoreState, Event, Namespace, StreamAddress};

/// The event type the subscriptions select.
const MATCHED: &str = "sim.example/e";
/// An event type they pass over.
const OTHER: &str = "sim.example/other";
const PATHS: [&str; 3] = ["/a", "/b", "/c"];
/// /a's copy subscription, and where it copies to.
const COPY: &str = "copy";
const COPY_TO: &str = "/b";

/// The cores' environment: a clock the schedule moves, ids from a counter.
struct SimEnv {
    now_ms: AtomicI64,
    ids: AtomicU64,
    jitter: Mutex<Rng>,
    /// The host's lease lapse count.
    lapses: AtomicU64,
    /// A renewal that found the leases lapsed lands as the next validity
    /// check reads them (it counts the lapse, then makes them valid).
    renewal_lands: std::sync::atomic::AtomicBool,
}

impl Environment for SimEnv {
    fn now_ms(&self) -> i64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn now_us(&self) -> i64 {
        self.now_ms() * 1000
    }

    fn lease_valid(&self) -> bool {
        if self.renewal_lands.swap(false, Ordering::SeqCst) {
            self.lapses.fetch_add(1, Ordering::SeqCst);
        }
        true
    }

    fn lease_lapses(&self) -> u64 {
        self.lapses.load(Ordering::SeqCst)
    }

    fn new_id(&self) -> String {
        format!("sim-{}", self.ids.fetch_add(1, Ordering::SeqCst))
    }

    fn jitter(&self) -> f64 {
        let mut rng = self.jitter.lock().expect("jitter");
        (rng.below(2001) as f64) / 1000.0 - 1.0
    }
}

/// One stream's row in the simulated log.
struct Row {
    row_id: i64,
    events: Vec<StoredEvent>,
    head_offset: u64,
    state_json: String,
    state_offset: u64,
    cursors: BTreeMap<String, CursorRow>,
    keys: HashMap<String, u64>,
}

/// The simulated database.
#[derive(Default)]
struct Log {
    rows: HashMap<String, Row>,
    next_row: i64,
}

impl Log {
    fn row(&self, path: &str) -> Option<&Row> {
        self.rows.get(path)
    }

    /// Applies a write as the real writer does (compare-and-set on the
    /// head, unique keys), checking what it must never see.
    fn apply(&mut self, seed: u64, path: &str, op: &WriteOp) -> Result<i64, CommitError> {
        match op {
            WriteOp::Commit(c) => {
                let row_id = match &c.stream {
                    StreamRef::New(_) => {
                        if self.rows.contains_key(path) {
                            return Err(CommitError::new("the stream exists already"));
                        }
                        self.next_row += 1;
                        self.rows.insert(
                            path.to_string(),
                            Row {
                                row_id: self.next_row,
                                events: Vec::new(),
                                head_offset: 0,
                                state_json: String::new(),
                                state_offset: 0,
                                cursors: BTreeMap::new(),
                                keys: HashMap::new(),
                            },
                        );
                        self.next_row
                    }
                    StreamRef::Existing {
                        row_id,
                        expected_head,
                    } => {
                        let row = self.rows.get(path).expect("an existing stream has a row");
                        assert_eq!(row.row_id, *row_id, "seed {seed}: {path}: another row");
                        if row.head_offset != *expected_head {
                            return Err(CommitError::new(format!(
                                "the head moved: {} is not {expected_head}",
                                row.head_offset
                            )));
                        }
                        *row_id
                    }
                };
                let row = self.rows.get_mut(path).expect("row exists");
                let mut seen = HashSet::new();
                for e in &c.events {
                    if let Some(k) = &e.idempotency_key {
                        if row.keys.contains_key(k) || !seen.insert(k.clone()) {
                            if matches!(c.stream, StreamRef::New(_)) {
                                self.rows.remove(path);
                            }
                            return Err(CommitError::duplicate(format!(
                                "idempotency key {k:?} is in the log"
                            )));
                        }
                    }
                }
                for e in &c.events {
                    let last = row.events.last().map_or(0, |l| l.offset);
                    assert_eq!(
                        e.offset,
                        last + 1,
                        "seed {seed}: invariant dense-offsets: {path}: offset {} follows {last}",
                        e.offset
                    );
                    if let Some(k) = &e.idempotency_key {
                        row.keys.insert(k.clone(), e.offset);
                    }
                    row.events.push(e.clone());
                }
                row.head_offset = c.head_offset;
                row.state_json = c.state_json.clone();
                row.state_offset = c.state_offset;
                for key in &c.removed_cursors {
                    row.cursors.remove(key);
                }
                store_cursors(seed, path, row, &c.cursors);
                Ok(row_id)
            }
            WriteOp::Cursors {
                row_id, cursors, ..
            } => {
                let row = self
                    .rows
                    .get_mut(path)
                    .expect("cursors of a stream with a row");
                assert_eq!(row.row_id, *row_id);
                store_cursors(seed, path, row, cursors);
                Ok(*row_id)
            }
            other => panic!("seed {seed}: the simulation writes no {other:?}"),
        }
    }

    /// What a load reads: the state folded from the log, its cursors.
    fn load(&self, seed: u64, path: &str) -> Option<LoadedStream> {
        let row = self.rows.get(path)?;
        let state = fold(&row.events);
        if row.state_offset == row.events.last().map_or(0, |e| e.offset) {
            assert_eq!(
                state.serialized(),
                row.state_json,
                "seed {seed}: {path}: the stored state is not the fold of the log"
            );
        }
        Some(LoadedStream {
            stream: Loaded {
                row_id: row.row_id,
                state,
                state_offset: row.events.last().map_or(0, |e| e.offset),
            },
            cursors: row.cursors.values().cloned().collect(),
            checkpoints: HashMap::new(),
            unseen: Vec::new(),
        })
    }

    fn lookup(&self, path: &str, keys: &[String], offsets: &[u64]) -> Found {
        let Some(row) = self.rows.get(path) else {
            return Default::default();
        };
        let by_key = keys
            .iter()
            .filter_map(|k| {
                let offset = row.keys.get(k)?;
                Some((k.clone(), event_at(row, *offset)?))
            })
            .collect();
        let by_offset = offsets
            .iter()
            .filter_map(|o| Some((*o, event_at(row, *o)?)))
            .collect();
        (by_key, by_offset)
    }
}

fn event_at(row: &Row, offset: u64) -> Option<Event> {
    let e = row.events.iter().find(|e| e.offset == offset)?;
    Some(serde_json::from_str(&e.body).expect("stored events parse"))
}

fn fold(events: &[StoredEvent]) -> CoreState {
    let mut state: Option<CoreState> = None;
    for e in events {
        let event: Event = serde_json::from_str(&e.body).expect("stored events parse");
        match &mut state {
            None => state = Some(CoreState::from_created(&event)),
            Some(s) => s.reduce(&event),
        }
    }
    state.expect("a row holds its created event")
}

fn store_cursors(seed: u64, path: &str, row: &mut Row, cursors: &[CursorRow]) {
    for c in cursors {
        if let Some(old) = row.cursors.get(&c.subscription_key) {
            if old.generation == c.generation {
                assert!(
                    c.acknowledged_offset >= old.acknowledged_offset,
                    "seed {seed}: invariant cursor-monotonic: {path}: {:?} stored cursor {} after {}",
                    c.subscription_key,
                    c.acknowledged_offset,
                    old.acknowledged_offset
                );
            }
        }
        let head = row.events.last().map_or(0, |e| e.offset);
        assert!(
            c.acknowledged_offset <= head,
            "seed {seed}: invariant no-delivery-past-head: {path}: {:?} cursor {} past head {head}",
            c.subscription_key,
            c.acknowledged_offset
        );
        row.cursors.insert(c.subscription_key.clone(), c.clone());
    }
}

/// A request for storage the core waits for.
enum Io {
    Load,
    Lookup {
        keys: Vec<String>,
        offsets: Vec<u64>,
    },
}

struct Node {
    path: &'static str,
    core: ActorCore,
    /// The write in flight.
    commit: Option<WriteOp>,
    /// The I/O the core waits for.
    io: Option<Io>,
    /// Loads answered so far: a run's cursor may restart at its stored
    /// cursor after a load, never within one.
    loads: u64,
}

/// An append waiting for its answer.
struct Asked {
    path: &'static str,
    rx: oneshot::Receiver<Result<AppendOutput, Error>>,
}

/// A delivery job the receiver holds.
struct Held {
    path: &'static str,
    job: Job,
    source: SourceInfo,
}

/// A copy batch the receiving stream's core holds, waiting for its commit.
struct Copying {
    path: &'static str,
    job: Job,
    through: u64,
    offsets: Vec<u64>,
    rx: oneshot::Receiver<Result<CopyOutcome, Error>>,
}

struct World {
    seed: u64,
    rng: Rng,
    env: Arc<SimEnv>,
    log: Log,
    nodes: Vec<Node>,
    asked: Vec<Asked>,
    jobs: Vec<Held>,
    copies: Vec<Copying>,
    reports: Vec<(&'static str, DeliveryDone)>,
    /// Whether storage and the receiver fail now.
    failing: bool,
    /// The first offset each idempotency key was answered with.
    keyed: HashMap<(&'static str, String), u64>,
    /// Everything acknowledged, checked again at the end.
    acknowledged: Vec<(&'static str, u64, String)>,
    /// The last job cursor per run and load.
    job_cursors: HashMap<(&'static str, String, u64, u64), u64>,
    /// Offsets the receiver took, per stream.
    received: HashMap<&'static str, HashSet<u64>>,
    answered: usize,
    requests: usize,
    /// What the schedule did: commits failed before and after reaching the
    /// log, loads and lookups failed, reports lost or failed, loads.
    faults: Faults,
}

#[derive(Default, Debug, Clone, Copy)]
struct Faults {
    commits_lost: usize,
    commits_unknown: usize,
    reads_failed: usize,
    reports_lost: usize,
    reports_failed: usize,
    loads: usize,
}

impl World {
    fn new(seed: u64) -> World {
        let env = Arc::new(SimEnv {
            now_ms: AtomicI64::new(1_800_000_000_000),
            ids: AtomicU64::new(0),
            jitter: Mutex::new(Rng::new(seed ^ 0xA5A5)),
            lapses: AtomicU64::new(0),
            renewal_lands: std::sync::atomic::AtomicBool::new(false),
        });
        let config = CoreConfig {
            metrics: crate::metrics::Metrics::new(),
            delivery: DeliveryConfig {
                max_attempts: 6,
                backoff_base_ms: 100,
                backoff_max_ms: 2_000,
                timeout_ms: 1_000,
                ..DeliveryConfig::default()
            },
            idle_stream_ms: 60_000,
            ephemeral: crate::quota::EphemeralMemory::new(1 << 20),
            stored: crate::quota::StoredBytes::new(None),
            bounds: Default::default(),
        };
        let nodes = PATHS
            .iter()
            .map(|path| Node {
                path,
                core: ActorCore::new(
                    StreamAddress::new(Namespace::Project("sim".into()), path)
                        .expect("a valid path"),
                    config.clone(),
                    env.clone(),
                ),
                commit: None,
                io: None,
                loads: 0,
            })
            .collect();
        World {
            seed,
            rng: Rng::new(seed),
            env,
            log: Log::default(),
            nodes,
            asked: Vec::new(),
            jobs: Vec::new(),
            copies: Vec::new(),
            reports: Vec::new(),
            failing: true,
            keyed: HashMap::new(),
            acknowledged: Vec::new(),
            job_cursors: HashMap::new(),
            received: HashMap::new(),
            answered: 0,
            requests: 0,
            faults: Faults::default(),
        }
    }

    /// Feeds `input` to node `n` and carries out what it asks.
    fn step(&mut self, n: usize, input: Input) {
        let outputs = self.nodes[n].core.handle(input);
        for output in outputs {
            self.carry_out(n, output);
        }
        self.check_answers();
    }

    fn carry_out(&mut self, n: usize, output: Output) {
        let seed = self.seed;
        let path = self.nodes[n].path;
        match output {
            Output::Load { .. } => {
                assert!(self.nodes[n].io.is_none(), "seed {seed}: two loads at once");
                self.nodes[n].io = Some(Io::Load);
            }
            Output::Lookup { keys, offsets, .. } => {
                assert!(
                    self.nodes[n].io.is_none(),
                    "seed {seed}: two lookups at once"
                );
                self.nodes[n].io = Some(Io::Lookup { keys, offsets });
            }
            Output::Submit(op) => {
                assert!(
                    self.nodes[n].commit.is_none(),
                    "seed {seed}: invariant one-write-in-flight: {path}"
                );
                self.nodes[n].commit = Some(*op);
            }
            Output::Read(page) => {
                let head = self.log.row(path).map_or(0, |r| r.head_offset);
                assert!(
                    page.head <= head,
                    "seed {seed}: invariant no-read-past-head: {path} serves head {} of {head}",
                    page.head
                );
                let events = self
                    .log
                    .row(path)
                    .map(|r| {
                        r.events
                            .iter()
                            .filter(|e| e.offset > page.query.after_offset && e.offset <= page.head)
                            .take(page.query.limit)
                            .map(|e| {
                                serde_json::value::RawValue::from_string(String::clone(&e.body))
                            })
                            .collect::<Result<Vec<_>, _>>()
                            .expect("stored events are JSON")
                    })
                    .unwrap_or_default();
                let _ = page.reply.send(Ok(ReadOutput {
                    stream_id: page.stream_id,
                    stream_created_at: page.created_at,
                    max_offset: page.head,
                    events,
                }));
            }
            Output::Spawn { jobs, source } => {
                let head = self.log.row(path).map_or(0, |r| r.events.len() as u64);
                let loads = self.nodes[n].loads;
                for job in jobs {
                    assert!(
                        job.head <= head,
                        "seed {seed}: invariant no-delivery-past-head: {path}: job for {:?} \
                         reaches offset {}, the log's head is {head}",
                        job.key,
                        job.head
                    );
                    assert!(
                        job.cursor <= job.head,
                        "seed {seed}: a cursor past its job's head"
                    );
                    let run = (path, job.key.clone(), job.generation, loads);
                    let last = self.job_cursors.entry(run).or_insert(0);
                    assert!(
                        job.cursor >= *last,
                        "seed {seed}: invariant cursor-monotonic: {path}: {:?} job after {} \
                         starts at {}",
                        job.key,
                        *last,
                        job.cursor
                    );
                    *last = job.cursor;
                    self.jobs.push(Held {
                        path,
                        job,
                        source: source.info.clone(),
                    });
                }
            }
            Output::React { .. } => panic!("seed {seed}: no reactor is configured"),
            Output::Connected { .. } => panic!("seed {seed}: no connection is opened"),
            Output::RingEffects => panic!("seed {seed}: no effect is written"),
        }
    }

    /// Checks every append answered since the last step.
    fn check_answers(&mut self) {
        let seed = self.seed;
        let mut i = 0;
        while i < self.asked.len() {
            let answer = match self.asked[i].rx.try_recv() {
                Ok(answer) => answer,
                Err(oneshot::error::TryRecvError::Empty) => {
                    i += 1;
                    continue;
                }
                Err(oneshot::error::TryRecvError::Closed) => {
                    panic!("seed {seed}: an append was dropped unanswered")
                }
            };
            let path = self.asked.swap_remove(i).path;
            self.answered += 1;
            let Ok(out) = answer else { continue };
            let row = self.log.row(path).unwrap_or_else(|| {
                panic!("seed {seed}: invariant acknowledged-means-committed: {path} has no log")
            });
            for e in &out.events {
                let stored = event_at(row, e.offset).unwrap_or_else(|| {
                    panic!(
                        "seed {seed}: invariant acknowledged-means-committed: {path}: offset {} \
                         was acknowledged, the log ends at {}",
                        e.offset,
                        row.events.len()
                    )
                });
                assert_eq!(
                    (&stored.event_type, &stored.idempotency_key, &stored.payload),
                    (&e.event_type, &e.idempotency_key, &e.payload),
                    "seed {seed}: invariant acknowledged-means-committed: {path}: offset {} \
                     holds another event",
                    e.offset
                );
                if let Some(k) = &e.idempotency_key {
                    let first = *self.keyed.entry((path, k.clone())).or_insert(e.offset);
                    assert_eq!(
                        first, e.offset,
                        "seed {seed}: {path}: key {k:?} answered offsets {first} and {}",
                        e.offset
                    );
                }
                self.acknowledged
                    .push((path, e.offset, e.event_type.clone()));
            }
        }
    }

    fn command(&mut self, n: usize, cmd: Command) {
        self.step(n, Input::Command(cmd));
    }

    /// A client's append of one to three events, some with keys from a
    /// small pool (so retries of committed keys happen).
    fn append(&mut self, n: usize) {
        let count = 1 + self.rng.below(3);
        let mut used = HashSet::new();
        let events: Vec<_> = (0..count)
            .map(|_| {
                let keyed = self.rng.percent(30);
                let key = format!("k{}", self.rng.below(8));
                if keyed && used.insert(key.clone()) {
                    json!({"type": MATCHED, "payload": {"key": key}, "idempotencyKey": key})
                } else {
                    let t = if self.rng.percent(70) { MATCHED } else { OTHER };
                    json!({"type": t, "payload": {"n": self.rng.below(1000)}})
                }
            })
            .collect();
        self.append_json(n, json!({ "events": events }));
    }

    fn append_json(&mut self, n: usize, input: serde_json::Value) {
        let input = serde_json::from_value(input).expect("a valid append");
        let (reply, rx) = oneshot::channel();
        self.requests += 1;
        self.asked.push(Asked {
            path: self.nodes[n].path,
            rx,
        });
        self.command(
            n,
            Command::Append {
                input,
                authority: Authority::Public,
                reply,
            },
        );
    }

    /// Completes node `n`'s write: it fails before reaching the log, reaches
    /// it and is reported failed (an fsync error), or commits.
    fn complete_commit(&mut self, n: usize) {
        let Some(op) = self.nodes[n].commit.take() else {
            return;
        };
        let path = self.nodes[n].path;
        let roll = self.rng.below(100);
        let result = if self.failing && roll < 8 {
            self.faults.commits_lost += 1;
            Err(CommitError::new("simulated: the disk is full"))
        } else {
            let applied = self.log.apply(self.seed, path, &op);
            if self.failing && roll < 14 && applied.is_ok() {
                self.faults.commits_unknown += 1;
                Err(CommitError::new("simulated: fsync failed after the write"))
            } else {
                applied
            }
        };
        self.step(n, Input::Committed(result));
    }

    /// Answers node `n`'s load or lookup (failing some).
    fn answer_io(&mut self, n: usize) {
        let Some(io) = self.nodes[n].io.take() else {
            return;
        };
        let path = self.nodes[n].path;
        let fail = self.failing && self.rng.percent(10);
        self.faults.reads_failed += usize::from(fail);
        let input = match io {
            Io::Load => {
                self.nodes[n].loads += 1;
                self.faults.loads += 1;
                let result = match fail {
                    true => Err(LoadError::Failed("simulated: the read failed".into())),
                    false => Ok((None, self.log.load(self.seed, path))),
                };
                Input::Loaded(Box::new(LoadResult { lapses: 0, result }))
            }
            Io::Lookup { keys, offsets } => Input::LookedUp(match fail {
                true => Err("simulated: the lookup failed".into()),
                false => Ok(self.log.lookup(path, &keys, &offsets)),
            }),
        };
        self.step(n, input);
    }

    /// The receiver takes job `i`: it succeeds, fails, or loses its report.
    fn receive(&mut self, i: usize) {
        let Held { path, job, source } = self.jobs.swap_remove(i);
        let seed = self.seed;
        let row = self.log.row(path).expect("a delivering stream has a log");
        let mut offsets = Vec::new();
        let mut through = job.head;
        for e in row
            .events
            .iter()
            .filter(|e| e.offset > job.cursor && e.offset <= job.head)
        {
            if e.event_type == MATCHED {
                if offsets.len() == job.limit {
                    through = offsets.last().copied().unwrap_or(job.cursor);
                    break;
                }
                offsets.push(e.offset);
            }
        }
        let roll = self.rng.below(100);
        if self.failing && roll < 5 {
            self.faults.reports_lost += 1;
            return; // lost: the attempt's deadline must catch it
        }
        if job.key == COPY {
            let events = offsets
                .iter()
                .map(|o| event_at(row, *o).expect("selected from the log"))
                .collect();
            let batch = CopyBatch {
                source,
                subscription_key: job.key.clone(),
                generation: job.generation,
                transform: None,
                events,
                shaped: None,
            };
            let (reply, rx) = oneshot::channel();
            self.copies.push(Copying {
                path,
                job,
                through,
                offsets,
                rx,
            });
            let to = self.node(COPY_TO);
            return self.command(
                to,
                Command::Deliver {
                    batch: Box::new(batch),
                    reply,
                },
            );
        }
        let result = if self.failing && roll < 25 && !offsets.is_empty() {
            self.faults.reports_failed += 1;
            Err(Failure {
                message: "simulated: the receiver answered 503".into(),
                retryable: true,
                single_offset: (offsets.len() == 1).then(|| offsets[0]),
                at_offset: Some(offsets[0]),
                detail: None,
                filter: false,
                retry_after_ms: None,
            })
        } else {
            let received = self.received.entry(path).or_default();
            for o in &offsets {
                assert!(
                    *o <= row.events.len() as u64,
                    "seed {seed}: invariant no-delivery-past-head: {path}: offset {o}"
                );
                received.insert(*o);
            }
            Ok(Delivered {
                through,
                offsets,
                bytes: 0,
            })
        };
        self.reports.push((path, done(job, result)));
    }

    /// Reports copy batch `i` once the receiving core has answered it (as
    /// the copy executor does).
    fn copied(&mut self, i: usize) {
        let answer = match self.copies[i].rx.try_recv() {
            Ok(answer) => answer,
            Err(oneshot::error::TryRecvError::Empty) => return,
            Err(oneshot::error::TryRecvError::Closed) => {
                panic!("seed {}: a copy batch was dropped unanswered", self.seed)
            }
        };
        let Copying {
            path,
            job,
            through,
            offsets,
            ..
        } = self.copies.swap_remove(i);
        let result = match answer {
            Ok(_) => Ok(Delivered {
                through,
                offsets,
                bytes: 0,
            }),
            Err(e) => Err(Failure {
                retryable: !matches!(e.code, "stale-delivery" | "too-large"),
                single_offset: (offsets.len() == 1).then(|| offsets[0]),
                at_offset: offsets.first().copied(),
                ..Failure::new(e.message, true)
            }),
        };
        self.reports.push((path, done(job, result)));
    }

    fn node(&self, path: &str) -> usize {
        PATHS.iter().position(|p| *p == path).expect("a known path")
    }

    fn report(&mut self, i: usize) {
        let (path, done) = self.reports.swap_remove(i);
        let n = self.node(path);
        self.command(n, Command::DeliveryDone(Box::new(done)));
    }

    /// Moves the clock; each core whose timer is then due gets its tick.
    fn advance(&mut self, ms: i64) {
        let timers: Vec<Option<i64>> = self.nodes.iter().map(|n| n.core.next_timer_ms()).collect();
        self.env.now_ms.fetch_add(ms, Ordering::SeqCst);
        let now = self.env.now_ms();
        for (n, at) in timers.into_iter().enumerate() {
            if at.is_some_and(|at| at <= now) {
                self.step(n, Input::Tick);
            }
        }
    }

    fn read(&mut self, n: usize) {
        let (reply, mut rx) = oneshot::channel();
        let after = self.rng.below(20);
        self.command(
            n,
            Command::Read {
                query: ReadQuery {
                    after_offset: after,
                    limit: 5,
                    include_ephemeral: false,
                },
                reply,
            },
        );
        // Answered now, or once the core has what it waits for; either way
        // what it serves is checked where it is served.
        let _ = rx.try_recv();
    }

    /// One scheduled action.
    fn act(&mut self) {
        let n = self.rng.below(self.nodes.len() as u64) as usize;
        match self.rng.below(100) {
            0..=24 => self.append(n),
            25..=44 => self.complete_commit(n),
            45..=59 => self.answer_io(n),
            60..=69 if !self.jobs.is_empty() => {
                let i = self.rng.below(self.jobs.len() as u64) as usize;
                self.receive(i)
            }
            70..=74 if !self.copies.is_empty() => {
                let i = self.rng.below(self.copies.len() as u64) as usize;
                self.copied(i)
            }
            75..=79 if !self.reports.is_empty() => {
                let i = self.rng.below(self.reports.len() as u64) as usize;
                self.report(i)
            }
            80..=94 => {
                let ms = self.rng.below(400) as i64;
                self.advance(ms)
            }
            _ => self.read(n),
        }
    }

    /// Configures each stream's webhook subscription, and /a's copies to /b.
    fn configure(&mut self) {
        self.append_json(
            0,
            json!({"events": [{"type": crate::stream::types::SUBSCRIPTION_CONFIGURED,
                "payload": {"subscriptionKey": COPY, "filter": {"eventTypes": [MATCHED]},
                    "receiver": {"action": "copy-to-stream", "receivingStreamPath": COPY_TO,
                        "delivery": {"start": "beginning", "onFailingEvent": "halt"}}}}]}),
        );
        for n in 0..self.nodes.len() {
            let policy = if n == 2 { "skip" } else { "halt" };
            self.append_json(
                n,
                json!({"events": [{"type": crate::stream::types::SUBSCRIPTION_CONFIGURED,
                    "payload": {"subscriptionKey": "hook", "filter": {"eventTypes": [MATCHED]},
                        "receiver": {"action": "webhook-post", "url": "http://sim.invalid/hook",
                            "delivery": {"start": "beginning", "onFailingEvent": policy}}}}]}),
            );
        }
    }

    /// Runs every node until all is answered, written and delivered.
    fn drain(&mut self) {
        for _ in 0..2_000 {
            for n in 0..self.nodes.len() {
                self.answer_io(n);
                self.complete_commit(n);
            }
            while !self.jobs.is_empty() {
                self.receive(0);
            }
            for i in (0..self.copies.len()).rev() {
                self.copied(i);
            }
            while !self.reports.is_empty() {
                self.report(0);
            }
            let idle = self.asked.is_empty()
                && self.copies.is_empty()
                && self.nodes.iter().all(|n| n.core.drained())
                && self.nodes.iter().all(|n| n.core.next_timer_ms().is_none());
            if idle {
                return;
            }
            self.advance(500);
        }
        let state: Vec<_> = self
            .nodes
            .iter()
            .map(|n| {
                (
                    n.path,
                    n.core.drained(),
                    n.core.next_timer_ms(),
                    n.core.reload.needed(),
                )
            })
            .collect();
        panic!(
            "seed {}: the simulation did not settle: {} appends unanswered; nodes (drained, \
             timer, reload) {state:?} at {}",
            self.seed,
            self.asked.len(),
            self.env.now_ms()
        );
    }

    fn check_end(&self) {
        let seed = self.seed;
        assert_eq!(
            self.answered, self.requests,
            "seed {seed}: unanswered requests"
        );
        for (path, offset, event_type) in &self.acknowledged {
            let row = self.log.row(path).expect("acknowledged, so logged");
            let stored = event_at(row, *offset).unwrap_or_else(|| {
                panic!("seed {seed}: invariant acknowledged-means-committed: {path}@{offset} lost")
            });
            assert_eq!(&stored.event_type, event_type);
        }
        for path in PATHS {
            let Some(row) = self.log.row(path) else {
                continue;
            };
            let offsets: Vec<u64> = row.events.iter().map(|e| e.offset).collect();
            let dense: Vec<u64> = (1..=offsets.len() as u64).collect();
            assert_eq!(
                offsets, dense,
                "seed {seed}: invariant dense-offsets: {path}"
            );
            assert_eq!(
                row.head_offset,
                offsets.len() as u64,
                "seed {seed}: {path}: head"
            );
            let state = fold(&row.events);
            assert_eq!(
                state.serialized(),
                row.state_json,
                "seed {seed}: {path}: the stored state is not the fold of the log"
            );
            if path == COPY_TO {
                self.check_copies(row);
            }
            // A run that did not halt has delivered every matching event.
            let hook = state.subscriptions.outbound.by_key.get("hook");
            assert!(
                hook.is_some(),
                "seed {seed}: {path}: the subscription is configured"
            );
            if hook.is_some_and(|s| s.delivery_halted.is_none()) {
                let received = self.received.get(path).cloned().unwrap_or_default();
                // (Offsets the skip policy passed over are recorded as such.)
                let skipped: HashSet<u64> = row
                    .events
                    .iter()
                    .filter(|e| e.event_type == crate::stream::types::ERROR_OCCURRED)
                    .filter_map(|e| {
                        let event: Event = serde_json::from_str(&e.body).ok()?;
                        event.payload.get("offset")?.as_u64()
                    })
                    .collect();
                for e in row
                    .events
                    .iter()
                    .filter(|e| e.event_type == MATCHED && !skipped.contains(&e.offset))
                {
                    assert!(
                        received.contains(&e.offset),
                        "seed {seed}: {path}: matching offset {} never delivered",
                        e.offset
                    );
                }
            }
        }
    }
}

impl World {
    /// Every matching event of /a is in /b once: never twice (the copies'
    /// idempotency keys), and, unless the copy run halted, at least once.
    fn check_copies(&self, to: &Row) {
        let seed = self.seed;
        let mut copied = HashSet::new();
        for e in &to.events {
            let event: Event = serde_json::from_str(&e.body).expect("stored events parse");
            let Some(from) = event.source.as_ref().and_then(|s| s.copied_from.last()) else {
                continue;
            };
            assert!(
                copied.insert(from.offset),
                "seed {seed}: invariant copies-exactly-once: {COPY_TO} holds /a@{} twice",
                from.offset
            );
        }
        let from = self.log.row(PATHS[0]).expect("/a has a log");
        let state = fold(&from.events);
        let halted = state
            .subscriptions
            .outbound
            .by_key
            .get(COPY)
            .is_none_or(|s| s.delivery_halted.is_some());
        if !halted {
            for e in from.events.iter().filter(|e| e.event_type == MATCHED) {
                assert!(
                    copied.contains(&e.offset),
                    "seed {seed}: /a@{} was never copied to {COPY_TO}",
                    e.offset
                );
            }
        }
    }
}

fn run(seed: u64, steps: usize) -> World {
    let mut world = World::new(seed);
    for n in 0..world.nodes.len() {
        world.step(n, Input::Tick);
    }
    // The subscriptions are configured before anything fails.
    world.failing = false;
    world.configure();
    world.drain();
    world.failing = true;
    for _ in 0..steps {
        world.act();
    }
    // The failures stop; everything must settle.
    world.failing = false;
    world.drain();
    world.check_end();
    world
}

#[test]
fn seeded_schedules_of_storage_and_receiver_failures_keep_the_logs_invariants() {
    let seeds: u64 = std::env::var("STREAMHOST_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let mut appended = 0;
    let mut delivered = 0;
    let mut copied = 0;
    let mut faults = Vec::new();
    for seed in 1..=seeds {
        let world = run(seed, 300);
        appended += world
            .log
            .rows
            .values()
            .map(|r| r.events.len())
            .sum::<usize>();
        delivered += world.received.values().map(HashSet::len).sum::<usize>();
        copied += world.log.row(COPY_TO).map_or(0, |r| {
            r.events
                .iter()
                .filter(|e| e.body.contains("\"copiedFrom\""))
                .count()
        });
        faults.push(world.faults);
    }
    // The schedules did work, and met every kind of failure.
    let total = |f: fn(&Faults) -> usize| faults.iter().map(f).sum::<usize>();
    let seeds = seeds as usize;
    println!(
        "{seeds} seeds: {appended} events committed, {delivered} delivered, {copied} copied; {:?}",
        Faults {
            commits_lost: total(|f| f.commits_lost),
            commits_unknown: total(|f| f.commits_unknown),
            reads_failed: total(|f| f.reads_failed),
            reports_lost: total(|f| f.reports_lost),
            reports_failed: total(|f| f.reports_failed),
            loads: total(|f| f.loads),
        }
    );
    assert!(appended > seeds * 20, "only {appended} events committed");
    assert!(delivered > seeds * 5, "only {delivered} events delivered");
    assert!(copied > seeds * 5, "only {copied} events copied");
    assert!(
        total(|f| f.commits_lost) >= seeds,
        "commits that never reach the log"
    );
    assert!(
        total(|f| f.commits_unknown) >= seeds / 2,
        "commits reported failed that did reach it"
    );
    assert!(
        total(|f| f.reads_failed) >= seeds / 2,
        "failed loads and lookups"
    );
    assert!(
        total(|f| f.reports_lost) >= seeds / 4,
        "lost delivery reports"
    );
    assert!(total(|f| f.reports_failed) >= seeds, "failed deliveries");
}

#[test]
fn a_commit_that_fails_after_reaching_the_log_is_answered_as_failed_and_its_retry_replays() {
    // One stream, one keyed append whose commit reaches the log and is
    // reported failed: the client sees an error, the core loads again, and
    // the retry with the same key answers the committed offset.
    let mut w = World::new(7);
    w.failing = false;
    let body =
        json!({"events": [{"type": MATCHED, "payload": {"key": "x"}, "idempotencyKey": "x"}]});
    w.append_json(0, body.clone());
    w.answer_io(0); // the first load finds no stream
    let op = w.nodes[0].commit.take().expect("a write in flight");
    let applied = w.log.apply(7, "/a", &op);
    assert!(applied.is_ok());
    w.step(
        0,
        Input::Committed(Err(CommitError::new("simulated: fsync failed"))),
    );
    assert_eq!(w.answered, 1, "the failed commit was answered");
    assert!(w.acknowledged.is_empty(), "and not as a success");
    w.append_json(0, body);
    assert!(matches!(w.nodes[0].io, Some(Io::Load)), "it loads first");
    // Loaded again, the key is not among the recent ones: the round is
    // planned as new, the log's index refuses it, and it is planned again
    // with its key read from the log.
    for _ in 0..10 {
        w.answer_io(0);
        w.complete_commit(0);
    }
    assert_eq!(w.answered, 2);
    assert_eq!(w.log.row("/a").map(|r| r.events.len()), Some(2));
    assert_eq!(
        w.acknowledged
            .iter()
            .map(|(_, o, _)| *o)
            .collect::<Vec<_>>(),
        vec![2],
        "the retry answers the committed offset (1 is the stream's creation)"
    );
}

#[test]
fn a_retry_of_a_recent_key_is_read_from_the_log_and_a_new_key_is_not() {
    // A keyed append commits; its retry (the stream still loaded) is read
    // from the log before planning and answered with the committed offset,
    // with no second write; a new key goes to its commit unread.
    let mut w = World::new(11);
    w.failing = false;
    let keyed = |key: &str| json!({"events": [{"type": MATCHED, "payload": {"key": key}, "idempotencyKey": key}]});
    w.append_json(0, keyed("x"));
    w.answer_io(0); // the first load finds no stream
    w.complete_commit(0);
    assert_eq!(w.acknowledged.len(), 1);

    w.append_json(0, keyed("x"));
    match &w.nodes[0].io {
        Some(Io::Lookup { keys, .. }) => assert_eq!(keys, &vec!["x".to_string()]),
        _ => panic!("the retry's key is read first"),
    }
    assert!(
        w.nodes[0].commit.is_none(),
        "nothing written before the read"
    );
    w.answer_io(0);
    assert!(w.nodes[0].commit.is_none(), "a replay writes nothing");
    assert_eq!(w.answered, 2);
    assert_eq!(w.log.row("/a").map(|r| r.events.len()), Some(2));
    let offsets: Vec<u64> = w.acknowledged.iter().map(|(_, o, _)| *o).collect();
    assert_eq!(
        offsets,
        vec![2, 2],
        "the retry answers the committed offset"
    );

    w.append_json(0, keyed("y"));
    assert!(w.nodes[0].io.is_none(), "a new key is not read");
    assert!(w.nodes[0].commit.is_some(), "it goes to its commit");
    w.complete_commit(0);
    assert_eq!(w.log.row("/a").map(|r| r.events.len()), Some(3));
}

/// The report of `job`'s attempt.
fn done(job: Job, result: Result<Delivered, Failure>) -> DeliveryDone {
    DeliveryDone {
        key: job.key,
        generation: job.generation,
        id: job.id,
        duration: std::time::Duration::from_millis(1),
        result,
    }
}

/// The answer to a load that finds /a owned by another host.
fn owned_elsewhere() -> Input {
    Input::Loaded(Box::new(LoadResult {
        lapses: 0,
        result: Err(LoadError::OwnedElsewhere {
            path: "/a".into(),
            url: "http://other.invalid".into(),
            owner: "other".into(),
        }),
    }))
}

#[test]
fn a_reload_that_finds_the_stream_owned_elsewhere_asks_for_nothing_more_and_lets_the_actor_go() {
    // A deposed owner (several hosts): its commit fails, the reload due at
    // once finds another host owning the stream. The core must not load
    // again on its own (its runtime carries out each load's follow-up in
    // the same step: a reload scheduled in the past would loop), and the
    // actor may leave memory.
    let mut w = World::new(11);
    w.failing = false;
    w.append_json(0, json!({"events": [{"type": MATCHED}]}));
    w.answer_io(0);
    w.complete_commit(0);
    w.append_json(0, json!({"events": [{"type": MATCHED}]}));
    w.nodes[0].commit.take().expect("a write in flight");
    w.step(
        0,
        Input::Committed(Err(CommitError::new("simulated: fenced out"))),
    );
    assert!(
        matches!(w.nodes[0].io, Some(Io::Load)),
        "the first failure reloads at once"
    );
    w.nodes[0].io = None;
    w.nodes[0].loads += 1;
    w.step(0, owned_elsewhere());
    assert!(w.nodes[0].io.is_none(), "no second load without a request");
    assert_eq!(
        w.nodes[0].core.next_timer_ms(),
        None,
        "and no timer for one"
    );
    assert!(
        w.nodes[0].core.releasable(),
        "nothing of the stream stays here"
    );
    assert_eq!(w.answered, 2);
    // A request asks again, and is answered with where the stream lives.
    let (reply, mut rx) = oneshot::channel();
    w.command(0, Command::State { reply });
    assert!(matches!(w.nodes[0].io, Some(Io::Load)));
    w.nodes[0].io = None;
    w.step(0, owned_elsewhere());
    let err = rx
        .try_recv()
        .expect("answered")
        .expect_err("owned elsewhere");
    assert_eq!(err.owner_url.as_deref(), Some("http://other.invalid"));
    assert!(w.nodes[0].io.is_none());
}

#[test]
fn an_actor_started_only_by_questions_for_its_predecessor_leaves_once_idle() {
    // A scrape's `Lags` or a sweep's `IdleCheck` that raced into an actor
    // as it released itself start no successor; and an actor that never
    // loaded, holding nothing, leaves once idle like any other instead of
    // waiting for a use that may never come.
    let mut w = World::new(12);
    let (reply, mut lags) = oneshot::channel();
    w.command(0, Command::Lags { reply });
    w.command(0, Command::IdleCheck);
    assert!(w.nodes[0].io.is_none(), "nothing loaded for questions");
    assert_eq!(lags.try_recv().expect("answered"), Vec::new());
    assert!(!w.nodes[0].core.releasable(), "not before the idle period");
    w.advance(60_001);
    w.command(0, Command::IdleCheck);
    assert!(w.nodes[0].core.releasable(), "idle and holding nothing");
}

/// Node 0's load answered with a fence (several hosts), as its log holds
/// /a now, at the host's lapse count.
fn load_fenced(w: &mut World, epoch: i64) {
    assert!(matches!(w.nodes[0].io, Some(Io::Load)), "a load asked for");
    w.nodes[0].io = None;
    w.nodes[0].loads += 1;
    let fence = crate::storage::Fence {
        project: "sim".into(),
        path: "/a".into(),
        owner: "this".into(),
        epoch,
    };
    let lapses = w.env.lease_lapses();
    let stream = w.log.load(w.seed, "/a");
    w.step(
        0,
        Input::Loaded(Box::new(LoadResult {
            lapses,
            result: Ok((Some(fence), stream)),
        })),
    );
}

#[test]
fn a_renewal_that_finds_the_leases_lapsed_between_two_looks_leaves_nothing_answered_from_stale_state(
) {
    // Several hosts. This host's leases lapsed (a pause) and another host
    // appended to /a meanwhile; this host's renewal lands just as the core
    // looks at its lease: after it looked at the lapse count, before it
    // looked at the validity. Neither a read nor a compare-and-append may
    // be answered from the state of before the lapse.
    let mut w = World::new(13);
    w.failing = false;
    w.append_json(0, json!({"events": [{"type": MATCHED}]}));
    load_fenced(&mut w, 1);
    w.complete_commit(0);
    assert_eq!(w.answered, 1);
    let head = |w: &World| w.log.row("/a").map(|r| r.events.len()).unwrap_or(0) as u64;
    let before = head(&w);
    let mut other = World::new(13);
    other.failing = false;
    // The other host's append, straight into the shared log.
    let other_appends = |w: &mut World, other: &mut World| {
        other.log = std::mem::take(&mut w.log);
        other.append_json(0, json!({"events": [{"type": MATCHED}]}));
        other.answer_io(0);
        other.complete_commit(0);
        w.log = std::mem::take(&mut other.log);
    };
    other_appends(&mut w, &mut other);
    assert_eq!(head(&w), before + 1);

    // A read: served from the stream loaded again, not the stale state.
    w.env.renewal_lands.store(true, Ordering::SeqCst);
    let (reply, mut rx) = oneshot::channel();
    w.command(0, Command::State { reply });
    load_fenced(&mut w, 2);
    let state = rx.try_recv().expect("answered").expect("the state");
    assert_eq!(state.max_offset, before + 1, "the state after the lapse");

    // A compare-and-append planned on the state before a lapse, the
    // renewal landing as its refusal is answered: not `offset-conflict`
    // against a stale head.
    other_appends(&mut w, &mut other);
    let now = head(&w);
    w.env.renewal_lands.store(true, Ordering::SeqCst);
    let (reply, mut rx) = oneshot::channel();
    let input = serde_json::from_value(json!({"events": [{"type": MATCHED, "offset": now + 1}]}))
        .expect("a valid append");
    w.command(
        0,
        Command::Append {
            input,
            authority: Authority::Public,
            reply,
        },
    );
    match rx.try_recv() {
        Ok(Err(e)) => assert_ne!(
            e.code, "offset-conflict",
            "a compare-and-append refused against the stale head: {}",
            e.message
        ),
        Ok(Ok(out)) => panic!("appended on a stale head: {out:?}"),
        Err(_) => assert!(
            matches!(w.nodes[0].io, Some(Io::Load)),
            "not answered, so it must be loading again"
        ),
    }
}

/// A read of `/a` from node 0; its answer, if it came at once.
fn read_now(w: &mut World) -> oneshot::Receiver<Result<ReadOutput, Error>> {
    let (reply, rx) = oneshot::channel();
    w.command(
        0,
        Command::Read {
            query: ReadQuery {
                after_offset: 0,
                limit: 10,
                include_ephemeral: false,
            },
            reply,
        },
    );
    rx
}

#[test]
fn a_read_beside_a_round_that_settles_an_effect_waits_for_it_and_reads_its_event() {
    // An append effect's settlement commits with its event, and the outbox
    // shows it as soon as the commit lands, before the core has the
    // result: a read that arrives while such a round is in flight is
    // answered once its result is in, with the event. A read beside any
    // other round is answered at once, from what has committed.
    let mut w = World::new(11);
    w.failing = false;
    w.append_json(
        0,
        json!({"events": [{"type": MATCHED, "payload": {"n": 1}}]}),
    );
    w.answer_io(0); // the first load finds no stream
    assert!(w.nodes[0].commit.is_some(), "the plain round is in flight");
    let mut plain = read_now(&mut w);
    let refused = plain
        .try_recv()
        .expect("answered at once beside a plain round");
    assert_eq!(
        refused.unwrap_err().code,
        "stream-not-found",
        "from what has committed: nothing yet"
    );
    w.complete_commit(0);

    let input = serde_json::from_value(json!({"events": [{
        "type": MATCHED,
        "payload": {"n": 2},
        "idempotencyKey": "effect:effector:/jobs:note",
        "source": {"effect": {"path": "/jobs", "streamId": "s-1", "component": "effector",
                              "key": "note", "checkpointOffset": 1}}
    }]}))
    .expect("a valid append");
    let (reply, _answer) = oneshot::channel();
    w.command(
        0,
        Command::Append {
            input,
            authority: Authority::Effect(7),
            reply,
        },
    );
    for _ in 0..3 {
        if w.nodes[0].commit.is_some() {
            break;
        }
        w.answer_io(0); // the key's lookup, if the round reads it
    }
    let Some(WriteOp::Commit(commit)) = &w.nodes[0].commit else {
        panic!("the effect's round is in flight");
    };
    assert_eq!(
        commit.settled.as_ref().map(|s| s.ids.clone()),
        Some(vec![7]),
        "the round settles the effect, by its id"
    );
    let mut beside = read_now(&mut w);
    assert!(
        beside.try_recv().is_err(),
        "a read beside the settling round waits for its result"
    );
    w.complete_commit(0);
    let page = beside
        .try_recv()
        .expect("answered once the round's result is in")
        .expect("the stream exists");
    assert_eq!(
        page.max_offset, 3,
        "creation, the plain event, the effect's"
    );
    assert_eq!(page.events.len(), 3);
}
