//! Runtime (non-replayed) delivery state of one subscription and its JSON
//! view for `:runtime`.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::target::Route;
use super::RunState;

/// Latency samples kept per statistic.
const LATENCY_SAMPLES_MAX: usize = 1024;

/// A bounded window of latency samples, in milliseconds.
#[derive(Debug, Clone, Default)]
pub struct LatencyStats {
    samples: VecDeque<f64>,
    count: u64,
    /// The summary kept by the run's cursor row (a restart): shown until
    /// new samples come, and counted in with them.
    restored: Option<Latency>,
}

impl LatencyStats {
    pub fn record(&mut self, ms: f64) {
        if self.samples.len() == LATENCY_SAMPLES_MAX {
            self.samples.pop_front();
        }
        self.samples.push_back(ms);
        self.count += 1;
    }

    /// Starts from a summary kept across a restart.
    pub fn restored(summary: Option<Latency>) -> Self {
        LatencyStats {
            restored: summary,
            ..LatencyStats::default()
        }
    }

    /// The window's summary, or `None` before any sample.
    pub fn summary(&self) -> Option<Latency> {
        if self.samples.is_empty() {
            return self.restored.clone();
        }
        let mut s: Vec<f64> = self.samples.iter().copied().collect();
        s.sort_by(|a, b| a.total_cmp(b));
        let pick = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
        let round = |v: f64| (v * 1000.0).round() / 1000.0;
        Some(Latency {
            count: self.count + self.restored.as_ref().map_or(0, |r| r.count),
            p50: round(pick(0.5)),
            p99: round(pick(0.99)),
            max: round(s[s.len() - 1]),
        })
    }
}

/// What a run measured, kept on its cursor row so `:runtime` shows it
/// after a restart (JSON in `subscription_cursors.measurements`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Measurements {
    /// The run measured (a row that a new run took over, on PostgreSQL,
    /// may still hold the old run's until its first write).
    #[serde(default)]
    pub generation: u64,
    /// When a failing run tries again (ms since the epoch; 0: not failing).
    #[serde(default)]
    pub next_attempt_at_ms: i64,
    #[serde(default)]
    pub bytes_sent: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_latency_ms: Option<Latency>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_duration_ms: Option<Latency>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_delivery_ms: Option<i64>,
}

impl SubscriptionRuntime {
    /// What the run measured, for its cursor row.
    pub fn measurements(&self) -> Measurements {
        Measurements {
            generation: self.generation,
            next_attempt_at_ms: if self.run.attempt > 0 {
                self.next_attempt_at_ms
            } else {
                0
            },
            bytes_sent: self.bytes_sent,
            completion_latency_ms: self.completion_latency_ms.summary(),
            delivery_duration_ms: self.delivery_duration_ms.summary(),
            last_delivery_ms: self.last_delivery_ms,
        }
    }

    /// Takes up what a cursor row kept for this run.
    pub fn restore_measurements(&mut self, m: Measurements) {
        if m.generation != self.generation {
            return;
        }
        if self.run.attempt > 0 {
            self.next_attempt_at_ms = m.next_attempt_at_ms;
        }
        self.bytes_sent = m.bytes_sent;
        self.completion_latency_ms = LatencyStats::restored(m.completion_latency_ms);
        self.delivery_duration_ms = LatencyStats::restored(m.delivery_duration_ms);
        self.last_delivery_ms = m.last_delivery_ms;
    }
}

/// A latency summary in milliseconds over the latest samples (at most
/// 1024; `count` is all of them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Samples ever recorded.
    pub count: u64,
    /// The median of the window.
    pub p50: f64,
    /// The 99th percentile of the window.
    pub p99: f64,
    /// The largest in the window.
    pub max: f64,
}

/// One subscription's delivery as `:runtime` shows it. A push run's
/// attempt, next attempt, last error, bytes and latencies are kept on its
/// cursor row as of its last cursor write, so a restart or a release
/// shows them again; a processor wake's measurements start again with
/// each process (its cursor is the processor's checkpoint).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryView {
    /// The source offset delivered and acknowledged (exclusive cursor).
    pub acknowledged_offset: u64,
    /// Committed source events not yet acknowledged.
    pub lag: u64,
    /// The current attempt (0: not failing).
    pub attempt: u32,
    /// When a failing delivery is tried again (ms since the epoch).
    pub next_attempt_at: Option<i64>,
    /// When the delivery in flight is given up (ms since the epoch).
    pub in_flight_deadline_at: Option<i64>,
    /// The next attempt is due but waits for a place: its project's share
    /// of receivers running at once is taken (`[delivery]
    /// concurrency-per-project`; for wakes and ITX receivers `[processors]
    /// max-concurrent-calls-per-project`). Waiting is not a failure.
    pub waiting_for_place: bool,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// Halted: nothing is delivered until it is resumed.
    pub halted: bool,
    /// The run (`cursorChangedAtSourceOffset` of its configuration).
    pub generation: u64,
    /// Bytes of events delivered.
    pub bytes_sent: u64,
    /// From an event's commit to its acknowledgement.
    pub completion_latency_ms: Option<Latency>,
    /// From a delivery's start to its acknowledgement.
    pub delivery_duration_ms: Option<Latency>,
    /// The component a processor wake wakes.
    pub processor: Option<String>,
    /// When the last delivery succeeded (ms since the epoch).
    pub last_delivery_at: Option<i64>,
}

/// A delivery in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct InFlight {
    /// The attempt id; only its report can settle it.
    pub id: u64,
    /// When the executor gives up on it (ms since the epoch); none while
    /// it waits for a place (its project's share of receivers is taken),
    /// since its time starts with its place.
    pub deadline_ms: Option<i64>,
    /// Its time once it runs: the timeout (and a receiver's grace).
    pub budget_ms: i64,
}

/// Delivery state of one push subscription on its source stream.
#[derive(Debug, Clone)]
pub struct SubscriptionRuntime {
    /// The run this state belongs to (`cursorChangedAtSourceOffset`).
    pub generation: u64,
    /// The run's receiver parsed once; an error halts the run.
    pub route: Result<Arc<Route>, String>,
    /// Acknowledged (exclusive) source offset.
    pub cursor: u64,
    /// The cursor as last committed to the cursor row.
    pub durable_cursor: u64,
    pub run: RunState,
    pub next_attempt_at_ms: i64,
    pub in_flight: Option<InFlight>,
    pub last_error: Option<String>,
    pub halted: bool,
    /// A halt or skip fact is being appended; no deliveries until it commits.
    pub fact_pending: bool,
    pub bytes_sent: u64,
    pub completion_latency_ms: LatencyStats,
    pub delivery_duration_ms: LatencyStats,
    /// For processor-wake subscriptions: the component woken. Its cursor is
    /// the processor's checkpoint, not a cursor row.
    pub processor: Option<String>,
    /// When the last delivery succeeded, ms since the epoch.
    pub last_delivery_ms: Option<i64>,
    /// The skip counters changed since the cursor row was written.
    pub counters_dirty: bool,
}

impl SubscriptionRuntime {
    /// The runtime of a run that starts after `cursor`.
    pub fn new(
        generation: u64,
        route: Result<Route, String>,
        cursor: u64,
        durable_cursor: u64,
        halted: bool,
    ) -> Self {
        SubscriptionRuntime {
            generation,
            route: route.map(Arc::new),
            cursor,
            durable_cursor,
            run: RunState::default(),
            next_attempt_at_ms: 0,
            in_flight: None,
            last_error: None,
            halted,
            fact_pending: false,
            bytes_sent: 0,
            completion_latency_ms: LatencyStats::default(),
            delivery_duration_ms: LatencyStats::default(),
            processor: None,
            last_delivery_ms: None,
            counters_dirty: false,
        }
    }

    /// Whether a delivery should start now.
    pub fn is_due(&self, now_ms: i64, head: u64) -> bool {
        !self.halted
            && !self.fact_pending
            && self.in_flight.is_none()
            && self.cursor < head
            && self.next_attempt_at_ms <= now_ms
    }

    /// The `:runtime` view.
    pub fn view(&self, head: u64) -> DeliveryView {
        DeliveryView {
            acknowledged_offset: self.cursor,
            lag: head.saturating_sub(self.cursor),
            attempt: self.run.attempt,
            next_attempt_at: (!self.halted && self.run.attempt != 0)
                .then_some(self.next_attempt_at_ms),
            in_flight_deadline_at: self.in_flight.as_ref().and_then(|f| f.deadline_ms),
            waiting_for_place: self
                .in_flight
                .as_ref()
                .is_some_and(|f| f.deadline_ms.is_none()),
            last_error: self.last_error.clone(),
            halted: self.halted,
            generation: self.generation,
            bytes_sent: self.bytes_sent,
            completion_latency_ms: self.completion_latency_ms.summary(),
            delivery_duration_ms: self.delivery_duration_ms.summary(),
            processor: self.processor.clone(),
            last_delivery_at: self.last_delivery_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_stats() {
        let mut l = LatencyStats::default();
        assert_eq!(l.summary(), None);
        for i in 1..=100 {
            l.record(i as f64);
        }
        let j = l.summary().unwrap();
        assert_eq!(j.count, 100);
        assert_eq!(j.max, 100.0);
        assert_eq!(j.p50, 51.0);
    }
}
