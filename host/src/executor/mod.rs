//! The executing half of the delivery engine: carries out a [`Job`] that a
//! stream actor decided (`delivery::schedule`). One pipeline for every
//! target: read the log after the cursor and select the batch (on a
//! blocking thread: SQLite and JSONata never run on an async worker), send
//! it (one module per target: `copy`, `webhook`, `itx`, `wake`), enforce the
//! job's deadline, and report. A send that panics or misses its deadline is
//! reported as a failure, so the actor always hears back.
//!
//! Effects of processors (the outbox) are not delivery jobs: `effect.rs`
//! leases them from storage and runs them with the same parts (the webhook
//! client, appends through stream actors, the wasm runtime, `guarded`).

pub mod copy;
pub mod effect;
pub mod itx;
pub mod signature;
pub mod wake;
pub mod webhook;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::delivery::copy::{CopyBatch, CopyOutcome, SourceInfo};
use crate::delivery::schedule::{Delivered, DeliveryDone, Job, Placement};
use crate::delivery::select::{select_batch, Selection};
use crate::delivery::target::Target;
pub(crate) use crate::delivery::webhook::destination;
use crate::delivery::Failure;
use crate::processor::runtime::Runtime;
pub use crate::processor::wake::Gate;
use crate::storage::Storage;
use crate::stream::{AppendInput, AppendOutput, Authority, StreamAddress};

/// Stored events read per attempt.
pub const SCAN_EVENTS_MAX: usize = 1000;

/// A future the stream registry answers.
pub type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, crate::error::Error>> + Send + 'a>>;

/// The stream registry as the executors use it: a copy's batch and an
/// effect's outcome are appended through the receiving stream's actor. The
/// registry (`crate::actor`) implements it over a weak handle, so the
/// executors do not keep a closing host alive; once it is gone, appends
/// answer `unavailable` and [`Streams::executors`] `None`.
pub trait Streams: Send + Sync {
    /// The host's executors, while it is open.
    fn executors(&self) -> Option<Executors>;
    /// Appends `input` to `address` (forwarded to its owner on another host).
    fn append<'a>(
        &'a self,
        address: &'a StreamAddress,
        input: AppendInput,
        authority: Authority,
    ) -> Answer<'a, AppendOutput>;
    /// Delivers a copy subscription's batch to its receiving stream.
    fn deliver<'a>(
        &'a self,
        receiver: &'a StreamAddress,
        batch: CopyBatch,
    ) -> Answer<'a, CopyOutcome>;
}

/// What executors use: storage, the stream registry (copies, effect
/// appends), the wasm runtime (ITX, wakes), the webhook client, the effect
/// worker's bell and metrics. Cheap to clone.
#[derive(Clone)]
pub struct Executors {
    pub storage: Storage,
    pub streams: Arc<dyn Streams>,
    pub runtime: Arc<Runtime>,
    pub webhooks: webhook::Client,
    /// Wakes the effect worker when effects commit or are retried.
    pub effects: effect::EffectsBell,
    /// Processor instances being refolded by a new version.
    pub refolds: crate::processor::refold::Refolds,
    /// Shadow versions folding beside the live ones, on this host.
    pub shadows: crate::processor::shadow::Shadows,
    pub metrics: crate::metrics::Metrics,
    /// Guest calls at once, per project and in all.
    pub calls: Arc<crate::processor::share::Shares>,
    /// Webhook POSTs and copies of subscriptions at once, per project and
    /// in all (`[delivery] concurrency`).
    pub sends: Arc<crate::processor::share::Shares>,
    /// What the configuration bounds in deliveries' evaluations.
    pub bounds: crate::delivery::Bounds,
    /// Trace spans for the OTLP endpoint (off without one).
    pub telemetry: crate::telemetry::Telemetry,
    /// Counts the wakes that ended on this host (committed or failed):
    /// what a wait for a processor watches.
    pub wakes_ended: Arc<tokio::sync::watch::Sender<u64>>,
    /// Counts the effect executions that ended on this host (settled or
    /// put back for a retry): what a wait for an effect watches.
    pub effects_ended: Arc<tokio::sync::watch::Sender<u64>>,
    /// The projects' webhook signing secrets, as this host read them.
    pub secrets: signature::SecretCache,
    /// The host's clock (a signed webhook's timestamp).
    pub clock: Arc<dyn crate::clock::Clock>,
    /// What each project stores, against `[limits] max-project-bytes`: a
    /// wake's keyed writes are admitted before they commit.
    pub stored: Arc<crate::quota::StoredBytes>,
    /// Webhook POSTs at once per destination, deliveries and effects
    /// alike (`[effects] per-destination-concurrency`).
    pub destinations: Arc<crate::processor::share::Shares>,
}

/// What a target's `send` works with.
#[derive(Clone, Copy)]
pub struct Attempt<'a> {
    pub exec: &'a Executors,
    pub job: &'a Job,
    pub source: &'a Source,
}

/// The source stream of a job, as of when it was decided.
#[derive(Debug, Clone)]
pub struct Source {
    pub row_id: i64,
    pub info: SourceInfo,
    /// The source's owner's lease (several hosts): a processor's
    /// checkpoint commits only while it holds.
    pub fence: Option<crate::storage::Fence>,
}

/// What an attempt tells its source's actor: that it waits for a place,
/// or got one after waiting (see [`Executors::share_of`]), and, exactly
/// once, its result.
#[derive(Debug)]
pub enum Report {
    Placement(Placement),
    Done(DeliveryDone),
}

impl Executors {
    /// The places an attempt holds while it runs, and whose: a call into a
    /// component (a wake, an ITX receiver) holds one of the guest calls'
    /// (`[processors] max-concurrent-calls`), of the component's project; a
    /// webhook POST or a copy one of the deliveries' (`[delivery]
    /// concurrency`), of the source's project.
    pub fn share_of<'a>(
        &'a self,
        job: &'a Job,
        source: &'a Source,
    ) -> (&'a Arc<crate::processor::share::Shares>, &'a str) {
        match &job.route.target {
            Target::Wake { project, .. } | Target::Itx { project, .. } => (&self.calls, project),
            Target::Copy { .. } | Target::Webhook { .. } => {
                (&self.sends, source.info.project_id.as_deref().unwrap_or(""))
            }
        }
    }
}

/// Runs `job` as a task once it holds its places: at once when they are
/// free; else it tells `report` that it waits (no deadline runs while it
/// does), and again when it has them (its time starts then). `report`
/// receives its result exactly once.
pub fn spawn<R, F>(exec: &Executors, mut job: Job, source: Arc<Source>, report: R)
where
    R: Fn(Report) -> F + Send + 'static,
    F: Future<Output = ()> + Send,
{
    let exec = exec.clone();
    tokio::spawn(async move {
        let (key, generation, id, timeout_ms) =
            (job.key.clone(), job.generation, job.id, job.timeout_ms);
        let (shares, project) = exec.share_of(&job, &source);
        let (shares, project) = (Arc::clone(shares), project.to_string());
        let placement = |placed| {
            Report::Placement(Placement {
                key: key.clone(),
                generation,
                id,
                placed,
            })
        };
        // A webhook first waits for a place at its destination (holding
        // nothing else meanwhile), then for one of its project's.
        let destination = match &job.route.target {
            Target::Webhook { url, .. } => destination(url),
            _ => None,
        };
        let mut places = Vec::with_capacity(2);
        for (shares, key) in destination
            .map(|d| (Arc::clone(&exec.destinations), d))
            .into_iter()
            .chain([(shares, project)])
        {
            let place = match shares.try_enter(&key) {
                Some(place) => place,
                None => {
                    let waiting = Instant::now();
                    report(placement(false)).await;
                    let place = shares.enter(&key).await;
                    report(placement(true)).await;
                    // The attempt's time starts now.
                    job.delay(i64::try_from(waiting.elapsed().as_millis()).unwrap_or(i64::MAX));
                    place
                }
            };
            places.push(place);
        }
        // A component this host must compile first (being compiled after
        // a deploy, or compiled nowhere here): the attempt waits for the
        // compile, and its time starts after it.
        if let Some(digest) = compiling_component(&exec, &job).await {
            let waiting = Instant::now();
            report(placement(false)).await;
            exec.runtime.compiled(&digest).await;
            report(placement(true)).await;
            job.delay(i64::try_from(waiting.elapsed().as_millis()).unwrap_or(i64::MAX));
        }
        let started = Instant::now();
        let label = job.route.target.label();
        let wait = Duration::from_millis((job.deadline_ms - job.now_ms).max(0) as u64);
        let gate = Arc::new(Gate::default());
        let result = guarded(
            &label,
            wait,
            timeout_ms,
            &gate.clone(),
            execute(exec, job, source, gate),
        )
        .await;
        drop(places);
        report(Report::Done(DeliveryDone {
            key,
            generation,
            id,
            duration: started.elapsed(),
            result,
        }))
        .await;
    });
}

/// The digest of the component that `job` (a wake or an ITX call) runs,
/// when this host must compile it first: being compiled now (a deploy
/// answers before its compile ends), or compiled nowhere on this host (a
/// host that did not take the deploy, a restart without its compile
/// cache): then its compile is queued here. No storage read while the
/// version the component ran last is in memory and nothing compiles.
async fn compiling_component(exec: &Executors, job: &Job) -> Option<String> {
    let (project, component) = match &job.route.target {
        Target::Wake { project, component } => (project, component),
        Target::Itx {
            project, component, ..
        } => (project, component),
        Target::Copy { .. } | Target::Webhook { .. } => return None,
    };
    let runtime = &exec.runtime;
    if runtime.ready(project, component) {
        return None;
    }
    let (storage, p, c) = (exec.storage.clone(), project.clone(), component.clone());
    let row = tokio::task::spawn_blocking(move || storage.component(&p, &c))
        .await
        .ok()?
        .ok()??;
    if !runtime.is_compiled(&row.digest) {
        let (storage, digest) = (exec.storage.clone(), row.digest.clone());
        runtime.compile_in_background(&row.digest, move || storage.component_bytes(&digest));
    }
    runtime.is_compiling(&row.digest).then_some(row.digest)
}

/// Runs `attempt`, waiting at most `wait` for it: a panic becomes a
/// retryable failure, and so does the deadline (the attempt is then
/// abandoned through `gate` and dropped, which cancels it), unless the
/// attempt's commit began before the deadline: then its outcome is the
/// result. Whatever happens, there is a result to report. (No task of its
/// own: a copy's latency is a chain of hand-offs.)
pub async fn guarded<T>(
    label: &str,
    wait: Duration,
    timeout_ms: u64,
    gate: &Gate,
    attempt: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    use futures_util::FutureExt;
    let attempt = std::panic::AssertUnwindSafe(attempt).catch_unwind();
    tokio::pin!(attempt);
    let finished = match tokio::time::timeout(wait, &mut attempt).await {
        Ok(finished) => finished,
        Err(_) if gate.abandon() => {
            return Err(Failure::new(
                format!("{label} timed out after {timeout_ms}ms"),
                true,
            ))
        }
        // Its commit began before the deadline: that commit's outcome is
        // the attempt's.
        Err(_) => attempt.await,
    };
    finished.unwrap_or_else(|panic| {
        Err(Failure::new(
            format!("{label} panicked: {}", panic_text(panic)),
            true,
        ))
    })
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// One attempt: read → select → send.
async fn execute(
    exec: Executors,
    job: Job,
    source: Arc<Source>,
    gate: Arc<Gate>,
) -> Result<Delivered, Failure> {
    if let Target::Wake { project, component } = &job.route.target {
        // A wake reads after the processor's checkpoint, not a cursor.
        return wake::send(&exec, &job, &source, project, component, gate).await;
    }
    let mut selection = read_and_select(&exec.storage, &job, source.row_id).await?;
    let offsets: Vec<u64> = selection.events.iter().map(|e| e.offset).collect();
    if offsets.is_empty() {
        // Nothing matched: passing over is progress.
        return Ok(Delivered {
            through: selection.through,
            offsets,
            bytes: 0,
        });
    }
    let single_offset = (offsets.len() == 1).then(|| offsets[0]);
    let first_offset = offsets.first().copied();
    // A delivery attempt of traced events is a span of their trace; what
    // it sends or copies carries the span on.
    let span = selection
        .events
        .iter()
        .find_map(|e| e.trace.as_ref())
        .and_then(|parent| exec.telemetry.begin(Some(parent)));
    if let Some(span) = &span {
        span.hand_on(&mut selection.events);
    }
    let (through, bytes) = (selection.through, selection.bytes);
    let attempt = Attempt {
        exec: &exec,
        job: &job,
        source: &source,
    };
    let sent = match &job.route.target {
        Target::Copy {
            receiver,
            transform,
        } => copy::send(attempt, selection, receiver, transform.clone()).await,
        Target::Webhook {
            url,
            transform,
            configured_at,
        } => webhook::send(attempt, selection, url, transform.clone(), *configured_at)
            .await
            .map(|()| through),
        Target::Itx {
            project,
            component,
            function,
            transform,
        } => {
            let call = itx::Call {
                project: project.clone(),
                component: component.clone(),
                function: function.clone(),
                transform: transform.clone(),
            };
            itx::send(attempt, selection, call).await
        }
        Target::Wake { .. } => unreachable!("handled above"),
    };
    if let Some(span) = span {
        let mut record =
            crate::telemetry::Record::of_path(source.info.project_id.as_deref(), &source.info.path)
                .with("streamhost.subscription.key", job.key.clone())
                .with("streamhost.delivery.target", job.route.target.label())
                .with("streamhost.offset.first", first_offset.unwrap_or(0) as i64)
                .with(
                    "streamhost.offset.last",
                    offsets.last().copied().unwrap_or(0) as i64,
                );
        record.error = sent.as_ref().err().map(|f| f.message.clone());
        exec.telemetry.end(
            span,
            "delivery attempt",
            opentelemetry::trace::SpanKind::Producer,
            record,
        );
    }
    match sent {
        // (Less than the selection when a copy or ITX batch stopped before
        // an event its transform throws on.)
        Ok(delivered) => Ok(Delivered {
            through: delivered,
            offsets: offsets.into_iter().filter(|o| *o <= delivered).collect(),
            bytes,
        }),
        Err(mut f) => {
            f.single_offset = f.single_offset.or(single_offset);
            f.at_offset = f.at_offset.or(f.single_offset).or(first_offset);
            Err(f)
        }
    }
}

/// Stored events after the job's cursor, selected by its filter, on a
/// blocking thread.
async fn read_and_select(storage: &Storage, job: &Job, row_id: i64) -> Result<Selection, Failure> {
    let storage = storage.clone();
    let (key, route, cursor, head, limit) = (
        job.key.clone(),
        job.route.clone(),
        job.cursor,
        job.head,
        job.limit,
    );
    blocking(move || {
        let stored = storage
            .events_after(row_id, cursor, SCAN_EVENTS_MAX, head)
            .map_err(|e| Failure::new(format!("reading the source failed: {e:#}"), true))?;
        select_batch(&key, &stored, &route.filter, limit, cursor)
    })
    .await
}

/// The deployed component `component` of `project`, compiled (blocking);
/// not deployed, or not loadable, is a retryable failure (it may be
/// deployed, or storage may recover).
pub(crate) fn deployed_component(
    storage: &Storage,
    runtime: &Runtime,
    project: &str,
    component: &str,
) -> Result<Arc<crate::processor::runtime::Prepared>, Failure> {
    crate::processor::deployed(storage, runtime, project, component)
        .map_err(|e| {
            Failure::new(
                format!("loading component {component:?} failed: {e:#}"),
                true,
            )
        })?
        .map(|(prepared, _)| prepared)
        .ok_or_else(|| Failure::new(format!("component {component:?} is not deployed"), true))
}

/// Runs `f` on a blocking thread; a panic there is a retryable failure.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Failure> + Send + 'static,
) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Failure::new(format!("a blocking task failed: {e}"), true))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_attempt_reports_a_retryable_failure() {
        let result: Result<(), Failure> = guarded(
            "copy to \"/x\"",
            Duration::from_secs(5),
            5000,
            &Gate::default(),
            async { panic!("the receiver exploded") },
        )
        .await;
        let failure = result.unwrap_err();
        assert!(failure.retryable);
        assert_eq!(
            failure.message,
            "copy to \"/x\" panicked: the receiver exploded"
        );
    }

    #[tokio::test]
    async fn an_attempt_past_its_deadline_is_cancelled_and_reports() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let result: Result<(), Failure> = guarded(
            "webhook POST",
            Duration::from_millis(100),
            100,
            &Gate::default(),
            async move {
                // Never finishes; dropping `tx` tells the test it was aborted.
                let _tx = tx;
                std::future::pending::<()>().await;
                Ok(())
            },
        )
        .await;
        let failure = result.unwrap_err();
        assert_eq!(failure.message, "webhook POST timed out after 100ms");
        assert!(failure.retryable);
        assert!(rx.await.is_err(), "the attempt was dropped (cancelled)");
    }

    #[tokio::test]
    async fn past_its_deadline_an_attempt_is_abandoned_unless_its_commit_began() {
        // Abandoned: the late attempt (released only once the host has
        // reported the timeout) may not commit.
        let gate = Arc::new(Gate::default());
        let late = gate.clone();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (tx, rx) = tokio::sync::oneshot::channel::<bool>();
        let result: Result<(), Failure> =
            guarded("wake", Duration::from_millis(50), 50, &gate, async move {
                let work = tokio::task::spawn_blocking(move || {
                    let _ = released.recv();
                    let _ = tx.send(late.begin_commit());
                });
                let _ = work.await;
                Ok(())
            })
            .await;
        assert_eq!(result.unwrap_err().message, "wake timed out after 50ms");
        assert!(gate.abandoned());
        release.send(()).unwrap();
        assert_eq!(rx.await, Ok(false), "the late attempt's commit is refused");

        // Committing at the deadline: the attempt is waited for, and its
        // result is the answer.
        let gate = Arc::new(Gate::default());
        let committing = gate.clone();
        let result = guarded("wake", Duration::from_millis(50), 50, &gate, async move {
            assert!(committing.begin_commit());
            // A commit that outlasts the deadline (its length is the
            // subject here, not a wait for a condition).
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(9)
        })
        .await;
        assert_eq!(result.unwrap(), 9);
        assert!(!gate.abandoned());
    }

    #[tokio::test]
    async fn a_finished_attempt_passes_its_result_through() {
        let ok = guarded("x", Duration::from_secs(1), 1000, &Gate::default(), async {
            Ok(7)
        })
        .await;
        assert_eq!(ok.unwrap(), 7);
        let err: Result<u8, Failure> =
            guarded("x", Duration::from_secs(1), 1000, &Gate::default(), async {
                Err(Failure::new("no", false))
            })
            .await;
        assert!(!err.unwrap_err().retryable);
    }
}
