//! The delivery engine inside a source stream's actor: repairing delivery
//! state from core state after every commit, starting deliveries as tasks,
//! and applying their results. Decisions are the pure ones of `delivery`.
//!
//! **Architecture Invariant:** delivery never runs inside an append. A
//! delivery is a task; its result comes back as a message, and a result from
//! an older run (the cursor or configuration changed since) is ignored.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{Actor, Command, Pending};
use crate::delivery::copy::{CopyBatch, SourceInfo};
use crate::delivery::runtime::{select_batch, CompiledFilter, InFlight, SubscriptionRuntime};
use crate::delivery::{Decision, Failure};
use crate::storage::{CursorRow, WriteOp};
use crate::stream::{types, AppendInput, Authority, CoreState, EventInput, StreamAddress};
use crate::subscription::{OutboundSubscription, Receiver};

/// Stored events read per delivery attempt.
const SCAN_EVENTS_MAX: usize = 1000;

/// The result of one delivery attempt, sent back to the source's actor.
#[derive(Debug)]
pub struct DeliveryDone {
    pub key: String,
    pub generation: u64,
    pub id: u64,
    pub duration: Duration,
    pub result: Result<Delivered, Failure>,
}

/// A successful attempt.
#[derive(Debug)]
pub struct Delivered {
    /// The cursor after this attempt.
    pub through: u64,
    /// Offsets delivered to the receiver.
    pub offsets: Vec<u64>,
    pub bytes: usize,
}

/// Sends an attempt's result back to the actor that started it.
async fn report(
    self_tx: &tokio::sync::mpsc::WeakSender<Command>,
    key: String,
    generation: u64,
    id: u64,
    started: Instant,
    result: Result<Delivered, Failure>,
) {
    let done = DeliveryDone {
        key,
        generation,
        id,
        duration: started.elapsed(),
        result,
    };
    if let Some(tx) = self_tx.upgrade() {
        let _ = tx.send(Command::DeliveryDone(Box::new(done))).await;
    }
}

/// Stored events after `cursor` (at most [`SCAN_EVENTS_MAX`], up to `head`),
/// read on a blocking thread.
async fn read_after(
    storage: crate::storage::Storage,
    row_id: i64,
    cursor: u64,
    head: u64,
) -> Result<Vec<(u64, String)>, Failure> {
    tokio::task::spawn_blocking(move || storage.events_after(row_id, cursor, SCAN_EVENTS_MAX, head))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| format!("{e:#}")))
        .map_err(|m| Failure {
            message: format!("reading the source failed: {m}"),
            retryable: true,
            single_offset: None,
        })
}

/// Push subscriptions have a cursor on the source; processor-wake does not.
fn has_source_cursor(sub: &OutboundSubscription) -> bool {
    sub.configuration.receiver.delivery().is_some()
}

/// The component a processor-wake subscription wakes.
fn woken_component(sub: &OutboundSubscription) -> Option<String> {
    match &sub.configuration.receiver {
        Receiver::ProcessorWake { expression } => crate::itx::wake_component(expression).ok(),
        _ => None,
    }
}

/// Subscriptions the engine drives: push receivers and processor wakes.
fn is_driven(sub: &OutboundSubscription) -> bool {
    has_source_cursor(sub) || woken_component(sub).is_some()
}

/// The cursor row of a run that starts now.
fn fresh_row(key: &str, generation: u64, cursor: u64) -> CursorRow {
    CursorRow {
        subscription_key: key.to_string(),
        generation,
        acknowledged_offset: cursor,
        failing_offset: None,
        failing_attempts: 0,
        skips: 0,
    }
}

/// The cursor row of a running subscription, skip counters included.
fn cursor_row(key: &str, rt: &SubscriptionRuntime) -> CursorRow {
    CursorRow {
        subscription_key: key.to_string(),
        generation: rt.generation,
        acknowledged_offset: rt.cursor,
        failing_offset: rt.run.failing_event.map(|(o, _)| o),
        failing_attempts: rt.run.failing_event.map_or(0, |(_, n)| n),
        skips: rt.run.skips_since_success,
    }
}

fn jitter() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (nanos % 2001) as f64 / 1000.0 - 1.0
}

impl Actor {
    /// Brings delivery state in line with `state`: a new generation starts a
    /// new run at its start cursor (or the committed row of that run), a
    /// removed subscription loses its state, halts and resumes are applied.
    pub(super) fn repair_deliveries(&mut self, state: &CoreState, rows: &[CursorRow]) {
        let by_key = &state.subscriptions.outbound.by_key;
        self.deliveries
            .retain(|k, _| by_key.get(k).is_some_and(is_driven));
        let row_id = self.stream.as_ref().map(|s| s.row_id);
        for (key, sub) in by_key.iter().filter(|(_, s)| is_driven(s)) {
            let generation = sub.generation();
            let halted = sub.delivery_halted.is_some();
            let row = rows
                .iter()
                .find(|r| r.subscription_key == *key && r.generation == generation);
            match self.deliveries.get_mut(key) {
                Some(rt) if rt.generation == generation => {
                    if let Some(row) = row {
                        rt.durable_cursor = rt.durable_cursor.max(row.acknowledged_offset);
                        rt.counters_dirty = false;
                    }
                    if rt.halted && !halted {
                        // Resumed: restart at the existing cursor.
                        rt.run.attempt = 0;
                        rt.next_attempt_at_ms = 0;
                    }
                    if halted {
                        rt.fact_pending = false;
                        rt.in_flight = None;
                    }
                    rt.halted = halted;
                }
                _ => {
                    if let Some(component) = woken_component(sub) {
                        // The processor's checkpoint is its cursor.
                        let checkpoint = row_id
                            .and_then(|id| {
                                self.ctx.storage.checkpoint(id, &component).ok().flatten()
                            })
                            .filter(|c| c.stream_id == state.stream_id)
                            .map(|c| c.checkpoint_offset)
                            .unwrap_or(0);
                        let mut rt =
                            SubscriptionRuntime::new(generation, checkpoint, checkpoint, halted);
                        rt.processor = Some(component);
                        self.deliveries.insert(key.clone(), rt);
                        continue;
                    }
                    let (cursor, durable) = match row {
                        Some(r) => (r.acknowledged_offset, r.acknowledged_offset),
                        None => (sub.start_cursor(), 0),
                    };
                    let mut rt = SubscriptionRuntime::new(generation, cursor, durable, halted);
                    if let Some(r) = row {
                        // The skip counters survive restarts.
                        rt.run.failing_event = r.failing_offset.map(|o| (o, r.failing_attempts));
                        rt.run.skips_since_success = r.skips;
                        rt.run.isolating = r.failing_offset.is_some();
                    }
                    self.deliveries.insert(key.clone(), rt);
                }
            }
        }
    }

    /// Cursor rows to write with a round that leads to `next`: new runs at
    /// their start, advanced cursors, and removed subscriptions.
    pub(super) fn cursor_rows_for(&self, next: &CoreState) -> (Vec<CursorRow>, Vec<String>) {
        let by_key = &next.subscriptions.outbound.by_key;
        let mut rows = Vec::new();
        for (key, sub) in by_key.iter().filter(|(_, s)| is_driven(s)) {
            let generation = sub.generation();
            if !has_source_cursor(sub) {
                // A processor wake: a marker row, so the stream wakes at startup.
                if self
                    .deliveries
                    .get(key)
                    .is_none_or(|rt| rt.generation != generation)
                {
                    rows.push(fresh_row(key, generation, 0));
                }
                continue;
            }
            match self.deliveries.get(key) {
                Some(rt) if rt.generation == generation => {
                    if rt.cursor != rt.durable_cursor || rt.counters_dirty {
                        rows.push(cursor_row(key, rt));
                    }
                }
                _ => rows.push(fresh_row(key, generation, sub.start_cursor())),
            }
        }
        let removed = self
            .deliveries
            .keys()
            .filter(|k| !by_key.get(*k).is_some_and(is_driven))
            .cloned()
            .collect();
        (rows, removed)
    }

    /// A write of advanced cursors, when there is nothing else to commit.
    pub(super) fn start_cursor_write(
        &mut self,
    ) -> Option<(
        super::InFlight,
        tokio::sync::oneshot::Receiver<Result<i64, crate::storage::CommitError>>,
    )> {
        let stream = self.stream.as_ref()?;
        if self.reload_needed {
            return None;
        }
        let cursors: Vec<CursorRow> = self
            .deliveries
            .iter()
            .filter(|(_, rt)| {
                rt.processor.is_none() && (rt.cursor != rt.durable_cursor || rt.counters_dirty)
            })
            .map(|(k, rt)| cursor_row(k, rt))
            .collect();
        if cursors.is_empty() {
            return None;
        }
        let rx = self.ctx.storage.submit(WriteOp::Cursors {
            row_id: stream.row_id,
            cursors: cursors.clone(),
        });
        Some((super::InFlight::Cursors { cursors }, rx))
    }

    /// When the next backoff ends, for the actor's timer.
    pub(super) fn next_delivery_timer(&self) -> Option<tokio::time::Instant> {
        let head = self.stream.as_ref()?.state_offset;
        let now_ms = self.ctx.clock.now_ms();
        let at = self
            .deliveries
            .values()
            .filter(|rt| {
                !rt.halted && !rt.fact_pending && rt.in_flight.is_none() && rt.cursor < head
            })
            .map(|rt| rt.next_attempt_at_ms)
            .min()?;
        let wait_ms = (at - now_ms).max(1) as u64;
        Some(tokio::time::Instant::now() + Duration::from_millis(wait_ms))
    }

    /// Starts every delivery that is due.
    pub(super) fn pump_deliveries(&mut self) {
        if self.reload_needed {
            return;
        }
        let Some(stream) = &self.stream else { return };
        let head = stream.state_offset;
        let now_ms = self.ctx.clock.now_ms();
        let due: Vec<String> = self
            .deliveries
            .iter()
            .filter(|(_, rt)| rt.is_due(now_ms, head))
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.start_delivery(&key, head, now_ms);
        }
    }

    fn start_delivery(&mut self, key: &str, head: u64, now_ms: i64) {
        let Some(stream) = &self.stream else { return };
        let Some(sub) = stream.state.subscriptions.outbound.by_key.get(key) else {
            return;
        };
        if let Receiver::ProcessorWake { .. } = &sub.configuration.receiver {
            self.start_wake(key, head, now_ms);
            return;
        }
        if let Receiver::WebhookPost { .. } = &sub.configuration.receiver {
            self.start_webhook(key, head, now_ms);
            return;
        }
        if let Receiver::ItxCall { .. } = &sub.configuration.receiver {
            self.start_itx(key, head, now_ms);
            return;
        }
        let Receiver::CopyToStream {
            receiving_stream_path,
            jsonata_transform,
            ..
        } = &sub.configuration.receiver
        else {
            return;
        };
        let Ok(receiver) =
            StreamAddress::new(self.address.namespace.clone(), receiving_stream_path)
        else {
            return;
        };
        let filter = CompiledFilter::for_subscription(sub);
        let source = SourceInfo {
            project_id: stream.state.project_id.clone(),
            path: stream.state.path.clone(),
            stream_id: stream.state.stream_id.clone(),
            stream_created_at: stream.state.created_at.clone(),
        };
        let row_id = stream.row_id;
        let transform = jsonata_transform.clone();
        let timeout_ms = self.ctx.delivery.timeout_ms;
        let Some(rt) = self.deliveries.get_mut(key) else {
            return;
        };
        self.next_delivery_id += 1;
        let id = self.next_delivery_id;
        rt.in_flight = Some(InFlight::starting(id, now_ms, timeout_ms));
        let (generation, cursor, limit) = (rt.generation, rt.cursor, rt.run.batch_limit());
        let storage = self.ctx.storage.clone();
        let streams = self.ctx.streams.clone();
        let self_tx = self.self_tx.clone();
        let key = key.to_string();
        tokio::spawn(async move {
            let started = Instant::now();
            let label = format!("copy to {:?}", receiver.path);
            let attempt = async {
                let filter = filter.map_err(|m| Failure {
                    message: m,
                    retryable: false,
                    single_offset: None,
                })?;
                let stored = read_after(storage, row_id, cursor, head).await?;
                let selection = select_batch(&key, &stored, &filter, limit, cursor)?;
                let offsets: Vec<u64> = selection.events.iter().map(|e| e.offset).collect();
                if selection.events.is_empty() {
                    return Ok(Delivered {
                        through: selection.through,
                        offsets,
                        bytes: 0,
                    });
                }
                let single_offset = (offsets.len() == 1).then(|| offsets[0]);
                let streams = streams.upgrade().ok_or_else(|| Failure {
                    message: "the host is shutting down".into(),
                    retryable: true,
                    single_offset,
                })?;
                let batch = CopyBatch {
                    source,
                    subscription_key: key.clone(),
                    generation,
                    transform,
                    events: selection.events,
                };
                match streams.deliver(&receiver, batch).await {
                    Ok(_) => Ok(Delivered {
                        through: selection.through,
                        offsets,
                        bytes: selection.bytes,
                    }),
                    Err(e) => Err(Failure {
                        message: format!("{label} failed: {}", e.message),
                        retryable: e.code != "stale-delivery",
                        single_offset,
                    }),
                }
            };
            let result =
                match tokio::time::timeout(Duration::from_millis(timeout_ms), attempt).await {
                    Ok(r) => r,
                    Err(_) => Err(Failure {
                        message: format!("{label} timed out after {timeout_ms}ms"),
                        retryable: true,
                        single_offset: None,
                    }),
                };
            report(&self_tx, key, generation, id, started, result).await;
        });
    }

    /// Starts one awaited ITX call with a batch.
    fn start_itx(&mut self, key: &str, head: u64, now_ms: i64) {
        let Some(stream) = &self.stream else { return };
        let Some(sub) = stream.state.subscriptions.outbound.by_key.get(key) else {
            return;
        };
        let Receiver::ItxCall {
            expression,
            jsonata_transform,
            ..
        } = &sub.configuration.receiver
        else {
            return;
        };
        let Ok(crate::itx::Target::ComponentFunction {
            component,
            function,
        }) = crate::itx::resolve(expression)
        else {
            return;
        };
        let Some(project) = self.address.namespace.project_id().map(str::to_string) else {
            return;
        };
        let filter = CompiledFilter::for_subscription(sub);
        let transform = jsonata_transform.clone();
        let stream_json = json!({
            "projectId": stream.state.project_id,
            "path": stream.state.path,
            "streamId": stream.state.stream_id,
            "streamCreatedAt": stream.state.created_at,
            "maxOffset": head,
        });
        let stream_id = stream.state.stream_id.clone();
        let row_id = stream.row_id;
        let timeout_ms = self.ctx.delivery.timeout_ms;
        let Some(rt) = self.deliveries.get_mut(key) else {
            return;
        };
        self.next_delivery_id += 1;
        let id = self.next_delivery_id;
        rt.in_flight = Some(InFlight::starting(id, now_ms, timeout_ms));
        let (generation, cursor, limit) = (rt.generation, rt.cursor, rt.run.batch_limit());
        let (storage, runtime) = (self.ctx.storage.clone(), self.ctx.runtime.clone());
        let self_tx = self.self_tx.clone();
        let key = key.to_string();
        tokio::spawn(async move {
            let started = Instant::now();
            let result = async {
                let filter = filter.map_err(|m| Failure {
                    message: m,
                    retryable: false,
                    single_offset: None,
                })?;
                let stored = read_after(storage.clone(), row_id, cursor, head).await?;
                let selection = select_batch(&key, &stored, &filter, limit, cursor)?;
                let offsets: Vec<u64> = selection.events.iter().map(|e| e.offset).collect();
                if selection.events.is_empty() {
                    return Ok(Delivered {
                        through: selection.through,
                        offsets,
                        bytes: 0,
                    });
                }
                let single_offset = (offsets.len() == 1).then(|| offsets[0]);
                let mut events = Vec::with_capacity(selection.events.len());
                for e in &selection.events {
                    let posted =
                        crate::delivery::webhook::posted_event(e, transform.as_deref(), &key)?;
                    events.push(json!({
                        "offset": e.offset,
                        "type": posted["type"],
                        "payload": posted["payload"].to_string(),
                        "metadata": posted.get("metadata").map(|m| m.to_string()),
                        "createdAt": e.created_at,
                        "idempotencyKey": e.idempotency_key,
                    }));
                }
                let delivery_id = format!(
                    "{stream_id}:{key}:{generation}:{}-{}",
                    offsets[0],
                    offsets[offsets.len() - 1]
                );
                let batch = json!({
                    "stream": stream_json,
                    "events": events,
                    "scannedThroughOffset": selection.through,
                    "deliveryId": delivery_id,
                });
                let label = format!("itx call {component}.{function}");
                let called = tokio::task::spawn_blocking(move || {
                    use crate::processor::runtime::CallError;
                    let (prepared, _) =
                        crate::processor::deployed(&storage, &runtime, &project, &component)
                            .map_err(|e| {
                                (
                                    format!("loading component {component:?} failed: {e:#}"),
                                    true,
                                )
                            })?
                            .ok_or_else(|| {
                                (format!("component {component:?} is not deployed"), true)
                            })?;
                    let opts = crate::itx::value::ToVal {
                        ignore_unknown_fields: true,
                    };
                    runtime
                        .call_function(&component, &prepared, &function, &[batch], timeout_ms, opts)
                        .map_err(|e| match e {
                            CallError::Err(v) => (
                                v["message"]
                                    .as_str()
                                    .map(str::to_string)
                                    .unwrap_or_else(|| v.to_string()),
                                v["retryable"].as_bool().unwrap_or(true),
                            ),
                            CallError::Argument(m) => (
                                format!("the batch does not fit the function's parameter: {m}"),
                                false,
                            ),
                            CallError::NoSuchFunction(f) => (
                                format!("component {component:?} exports no function {f:?}"),
                                true,
                            ),
                            CallError::Guest(g) => (g.to_string(), true),
                        })
                })
                .await
                .map_err(|e| (format!("the call panicked: {e}"), true))
                .and_then(|r| r);
                match called {
                    Ok(_) => Ok(Delivered {
                        through: selection.through,
                        offsets,
                        bytes: selection.bytes,
                    }),
                    Err((message, retryable)) => Err(Failure {
                        message: format!("{label} failed: {message}"),
                        retryable,
                        single_offset,
                    }),
                }
            }
            .await;
            report(&self_tx, key, generation, id, started, result).await;
        });
    }

    /// Starts one webhook POST (always a single event).
    fn start_webhook(&mut self, key: &str, head: u64, now_ms: i64) {
        let Some(stream) = &self.stream else { return };
        let Some(sub) = stream.state.subscriptions.outbound.by_key.get(key) else {
            return;
        };
        let Receiver::WebhookPost {
            url,
            jsonata_transform,
            ..
        } = &sub.configuration.receiver
        else {
            return;
        };
        let filter = CompiledFilter::for_subscription(sub);
        let (url, transform) = (url.clone(), jsonata_transform.clone());
        let configured_at = sub.configured_at_offset;
        let (project_id, path, stream_id, created_at) = (
            stream.state.project_id.clone(),
            stream.state.path.clone(),
            stream.state.stream_id.clone(),
            stream.state.created_at.clone(),
        );
        let row_id = stream.row_id;
        let timeout_ms = self.ctx.delivery.timeout_ms;
        let Some(rt) = self.deliveries.get_mut(key) else {
            return;
        };
        self.next_delivery_id += 1;
        let id = self.next_delivery_id;
        rt.in_flight = Some(InFlight::starting(id, now_ms, timeout_ms));
        let (generation, cursor, failing) = (rt.generation, rt.cursor, rt.run.failing_event);
        let storage = self.ctx.storage.clone();
        let self_tx = self.self_tx.clone();
        let key = key.to_string();
        tokio::spawn(async move {
            let started = Instant::now();
            let result = async {
                let filter = filter.map_err(|m| Failure {
                    message: m,
                    retryable: false,
                    single_offset: None,
                })?;
                let (stored, configured) = tokio::task::spawn_blocking(move || {
                    let stored = storage.events_after(row_id, cursor, SCAN_EVENTS_MAX, head)?;
                    let configured = storage.events_after(
                        row_id,
                        configured_at.saturating_sub(1),
                        1,
                        configured_at,
                    )?;
                    anyhow::Ok((stored, configured))
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| format!("{e:#}")))
                .map_err(|m| Failure {
                    message: format!("reading the source failed: {m}"),
                    retryable: true,
                    single_offset: None,
                })?;
                let selection = select_batch(&key, &stored, &filter, 1, cursor)?;
                let Some(event) = selection.events.first() else {
                    return Ok(Delivered {
                        through: selection.through,
                        offsets: Vec::new(),
                        bytes: 0,
                    });
                };
                let configured_event: Value = configured
                    .first()
                    .and_then(|(_, body)| serde_json::from_str(body).ok())
                    .unwrap_or(Value::Null);
                let attempt = match failing {
                    Some((o, n)) if o == event.offset => n + 1,
                    _ => 1,
                };
                let posted =
                    crate::delivery::webhook::posted_event(event, transform.as_deref(), &key)?;
                let envelope = crate::delivery::webhook::Envelope {
                    project_id: project_id.as_deref(),
                    path: &path,
                    stream_id: &stream_id,
                    stream_created_at: &created_at,
                    subscription_key: &key,
                    generation,
                    attempt,
                    configured_event: &configured_event,
                };
                let body = crate::delivery::webhook::body(&envelope, &posted, event.offset);
                crate::delivery::webhook::post(&url, &body, timeout_ms, event.offset).await?;
                Ok(Delivered {
                    through: selection.through,
                    offsets: vec![event.offset],
                    bytes: selection.bytes,
                })
            }
            .await;
            report(&self_tx, key, generation, id, started, result).await;
        });
    }

    /// Starts one wake of a processor-wake subscription's component.
    fn start_wake(&mut self, key: &str, head: u64, now_ms: i64) {
        let Some(stream) = &self.stream else { return };
        let Some(sub) = stream.state.subscriptions.outbound.by_key.get(key) else {
            return;
        };
        let Some(rt) = self.deliveries.get_mut(key) else {
            return;
        };
        let Some(component) = rt.processor.clone() else {
            return;
        };
        let Some(project) = self.address.namespace.project_id().map(str::to_string) else {
            return;
        };
        let filter = CompiledFilter::new(sub.configuration.filter.as_ref(), false);
        let timeout_ms = self.ctx.delivery.timeout_ms;
        self.next_delivery_id += 1;
        let id = self.next_delivery_id;
        rt.in_flight = Some(InFlight::starting(id, now_ms, timeout_ms));
        let generation = rt.generation;
        let limit = rt.run.batch_limit();
        let job_stream = crate::processor::runtime::StreamInfo {
            project_id: stream.state.project_id.clone(),
            path: stream.state.path.clone(),
            stream_id: stream.state.stream_id.clone(),
            stream_created_at: stream.state.created_at.clone(),
            max_offset: head,
        };
        let (storage, runtime, row_id) = (
            self.ctx.storage.clone(),
            self.ctx.runtime.clone(),
            stream.row_id,
        );
        let self_tx = self.self_tx.clone();
        let key = key.to_string();
        tokio::spawn(async move {
            let started = Instant::now();
            let result = async {
                let filter = filter.map_err(|m| Failure {
                    message: m,
                    retryable: false,
                    single_offset: None,
                })?;
                let job = crate::processor::wake::WakeJob {
                    storage: storage.clone(),
                    runtime,
                    row_id,
                    project,
                    component: component.clone(),
                    stream: job_stream,
                    head,
                    limit,
                    filter,
                    timeout_ms,
                    now_ms,
                };
                let woken = tokio::task::spawn_blocking(move || crate::processor::wake::wake(job))
                    .await
                    .map_err(|e| Failure {
                        message: format!("processor {component:?} wake panicked: {e}"),
                        retryable: true,
                        single_offset: None,
                    })??;
                let through = woken.checkpoint.offset;
                let bytes = woken.checkpoint.state.len();
                storage
                    .submit(WriteOp::Checkpoint(woken.checkpoint))
                    .await
                    .map_err(|_| "the storage writer stopped".to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()))
                    .map_err(|m| Failure {
                        message: format!(
                            "committing the checkpoint of processor {component:?} failed: {m}"
                        ),
                        retryable: true,
                        single_offset: None,
                    })?;
                Ok(Delivered {
                    through,
                    offsets: woken.offsets,
                    bytes,
                })
            }
            .await;
            report(&self_tx, key, generation, id, started, result).await;
        });
    }

    /// Applies a delivery result, unless it belongs to an older run.
    pub(super) fn delivery_done(&mut self, done: DeliveryDone) {
        let now_ms = self.ctx.clock.now_ms();
        let Some(stream) = &self.stream else { return };
        let Some(sub) = stream.state.subscriptions.outbound.by_key.get(&done.key) else {
            return;
        };
        let on_failing_event = sub
            .configuration
            .receiver
            .delivery()
            .map_or(crate::subscription::OnFailingEvent::Halt, |d| {
                d.on_failing_event
            });
        let Some(rt) = self.deliveries.get_mut(&done.key) else {
            return;
        };
        if rt.generation != done.generation || rt.in_flight.as_ref().map(|f| f.id) != Some(done.id)
        {
            tracing::debug!(stream = %self.address, key = %done.key, "ignoring a stale delivery result");
            return;
        }
        rt.in_flight = None;
        rt.delivery_duration_ms
            .record(done.duration.as_secs_f64() * 1000.0);
        match done.result {
            Ok(d) => {
                rt.cursor = rt.cursor.max(d.through);
                if rt.processor.is_some() {
                    // Committed with the processor's state already.
                    rt.durable_cursor = rt.cursor;
                }
                rt.last_delivery_ms = Some(now_ms);
                // Passing over events that do not match is progress, not a
                // receiver's success: it neither ends isolation nor resets
                // the skip counters.
                if !d.offsets.is_empty() {
                    if rt.run.failing_event.is_some() || rt.run.skips_since_success > 0 {
                        rt.counters_dirty = true;
                    }
                    rt.run.on_success();
                }
                rt.last_error = None;
                rt.bytes_sent += d.bytes as u64;
                let now = Instant::now();
                for offset in d.offsets {
                    if let Ok(i) = self
                        .recent_commits
                        .binary_search_by_key(&offset, |(o, _)| *o)
                    {
                        let at = self.recent_commits[i].1;
                        rt.completion_latency_ms
                            .record(now.duration_since(at).as_secs_f64() * 1000.0);
                    }
                }
            }
            Err(failure) => {
                tracing::warn!(stream = %self.address, key = %done.key, error = %failure.message, attempt = rt.run.attempt + 1, "delivery failed");
                let decision = rt.run.on_failure(
                    &failure,
                    &self.ctx.delivery,
                    on_failing_event,
                    now_ms,
                    jitter(),
                );
                rt.last_error = Some(failure.message.clone());
                rt.counters_dirty = true;
                match decision {
                    Decision::Retry { at_ms } => rt.next_attempt_at_ms = at_ms,
                    Decision::Halt => {
                        rt.fact_pending = true;
                        let payload = json!({
                            "subscriptionKey": done.key,
                            "reason": "delivery-failed",
                            "afterOffset": rt.cursor,
                            "attempts": rt.run.attempt,
                            "error": failure.message,
                        });
                        self.append_fact(types::SUBSCRIPTION_DELIVERY_HALTED, payload);
                    }
                    Decision::Skip { offset } => {
                        let attempts = crate::delivery::EVENT_ATTEMPTS_BEFORE_SKIP;
                        rt.cursor = rt.cursor.max(offset);
                        rt.next_attempt_at_ms = 0;
                        let message = format!(
                            "subscription {:?} skipped failing event at offset {offset} after {attempts} event-specific attempts: {}",
                            done.key, failure.message
                        );
                        self.append_fact(
                            types::ERROR_OCCURRED,
                            json!({"message": message, "subscriptionKey": done.key, "offset": offset}),
                        );
                    }
                }
            }
        }
    }

    /// Queues a platform-authored event on this stream.
    pub(super) fn append_fact(&mut self, event_type: &str, payload: Value) {
        let input = AppendInput {
            events: vec![EventInput {
                event_type: event_type.to_string(),
                payload: payload.as_object().cloned(),
                metadata: None,
                idempotency_key: None,
                ephemeral: None,
                offset: None,
                source: None,
            }],
            expected_stream_id: None,
        };
        self.queue.push_back(Pending::Append {
            input,
            authority: Authority::Platform,
            reply: None,
        });
    }

    /// The `:runtime` answer.
    pub(super) fn runtime_json(&self) -> Value {
        let head = self.stream.as_ref().map(|s| s.state_offset).unwrap_or(0);
        let subscriptions: serde_json::Map<String, Value> = self
            .deliveries
            .iter()
            .map(|(k, rt)| (k.clone(), rt.to_json(head)))
            .collect();
        json!({"subscriptions": subscriptions, "connections": self.connections_json()})
    }
}
