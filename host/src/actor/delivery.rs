//! The delivery engine inside a source stream's actor core: it keeps the
//! runs of the stream's subscriptions in line with core state after every
//! commit, asks the runtime (`Output::Spawn`) to hand the jobs that the
//! pure schedule (`delivery::schedule`) finds due to the executors
//! (`crate::executor`), and applies their reports.
//!
//! **Architecture Invariant:** delivery never runs inside an append. A
//! delivery is a task; its result comes back as a message, and a result from
//! an older run (the cursor or configuration changed since) is ignored.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::core::{ActorCore, Output};
use crate::delivery::copy::SourceInfo;
use crate::delivery::runtime::SubscriptionRuntime;
use crate::delivery::schedule::{DeliveryDone, Fact};
use crate::delivery::target::Route;
use crate::executor::Source;
use crate::storage::CursorRow;
use crate::stream::CoreState;
use crate::subscription::OutboundSubscription;

/// Push subscriptions have a cursor on the source; processor-wake does not.
fn has_source_cursor(sub: &OutboundSubscription) -> bool {
    sub.configuration.receiver.delivery().is_some()
}

/// The component a processor-wake subscription wakes.
pub(super) fn woken_component(sub: &OutboundSubscription) -> Option<String> {
    match &sub.configuration.receiver {
        crate::subscription::Receiver::ProcessorWake { expression } => {
            crate::itx::wake_component(expression).ok()
        }
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
        attempts: 0,
        last_error: None,
        measurements: None,
    }
}

/// The cursor row of a running subscription, skip counters included.
pub(super) fn cursor_row(key: &str, rt: &SubscriptionRuntime) -> CursorRow {
    CursorRow {
        subscription_key: key.to_string(),
        generation: rt.generation,
        acknowledged_offset: rt.cursor,
        failing_offset: rt.run.failing_event.map(|(o, _)| o),
        failing_attempts: rt.run.failing_event.map_or(0, |(_, n)| n),
        skips: rt.run.skips_since_success,
        attempts: rt.run.attempt,
        last_error: rt
            .last_error
            .as_deref()
            .map(crate::delivery::schedule::cap_text),
        measurements: serde_json::to_string(&rt.measurements()).ok(),
    }
}

/// A loaded run's failure as it stood: a halted run's from its halt fact,
/// a failing run's from its cursor row (so `:runtime` shows `lastError`
/// and `attempt` after a release or a restart).
fn restore_failure(
    rt: &mut SubscriptionRuntime,
    sub: &OutboundSubscription,
    row: Option<&CursorRow>,
) {
    if let Some(halted) = &sub.delivery_halted {
        rt.run.attempt = u32::try_from(halted.attempts).unwrap_or(u32::MAX);
        rt.last_error = halted.error.clone();
    } else if let Some(r) = row.filter(|r| r.attempts > 0) {
        rt.run.attempt = r.attempts;
        rt.run.isolating = true;
        rt.last_error = r.last_error.clone();
    }
    let kept = row
        .and_then(|r| r.measurements.as_deref())
        .and_then(|m| serde_json::from_str(m).ok());
    if let Some(m) = kept {
        rt.restore_measurements(m);
    }
}

impl ActorCore {
    /// Brings delivery state in line with `state`: a new generation starts a
    /// new run at its start cursor (or the committed row of that run), a
    /// removed subscription loses its state, halts and resumes are applied.
    /// `checkpoints` are the processors' checkpoint offsets when known (read
    /// at load); a new wake run without one starts at 0 and its first wake
    /// finds the checkpoint.
    pub(super) fn repair_deliveries(
        &mut self,
        state: &CoreState,
        rows: &[CursorRow],
        checkpoints: &HashMap<String, u64>,
    ) {
        let by_key = &state.subscriptions.outbound.by_key;
        self.deliveries
            .runs
            .retain(|k, _| by_key.get(k).is_some_and(is_driven));
        for (key, sub) in by_key.iter().filter(|(_, s)| is_driven(s)) {
            let generation = sub.generation();
            let halted = sub.delivery_halted.is_some();
            let row = rows
                .iter()
                .find(|r| r.subscription_key == *key && r.generation == generation);
            match self.deliveries.runs.get_mut(key) {
                Some(rt) if rt.generation == generation => {
                    if let Some(row) = row {
                        rt.durable_cursor = rt.durable_cursor.max(row.acknowledged_offset);
                        rt.counters_dirty = false;
                    }
                    if rt.halted && !halted {
                        // Resumed: restart at the existing cursor.
                        rt.run.attempt = 0;
                        rt.next_attempt_at_ms = 0;
                        rt.counters_dirty = true;
                    }
                    if halted {
                        rt.fact_pending = false;
                        rt.in_flight = None;
                    }
                    rt.halted = halted;
                }
                _ => {
                    let route = Route::parse(sub, &self.address, self.config.bounds.jsonata);
                    if let Some(component) = woken_component(sub) {
                        // The processor's checkpoint is its cursor.
                        let checkpoint = checkpoints.get(&component).copied().unwrap_or(0);
                        let mut rt = SubscriptionRuntime::new(
                            generation, route, checkpoint, checkpoint, halted,
                        );
                        rt.processor = Some(component);
                        restore_failure(&mut rt, sub, row);
                        self.deliveries.runs.insert(key.clone(), rt);
                        continue;
                    }
                    let (cursor, durable) = match row {
                        Some(r) => (r.acknowledged_offset, r.acknowledged_offset),
                        None => (sub.start_cursor(), 0),
                    };
                    let mut rt =
                        SubscriptionRuntime::new(generation, route, cursor, durable, halted);
                    if let Some(r) = row {
                        // The skip counters survive restarts.
                        rt.run.failing_event = r.failing_offset.map(|o| (o, r.failing_attempts));
                        rt.run.skips_since_success = r.skips;
                        rt.run.isolating = r.failing_offset.is_some();
                    }
                    restore_failure(&mut rt, sub, row);
                    self.deliveries.runs.insert(key.clone(), rt);
                }
            }
        }
    }

    /// Cursor rows to write with a round that leads to `next`: new runs at
    /// their start, advanced cursors, and removed subscriptions.
    pub(super) fn cursor_rows_for(&self, next: &CoreState) -> (Vec<CursorRow>, Vec<String>) {
        let by_key = &next.subscriptions.outbound.by_key;
        let runs = &self.deliveries.runs;
        let mut rows = Vec::new();
        for (key, sub) in by_key.iter().filter(|(_, s)| is_driven(s)) {
            let generation = sub.generation();
            if !has_source_cursor(sub) {
                // A processor wake: a marker row, so the stream wakes at startup.
                if runs.get(key).is_none_or(|rt| rt.generation != generation) {
                    rows.push(fresh_row(key, generation, 0));
                }
                continue;
            }
            match runs.get(key) {
                Some(rt) if rt.generation == generation => {
                    if rt.cursor != rt.durable_cursor || rt.counters_dirty {
                        rows.push(cursor_row(key, rt));
                    }
                }
                _ => rows.push(fresh_row(key, generation, sub.start_cursor())),
            }
        }
        let removed = runs
            .keys()
            .filter(|k| !by_key.get(*k).is_some_and(is_driven))
            .cloned()
            .collect();
        (rows, removed)
    }

    /// When the schedule needs the actor next (retries, deadlines), in ms
    /// since the epoch.
    pub(super) fn next_delivery_at_ms(&self) -> Option<i64> {
        if self.reload.needed() {
            return None;
        }
        let head = self.stream.as_ref()?.state_offset;
        self.deliveries.next_wake_at_ms(head)
    }

    /// Expires attempts past their deadline and starts every run that is due.
    pub(super) fn pump_deliveries(&mut self) {
        // Several hosts: nothing is delivered while this host's leases may
        // be lapsing (`LeaseChanged` resumes it).
        if self.reload.needed() || !self.env.lease_valid() {
            return;
        }
        let Some(stream) = &self.stream else { return };
        let head = stream.state_offset;
        let now_ms = self.env.now_ms();
        let policy = self.config.delivery.clone();
        let expired = self.deliveries.expire(now_ms, self.env.jitter(), &policy);
        let (jobs, facts) = self.deliveries.due(now_ms, head, policy.timeout_ms);
        for fact in expired.into_iter().chain(facts) {
            self.append_run_fact(fact);
        }
        if jobs.is_empty() {
            return;
        }
        let Some(stream) = &self.stream else { return };
        let source = Arc::new(Source {
            row_id: stream.row_id,
            info: SourceInfo {
                project_id: stream.state.project_id.clone(),
                path: stream.state.path.clone(),
                stream_id: stream.state.stream_id.clone(),
                stream_created_at: stream.state.created_at.clone(),
            },
            fence: self.tenure.fence(),
        });
        self.push_output(Output::Spawn { jobs, source });
    }

    /// The receiver kind of run `key`, as metrics label it.
    fn receiver_kind(&self, key: &str) -> &'static str {
        self.deliveries
            .runs
            .get(key)
            .and_then(|rt| rt.route.as_ref().ok())
            .map_or("unknown", |route| route.target.kind())
    }

    /// Counts the halt and skip facts of run `key` that just committed.
    pub(super) fn count_run_facts(&self, key: &str, events: &[crate::stream::Event]) {
        let kind = self.receiver_kind(key);
        for e in events {
            match e.event_type.as_str() {
                crate::stream::types::SUBSCRIPTION_DELIVERY_HALTED => {
                    self.config.metrics.subscription_halted(kind)
                }
                crate::stream::types::ERROR_OCCURRED => {
                    self.config.metrics.subscription_skipped(kind)
                }
                _ => {}
            }
        }
    }

    /// Applies a delivery report, unless it belongs to an older attempt.
    pub(super) fn delivery_done(&mut self, done: DeliveryDone) {
        if self.stream.is_none() {
            return;
        }
        self.config
            .metrics
            .delivery_attempted(self.receiver_kind(&done.key), done.result.is_ok());
        if let Err(failure) = &done.result {
            tracing::warn!(stream = %self.address, key = %done.key, error = %failure.message, "delivery failed");
        }
        let now_ms = self.env.now_ms();
        let now_us = self.env.now_us();
        let recent = &self.recent_commits;
        let latency = |offset: u64| {
            recent
                .binary_search_by_key(&offset, |(o, _)| *o)
                .ok()
                .map(|i| (now_us - recent[i].1).max(0) as f64 / 1000.0)
        };
        let policy = self.config.delivery.clone();
        let fact = self
            .deliveries
            .complete(done, now_ms, self.env.jitter(), &policy, latency);
        self.prune_recent_commits();
        if let Some(fact) = fact {
            self.append_run_fact(fact);
        }
    }

    /// Queues a platform-authored event of a run (a halt or a skip line); if
    /// it does not commit, the run decides again later.
    fn append_run_fact(&mut self, fact: Fact) {
        let run = (fact.key.clone(), fact.generation);
        self.queue_fact(fact.event_type, fact.payload, Some(run));
    }

    /// Queues a platform-authored event on this stream.
    pub(super) fn append_fact(&mut self, event_type: &str, payload: Value) {
        self.queue_fact(event_type, payload, None);
    }

    /// A run's fact was rejected or failed to commit.
    pub(super) fn run_fact_failed(&mut self, run: &(String, u64)) {
        let now_ms = self.env.now_ms();
        self.deliveries.fact_failed(&run.0, run.1, now_ms);
    }

    /// The `:runtime` answer.
    pub(super) fn runtime_view(&self) -> crate::actor::RuntimeView {
        let head = self.stream.as_ref().map(|s| s.state_offset).unwrap_or(0);
        crate::actor::RuntimeView {
            subscriptions: self
                .deliveries
                .runs
                .iter()
                .map(|(k, rt)| (k.clone(), rt.view(head)))
                .collect(),
            connections: self.connections_view(),
        }
    }
}
