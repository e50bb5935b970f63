//! Runtime (non-replayed) delivery state of one subscription, its JSON view
//! for `:runtime`, and the pure selection of the next batch from the log.

use std::collections::VecDeque;
use std::time::Instant;

use serde_json::{json, Value};

use super::copy::is_drop_audit;
use super::{Failure, RunState, BATCH_BYTES_MAX};
use crate::jsonata::{Expression, Input};
use crate::stream::Event;
use crate::subscription::{Filter, OutboundSubscription};

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
#[derive(Debug, Clone)]
pub struct InFlight {
    pub id: u64,
    pub deadline_ms: i64,
    pub started: Instant,
}

impl InFlight {
    /// Attempt `id`, starting at `now_ms`, due back within `timeout_ms`.
    pub fn starting(id: u64, now_ms: i64, timeout_ms: u64) -> InFlight {
        InFlight {
            id,
            deadline_ms: now_ms + timeout_ms as i64,
            started: Instant::now(),
        }
    }
}

/// Delivery state of one push subscription on its source stream.
#[derive(Debug, Clone)]
pub struct SubscriptionRuntime {
    /// The run this state belongs to (`cursorChangedAtSourceOffset`).
    pub generation: u64,
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
    pub fn new(generation: u64, cursor: u64, durable_cursor: u64, halted: bool) -> Self {
        SubscriptionRuntime {
            generation,
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

/// A compiled filter.
#[derive(Clone, Debug, Default)]
pub struct CompiledFilter {
    pub event_types: Option<Vec<String>>,
    pub condition: Option<Expression>,
    /// Skip drop audit lines (copy subscriptions never copy them onward).
    pub skip_drop_audits: bool,
}

impl CompiledFilter {
    pub fn new(filter: Option<&Filter>, skip_drop_audits: bool) -> Result<Self, String> {
        Ok(CompiledFilter {
            event_types: filter.and_then(|f| f.event_types.clone()),
            condition: match filter.and_then(|f| f.jsonata_condition.as_deref()) {
                Some(c) => Some(crate::jsonata::compile(c)?),
                None => None,
            },
            skip_drop_audits,
        })
    }

    pub fn for_subscription(sub: &OutboundSubscription) -> Result<Self, String> {
        let copy = sub.configuration.receiver.action() == "copy-to-stream";
        Self::new(sub.configuration.filter.as_ref(), copy)
    }
}

/// The events chosen for one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// Matching events to deliver, in order.
    pub events: Vec<Event>,
    /// Bytes of the matching events as stored.
    pub bytes: usize,
    /// The cursor after a successful delivery of `events`.
    pub through: u64,
}

/// Chooses the next batch from stored events after the cursor: matching
/// events up to `limit` events and about [`BATCH_BYTES_MAX`] bytes; events
/// that do not match are passed over (they still advance the cursor). A
/// condition that throws ends the batch before that event, or, when it is the
/// first event to consider, is the attempt's failure.
pub fn select_batch(
    key: &str,
    stored: &[(u64, String)],
    filter: &CompiledFilter,
    limit: usize,
    cursor: u64,
) -> Result<Selection, Failure> {
    let mut selection = Selection {
        events: Vec::new(),
        bytes: 0,
        through: cursor,
    };
    for (offset, body) in stored {
        let value: Value = serde_json::from_str(body).map_err(|e| Failure {
            message: format!("the stored event at offset {offset} is not JSON: {e}"),
            retryable: true,
            single_offset: Some(*offset),
        })?;
        let event: Event = serde_json::from_value(value.clone()).map_err(|e| Failure {
            message: format!("the stored event at offset {offset} is malformed: {e}"),
            retryable: true,
            single_offset: Some(*offset),
        })?;
        let mut matches = filter
            .event_types
            .as_ref()
            .is_none_or(|ts| ts.contains(&event.event_type));
        if matches && filter.skip_drop_audits && is_drop_audit(&event.event_type, &event.payload) {
            matches = false;
        }
        if matches {
            if let Some(c) = &filter.condition {
                match c.matches(&Input::new(&value)) {
                    Ok(m) => matches = m,
                    Err(e) if selection.events.is_empty() && selection.through == cursor => {
                        return Err(Failure {
                            message: format!(
                                "subscription {key:?} filter condition failed on offset {offset}: {e}"
                            ),
                            retryable: true,
                            single_offset: Some(*offset),
                        })
                    }
                    // Deliver what precedes it; the next attempt starts here.
                    Err(_) => return Ok(selection),
                }
            }
        }
        if matches {
            if !selection.events.is_empty()
                && (selection.events.len() >= limit
                    || selection.bytes + body.len() > BATCH_BYTES_MAX)
            {
                return Ok(selection);
            }
            selection.bytes += body.len();
            selection.events.push(event);
        }
        selection.through = *offset;
    }
    Ok(selection)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(offset: u64, t: &str, payload: Value) -> (u64, String) {
        let e = json!({"offset": offset, "type": t, "payload": payload, "createdAt": "2026-11-30T00:00:00.000Z"});
        (offset, e.to_string())
    }

    fn log() -> Vec<(u64, String)> {
        vec![
            stored(3, "a", json!({"n": 1})),
            stored(4, "b", json!({"n": 2})),
            stored(5, "a", json!({"n": 3})),
            stored(6, "a", json!({"n": "x"})),
        ]
    }

    #[test]
    fn non_matching_events_advance_the_cursor() {
        let f = CompiledFilter::new(
            Some(&Filter {
                event_types: Some(vec!["b".into()]),
                jsonata_condition: None,
            }),
            false,
        )
        .unwrap();
        let s = select_batch("k", &log(), &f, 1000, 2).unwrap();
        assert_eq!(
            s.events.iter().map(|e| e.offset).collect::<Vec<_>>(),
            vec![4]
        );
        assert_eq!(s.through, 6);
        let none = CompiledFilter::new(
            Some(&Filter {
                event_types: Some(vec!["zzz".into()]),
                jsonata_condition: None,
            }),
            false,
        )
        .unwrap();
        let s = select_batch("k", &log(), &none, 1000, 2).unwrap();
        assert!(s.events.is_empty());
        assert_eq!(s.through, 6);
    }

    #[test]
    fn isolate_mode_takes_one_matching_event() {
        let s = select_batch("k", &log(), &CompiledFilter::default(), 1, 2).unwrap();
        assert_eq!(s.events.len(), 1);
        assert_eq!(s.through, 3);
    }

    #[test]
    fn a_throwing_condition_stops_before_the_event_or_fails_on_it() {
        let f = CompiledFilter::new(
            Some(&Filter {
                event_types: None,
                jsonata_condition: Some("$number(payload.n) > 0".into()),
            }),
            false,
        )
        .unwrap();
        let s = select_batch("k", &log(), &f, 1000, 2).unwrap();
        assert_eq!(s.events.len(), 3);
        assert_eq!(s.through, 5, "never past the failing event");
        let err = select_batch("k", &log()[3..], &f, 1000, 5).unwrap_err();
        assert!(
            err.message
                .starts_with("subscription \"k\" filter condition failed on offset 6"),
            "{}",
            err.message
        );
        assert_eq!(err.single_offset, Some(6));
    }

    #[test]
    fn drop_audits_are_never_selected_for_copies() {
        let audit = stored(
            7,
            "events.iterate.com/stream/error-occurred",
            json!({"reason": "copy-dropped"}),
        );
        let f = CompiledFilter::new(None, true).unwrap();
        let s = select_batch("k", std::slice::from_ref(&audit), &f, 1000, 6).unwrap();
        assert!(s.events.is_empty());
        assert_eq!(s.through, 7);
        let s = select_batch(
            "k",
            &[audit],
            &CompiledFilter::new(None, false).unwrap(),
            1000,
            6,
        )
        .unwrap();
        assert_eq!(s.events.len(), 1);
    }

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
