//! Runs the processor outbox: one worker per host leases due effects (a
//! `pending` one whose time has come, or a `running` one whose lease
//! expired), executes each as a task (at most `[effects] concurrency` at
//! once, each bounded by `[delivery] timeout-ms`; a webhook holding a
//! place at its destination, an ITX call one of its project's guest calls;
//! one project past its
//! share only while no other's effect is due, and never in the last
//! share's worth of places), and settles it with the
//! pure decision of `crate::effect::settle`. A terminal failure first
//! appends its one `error-occurred` line (idempotent) to the source stream,
//! then settles, so a crash between the two repeats nothing visible.
//!
//! At least once: an execution whose settlement is lost (crash, lost lease)
//! runs again; each target is idempotent by the effect's identity. At start
//! the effects left `running` by the previous process run again at once (the
//! data dir is locked to one host, so their executor is gone).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, Notify};

use super::{blocking, guarded, Executors};
use crate::clock::{format_timestamp, jitter, Clock};
use crate::config::{DeliveryConfig, EffectsConfig};
use crate::delivery::Failure;
use crate::effect::{self, Outcome, Settlement, Target};
use crate::error::ErrorKind;
use crate::processor::runtime::CallError;
use crate::storage::{DestinationRoom, EffectOp, EffectRow, Leasing, WriteOp};
use crate::stream::{
    AppendInput, Authority, EffectOrigin, EventInput, EventSource, Namespace, StreamAddress,
};

/// Longest the worker sleeps without looking (a safety net: commits and
/// API calls wake it at once).
const IDLE_LOOK_MS: i64 = 5_000;
/// Shortest pause before looking again for due effects.
const BUSY_LOOK_MS: i64 = 5;
/// How often a look also asks for the due effects of projects under their
/// share alone, while some project is at its share or the open places are
/// taken (that read passes over the whole backlog of the projects at
/// theirs).
const SHARE_LOOK_MS: i64 = 25;
/// Shortest pause when a look leased nothing although an effect is due: it
/// is running here past its lease, or its row is locked by another
/// transaction (PostgreSQL), so looking again at once would spin.
const STUCK_LOOK_MS: i64 = 100;

/// Wakes the effect worker: new effects were committed, or one was retried.
#[derive(Clone, Default)]
pub struct EffectsBell(Arc<Notify>);

impl EffectsBell {
    pub fn ring(&self) {
        self.0.notify_one();
    }
}

/// What the worker is configured with.
#[derive(Clone)]
pub struct Settings {
    pub effects: EffectsConfig,
    /// Backoff and the timeout of one execution.
    pub delivery: DeliveryConfig,
    pub clock: Arc<dyn Clock>,
}

/// Starts the worker; it ends with the stream registry. Between rounds it
/// holds nothing of the host but a weak handle, so a host that is dropped
/// goes at once (storage, runtime and all).
pub fn start(streams: Arc<dyn super::Streams>, bell: EffectsBell, settings: Settings) {
    tokio::spawn(run(streams, bell, settings));
}

async fn run(streams: Arc<dyn super::Streams>, bell: EffectsBell, settings: Settings) {
    // The data dir is locked to this host: what was running ran in a
    // process that is gone, so it need not wait for its lease. (With
    // several hosts on one database, only the effects of its own streams:
    // its host id outlives the process, in the data dir.)
    if let Some(exec) = streams.executors() {
        let op = EffectOp::ReclaimAll {
            now_ms: settings.clock.now_ms(),
            owner: exec.storage.cluster().map(|me| me.id.clone()),
        };
        match exec.storage.submit(WriteOp::Effect(op)).await {
            Ok(Ok(n)) if n > 0 => {
                tracing::info!(
                    effects = n,
                    "effects left running by the last process run again"
                )
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "reclaiming running effects failed"),
            _ => {}
        }
    }
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<i64>();
    // The effects executing here, and their projects; the destinations of
    // those that are webhooks.
    let mut running: HashMap<i64, String> = HashMap::new();
    let mut to: HashMap<i64, String> = HashMap::new();
    let per_destination = settings.effects.per_destination_concurrency;
    let concurrency = settings.effects.concurrency;
    let share = settings.effects.project_concurrency();
    let mut share_look_at = i64::MIN;
    loop {
        let Some(exec) = streams.executors() else {
            return;
        };
        let now = settings.clock.now_ms();
        let mut wait_ms = IDLE_LOOK_MS;
        if running.len() < concurrency {
            let storage = exec.storage.clone();
            // The effects running here hold leases that expire in the future,
            // so the due ones are others: ask for just the free slots.
            let want = concurrency - running.len();
            let lease_ms = settings.effects.lease_ms as i64;
            let here: Vec<i64> = running.keys().copied().collect();
            let at_share = at_share(&running, share);
            let open = concurrency.saturating_sub(share);
            // Now and then, while a project is at its share or the open
            // places are taken, a second read finds the due effects of
            // the projects under their share (behind another's backlog).
            let share_look = (!at_share.is_empty() || running.len() >= open)
                && now.saturating_sub(share_look_at) >= SHARE_LOOK_MS;
            if share_look {
                share_look_at = now;
            }
            let look = Look {
                now,
                lease_ms,
                want,
                share,
                // Places a project past its share may take: all but a
                // share's worth.
                open,
                taken: running.len(),
                room: destination_room(&to, per_destination),
            };
            let due = blocking(move || {
                look.due(&storage, here, &at_share, share_look)
                    .map_err(|e| Failure::new(format!("{e:#}"), true))
            })
            .await;
            match due {
                Ok(due) => {
                    let (leased, storage_failed) = match due {
                        Due::Leased(leased) => (leased, false),
                        Due::Read(any, under, room) => {
                            let places = Places {
                                concurrency,
                                share,
                                room,
                            };
                            let fresh = choose(any, under, &running, places);
                            lease(&exec, &settings, fresh, now).await
                        }
                    };
                    if leased.is_empty() {
                        wait_ms = next_wait(&exec, now).await;
                    } else {
                        // More may be due than this round took: look again soon.
                        wait_ms = BUSY_LOOK_MS;
                    }
                    if storage_failed {
                        // Storage refuses writes: do not spin on it.
                        wait_ms = 1_000;
                    }
                    for row in leased {
                        running.insert(row.id, row.project.clone());
                        if let Some(d) = &row.destination {
                            to.insert(row.id, d.clone());
                        }
                        let (exec, settings, done) =
                            (exec.clone(), settings.clone(), done_tx.clone());
                        tokio::spawn(async move {
                            let id = row.id;
                            execute_and_settle(&exec, &settings, row).await;
                            exec.effects_ended.send_modify(|n| *n = n.wrapping_add(1));
                            let _ = done.send(id);
                        });
                    }
                    if running.len() >= concurrency {
                        wait_ms = IDLE_LOOK_MS;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e.message, "reading due effects failed");
                    wait_ms = 1_000;
                }
            }
        }
        drop(exec);
        tokio::select! {
            _ = bell.0.notified() => {}
            Some(id) = done_rx.recv() => {
                running.remove(&id);
                to.remove(&id);
                while let Ok(id) = done_rx.try_recv() {
                    running.remove(&id);
                    to.remove(&id);
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(wait_ms.max(1) as u64)) => {}
        }
    }
}

/// What one look at the outbox found.
enum Due {
    /// Leased already (PostgreSQL).
    Leased(Vec<EffectRow>),
    /// Due, to be leased by the writer (SQLite): the oldest, and those of
    /// projects under their share (when looked for); and the room their
    /// destinations have.
    Read(Vec<EffectRow>, Vec<EffectRow>, DestinationRoom),
}

/// The room each destination has for more effects running here: at most
/// `per_destination` webhook effects to one host name (its POSTs' places,
/// `[effects] per-destination-concurrency`), so a slow or throttling
/// destination's backlog never fills the worker's places while another
/// destination's effects wait.
fn destination_room(to: &HashMap<i64, String>, per_destination: usize) -> DestinationRoom {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for d in to.values() {
        *counts.entry(d.as_str()).or_default() += 1;
    }
    DestinationRoom {
        cap: per_destination,
        room: counts
            .into_iter()
            .map(|(d, n)| (d.to_string(), per_destination.saturating_sub(n)))
            .collect(),
    }
}

/// How many effects of each project run here.
fn per_project(running: &HashMap<i64, String>) -> HashMap<String, usize> {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for project in running.values() {
        *counts.entry(project.clone()).or_default() += 1;
    }
    counts
}

/// The projects with `share` or more effects running here.
fn at_share(running: &HashMap<i64, String>, share: usize) -> Vec<String> {
    per_project(running)
        .into_iter()
        .filter(|(_, n)| *n >= share)
        .map(|(p, _)| p)
        .collect()
}

/// One look at the outbox for due effects.
struct Look {
    now: i64,
    lease_ms: i64,
    /// Free places.
    want: usize,
    share: usize,
    /// Places that effects of projects past their share may fill.
    open: usize,
    /// Places taken before this look.
    taken: usize,
    /// What each destination may still take.
    room: DestinationRoom,
}

impl Look {
    /// PostgreSQL leases as it reads (one statement a read): the oldest due
    /// effects, as many as projects at their share may still take (all
    /// free places when none is), then, on a share look, those of the
    /// projects under their share. SQLite reads the same two ways; the
    /// worker chooses ([`choose`]) and the writer leases.
    fn due(
        &self,
        storage: &crate::storage::Storage,
        mut here: Vec<i64>,
        at_share: &[String],
        share_look: bool,
    ) -> anyhow::Result<Due> {
        // Leased before their projects are known: only into the open
        // places (a project under its share finds the last ones on a
        // share look).
        let oldest = self.open.saturating_sub(self.taken).min(self.want);
        let mut room = self.room.clone();
        if storage.cluster().is_none() {
            let any = self.read_past_full(storage, &[], &room)?;
            let under = if share_look {
                self.read_past_full(storage, at_share, &room)?
            } else {
                Vec::new()
            };
            return Ok(Due::Read(any, under, room));
        }
        let mut leased = Vec::new();
        if oldest > 0 {
            leased = self.lease_past_full(storage, oldest, &mut here, &[], &mut room)?;
        }
        let left = self.want - leased.len();
        if share_look && left > 0 {
            let limit = left.min(self.share);
            leased.extend(self.lease_past_full(storage, limit, &mut here, at_share, &mut room)?);
        }
        Ok(Due::Leased(leased))
    }

    /// The oldest due effects (`want`) of the projects not `passed`, none
    /// to a destination without room, read again past each destination
    /// whose rows fill the room it has (at most [`ROOM_READS`] reads): one
    /// destination's backlog does not hide the others' effects behind it.
    fn read_past_full(
        &self,
        storage: &crate::storage::Storage,
        passed: &[String],
        room: &DestinationRoom,
    ) -> anyhow::Result<Vec<EffectRow>> {
        let mut past: Vec<String> = room.full().into_iter().map(str::to_string).collect();
        let mut rows: Vec<EffectRow> = Vec::new();
        for _ in 0..ROOM_READS {
            let names: Vec<&str> = past.iter().map(String::as_str).collect();
            let read = storage.due_effects(self.now, self.want, passed, &names)?;
            let window_full = read.len() == self.want;
            let seen: HashSet<i64> = rows.iter().map(|r| r.id).collect();
            rows.extend(read.into_iter().filter(|r| !seen.contains(&r.id)));
            let mut counts: HashMap<&str, usize> = HashMap::new();
            for d in rows.iter().filter_map(|r| r.destination.as_deref()) {
                *counts.entry(d).or_default() += 1;
            }
            let filled: Vec<String> = counts
                .into_iter()
                .filter(|(d, n)| *n >= room.of(d) && !past.iter().any(|p| p == d))
                .map(|(d, _)| d.to_string())
                .collect();
            if !window_full || filled.is_empty() {
                break;
            }
            past.extend(filled);
        }
        Ok(rows)
    }

    /// PostgreSQL: leases up to `limit` due effects of the projects not
    /// `passed`, again past each destination the lease left without room
    /// (at most [`ROOM_READS`] statements); `here` and `room` take what
    /// was leased.
    fn lease_past_full(
        &self,
        storage: &crate::storage::Storage,
        limit: usize,
        here: &mut Vec<i64>,
        passed: &[String],
        room: &mut DestinationRoom,
    ) -> anyhow::Result<Vec<EffectRow>> {
        let mut leased: Vec<EffectRow> = Vec::new();
        for _ in 0..ROOM_READS {
            let full_before = room.full().len();
            let Some(rows) = storage.lease_due_effects(
                self.lease_ms,
                limit - leased.len(),
                here,
                passed,
                room,
            )?
            else {
                break;
            };
            let got = rows.len();
            for e in &rows {
                room.take(e.destination.as_deref());
                here.push(e.id);
            }
            leased.extend(rows);
            if got == 0 || leased.len() >= limit || room.full().len() == full_before {
                break;
            }
        }
        Ok(leased)
    }
}

/// Reads (or PostgreSQL leases) of one look, each past the destinations
/// the one before left without room.
const ROOM_READS: usize = 4;

/// The worker's places as one look sees them.
struct Places {
    concurrency: usize,
    /// A project's share.
    share: usize,
    /// What each destination may still take.
    room: DestinationRoom,
}

/// The due effects to lease (SQLite), given what runs here: from the
/// oldest (`any`) and those of projects under their share (`under`), each
/// project up to its `share` while the places allow, and past it only
/// while a share's worth of places stays free; at most the free places,
/// and no more to one destination than its room.
fn choose(
    any: Vec<EffectRow>,
    under: Vec<EffectRow>,
    running: &HashMap<i64, String>,
    places: Places,
) -> Vec<EffectRow> {
    let Places {
        concurrency,
        share,
        mut room,
    } = places;
    let mut per_project = per_project(running);
    let mut ids: HashSet<i64> = running.keys().copied().collect();
    let mut chosen: Vec<EffectRow> = Vec::new();
    // Within the shares first (the oldest first), then past them.
    let mut past = Vec::new();
    for e in any.into_iter().chain(under) {
        if ids.contains(&e.id) {
            continue;
        }
        let n = per_project.entry(e.project.clone()).or_default();
        if *n < share && running.len() + chosen.len() < concurrency {
            if room.take(e.destination.as_deref()) {
                *n += 1;
                ids.insert(e.id);
                chosen.push(e);
            }
        } else {
            past.push(e);
        }
    }
    for e in past {
        if running.len() + chosen.len() + share >= concurrency {
            break;
        }
        if !ids.contains(&e.id) && room.take(e.destination.as_deref()) {
            ids.insert(e.id);
            chosen.push(e);
        }
    }
    chosen
}

/// How long to wait after a look that leased nothing: until the next
/// effect falls due (at most [`IDLE_LOOK_MS`]), or [`STUCK_LOOK_MS`] when
/// one is due already.
async fn next_wait(exec: &Executors, now: i64) -> i64 {
    let storage = exec.storage.clone();
    let next = blocking(move || {
        storage
            .next_effect_due()
            .map_err(|e| Failure::new(format!("{e:#}"), true))
    })
    .await;
    match next {
        // Due already, yet not leased: held elsewhere, or running here.
        Ok(Some(at)) if at <= now => STUCK_LOOK_MS,
        Ok(Some(at)) => (at - now).clamp(BUSY_LOOK_MS, IDLE_LOOK_MS),
        _ => IDLE_LOOK_MS,
    }
}

/// Leases `due` (one statement); answers the rows leased, with
/// `attempts` counting this execution, and whether the write failed. An
/// effect another write moved since it was read (cancelled, settled) is
/// not leased: when fewer than all were, the rows are read again to
/// learn which.
async fn lease(
    exec: &Executors,
    settings: &Settings,
    mut due: Vec<EffectRow>,
    now: i64,
) -> (Vec<EffectRow>, bool) {
    if due.is_empty() {
        return (due, false);
    }
    let reply = exec.storage.submit(WriteOp::Effect(EffectOp::Lease {
        effects: due.iter().map(Leasing::of).collect(),
        now_ms: now,
        lease_until_ms: now + settings.effects.lease_ms as i64,
    }));
    let leased = match reply.await {
        Ok(Ok(n)) => n as usize,
        Ok(Err(e)) => {
            tracing::warn!(effects = due.len(), error = %e, "leasing effects failed");
            return (Vec::new(), true);
        }
        Err(_) => return (Vec::new(), true),
    };
    for row in &mut due {
        row.attempts += 1;
        row.lease_id += 1;
        row.status = "running".into();
    }
    if leased == due.len() {
        return (due, false);
    }
    // Which were leased: those now running under the lease that follows
    // the one they were read with.
    let storage = exec.storage.clone();
    let read = blocking(move || {
        let mut kept = Vec::with_capacity(due.len());
        for row in due {
            let now = storage
                .effect(&row.project, row.id)
                .map_err(|e| Failure::new(format!("{e:#}"), true))?;
            if now.is_some_and(|n| {
                n.status == "running" && n.lease_id == row.lease_id && n.attempts == row.attempts
            }) {
                kept.push(row);
            }
        }
        Ok(kept)
    })
    .await;
    match read {
        Ok(kept) => (kept, false),
        Err(e) => {
            tracing::warn!(error = %e.message, "reading leased effects failed");
            (Vec::new(), true)
        }
    }
}

/// What an effect's lease keeps beyond its wait for a place (at its
/// destination, or of its project's guest calls) and its execution's
/// timeout.
const PLACE_WAIT_MARGIN_MS: u64 = 1000;

async fn execute_and_settle(exec: &Executors, settings: &Settings, row: EffectRow) {
    let timeout_ms = settings.delivery.timeout_ms;
    let (kind, name) = effect::consumer(&row.component);
    let label = format!("effect {:?} of {kind} {name:?}", row.key);
    if let (Some(not_before), 1) = (row.not_before_ms, row.attempts) {
        exec.metrics
            .effect_due_lag(settings.clock.now_ms() - not_before);
    }
    // An effect of a traced event is a span of its trace; what it appends
    // or posts carries the span on.
    let stored_trace = effect::stored_trace(&row.target);
    let span = stored_trace
        .as_ref()
        .and_then(|t| exec.telemetry.begin(Some(t)));
    let carried = span.as_ref().map(|s| s.handed_on.clone()).or(stored_trace);
    // A webhook first waits for a place at its destination, an ITX call
    // for one of its project's guest calls (as a subscription's ITX
    // receiver does, so one project's looping calls hold its own share of
    // the threads, not the host's), each for as long as its lease outlasts
    // the wait and the execution (then it is retried).
    let target = Target::from_json(&row.target);
    let waited_for = Duration::from_millis(
        settings
            .effects
            .lease_ms
            .saturating_sub(timeout_ms)
            .saturating_sub(PLACE_WAIT_MARGIN_MS),
    );
    // Each place with what its wait answers when it runs out.
    type Refusal = fn(&str, u128) -> String;
    let places: Option<(_, String, Refusal)> = match &target {
        Ok(Target::Webhook { url, .. }) => super::destination(url).map(|d| {
            let refusal: Refusal = |d, ms| {
                format!(
                    "no place at destination {d} for {ms} ms ([effects] \
                     per-destination-concurrency POSTs to it were running)"
                )
            };
            (&exec.destinations, d, refusal)
        }),
        Ok(Target::Itx { .. }) => {
            let refusal: Refusal = |project, ms| {
                format!(
                    "no place among project {project:?}'s guest calls for {ms} ms \
                     ([processors] max-concurrent-calls-per-project calls were running)"
                )
            };
            Some((&exec.calls, row.project.clone(), refusal))
        }
        _ => None,
    };
    let place = match places {
        Some((shares, key, refusal)) => tokio::time::timeout(waited_for, shares.enter(&key))
            .await
            .map(Some)
            .map_err(|_| refusal(&key, waited_for.as_millis())),
        None => Ok(None),
    };
    // An append effect's settlement commits with its event (the stream's
    // round writes it); a replayed event's was not, and is written here.
    let mut settled_with_target = false;
    let outcome = match (place, target) {
        (Err(message), _) => Outcome::Failed {
            message,
            retryable: true,
            retry_after_ms: None,
        },
        (Ok(_place), Ok(target)) => {
            let wait = Duration::from_millis(timeout_ms);
            match guarded(
                &label,
                wait,
                timeout_ms,
                &super::Gate::default(),
                execute(exec, &row, target, timeout_ms, carried),
            )
            .await
            {
                Ok(executed) => {
                    settled_with_target = executed.settled;
                    Outcome::Succeeded {
                        result: executed.result,
                    }
                }
                Err(f) => Outcome::Failed {
                    message: f.message,
                    retryable: f.retryable,
                    retry_after_ms: f.retry_after_ms,
                },
            }
        }
        (Ok(_), Err(message)) => Outcome::Failed {
            message,
            retryable: false,
            retry_after_ms: None,
        },
    };
    if let Some(span) = span {
        let mut record = crate::telemetry::Record::of_path(Some(&row.project), &row.path)
            .with("streamhost.effect.key", row.key.clone())
            .with("streamhost.effect.consumer", format!("{kind}:{name}"))
            .with("streamhost.effect.attempt", i64::from(row.attempts));
        if let Outcome::Failed { message, .. } = &outcome {
            record.error = Some(message.clone());
        }
        exec.telemetry.end(
            span,
            "effect attempt",
            opentelemetry::trace::SpanKind::Producer,
            record,
        );
    }
    let now = settings.clock.now_ms();
    let settlement = effect::settle(
        outcome,
        row.attempts,
        settings.effects.max_attempts,
        &settings.delivery,
        now,
        jitter(),
    );
    exec.metrics.effect_executed(settlement.label());
    let op = match settlement {
        Settlement::Succeeded { .. } if settled_with_target => return,
        Settlement::Succeeded { result } => EffectOp::Settle {
            id: row.id,
            lease_id: row.lease_id,
            now_ms: now,
            status: "succeeded",
            due_at_ms: now,
            last_error: None,
            result: result.map(|r| r.to_string()),
            settled_at: Some(format_timestamp(now)),
        },
        Settlement::Retry { at_ms, error } => {
            tracing::info!(id = row.id, attempts = row.attempts, error = %error, "effect will be retried");
            EffectOp::Settle {
                id: row.id,
                lease_id: row.lease_id,
                now_ms: now,
                status: "pending",
                due_at_ms: at_ms,
                last_error: Some(error),
                result: None,
                settled_at: None,
            }
        }
        Settlement::Failed { error } => {
            tracing::warn!(id = row.id, attempts = row.attempts, error = %error, "effect failed");
            if let Err(e) = append_error_line(exec, &row, &error).await {
                // The lease runs out and the effect runs again: its line is
                // owed, so it does not settle without one.
                tracing::warn!(id = row.id, error = %e, "appending the error line of a failed effect failed; it will be retried after its lease");
                return;
            }
            EffectOp::Settle {
                id: row.id,
                lease_id: row.lease_id,
                now_ms: now,
                status: "failed",
                due_at_ms: now,
                last_error: Some(error),
                result: None,
                settled_at: Some(format_timestamp(now)),
            }
        }
    };
    match exec.storage.submit(WriteOp::Effect(op)).await {
        Ok(Ok(1)) => {}
        // (Or, for an append effect another host's actor appended, its
        // event's commit settled it there.)
        Ok(Ok(_)) => tracing::info!(
            id = row.id,
            "an effect's lease was lost before it settled, or it was settled already"
        ),
        Ok(Err(e)) => tracing::warn!(id = row.id, error = %e, "settling an effect failed"),
        Err(_) => {}
    }
}

fn address_of(project: &str, path: &str) -> Result<StreamAddress, Failure> {
    StreamAddress::new(Namespace::from_storage_key(project), path)
        .map_err(|e| Failure::new(e.message, false))
}

/// What one effect's execution answers.
struct Executed {
    /// An ITX call's result.
    result: Option<Value>,
    /// Whether its settlement committed already: an append effect's
    /// commits with its event, unless the event was committed before (a
    /// replay of its key).
    settled: bool,
}

impl Executed {
    fn unsettled(result: Option<Value>) -> Executed {
        Executed {
            result,
            settled: false,
        }
    }
}

/// Runs one effect's target.
async fn execute(
    exec: &Executors,
    row: &EffectRow,
    target: Target,
    timeout_ms: u64,
    trace: Option<crate::trace::Trace>,
) -> Result<Executed, Failure> {
    match target {
        // Applied in the commit that stored it (and stored done).
        Target::Cancel { .. } => Ok(Executed::unsettled(None)),
        Target::Append {
            stream_path,
            event_type,
            payload,
            metadata,
        } => {
            let address = address_of(&row.project, &stream_path)?;
            let event = EventInput {
                event_type,
                payload: Some(payload),
                metadata,
                idempotency_key: Some(effect::append_idempotency_key(
                    &row.component,
                    &row.path,
                    &row.key,
                )),
                ephemeral: None,
                offset: None,
                source: Some(EventSource {
                    copied_from: Vec::new(),
                    effect: Some(EffectOrigin {
                        path: row.path.clone(),
                        stream_id: row.stream_id.clone(),
                        component: row.component.clone(),
                        key: row.key.clone(),
                        checkpoint_offset: row.checkpoint_offset,
                    }),
                }),
                trace,
                redacted: None,
            };
            append(exec, &address, event, Authority::Effect(row.id))
                .await
                .map(|out| Executed {
                    result: None,
                    settled: out.replayed == [false],
                })
        }
        Target::Webhook { url, body } => {
            // Signed with the project's secrets, if it has any; the
            // effect's id is the webhook's (the same on every attempt).
            let signing = exec
                .secrets
                .get(&exec.storage, &row.project)
                .await?
                .map(|secrets| super::signature::Signing {
                    id: row.id.to_string(),
                    secrets,
                    timestamp: exec.clock.now_ms().div_euclid(1000),
                });
            exec.webhooks
                .post_traced(
                    &exec.telemetry,
                    trace.as_ref(),
                    &url,
                    &body,
                    timeout_ms,
                    effect::webhook_headers(row.id, &row.component, &row.key, &row.target),
                    signing,
                )
                .await
                .map(|_| Executed::unsettled(None))
                .map_err(|(mut f, status)| {
                    // A refused address stays refused, whatever the status.
                    f.retryable = f.retryable && effect::webhook_retryable(status);
                    f
                })
        }
        Target::Itx { expression, args } => {
            let crate::itx::Target::ComponentFunction {
                component,
                function,
            } = crate::itx::resolve(&expression).map_err(|m| Failure::new(m, false))?;
            let (storage, runtime, project) = (
                exec.storage.clone(),
                exec.runtime.clone(),
                row.project.clone(),
            );
            blocking(move || {
                let prepared = super::deployed_component(&storage, &runtime, &project, &component)?;
                runtime
                    .call_function(
                        &component,
                        &prepared,
                        &function,
                        &args,
                        timeout_ms,
                        Default::default(),
                    )
                    .map(|result| Executed::unsettled(Some(result)))
                    .map_err(|e| match e {
                        CallError::Err(v) => {
                            Failure::new(format!("{component}.{function} returned err: {v}"), true)
                        }
                        CallError::Guest(g) => {
                            Failure::new(format!("{component}.{function}: {g}"), g.retryable())
                        }
                        CallError::Argument(m) => Failure::new(
                            format!("the args do not fit {component}.{function}: {m}"),
                            false,
                        ),
                        CallError::NoSuchFunction(f) => Failure::new(
                            format!("component {component:?} exports no function {f:?}"),
                            true,
                        ),
                    })
            })
            .await
        }
    }
}

/// Appends one event through the stream's actor; a refusal that waiting
/// can cure (paused, overloaded, storage) is retryable.
async fn append(
    exec: &Executors,
    address: &StreamAddress,
    event: EventInput,
    authority: Authority,
) -> Result<crate::stream::AppendOutput, Failure> {
    let input = AppendInput {
        events: vec![event],
        expected_stream_id: None,
    };
    exec.streams
        .append(address, input, authority)
        .await
        .map_err(|e| {
            let retryable = matches!(
                e.kind,
                ErrorKind::Unavailable
                    | ErrorKind::Internal
                    | ErrorKind::Timeout
                    | ErrorKind::InsufficientStorage
            );
            Failure::new(format!("append to {address}: {}", e.message), retryable)
        })
}

/// The one `error-occurred` line of a failed effect, on its source stream.
async fn append_error_line(exec: &Executors, row: &EffectRow, error: &str) -> Result<(), String> {
    let address = address_of(&row.project, &row.path).map_err(|f| f.message)?;
    let payload = effect::error_line(row.id, &row.component, &row.key, row.attempts, error);
    let event = EventInput {
        event_type: crate::stream::types::ERROR_OCCURRED.to_string(),
        payload: Some(payload),
        metadata: None,
        idempotency_key: Some(effect::error_line_key(row.id, row.retries)),
        ephemeral: None,
        offset: None,
        source: None,
        trace: None,
        redacted: None,
    };
    append(exec, &address, event, Authority::Platform)
        .await
        .map(|_| ())
        .map_err(|f| f.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(id: i64, project: &str) -> EffectRow {
        EffectRow {
            id,
            project: project.into(),
            path: "/s".into(),
            stream_id: "s1".into(),
            component: "c".into(),
            key: format!("k{id}"),
            checkpoint_offset: 1,
            target: Value::Null,
            status: "pending".into(),
            attempts: 0,
            due_at_ms: 0,
            last_error: None,
            result: None,
            retries: 0,
            created_at: String::new(),
            settled_at: None,
            lease_id: 0,
            not_before_ms: None,
            destination: None,
        }
    }

    /// A webhook effect to `destination`.
    fn to(id: i64, project: &str, destination: &str) -> EffectRow {
        EffectRow {
            destination: Some(destination.into()),
            ..due(id, project)
        }
    }

    /// The places of a worker with `concurrency`, a project `share`, and
    /// eight places a destination.
    fn places(concurrency: usize, share: usize) -> Places {
        Places {
            concurrency,
            share,
            room: DestinationRoom {
                cap: 8,
                room: Vec::new(),
            },
        }
    }

    fn ids(rows: &[EffectRow]) -> Vec<i64> {
        rows.iter().map(|r| r.id).collect()
    }

    #[test]
    fn one_busy_project_alone_takes_all_but_a_share_of_the_places() {
        let evil: Vec<EffectRow> = (1..=20).map(|i| due(i, "evil")).collect();
        let chosen = choose(evil, Vec::new(), &HashMap::new(), places(8, 2));
        assert_eq!(ids(&chosen), vec![1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn a_project_under_its_share_takes_the_kept_places_and_one_past_it_none() {
        let running: HashMap<i64, String> = (1..=6).map(|i| (i, "evil".to_string())).collect();
        // The oldest are evil's; the share look finds good's behind them.
        let any = vec![due(7, "evil"), due(8, "evil")];
        let under = vec![due(20, "good"), due(21, "good"), due(22, "good")];
        let chosen = choose(any, under, &running, places(8, 2));
        assert_eq!(ids(&chosen), vec![20, 21], "good's share; evil's wait");
    }

    #[test]
    fn the_oldest_go_first_each_project_up_to_its_share_then_past_it() {
        let any = vec![due(1, "a"), due(2, "a"), due(3, "a"), due(4, "b")];
        let chosen = choose(any, Vec::new(), &HashMap::new(), places(16, 2));
        assert_eq!(ids(&chosen), vec![1, 2, 4, 3]);
    }

    #[test]
    fn no_destination_takes_more_than_its_room_and_the_others_are_chosen_past_it() {
        // Five of the slow destination run here already: three more may.
        let running: HashMap<i64, String> = (1..=5).map(|i| (i, "p".to_string())).collect();
        let on: HashMap<i64, String> = (1..=5).map(|i| (i, "slow".to_string())).collect();
        let mut any: Vec<EffectRow> = (6..=12).map(|i| to(i, "p", "slow")).collect();
        any.extend([to(13, "p", "fine"), due(14, "p")]);
        let places = Places {
            concurrency: 16,
            share: 16,
            room: destination_room(&on, 8),
        };
        let chosen = choose(any, Vec::new(), &running, places);
        assert_eq!(ids(&chosen), vec![6, 7, 8, 13, 14]);
        // A full destination is named to the reads (none of its rows read).
        let on: HashMap<i64, String> = (1..=8).map(|i| (i, "slow".to_string())).collect();
        assert_eq!(destination_room(&on, 8).full(), vec!["slow"]);
    }

    #[test]
    fn the_projects_at_their_share_are_named() {
        let running: HashMap<i64, String> = [(1, "a"), (2, "a"), (3, "b")]
            .into_iter()
            .map(|(i, p)| (i, p.to_string()))
            .collect();
        assert_eq!(at_share(&running, 2), vec!["a".to_string()]);
    }
}
