//! One wake of a processor instance: load its checkpoint and component, read
//! the events after the checkpoint (the subscription's filter ∩ the
//! processor's `consumes`), fold them, and produce the checkpoint to commit.
//! Runs on a blocking thread; the caller commits the checkpoint.

use std::sync::Arc;

use serde_json::Value;

use super::keyed::{Bucket, Session};
use super::runtime::{Batch, Determinism, GuestError, Prepared, Runtime, StreamInfo};
use streamhost_core::clock::format_timestamp;
use streamhost_core::delivery::select::select_batch;
use streamhost_core::delivery::Failure;
use streamhost_core::effect::{check, Returned, ReturnedEffect};
use streamhost_core::filter::CompiledFilter;
use streamhost_storage::{Checkpoint, NewEffect, Storage};

/// Largest processor state, in bytes.
pub const PROCESSOR_STATE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Stored events read per wake.
const SCAN_EVENTS_MAX: usize = 1000;

/// Everything one wake needs.
pub struct WakeJob {
    pub storage: Storage,
    pub runtime: Arc<Runtime>,
    pub row_id: i64,
    pub project: String,
    pub component: String,
    pub stream: StreamInfo,
    /// The last committed durable offset of the stream.
    pub head: u64,
    pub limit: usize,
    pub filter: CompiledFilter,
    pub timeout_ms: u64,
    pub now_ms: i64,
    /// A refold is under way: run the checkpoint's version.
    pub pinned: bool,
    /// The source's owner's lease (several hosts), checked by the commit.
    pub fence: Option<streamhost_storage::Fence>,
    /// Tells whether the host gave up on this wake (its deadline passed):
    /// then no guest runs any more and nothing commits.
    pub gate: std::sync::Arc<Gate>,
    /// What the wake saw, for its span (kept whether it succeeds or fails).
    pub seen: Arc<Seen>,
}

/// What a wake saw, for its span: the trace context of the latest traced
/// event it chose to fold, and the lines its guest calls wrote.
#[derive(Debug, Default)]
pub struct Seen {
    trace: std::sync::OnceLock<streamhost_core::trace::Trace>,
    /// The lines the guest wrote (bounded).
    pub output: super::runtime::Output,
}

impl Seen {
    /// The trace context of the latest traced event the wake chose.
    pub fn trace(&self) -> Option<&streamhost_core::trace::Trace> {
        self.trace.get()
    }
}

/// A wake that produced a checkpoint to commit.
pub struct Woken {
    pub checkpoint: Checkpoint,
    pub offsets: Vec<u64>,
}

fn failure(message: String, retryable: bool) -> Failure {
    Failure::new(message, retryable)
}

/// Where a wake starts.
struct Start {
    /// The stored checkpoint it replaces.
    previous: Option<streamhost_storage::CheckpointId>,
    /// The offset to read after.
    offset: u64,
    state: String,
    /// The keyed state as of the checkpoint, and its bucket id.
    bucket: Bucket,
    bucket_id: i64,
    /// The old lifetime's bucket, dropped with the commit.
    drop_bucket: Option<i64>,
}

/// Where the processor's checkpoint starts.
fn start(job: &WakeJob, prepared: &super::runtime::Prepared) -> Result<Start, Failure> {
    let row = job
        .storage
        .checkpoint(job.row_id, &job.component)
        .map_err(|e| failure(format!("reading the checkpoint failed: {e:#}"), true))?;
    match row {
        Some(c) if c.stream_id == job.stream.stream_id => {
            // (Bucket 0: a checkpoint from before keyed state, no keys yet.)
            let (bucket, bucket_id) = if c.bucket == 0 {
                (Bucket::empty(), job.storage.new_bucket())
            } else {
                let tag = streamhost_storage::key_tag(&c.id());
                let stored = job.storage.stored_bucket(c.bucket, &tag);
                (Bucket::new(Arc::new(stored)), c.bucket)
            };
            Ok(Start {
                previous: Some(c.id()),
                offset: c.checkpoint_offset,
                state: c.state,
                bucket,
                bucket_id,
                drop_bucket: None,
            })
        }
        other => {
            // A new source lifetime (or a first wake): start from nothing,
            // in a new, empty bucket.
            let state = job
                .runtime
                .initial_state(&job.component, prepared, job.timeout_ms)
                .map_err(|e| guest_failure(&job.component, "initial-state", e))?;
            Ok(Start {
                drop_bucket: other.as_ref().map(|c| c.bucket).filter(|b| *b != 0),
                previous: other.map(|c| c.id()),
                offset: 0,
                state,
                bucket: Bucket::empty(),
                bucket_id: job.storage.new_bucket(),
            })
        }
    }
}

fn guest_failure(component: &str, call: &str, e: GuestError) -> Failure {
    let retryable = e.retryable();
    let message = match e {
        // The guest's own words first (a thrown error with its file and
        // line, an exception with its traceback, `Failure.fatal`'s text),
        // then whose they are.
        GuestError::Failure { message, .. } => {
            format!("{message}\n(the failure processor {component:?} returned from {call})")
        }
        e => format!("processor {component:?} {call}: {e}"),
    };
    failure(message, retryable)
}

/// The subscription's filter narrowed to the event types the processor
/// announces it consumes (none announced: all).
pub fn consumed(
    mut filter: CompiledFilter,
    announcement: &super::runtime::Announcement,
) -> CompiledFilter {
    if !announcement.consumes.is_empty() {
        filter.event_types = Some(match filter.event_types.take() {
            None => announcement.consumes.clone(),
            Some(types) => types
                .into_iter()
                .filter(|t| announcement.consumes.contains(t))
                .collect(),
        });
    }
    filter
}

/// Committed events as a batch's `events`: one JSON array of the events as
/// the HTTP API serves them.
pub fn batch_events(events: &[streamhost_core::stream::Event]) -> String {
    // Serializing plain data (strings, numbers, JSON maps) cannot fail.
    serde_json::to_string(events).expect("events serialize")
}

/// The component a wake runs: the deployed one, or, while the instance is
/// being refolded by a new version, the version of its checkpoint (the old
/// state is served, and advanced, by the old code until the switch).
fn component_of(job: &WakeJob) -> anyhow::Result<Option<Arc<Prepared>>> {
    // Pinned by the refold's record in the database, not by one host's
    // memory: with several hosts the refold may run on another host.
    if job.pinned || job.storage.refold_pending(&job.project, &job.component)? {
        if let Some(c) = job.storage.checkpoint(job.row_id, &job.component)? {
            let storage = job.storage.clone();
            let digest = c.digest.clone();
            return Ok(Some(
                job.runtime
                    .prepare(&c.digest, move || storage.component_bytes(&digest))?,
            ));
        }
    }
    Ok(super::deployed(&job.storage, &job.runtime, &job.project, &job.component)?.map(|(p, _)| p))
}

/// The failure of a wake the host gave up on (never reported: the timeout
/// was).
fn gave_up(component: &str) -> Failure {
    failure(
        format!("the wake of processor {component:?} was given up on (its deadline passed)"),
        true,
    )
}

/// Runs one wake (blocking).
pub fn wake(job: WakeJob) -> Result<Woken, Failure> {
    let prepared = component_of(&job)
        .map_err(|e| {
            failure(
                format!("loading component {:?} failed: {e:#}", job.component),
                true,
            )
        })?
        .ok_or_else(|| {
            failure(
                format!("component {:?} is not deployed", job.component),
                true,
            )
        })?;
    // Compiling a large component may take longer than the wake's deadline.
    if job.gate.abandoned() {
        return Err(gave_up(&job.component));
    }
    let announcement = job
        .runtime
        .describe(&job.component, &prepared, job.timeout_ms)
        .map_err(|e| guest_failure(&job.component, "describe", e))?;
    let Start {
        previous,
        offset: checkpoint,
        state,
        bucket,
        bucket_id,
        drop_bucket,
    } = start(&job, &prepared)?;
    let stored = job
        .storage
        .events_after(job.row_id, checkpoint, SCAN_EVENTS_MAX, job.head)
        .map_err(|e| failure(format!("reading the stream failed: {e:#}"), true))?;
    let filter = consumed(job.filter.clone(), &announcement);
    let selection = select_batch(
        &format!("processor {}", job.component),
        &stored,
        &filter,
        job.limit,
        checkpoint,
    )?;
    assert!(
        selection.through >= checkpoint
            && selection
                .events
                .iter()
                .all(|e| e.offset > checkpoint && e.offset <= selection.through),
        "invariant processor-state-is-the-fold: a wake from checkpoint {checkpoint} folds only \
         events after it, through {}",
        selection.through
    );
    let offsets: Vec<u64> = selection.events.iter().map(|e| e.offset).collect();
    if let Some(trace) = selection.events.iter().rev().find_map(|e| e.trace.clone()) {
        let _ = job.seen.trace.set(trace);
    }
    let (new_state, effects, bucket) = if selection.events.is_empty() {
        (state, Vec::new(), bucket)
    } else {
        let guest = Guest {
            runtime: &job.runtime,
            prepared: &prepared,
            component: &job.component,
            timeout_ms: job.timeout_ms,
            output: Some(&job.seen.output),
        };
        fold_events(
            &guest,
            &job.stream,
            &state,
            &selection.events,
            selection.through,
            bucket,
        )?
    };
    Ok(Woken {
        checkpoint: Checkpoint {
            row_id: job.row_id,
            component: job.component.clone(),
            stream_id: job.stream.stream_id.clone(),
            previous_offset: previous,
            offset: selection.through,
            state: new_state,
            digest: prepared.digest.clone(),
            effects,
            bucket: bucket_id,
            keys: bucket.into_writes(),
            drop_bucket,
            adopts_scratch: false,
            updated_at: format_timestamp(job.now_ms),
            now_ms: job.now_ms,
            project: job.project.clone(),
            path: job.stream.path.clone(),
            fence: job.fence.clone(),
        },
        offsets,
    })
}

/// A loaded component to call.
pub struct Guest<'a> {
    pub runtime: &'a Runtime,
    pub prepared: &'a Prepared,
    pub component: &'a str,
    pub timeout_ms: u64,
    /// Where the lines the guest writes go (a wake's span), if anywhere.
    pub output: Option<&'a super::runtime::Output>,
}

/// Folds one batch of (non-empty) `events`, scanned through `through`, from
/// `state`: the new state, checked (JSON, bounded), and the batch's effects,
/// checked. The wake, verify, backfill and refold all fold through here.
///
/// The batch is folded in one call with the environment of its first event
/// ([`Determinism::for_event`]). A guest that read its clock or random bytes
/// during that call saw a value that depends on where the batch was cut, so
/// its result is dropped and the batch is folded again one event per call,
/// each with its own event's environment: what it computes then depends on
/// the events alone, never on the batching (see ARCHITECTURE.md,
/// "Deterministic folds"). A batch that fails for good (a trap, a failure
/// the guest says is not retryable) is folded one event per call too, so
/// the failure names the event that causes it.
pub fn fold_events(
    guest: &Guest<'_>,
    stream: &StreamInfo,
    state: &str,
    events: &[streamhost_core::stream::Event],
    through: u64,
    bucket: Bucket,
) -> Result<(String, Vec<NewEffect>, Bucket), Failure> {
    let env = |e: &streamhost_core::stream::Event| {
        Determinism::for_event(&stream.stream_id, e.offset, created_ms(&e.created_at))
    };
    let whole = env(&events[0]);
    let witness = whole.witness.clone();
    let clock_ms = created_ms(&events[events.len() - 1].created_at);
    let cause = Cause::of(events);
    let folded = fold_call(guest, stream, state, events, through, whole, bucket);
    // A batch that failed for good is folded again one event per call, to
    // name the event that fails (the calls are deterministic).
    let locate = matches!(&folded, Err((f, _)) if !f.retryable);
    if events.len() == 1 || !(witness.read() || locate) {
        let (state_after, returned, session) = folded.map_err(|(f, _)| *f)?;
        let causes = vec![cause; returned.len()];
        let effects = checked_effects(guest.component, &returned, &causes, through, clock_ms)?;
        return Ok((state_after, effects, session.keep()));
    }
    // The whole batch's call is dropped, its writes with it.
    let (mut bucket, batch_failure) = match folded {
        Ok((_, _, session)) => (session.drop_writes(), None),
        Err((f, bucket)) => (bucket, Some(*f)),
    };
    let mut state = state.to_string();
    let mut returned = Vec::new();
    let mut causes = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let scanned = if i + 1 == events.len() {
            through
        } else {
            e.offset
        };
        let (next, mut effects, session) = fold_call(
            guest,
            stream,
            &state,
            std::slice::from_ref(e),
            scanned,
            env(e),
            bucket,
        )
        .map_err(|(mut f, _)| {
            // What became of the events before it: a wake commits whole.
            f.message = format!(
                "{}\n(none of this wake's {} events, offsets {}–{}, was committed: the checkpoint \
                 stays before offset {}; {} event(s) before offset {} fold without failing and are \
                 folded again when the processor resumes)",
                f.message,
                events.len(),
                events[0].offset,
                events[events.len() - 1].offset,
                events[0].offset,
                i,
                e.offset
            );
            *f
        })?;
        bucket = session.keep();
        state = next;
        causes.extend(std::iter::repeat_n(
            Cause::of(std::slice::from_ref(e)),
            effects.len(),
        ));
        returned.append(&mut effects);
    }
    if let Some(f) = batch_failure {
        // Every event folds alone: the batch failed as a whole.
        return Err(f);
    }
    let effects = checked_effects(guest.component, &returned, &causes, through, clock_ms)?;
    Ok((state, effects, bucket))
}

/// Milliseconds since the epoch of an RFC 3339 timestamp (0 if it is not one).
pub fn created_ms(created_at: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(created_at)
        .map(|t| t.timestamp_millis())
        .unwrap_or(0)
}

/// One fold call's outcome: the new state, the returned effects and the
/// call's session (its writes not yet kept), or the failure and the bucket
/// as it was before the call.
type Call = Result<(String, Vec<super::runtime::Effect>, Session), (Box<Failure>, Bucket)>;

/// One fold call, its state checked; a failure carries the repro command
/// (with the keys the call read) and names the environment the call ran
/// with.
fn fold_call(
    guest: &Guest<'_>,
    stream: &StreamInfo,
    state: &str,
    events: &[streamhost_core::stream::Event],
    through: u64,
    env: Determinism,
    bucket: Bucket,
) -> Call {
    let component = guest.component;
    let batch = Batch {
        stream: stream.clone(),
        events: batch_events(events),
        scanned_through_offset: through,
    };
    let (clock_ms, seed) = (env.wall_clock_ms, env.seed_hex());
    let witness = env.witness.clone();
    let (folded, session) = guest.runtime.fold(
        component,
        guest.prepared,
        state,
        &batch,
        env,
        guest.timeout_ms,
        bucket.session(),
        guest.output,
    );
    let folded = match folded {
        Ok(f) => f,
        Err(e) => {
            let (bucket, read) = session.failed();
            let mut f = guest_failure(component, "fold", e);
            // The environment matters only to a call that read it.
            if witness.read() {
                f.message = format!(
                    "{} (the call read its clock or random bytes: the clock read {clock_ms} ms \
                     and the seed was {seed}; `streamhost fold --clock-ms {clock_ms} --seed {seed}` \
                     replays it)",
                    f.message
                );
            }
            f.single_offset = (events.len() == 1).then_some(events[0].offset);
            f.at_offset = Some(events[0].offset);
            // The repro holds the whole state and batch: it goes with the
            // processor's last failure, not into the halt fact.
            f.detail = Some(super::wave::fold_command(
                &format!("{component}.wasm"),
                state,
                &batch,
                guest.prepared.keyed().then_some(&read[..]),
            ));
            return Err((Box::new(f), bucket));
        }
    };
    let refuse = |mut f: Failure, session: Session| {
        f.at_offset = Some(events[0].offset);
        Err((Box::new(f), session.drop_writes()))
    };
    if folded.state.len() > PROCESSOR_STATE_BYTES_MAX {
        return refuse(
            failure(
                format!(
                    "processor {component:?} returned a state of {} bytes, over the {PROCESSOR_STATE_BYTES_MAX}-byte limit",
                    folded.state.len()
                ),
                false,
            ),
            session,
        );
    }
    if let Err(e) = serde_json::from_str::<Value>(&folded.state) {
        return refuse(
            failure(
                format!("processor {component:?} returned a state that is not JSON: {e}"),
                false,
            ),
            session,
        );
    }
    Ok((folded.state, folded.effects, session))
}

/// An effect as the guest returned it, for [`streamhost_core::effect::check`].
pub fn returned(e: &super::runtime::Effect) -> ReturnedEffect<'_> {
    use super::runtime::EffectTarget;
    let target = match &e.target {
        EffectTarget::Append(a) => Returned::Append {
            stream_path: &a.stream_path,
            event_type: &a.type_,
            payload: &a.payload,
            metadata: a.metadata.as_deref(),
        },
        EffectTarget::Webhook(w) => Returned::Webhook {
            url: &w.url,
            body: &w.body,
        },
        EffectTarget::Itx(x) => Returned::Itx {
            expression: &x.expression,
            args: &x.args,
        },
        EffectTarget::Cancel(key) => Returned::Cancel { key },
    };
    ReturnedEffect {
        key: &e.key,
        target,
        not_before: e.not_before,
        effect_type: e.type_.as_deref(),
        metadata: e.metadata.as_deref(),
        group: e.group.as_deref(),
    }
}

/// What caused the effects of one fold call: the offsets it folded and
/// the trace context the latest of them carried.
#[derive(Debug, Clone, Copy)]
pub struct Cause<'a> {
    pub from_offset: u64,
    pub to_offset: u64,
    pub trace: Option<&'a streamhost_core::trace::Trace>,
}

impl<'a> Cause<'a> {
    /// The cause of what a call folding `events` (non-empty) returned.
    pub fn of(events: &'a [streamhost_core::stream::Event]) -> Cause<'a> {
        Cause {
            from_offset: events.first().map_or(0, |e| e.offset),
            to_offset: events.last().map_or(0, |e| e.offset),
            trace: events.iter().rev().find_map(|e| e.trace.as_ref()),
        }
    }
}

/// The effects a fold returned, checked and in their stored form; a bad one
/// fails the fold (not retryable: the same events give the same effects),
/// naming it. `clock_ms` is the time of the batch's last event (a
/// `not-before` is bounded from it).
pub fn checked_effects(
    component: &str,
    returned: &[super::runtime::Effect],
    causes: &[Cause<'_>],
    checkpoint_offset: u64,
    clock_ms: i64,
) -> Result<Vec<NewEffect>, Failure> {
    let mut seen = std::collections::HashSet::new();
    let mut effects = Vec::with_capacity(returned.len());
    for (i, e) in returned.iter().enumerate() {
        let at = format!("effects[{i}]");
        let checked = check(&at, self::returned(e), clock_ms).map_err(|m| {
            failure(
                format!("processor {component:?} returned a bad effect: {m}"),
                false,
            )
        })?;
        // The first of two effects with one key in a batch wins, as a later
        // batch's would be ignored.
        if seen.insert(e.key.as_str()) {
            let checked = match causes.get(i) {
                Some(c) => checked.caused_by(c.from_offset, c.to_offset, c.trace),
                None => checked,
            };
            effects.push(NewEffect::of(checked, checkpoint_offset));
        }
    }
    Ok(effects)
}

/// Decides, once, between an attempt's commit and the host giving up on
/// it at its deadline: whichever comes first wins, so an attempt the host
/// gave up on commits nothing afterwards (its late result is discarded),
/// and an attempt whose commit has begun is waited for, not reported as
/// timed out while its commit lands.
#[derive(Debug, Default)]
pub struct Gate(std::sync::atomic::AtomicU8);

const GATE_OPEN: u8 = 0;
const GATE_COMMITTING: u8 = 1;
const GATE_ABANDONED: u8 = 2;

impl Gate {
    fn swap_from_open(&self, to: u8) -> bool {
        use std::sync::atomic::Ordering;
        self.0
            .compare_exchange(GATE_OPEN, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The attempt is about to commit: `false` once the host gave up on it
    /// (then it must commit nothing).
    pub fn begin_commit(&self) -> bool {
        self.swap_from_open(GATE_COMMITTING)
    }

    /// The host gives up on the attempt: `true` when no commit had begun
    /// (none will), `false` when one has (its result is the attempt's).
    pub fn abandon(&self) -> bool {
        self.swap_from_open(GATE_ABANDONED)
    }

    /// Whether the host gave up on the attempt.
    pub fn abandoned(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire) == GATE_ABANDONED
    }
}
