//! Runs the processor outbox: one worker per host leases due effects (a
//! `pending` one whose time has come, or a `running` one whose lease
//! expired), executes each as a task (at most `[effects] concurrency` at
//! once, each bounded by `[delivery] timeout-ms`), and settles it with the
//! pure decision of `crate::effect::settle`. A terminal failure first
//! appends its one `error-occurred` line (idempotent) to the source stream,
//! then settles, so a crash between the two repeats nothing visible.
//!
//! At least once: an execution whose settlement is lost (crash, lost lease)
//! runs again; each target is idempotent by the effect's identity. At start
//! the effects left `running` by the previous process run again at once (the
//! data dir is locked to one host, so their executor is gone).

use std::collections::HashSet;
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
use crate::storage::{EffectOp, EffectRow, WriteOp};
use crate::stream::{
    AppendInput, Authority, EffectOrigin, EventInput, EventSource, Namespace, StreamAddress,
    StreamsRef,
};

/// Longest the worker sleeps without looking (a safety net: commits and
/// API calls wake it at once).
const IDLE_LOOK_MS: i64 = 5_000;
/// Shortest pause before looking again for due effects.
const BUSY_LOOK_MS: i64 = 5;
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
pub fn start(streams: StreamsRef, bell: EffectsBell, settings: Settings) {
    tokio::spawn(run(streams, bell, settings));
}

async fn run(streams: StreamsRef, bell: EffectsBell, settings: Settings) {
    // The data dir is locked to this host: what was running ran in a
    // process that is gone, so it need not wait for its lease. (With
    // several hosts on one database, only the effects of its own streams:
    // its host id outlives the process, in the data dir.)
    if let Some(live) = streams.upgrade() {
        let op = EffectOp::ReclaimAll {
            now_ms: settings.clock.now_ms(),
            owner: live.storage().cluster().map(|me| me.id.clone()),
        };
        match live.storage().submit(WriteOp::Effect(op)).await {
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
    let mut running: HashSet<i64> = HashSet::new();
    let concurrency = settings.effects.concurrency;
    loop {
        let Some(live) = streams.upgrade() else {
            return;
        };
        let exec = live.executors().clone();
        drop(live);
        let now = settings.clock.now_ms();
        let mut wait_ms = IDLE_LOOK_MS;
        if running.len() < concurrency {
            let storage = exec.storage.clone();
            // The effects running here hold leases that expire in the future,
            // so the due ones are others: ask for just the free slots.
            let want = concurrency - running.len();
            let lease_ms = settings.effects.lease_ms as i64;
            let here: Vec<i64> = running.iter().copied().collect();
            // PostgreSQL: due rows are leased in one statement (one round
            // trip for the whole batch); SQLite: read, then leased by the
            // writer in one group.
            let due = blocking(move || {
                let due = match storage.lease_due_effects(lease_ms, want, &here) {
                    Ok(Some(leased)) => Ok(Due::Leased(leased)),
                    Ok(None) => storage.due_effects(now, want).map(Due::Read),
                    Err(e) => Err(e),
                };
                due.map_err(|e| Failure::new(format!("{e:#}"), true))
            })
            .await;
            match due {
                Ok(due) => {
                    let (leased, storage_failed) = match due {
                        Due::Leased(leased) => (leased, false),
                        Due::Read(due) => {
                            let fresh: Vec<EffectRow> = due
                                .into_iter()
                                .filter(|e| !running.contains(&e.id))
                                .take(want)
                                .collect();
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
                        running.insert(row.id);
                        let (exec, settings, done) =
                            (exec.clone(), settings.clone(), done_tx.clone());
                        tokio::spawn(async move {
                            let id = row.id;
                            execute_and_settle(&exec, &settings, row).await;
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
                while let Ok(id) = done_rx.try_recv() {
                    running.remove(&id);
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
    /// Due, to be leased by the writer (SQLite).
    Read(Vec<EffectRow>),
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

/// Leases `due` (one write each, committed together); answers the rows
/// leased, with `attempts` counting this execution, and whether a write
/// failed.
async fn lease(
    exec: &Executors,
    settings: &Settings,
    due: Vec<EffectRow>,
    now: i64,
) -> (Vec<EffectRow>, bool) {
    let lease_until_ms = now + settings.effects.lease_ms as i64;
    let pending: Vec<_> = due
        .into_iter()
        .map(|row| {
            let reply = exec.storage.submit(WriteOp::Effect(EffectOp::Lease {
                id: row.id,
                attempts: row.attempts,
                now_ms: now,
                lease_until_ms,
            }));
            (row, reply)
        })
        .collect();
    let mut leased = Vec::with_capacity(pending.len());
    let mut failed = false;
    for (mut row, reply) in pending {
        match reply.await {
            Ok(Ok(lease_id)) if lease_id > 0 => {
                row.attempts += 1;
                row.lease_id = lease_id;
                row.status = "running".into();
                leased.push(row);
            }
            Ok(Ok(_)) => {} // moved by someone else (cancelled, settled)
            Ok(Err(e)) => {
                failed = true;
                tracing::warn!(id = row.id, error = %e, "leasing an effect failed");
            }
            Err(_) => return (leased, true),
        }
    }
    (leased, failed)
}

async fn execute_and_settle(exec: &Executors, settings: &Settings, row: EffectRow) {
    let timeout_ms = settings.delivery.timeout_ms;
    let (kind, name) = effect::consumer(&row.component);
    let label = format!("effect {:?} of {kind} {name:?}", row.key);
    let outcome = match Target::from_json(&row.target) {
        Ok(target) => {
            let wait = Duration::from_millis(timeout_ms);
            match guarded(
                &label,
                wait,
                timeout_ms,
                &super::Gate::default(),
                execute(exec, &row, target, timeout_ms),
            )
            .await
            {
                Ok(result) => Outcome::Succeeded { result },
                Err(f) => Outcome::Failed {
                    message: f.message,
                    retryable: f.retryable,
                },
            }
        }
        Err(message) => Outcome::Failed {
            message,
            retryable: false,
        },
    };
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
        Ok(Ok(_)) => tracing::info!(id = row.id, "an effect's lease was lost before it settled"),
        Ok(Err(e)) => tracing::warn!(id = row.id, error = %e, "settling an effect failed"),
        Err(_) => {}
    }
}

fn address_of(project: &str, path: &str) -> Result<StreamAddress, Failure> {
    StreamAddress::new(Namespace::from_storage_key(project), path)
        .map_err(|e| Failure::new(e.message, false))
}

/// Runs one effect's target; an ITX call's result comes back.
async fn execute(
    exec: &Executors,
    row: &EffectRow,
    target: Target,
    timeout_ms: u64,
) -> Result<Option<Value>, Failure> {
    match target {
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
            };
            append(exec, &address, event, Authority::Effect)
                .await
                .map(|_| None)
        }
        Target::Webhook { url, body } => exec
            .webhooks
            .post_keyed(&url, &body, timeout_ms, &effect::webhook_headers(row))
            .await
            .map(|()| None)
            .map_err(|(mut f, status)| {
                // A refused address stays refused, whatever the status.
                f.retryable = f.retryable && effect::webhook_retryable(status);
                f
            }),
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
                    .map(Some)
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
) -> Result<(), Failure> {
    let streams = exec
        .streams
        .upgrade()
        .ok_or_else(|| Failure::new("the host is shutting down", true))?;
    let input = AppendInput {
        events: vec![event],
        expected_stream_id: None,
    };
    streams
        .append(address, input, authority)
        .await
        .map(|_| ())
        .map_err(|e| {
            let retryable = matches!(
                e.kind,
                ErrorKind::Unavailable | ErrorKind::Internal | ErrorKind::Timeout
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
    };
    append(exec, &address, event, Authority::Platform)
        .await
        .map_err(|f| f.message)
}
