//! The delivery engine's pure half, shared by every receiver kind: batch
//! size (isolate-or-progress), retry with backoff, halt, skip (here); the
//! receiver parsed once per run (`target.rs`); which runs are due and what a
//! report does (`schedule.rs`); the selection of a batch from the log
//! (`select.rs`); the copy receiver's side (`copy.rs`) and the webhook
//! envelope (`webhook.rs`). Time and randomness come in as arguments so the
//! decisions are unit-testable. Nothing here does IO: jobs run in
//! `crate::executor`, and the engine lives in the source stream's actor
//! (`actor/delivery.rs`).

pub mod copy;
pub mod runtime;
pub mod schedule;
pub mod select;
pub mod target;
pub mod webhook;

use crate::subscription::OnFailingEvent;
use serde::Deserialize;

/// What a host's configuration bounds in the work of its deliveries (each
/// host its own): the JSONata evaluations of filters and transforms, and
/// the largest event a transform may make (the append limit,
/// `max-body-bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// `[limits] jsonata-timeout-ms` and `jsonata-max-bytes`.
    pub jsonata: crate::jsonata::Limits,
    /// `max-body-bytes`.
    pub event_bytes_max: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            jsonata: crate::jsonata::Limits::default(),
            event_bytes_max: crate::stream::MAX_BODY_BYTES_DEFAULT,
        }
    }
}

/// Delivery timing for durable subscriptions.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct DeliveryConfig {
    /// Attempts before `subscription-delivery-halted` (15).
    pub max_attempts: u32,
    /// Backoff of attempt n: `min(max, base * 2^(n-1))` ±20 % (1000 ms).
    pub backoff_base_ms: u64,
    /// Longest backoff (30 min).
    pub backoff_max_ms: u64,
    /// Deadline of one receiver call (20 s).
    pub timeout_ms: u64,
    /// Webhook POSTs and copies of subscriptions running at once on this
    /// host (1024). A processor wake or an ITX receiver's call holds a
    /// place of `[processors] max-concurrent-calls` instead.
    pub concurrency: usize,
    /// One project's share of them (a quarter of `concurrency`, at least 1;
    /// see [`DeliveryConfig::project_concurrency`]). A run due past its
    /// project's share waits for a place; its deadline starts with it.
    pub concurrency_per_project: Option<usize>,
}

/// One project's share of `total` places: as configured, or a quarter of
/// them; at least one, at most all.
pub fn project_share(configured: Option<usize>, total: usize) -> usize {
    configured.unwrap_or(total / 4).clamp(1, total.max(1))
}

impl DeliveryConfig {
    /// Webhook and copy attempts of one project running at once.
    pub fn project_concurrency(&self) -> usize {
        project_share(self.concurrency_per_project, self.concurrency)
    }
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            max_attempts: 15,
            backoff_base_ms: 1000,
            backoff_max_ms: 30 * 60 * 1000,
            timeout_ms: 20_000,
            concurrency: 1024,
            concurrency_per_project: None,
        }
    }
}

/// Most events in one delivered batch.
pub const BATCH_EVENTS_MAX: usize = 1000;
/// Approximate byte bound of one batch; the first event always goes.
pub const BATCH_BYTES_MAX: usize = 1024 * 1024;
/// Failures of the same event, delivered alone, before it is skipped (skip policy).
pub const EVENT_ATTEMPTS_BEFORE_SKIP: u32 = 3;
/// Skips with no success between them before the subscription halts.
pub const SKIPS_BEFORE_HALT: u32 = 3;
/// Backoff jitter: ±20 %.
pub const BACKOFF_JITTER: f64 = 0.2;

/// A failed delivery attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub message: String,
    /// `false`: retrying cannot help (the subscription halts at once).
    pub retryable: bool,
    /// The offset of the one event the attempt carried, when it carried one.
    pub single_offset: Option<u64>,
    /// The offset of the event being handled when the attempt failed: the
    /// one that failed, or the batch's first when the batch failed as a
    /// whole (`None`: the attempt failed before any event).
    pub at_offset: Option<u64>,
    /// What reproduces the failure (a processor's `wasmtime` command):
    /// kept with the processor's last failure, not in the halt fact.
    pub detail: Option<String>,
    /// The subscription's own filter failed: never skipped, whatever the
    /// policy (the reference's rule).
    pub filter: bool,
    /// The receiver asked for no attempt before this long (a webhook's
    /// `429` or `503` with `retry-after`, in ms): the next attempt waits at
    /// least this (up to [`RETRY_AFTER_MAX_MS`]), even past the backoff's
    /// max.
    pub retry_after_ms: Option<u64>,
}

impl Failure {
    /// A failure with no single offset and no detail.
    pub fn new(message: impl Into<String>, retryable: bool) -> Failure {
        Failure {
            message: message.into(),
            retryable,
            single_offset: None,
            at_offset: None,
            detail: None,
            filter: false,
            retry_after_ms: None,
        }
    }
}

/// What to do after a failure.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Try again at this time (epoch ms).
    Retry { at_ms: i64 },
    /// Append `subscription-delivery-halted`.
    Halt,
    /// Record the failing event with `error-occurred` and move past it.
    Skip { offset: u64 },
}

/// Retry state of one delivery run (reset when a new run starts).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunState {
    /// Consecutive failed attempts.
    pub attempt: u32,
    /// Batches of one event until the next success.
    pub isolating: bool,
    /// The event that failed alone, and how often.
    pub failing_event: Option<(u64, u32)>,
    /// Skips since the last success.
    pub skips_since_success: u32,
}

impl RunState {
    /// Events the next batch may carry.
    pub fn batch_limit(&self) -> usize {
        if self.isolating {
            1
        } else {
            BATCH_EVENTS_MAX
        }
    }

    /// A successful delivery: full batches again, counters cleared.
    pub fn on_success(&mut self) {
        *self = RunState::default();
    }

    /// A failed delivery. `jitter` is uniform in `[-1, 1]`.
    pub fn on_failure(
        &mut self,
        failure: &Failure,
        policy: &DeliveryConfig,
        on_failing_event: OnFailingEvent,
        now_ms: i64,
        jitter: f64,
    ) -> Decision {
        self.attempt += 1;
        self.isolating = true;
        if let Some(offset) = failure.single_offset {
            self.failing_event = match self.failing_event {
                Some((o, n)) if o == offset => Some((o, n + 1)),
                _ => Some((offset, 1)),
            };
        }
        let skipping = on_failing_event == OnFailingEvent::Skip && !failure.filter;
        if !failure.retryable {
            // Final: the same event fails the same way again. `halt` halts
            // at once; `skip` skips the event at once, or first isolates it
            // (a batch of one, at once) when the batch failed as a whole.
            if !skipping {
                return Decision::Halt;
            }
            return match failure.single_offset {
                Some(offset) => self.skip(offset),
                None if self.attempt < policy.max_attempts => Decision::Retry { at_ms: now_ms },
                None => Decision::Halt,
            };
        }
        if skipping {
            if let Some((offset, n)) = self.failing_event {
                if n >= EVENT_ATTEMPTS_BEFORE_SKIP {
                    return self.skip(offset);
                }
            }
        }
        if self.attempt >= policy.max_attempts {
            return Decision::Halt;
        }
        Decision::Retry {
            at_ms: now_ms + wait_ms(policy, self.attempt, jitter, failure.retry_after_ms) as i64,
        }
    }
}

impl RunState {
    /// Skips the event at `offset`, unless that would be the
    /// [`SKIPS_BEFORE_HALT`]th skip in a row: then halts.
    fn skip(&mut self, offset: u64) -> Decision {
        if self.skips_since_success + 1 >= SKIPS_BEFORE_HALT {
            return Decision::Halt;
        }
        self.skips_since_success += 1;
        self.attempt = 0;
        self.failing_event = None;
        Decision::Skip { offset }
    }
}

/// The longest wait a receiver's `retry-after` gets: an hour.
pub const RETRY_AFTER_MAX_MS: u64 = 60 * 60 * 1000;

/// The wait before attempt `n + 1` after `n` failures: the backoff, or
/// what the receiver asked for (`retry-after`, at most
/// [`RETRY_AFTER_MAX_MS`]) when that is longer.
pub fn wait_ms(policy: &DeliveryConfig, failures: u32, jitter: f64, asked: Option<u64>) -> u64 {
    let backoff = backoff_ms(policy, failures, jitter);
    match asked {
        Some(asked) => backoff.max(asked.min(RETRY_AFTER_MAX_MS)),
        None => backoff,
    }
}

/// Backoff before attempt `n + 1` after `n` failures:
/// `min(max, base * 2^(n-1))` scaled by `1 + 0.2 * jitter`.
pub fn backoff_ms(policy: &DeliveryConfig, failures: u32, jitter: f64) -> u64 {
    let exp = failures.saturating_sub(1).min(40);
    let raw = policy
        .backoff_base_ms
        .saturating_mul(1u64 << exp)
        .min(policy.backoff_max_ms);
    let jitter = jitter.clamp(-1.0, 1.0) * BACKOFF_JITTER;
    (raw as f64 * (1.0 + jitter)).round().max(0.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> DeliveryConfig {
        DeliveryConfig {
            max_attempts: 4,
            backoff_base_ms: 100,
            backoff_max_ms: 1000,
            timeout_ms: 50,
            ..DeliveryConfig::default()
        }
    }

    fn final_failure(single: Option<u64>) -> Failure {
        Failure {
            retryable: false,
            ..failure(single)
        }
    }

    #[test]
    fn a_final_failure_skips_at_once_under_skip_and_halts_at_once_under_halt() {
        let mut run = RunState::default();
        let d = run.on_failure(
            &final_failure(Some(7)),
            &policy(),
            OnFailingEvent::Skip,
            0,
            0.0,
        );
        assert_eq!(d, Decision::Skip { offset: 7 });
        let mut run = RunState::default();
        let d = run.on_failure(
            &final_failure(Some(7)),
            &policy(),
            OnFailingEvent::Halt,
            0,
            0.0,
        );
        assert_eq!(d, Decision::Halt);
    }

    #[test]
    fn a_final_failure_of_a_whole_batch_isolates_its_event_at_once_then_skips_it() {
        let mut run = RunState::default();
        let d = run.on_failure(
            &final_failure(None),
            &policy(),
            OnFailingEvent::Skip,
            1000,
            0.0,
        );
        assert_eq!(d, Decision::Retry { at_ms: 1000 }, "at once, alone");
        assert_eq!(run.batch_limit(), 1);
        let d = run.on_failure(
            &final_failure(Some(3)),
            &policy(),
            OnFailingEvent::Skip,
            1000,
            0.0,
        );
        assert_eq!(d, Decision::Skip { offset: 3 });
    }

    #[test]
    fn a_filter_failure_never_skips_and_final_skips_in_a_row_halt() {
        let mut run = RunState::default();
        let filter = Failure {
            filter: true,
            ..final_failure(Some(4))
        };
        assert_eq!(
            run.on_failure(&filter, &policy(), OnFailingEvent::Skip, 0, 0.0),
            Decision::Halt
        );
        let mut run = RunState::default();
        let mut decisions = Vec::new();
        for offset in 1..=SKIPS_BEFORE_HALT as u64 {
            decisions.push(run.on_failure(
                &final_failure(Some(offset)),
                &policy(),
                OnFailingEvent::Skip,
                0,
                0.0,
            ));
        }
        assert_eq!(
            decisions,
            [
                Decision::Skip { offset: 1 },
                Decision::Skip { offset: 2 },
                Decision::Halt
            ]
        );
    }

    fn failure(single: Option<u64>) -> Failure {
        Failure {
            message: "boom".into(),
            retryable: true,
            single_offset: single,
            at_offset: None,
            detail: None,
            filter: false,
            retry_after_ms: None,
        }
    }

    #[test]
    fn a_receivers_retry_after_is_waited_for_up_to_an_hour() {
        let p = DeliveryConfig {
            backoff_base_ms: 100,
            backoff_max_ms: 10_000,
            ..DeliveryConfig::default()
        };
        assert_eq!(wait_ms(&p, 1, 0.0, None), 100);
        assert_eq!(wait_ms(&p, 1, 0.0, Some(3_000)), 3_000);
        assert_eq!(
            wait_ms(&p, 1, 0.0, Some(50)),
            100,
            "never below the backoff"
        );
        assert_eq!(
            wait_ms(&p, 1, 0.0, Some(30_000)),
            30_000,
            "past the backoff's max"
        );
        assert_eq!(wait_ms(&p, 1, 0.0, Some(86_400_000)), RETRY_AFTER_MAX_MS);
        let mut run = RunState::default();
        let failure = Failure {
            retry_after_ms: Some(2_000),
            ..Failure::new("webhook responded 429", true)
        };
        assert_eq!(
            run.on_failure(&failure, &p, OnFailingEvent::Halt, 1_000, 0.0),
            Decision::Retry { at_ms: 3_000 }
        );
    }

    #[test]
    fn backoff_doubles_up_to_the_max_with_jitter() {
        let p = policy();
        assert_eq!(backoff_ms(&p, 1, 0.0), 100);
        assert_eq!(backoff_ms(&p, 2, 0.0), 200);
        assert_eq!(backoff_ms(&p, 4, 0.0), 800);
        assert_eq!(backoff_ms(&p, 5, 0.0), 1000);
        assert_eq!(backoff_ms(&p, 60, 0.0), 1000);
        assert_eq!(backoff_ms(&p, 1, 1.0), 120);
        assert_eq!(backoff_ms(&p, 1, -1.0), 80);
    }

    #[test]
    fn failures_isolate_then_halt_after_max_attempts() {
        let p = policy();
        let mut s = RunState::default();
        assert_eq!(s.batch_limit(), BATCH_EVENTS_MAX);
        assert_eq!(
            s.on_failure(&failure(None), &p, OnFailingEvent::Halt, 1000, 0.0),
            Decision::Retry { at_ms: 1100 }
        );
        assert_eq!(s.batch_limit(), 1, "isolate after any failure");
        assert_eq!(
            s.on_failure(&failure(Some(5)), &p, OnFailingEvent::Halt, 2000, 0.0),
            Decision::Retry { at_ms: 2200 }
        );
        s.on_failure(&failure(Some(5)), &p, OnFailingEvent::Halt, 3000, 0.0);
        assert_eq!(
            s.on_failure(&failure(Some(5)), &p, OnFailingEvent::Halt, 4000, 0.0),
            Decision::Halt
        );
    }

    #[test]
    fn success_restores_full_batches() {
        let p = policy();
        let mut s = RunState::default();
        s.on_failure(&failure(None), &p, OnFailingEvent::Halt, 0, 0.0);
        s.on_success();
        assert_eq!(s, RunState::default());
        assert_eq!(s.batch_limit(), BATCH_EVENTS_MAX);
    }

    #[test]
    fn non_retryable_failures_halt_at_once_under_halt() {
        let mut s = RunState::default();
        let f = Failure {
            retryable: false,
            ..failure(None)
        };
        assert_eq!(
            s.on_failure(&f, &policy(), OnFailingEvent::Halt, 0, 0.0),
            Decision::Halt
        );
    }

    #[test]
    fn skip_policy_skips_an_event_that_fails_alone_three_times_and_halts_after_three_skips() {
        let p = DeliveryConfig {
            max_attempts: 100,
            ..policy()
        };
        let mut s = RunState::default();
        for round in 0..2u64 {
            let offset = 10 + round;
            assert!(matches!(
                s.on_failure(&failure(Some(offset)), &p, OnFailingEvent::Skip, 0, 0.0),
                Decision::Retry { .. }
            ));
            s.on_failure(&failure(Some(offset)), &p, OnFailingEvent::Skip, 0, 0.0);
            assert_eq!(
                s.on_failure(&failure(Some(offset)), &p, OnFailingEvent::Skip, 0, 0.0),
                Decision::Skip { offset }
            );
        }
        s.on_failure(&failure(Some(12)), &p, OnFailingEvent::Skip, 0, 0.0);
        s.on_failure(&failure(Some(12)), &p, OnFailingEvent::Skip, 0, 0.0);
        assert_eq!(
            s.on_failure(&failure(Some(12)), &p, OnFailingEvent::Skip, 0, 0.0),
            Decision::Halt,
            "a third skip with no success between halts"
        );
        // With halt policy the same event never skips.
        let mut h = RunState::default();
        for _ in 0..3 {
            assert!(matches!(
                h.on_failure(&failure(Some(1)), &p, OnFailingEvent::Halt, 0, 0.0),
                Decision::Retry { .. }
            ));
        }
    }
}
