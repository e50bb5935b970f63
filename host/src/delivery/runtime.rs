//! Runtime (non-replayed) delivery state of one subscription and its JSON
//! view for `:runtime`.

use std::collections::VecDeque;
use std::sync::Arc;

use serde_json::{json, Value};

use super::target::Route;
use super::RunState;

/// Latency samples kept per statistic.
const LATENCY_SAMPLES_MAX: usize = 1024;

/// A bounded window of latency samples, in milliseconds.
#[derive(Debug, Clone, Default)]
pub struct LatencyStats {
    samples: VecDeque<f64>,
    count: u64,
}

impl LatencyStats {
    pub fn record(&mut self, ms: f64) {
        if self.samples.len() == LATENCY_SAMPLES_MAX {
            self.samples.pop_front();
        }
        self.samples.push_back(ms);
        self.count += 1;
    }

    /// `{count, p50, p99, max}` over the window, or `null` before any sample.
    pub fn to_json(&self) -> Value {
        if self.samples.is_empty() {
            return Value::Null;
        }
        let mut s: Vec<f64> = self.samples.iter().copied().collect();
        s.sort_by(|a, b| a.total_cmp(b));
        let pick = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
        let round = |v: f64| (v * 1000.0).round() / 1000.0;
        json!({
            "count": self.count,
            "p50": round(pick(0.5)),
            "p99": round(pick(0.99)),
            "max": round(s[s.len() - 1]),
        })
    }
}

/// A delivery in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct InFlight {
    /// The attempt id; only its report can settle it.
    pub id: u64,
    /// When the executor gives up on it (ms since the epoch).
    pub deadline_ms: i64,
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
    pub fn to_json(&self, head: u64) -> Value {
        json!({
            "acknowledgedOffset": self.cursor,
            "lag": head.saturating_sub(self.cursor),
            "attempt": self.run.attempt,
            "nextAttemptAt": if self.halted || self.run.attempt == 0 { Value::Null } else { json!(self.next_attempt_at_ms) },
            "inFlightDeadlineAt": self.in_flight.as_ref().map(|f| f.deadline_ms),
            "lastError": self.last_error,
            "halted": self.halted,
            "generation": self.generation,
            "bytesSent": self.bytes_sent,
            "completionLatencyMs": self.completion_latency_ms.to_json(),
            "deliveryDurationMs": self.delivery_duration_ms.to_json(),
            "processor": self.processor,
            "lastDeliveryAt": self.last_delivery_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_stats() {
        let mut l = LatencyStats::default();
        assert_eq!(l.to_json(), Value::Null);
        for i in 1..=100 {
            l.record(i as f64);
        }
        let j = l.to_json();
        assert_eq!(j["count"], 100);
        assert_eq!(j["max"], 100.0);
        assert_eq!(j["p50"], 51.0);
    }
}
