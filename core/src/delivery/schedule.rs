//! The deciding half of the delivery engine, pure: which runs are due (each
//! becomes a [`Job`]), what a report ([`DeliveryDone`]) does to its run,
//! which attempts missed their deadline, and when the actor must wake next.
//! Time and jitter come in as arguments, so schedules of failures can be
//! simulated (see the tests). The executing half is `crate::executor`.
//!
//! **Architecture Invariant:** at most one attempt per run is in flight, and
//! only the report of that attempt (same generation and attempt id) can move
//! the run: a late report of an expired attempt is ignored.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::runtime::{InFlight, SubscriptionRuntime};
use super::target::Route;
use super::DeliveryConfig;
use super::{Decision, Failure, EVENT_ATTEMPTS_BEFORE_SKIP};
use crate::stream::types;

/// Longest text a halt or error fact carries; the rest is cut (the whole
/// failure stays readable where its receiver keeps it).
pub const FACT_TEXT_BYTES_MAX: usize = 4096;
/// Extra time past the timeout for receivers that time themselves, so their
/// own (more precise) timeout message wins.
pub const DEADLINE_GRACE_MS: i64 = 1000;
/// How long past its deadline an attempt may stay unreported before the
/// engine counts it as failed (the executor reports at the deadline itself;
/// this is the backstop when a report is lost).
pub const EXPIRY_SLACK_MS: i64 = 2000;
/// Wait before a platform fact that failed to commit is tried again.
pub const FACT_RETRY_MS: i64 = 1000;

/// One attempt of one run, decided by the actor and carried out by an
/// executor.
#[derive(Debug, Clone)]
pub struct Job {
    pub key: String,
    pub route: Arc<Route>,
    pub generation: u64,
    /// The attempt id; its report must carry it.
    pub id: u64,
    /// Deliver events after this offset ...
    pub cursor: u64,
    /// ... up to this one (the last committed offset).
    pub head: u64,
    /// Most matching events in the batch (1 while isolating).
    pub limit: usize,
    /// The event failing alone and its attempts so far.
    pub failing: Option<(u64, u32)>,
    pub timeout_ms: u64,
    /// When the executor reports a failure if the attempt has not ended.
    pub deadline_ms: i64,
    pub now_ms: i64,
}

impl Job {
    /// The attempt waited `waited_ms` before it could start (for places,
    /// or a compile): its clock and deadline move on by as much.
    pub fn delay(&mut self, waited_ms: i64) {
        self.now_ms = self.now_ms.saturating_add(waited_ms);
        self.deadline_ms = self.deadline_ms.saturating_add(waited_ms);
    }
}

/// The result of one attempt, sent back to the source's actor.
#[derive(Debug)]
pub struct DeliveryDone {
    pub key: String,
    pub generation: u64,
    pub id: u64,
    pub duration: Duration,
    pub result: Result<Delivered, Failure>,
}

/// An attempt's executor found its project's share of places taken
/// (`placed: false`: the attempt waits, without a deadline), or got a place
/// after waiting (`placed: true`: its time starts now). See
/// [`Deliveries::placed`].
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub key: String,
    pub generation: u64,
    pub id: u64,
    pub placed: bool,
}

/// A successful attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivered {
    /// The cursor after this attempt.
    pub through: u64,
    /// Offsets delivered to the receiver.
    pub offsets: Vec<u64>,
    pub bytes: usize,
}

/// A platform event the actor appends to the source for a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Fact {
    pub event_type: &'static str,
    pub payload: Value,
    /// The run it belongs to.
    pub key: String,
    pub generation: u64,
    /// Halts stop the run until the fact commits.
    pub halts: bool,
}

/// `text` cut to [`FACT_TEXT_BYTES_MAX`] bytes (on a char boundary), with a
/// marker when cut.
pub fn cap_text(text: &str) -> String {
    if text.len() <= FACT_TEXT_BYTES_MAX {
        return text.to_string();
    }
    const MARK: &str = " … (cut)";
    let mut end = FACT_TEXT_BYTES_MAX - MARK.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

/// The delivery runs of one source stream, by subscription key.
#[derive(Debug, Default)]
pub struct Deliveries {
    pub runs: HashMap<String, SubscriptionRuntime>,
    next_id: u64,
}

impl Deliveries {
    /// Starts every due run: a job each, or, for a run whose receiver could
    /// not be parsed, the halt fact at once.
    pub fn due(&mut self, now_ms: i64, head: u64, timeout_ms: u64) -> (Vec<Job>, Vec<Fact>) {
        let mut jobs = Vec::new();
        let mut facts = Vec::new();
        let mut keys: Vec<&String> = self
            .runs
            .iter()
            .filter(|(_, rt)| rt.is_due(now_ms, head))
            .map(|(k, _)| k)
            .collect();
        keys.sort();
        let keys: Vec<String> = keys.into_iter().cloned().collect();
        for key in keys {
            let rt = self.runs.get_mut(&key).expect("listed");
            match &rt.route {
                Ok(route) => {
                    self.next_id += 1;
                    let grace = if route.target.times_itself() {
                        DEADLINE_GRACE_MS
                    } else {
                        0
                    };
                    let budget_ms = timeout_ms as i64 + grace;
                    let deadline_ms = now_ms + budget_ms;
                    rt.in_flight = Some(InFlight {
                        id: self.next_id,
                        deadline_ms: Some(deadline_ms),
                        budget_ms,
                    });
                    jobs.push(Job {
                        key: key.clone(),
                        route: route.clone(),
                        generation: rt.generation,
                        id: self.next_id,
                        cursor: rt.cursor,
                        head,
                        limit: rt.run.batch_limit().min(route.target.events_max()),
                        failing: rt.run.failing_event,
                        timeout_ms,
                        deadline_ms,
                        now_ms,
                    });
                }
                Err(message) => {
                    let message = format!("subscription {key:?} cannot be delivered: {message}");
                    rt.run.attempt += 1;
                    rt.last_error = Some(message.clone());
                    facts.push(halt_fact(&key, rt, &message));
                }
            }
        }
        (jobs, facts)
    }

    /// Applies a report. Returns the fact to append, if the decision needs
    /// one, or `None` (also for a stale report, which changes nothing).
    /// `latency_ms` gives the time since an offset's commit, when known.
    pub fn complete(
        &mut self,
        done: DeliveryDone,
        now_ms: i64,
        jitter: f64,
        policy: &DeliveryConfig,
        mut latency_ms: impl FnMut(u64) -> Option<f64>,
    ) -> Option<Fact> {
        let rt = self.runs.get_mut(&done.key)?;
        if rt.generation != done.generation || rt.in_flight.as_ref().map(|f| f.id) != Some(done.id)
        {
            return None;
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
                    if rt.run.failing_event.is_some()
                        || rt.run.skips_since_success > 0
                        || rt.run.attempt > 0
                    {
                        rt.counters_dirty = true;
                    }
                    rt.run.on_success();
                }
                if rt.last_error.take().is_some() {
                    rt.counters_dirty = true;
                }
                rt.bytes_sent += d.bytes as u64;
                for offset in d.offsets {
                    if let Some(ms) = latency_ms(offset) {
                        rt.completion_latency_ms.record(ms);
                    }
                }
                None
            }
            Err(failure) => fail(&done.key, rt, &failure, now_ms, jitter, policy),
        }
    }

    /// An attempt's executor found no free place for it (`placed: false`):
    /// it has no deadline until it gets one; or it got one late (`placed:
    /// true`): its deadline is its whole time from `now_ms`. Waiting is
    /// not a failure. A report of a stale attempt changes nothing.
    pub fn placed(&mut self, placement: &Placement, now_ms: i64) {
        let Some(rt) = self.runs.get_mut(&placement.key) else {
            return;
        };
        if rt.generation != placement.generation {
            return;
        }
        if let Some(f) = rt.in_flight.as_mut().filter(|f| f.id == placement.id) {
            f.deadline_ms = placement.placed.then_some(now_ms + f.budget_ms);
        }
    }

    /// Counts every attempt still unreported [`EXPIRY_SLACK_MS`] after its
    /// deadline as failed; its report, if it ever comes, is then stale.
    pub fn expire(&mut self, now_ms: i64, jitter: f64, policy: &DeliveryConfig) -> Vec<Fact> {
        let mut facts = Vec::new();
        let mut keys: Vec<String> = self
            .runs
            .iter()
            .filter(|(_, rt)| {
                rt.in_flight
                    .as_ref()
                    .and_then(|f| f.deadline_ms)
                    .is_some_and(|deadline_ms| now_ms > deadline_ms + EXPIRY_SLACK_MS)
            })
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        for key in keys {
            let rt = self.runs.get_mut(&key).expect("listed");
            let label = rt
                .route
                .as_ref()
                .map(|r| r.target.label())
                .unwrap_or_else(|_| "delivery".into());
            rt.in_flight = None;
            let failure = Failure {
                message: format!("{label} did not report by its deadline"),
                retryable: true,
                single_offset: None,
                at_offset: None,
                detail: None,
                filter: false,
                retry_after_ms: None,
            };
            facts.extend(fail(&key, rt, &failure, now_ms, jitter, policy));
        }
        facts
    }

    /// Retries at once the runs that are failing but not halted: the run
    /// of `key`, or every run whose receiver calls `component`. A run with
    /// an attempt in flight is retrying already. Answers the keys of the
    /// runs that retry.
    pub fn retry_now(&mut self, key: Option<&str>, component: Option<&str>) -> Vec<String> {
        let mut keys: Vec<String> = self
            .runs
            .iter_mut()
            .filter(|(k, rt)| {
                key.is_none_or(|key| key == k.as_str())
                    && component.is_none_or(|c| {
                        rt.route
                            .as_ref()
                            .is_ok_and(|r| r.target.component() == Some(c))
                    })
                    && !rt.halted
                    && !rt.fact_pending
                    && rt.run.attempt > 0
            })
            .map(|(k, rt)| {
                // (One in flight is retrying already.)
                rt.next_attempt_at_ms = 0;
                k.clone()
            })
            .collect();
        keys.sort();
        keys
    }

    /// A fact appended for a run did not commit: the run may act again
    /// after [`FACT_RETRY_MS`] (a failing run decides its halt again), so a
    /// halt can never stay pending forever.
    pub fn fact_failed(&mut self, key: &str, generation: u64, now_ms: i64) {
        if let Some(rt) = self.runs.get_mut(key) {
            if rt.generation == generation && rt.fact_pending {
                rt.fact_pending = false;
                rt.next_attempt_at_ms = now_ms + FACT_RETRY_MS;
            }
        }
    }

    /// When the actor must look at its runs again (ms since the epoch): the
    /// earliest retry of a run with work, or deadline expiry of an attempt.
    pub fn next_wake_at_ms(&self, head: u64) -> Option<i64> {
        self.runs
            .values()
            .filter(|rt| !rt.halted && !rt.fact_pending)
            .filter_map(|rt| match &rt.in_flight {
                // (Waiting for a place: its executor reports when it has
                // one.)
                Some(f) => f.deadline_ms.map(|d| d + EXPIRY_SLACK_MS + 1),
                None if rt.cursor < head => Some(rt.next_attempt_at_ms),
                None => None,
            })
            .min()
    }

    /// The lowest cursor of the runs (`None`: no runs): offsets at or below
    /// it are delivered everywhere, so their commit instants are no longer
    /// needed for latency.
    pub fn lowest_cursor(&self) -> Option<u64> {
        self.runs.values().map(|rt| rt.cursor).min()
    }

    /// Whether no run has work in flight, due or scheduled, and no fact is
    /// pending: the stream may be released from memory.
    pub fn is_quiet(&self, head: u64) -> bool {
        self.runs.values().all(|rt| {
            rt.in_flight.is_none()
                && !rt.fact_pending
                && (rt.halted || rt.cursor >= head)
                && rt.cursor == rt.durable_cursor
                && !rt.counters_dirty
        })
    }
}

fn halt_fact(key: &str, rt: &mut SubscriptionRuntime, message: &str) -> Fact {
    rt.fact_pending = true;
    Fact {
        event_type: types::SUBSCRIPTION_DELIVERY_HALTED,
        payload: json!({
            "subscriptionKey": key,
            "reason": "delivery-failed",
            "afterOffset": rt.cursor,
            "attempts": rt.run.attempt,
            "error": cap_text(message),
        }),
        key: key.to_string(),
        generation: rt.generation,
        halts: true,
    }
}

fn fail(
    key: &str,
    rt: &mut SubscriptionRuntime,
    failure: &Failure,
    now_ms: i64,
    jitter: f64,
    policy: &DeliveryConfig,
) -> Option<Fact> {
    let on_failing_event = rt
        .route
        .as_ref()
        .map_or(crate::subscription::OnFailingEvent::Halt, |r| {
            r.on_failing_event
        });
    let decision = rt
        .run
        .on_failure(failure, policy, on_failing_event, now_ms, jitter);
    rt.last_error = Some(failure.message.clone());
    rt.counters_dirty = true;
    match decision {
        Decision::Retry { at_ms } => {
            rt.next_attempt_at_ms = at_ms;
            None
        }
        Decision::Halt => Some(halt_fact(key, rt, &failure.message)),
        Decision::Skip { offset } => {
            rt.cursor = rt.cursor.max(offset);
            rt.next_attempt_at_ms = 0;
            let message = if failure.retryable {
                format!(
                    "subscription {key:?} skipped failing event at offset {offset} after {EVENT_ATTEMPTS_BEFORE_SKIP} event-specific attempts: {}",
                    failure.message
                )
            } else {
                format!(
                    "subscription {key:?} skipped failing event at offset {offset} at once (the failure is final: retrying cannot help): {}",
                    failure.message
                )
            };
            Some(Fact {
                event_type: types::ERROR_OCCURRED,
                payload: json!({"message": cap_text(&message), "subscriptionKey": key, "offset": offset}),
                key: key.to_string(),
                generation: rt.generation,
                halts: false,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::target::Target;
    use crate::filter::CompiledFilter;
    use crate::stream::{Namespace, StreamAddress};
    use crate::subscription::OnFailingEvent;

    fn route(on_failing_event: OnFailingEvent) -> Route {
        Route {
            target: Target::Copy {
                receiver: StreamAddress::new(Namespace::Project("p".into()), "/to").unwrap(),
                transform: None,
            },
            filter: CompiledFilter::default(),
            on_failing_event,
        }
    }

    fn policy() -> DeliveryConfig {
        DeliveryConfig {
            max_attempts: 5,
            backoff_base_ms: 10,
            backoff_max_ms: 200,
            timeout_ms: 100,
            ..DeliveryConfig::default()
        }
    }

    fn done(job: &Job, result: Result<Delivered, Failure>) -> DeliveryDone {
        DeliveryDone {
            key: job.key.clone(),
            generation: job.generation,
            id: job.id,
            duration: Duration::from_millis(1),
            result,
        }
    }

    fn failure(single: Option<u64>) -> Failure {
        Failure {
            message: "receiver said no".into(),
            retryable: true,
            single_offset: single,
            at_offset: None,
            detail: None,
            filter: false,
            retry_after_ms: None,
        }
    }

    /// A small deterministic generator (xorshift), so failures are random
    /// but every run of the test sees the same schedules.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn chance(&mut self, percent: u64) -> bool {
            self.next() % 100 < percent
        }
        fn jitter(&mut self) -> f64 {
            (self.next() % 2001) as f64 / 1000.0 - 1.0
        }
    }

    #[test]
    fn a_parse_error_halts_at_once_without_a_job() {
        let mut d = Deliveries::default();
        d.runs.insert(
            "k".into(),
            SubscriptionRuntime::new(3, Err("bad url".into()), 0, 0, false),
        );
        let (jobs, facts) = d.due(0, 10, 100);
        assert!(jobs.is_empty());
        assert_eq!(facts.len(), 1);
        assert_eq!(facts[0].event_type, types::SUBSCRIPTION_DELIVERY_HALTED);
        assert!(facts[0].payload["error"]
            .as_str()
            .unwrap()
            .contains("bad url"));
        assert!(
            d.due(0, 10, 100).0.is_empty(),
            "nothing while the halt is pending"
        );
    }

    #[test]
    fn a_webhook_job_carries_one_event_and_gets_a_grace_period() {
        let mut d = Deliveries::default();
        let webhook = Route {
            target: Target::Webhook {
                url: "http://example.com/hook".into(),
                transform: None,
                configured_at: 2,
            },
            ..route(OnFailingEvent::Halt)
        };
        d.runs.insert(
            "w".into(),
            SubscriptionRuntime::new(2, Ok(webhook), 2, 2, false),
        );
        d.runs.insert(
            "c".into(),
            SubscriptionRuntime::new(2, Ok(route(OnFailingEvent::Halt)), 2, 2, false),
        );
        let (jobs, _) = d.due(0, 50, 100);
        let limits: Vec<(&str, usize, i64)> = jobs
            .iter()
            .map(|j| (j.key.as_str(), j.limit, j.deadline_ms))
            .collect();
        assert_eq!(
            limits,
            vec![
                ("c", crate::delivery::BATCH_EVENTS_MAX, 100),
                ("w", 1, 100 + DEADLINE_GRACE_MS)
            ]
        );
    }

    /// One run `k` (generation 1) whose first failure halts it.
    fn one_run_halting_at_first_failure() -> (Deliveries, DeliveryConfig) {
        let mut d = Deliveries::default();
        d.runs.insert(
            "k".into(),
            SubscriptionRuntime::new(1, Ok(route(OnFailingEvent::Halt)), 0, 0, false),
        );
        let p = DeliveryConfig {
            max_attempts: 1,
            ..policy()
        };
        (d, p)
    }

    #[test]
    fn halt_text_is_capped() {
        let (mut d, p) = one_run_halting_at_first_failure();
        let (jobs, _) = d.due(0, 5, 100);
        let long = Failure {
            message: "é".repeat(100_000),
            ..failure(None)
        };
        let fact = d.complete(done(&jobs[0], Err(long)), 1, 0.0, &p, |_| None);
        let error = fact.unwrap().payload["error"].as_str().unwrap().to_string();
        assert!(error.len() <= FACT_TEXT_BYTES_MAX, "{}", error.len());
        assert!(error.ends_with("(cut)"));
    }

    #[test]
    fn retry_now_brings_a_failing_run_forward_and_leaves_others() {
        let mut d = Deliveries::default();
        let wake = |component: &str| Route {
            target: Target::Wake {
                project: "p".into(),
                component: component.into(),
            },
            ..route(OnFailingEvent::Halt)
        };
        for key in ["a", "b", "ok"] {
            let r = if key == "b" {
                wake("other")
            } else {
                wake("proc")
            };
            d.runs
                .insert(key.into(), SubscriptionRuntime::new(1, Ok(r), 0, 0, false));
        }
        let p = policy();
        let (jobs, _) = d.due(0, 5, 100);
        for job in &jobs {
            let result = if job.key == "ok" {
                Ok(Delivered {
                    through: 5,
                    offsets: vec![1],
                    bytes: 1,
                })
            } else {
                Err(failure(None))
            };
            assert!(d
                .complete(done(job, result), 0, 0.0, &p, |_| None)
                .is_none());
        }
        assert!(d.due(1, 5, 100).0.is_empty(), "both wait out their backoff");
        assert_eq!(
            d.retry_now(Some("ok"), None),
            Vec::<String>::new(),
            "not failing"
        );
        assert_eq!(d.retry_now(None, Some("proc")), vec!["a".to_string()]);
        let (jobs, _) = d.due(1, 5, 100);
        assert_eq!(
            jobs.iter().map(|j| j.key.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
        assert_eq!(
            d.retry_now(Some("a"), None),
            vec!["a".to_string()],
            "in flight"
        );
        assert!(d.due(1, 5, 100).0.is_empty(), "one attempt at a time");
        assert_eq!(d.retry_now(Some("b"), None), vec!["b".to_string()]);
        // A halted run resumes with an event, not a retry.
        d.runs.get_mut("b").unwrap().halted = true;
        assert_eq!(d.retry_now(Some("b"), None), Vec::<String>::new());
    }

    #[test]
    fn a_failed_fact_lets_the_run_decide_again_later() {
        let (mut d, p) = one_run_halting_at_first_failure();
        let (jobs, _) = d.due(0, 5, 100);
        assert!(d
            .complete(done(&jobs[0], Err(failure(None))), 0, 0.0, &p, |_| None)
            .is_some());
        assert!(d.due(10_000, 5, 100).0.is_empty(), "halt pending");
        assert_eq!(
            d.next_wake_at_ms(5),
            None,
            "no timer while a fact is pending"
        );
        d.fact_failed("k", 1, 100);
        assert_eq!(d.next_wake_at_ms(5), Some(100 + FACT_RETRY_MS));
        let (jobs, _) = d.due(100 + FACT_RETRY_MS, 5, 100);
        let again = d.complete(done(&jobs[0], Err(failure(None))), 2000, 0.0, &p, |_| None);
        assert!(again.unwrap().halts, "the halt is decided again");
    }

    #[test]
    fn an_unreported_attempt_expires_and_its_late_report_is_stale() {
        let mut d = Deliveries::default();
        d.runs.insert(
            "k".into(),
            SubscriptionRuntime::new(1, Ok(route(OnFailingEvent::Halt)), 0, 0, false),
        );
        let (jobs, _) = d.due(0, 5, 100);
        assert_eq!(
            jobs[0].deadline_ms, 100,
            "copies time themselves by the pipeline"
        );
        assert_eq!(d.next_wake_at_ms(5), Some(100 + EXPIRY_SLACK_MS + 1));
        assert!(d.expire(100 + EXPIRY_SLACK_MS, 0.0, &policy()).is_empty());
        assert!(d.runs["k"].in_flight.is_some());
        assert!(d.expire(101 + EXPIRY_SLACK_MS, 0.0, &policy()).is_empty());
        let rt = &d.runs["k"];
        assert!(rt.in_flight.is_none());
        assert_eq!(rt.run.attempt, 1);
        assert!(rt.last_error.as_deref().unwrap().contains("did not report"));
        let late = Delivered {
            through: 5,
            offsets: vec![1, 2, 3, 4, 5],
            bytes: 5,
        };
        assert!(d
            .complete(done(&jobs[0], Ok(late)), 3000, 0.0, &policy(), |_| None)
            .is_none());
        assert_eq!(d.runs["k"].cursor, 0, "a stale report moves nothing");
    }

    #[test]
    fn an_attempt_waiting_for_a_place_has_no_deadline_until_it_has_one() {
        let mut d = Deliveries::default();
        d.runs.insert(
            "k".into(),
            SubscriptionRuntime::new(1, Ok(route(OnFailingEvent::Halt)), 0, 0, false),
        );
        let (jobs, _) = d.due(0, 5, 100);
        let placement = |placed| Placement {
            key: "k".into(),
            generation: jobs[0].generation,
            id: jobs[0].id,
            placed,
        };
        d.placed(&placement(false), 10);
        assert!(d.runs["k"].view(5).waiting_for_place);
        assert_eq!(
            d.next_wake_at_ms(5),
            None,
            "its executor reports when placed"
        );
        assert!(d.expire(1_000_000, 0.0, &policy()).is_empty());
        assert_eq!(d.runs["k"].run.attempt, 0, "waiting is not a failure");
        assert_eq!(d.due(1_000_000, 5, 100).0.len(), 0, "still in flight");
        // Placed at 1,000,000: its whole time from then.
        d.placed(&placement(true), 1_000_000);
        let view = d.runs["k"].view(5);
        assert!(!view.waiting_for_place);
        assert_eq!(view.in_flight_deadline_at, Some(1_000_100));
        assert!(d
            .expire(1_000_100 + EXPIRY_SLACK_MS, 0.0, &policy())
            .is_empty());
        assert_eq!(
            d.expire(1_000_101 + EXPIRY_SLACK_MS, 0.0, &policy()).len(),
            0
        );
        assert_eq!(
            d.runs["k"].run.attempt, 1,
            "then it expires like any attempt"
        );
        // A placement of a stale attempt changes nothing.
        d.placed(&placement(false), 2_000_000);
        assert!(d.runs["k"].in_flight.is_none());
    }

    /// Many schedules of failures, timeouts (lost reports), duplicate and
    /// late reports against a simulated clock. Checks, at every step: at most
    /// one attempt in flight per run, the cursor never moves back nor past
    /// the head, attempts never pass `max-attempts`, a halted run gets no
    /// job, the actor's timer is set whenever a run has work; and, once
    /// failures stop, every run catches up with the head or is halted.
    #[test]
    fn simulated_schedules_of_failures_keep_the_invariants() {
        let p = policy();
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut d = Deliveries::default();
            let keys = ["a", "b", "c"];
            for (i, k) in keys.iter().enumerate() {
                let policy = if i == 2 {
                    OnFailingEvent::Skip
                } else {
                    OnFailingEvent::Halt
                };
                d.runs.insert(
                    k.to_string(),
                    SubscriptionRuntime::new(1, Ok(route(policy)), 0, 0, false),
                );
            }
            let mut now: i64 = 1_000;
            let mut head: u64 = 0;
            let mut outstanding: Vec<Job> = Vec::new();
            let mut cursors: HashMap<String, u64> = HashMap::new();
            let fail_percent = rng.next() % 60;
            for step in 0..400 {
                let failing_phase = step < 250;
                if rng.chance(30) {
                    head += 1 + rng.next() % 5;
                }
                for fact in d.expire(now, rng.jitter(), &p) {
                    apply_fact(&mut d, &fact);
                }
                let (jobs, facts) = d.due(now, head, p.timeout_ms);
                assert!(facts.is_empty(), "every route parses");
                for job in &jobs {
                    assert!(
                        !outstanding.iter().any(|o| o.key == job.key
                            && d.runs[&job.key].in_flight.as_ref().map(|f| f.id) == Some(o.id)),
                        "seed {seed}: two attempts in flight for {}",
                        job.key
                    );
                    assert!(!d.runs[&job.key].halted);
                }
                outstanding.extend(jobs);
                // Settle some outstanding attempts, in any order.
                let mut i = 0;
                while i < outstanding.len() {
                    if !rng.chance(60) {
                        i += 1;
                        continue;
                    }
                    let job = outstanding.swap_remove(i);
                    let roll = rng.next() % 100;
                    let result = if failing_phase && roll < fail_percent {
                        let single = (job.limit == 1).then_some(job.cursor + 1);
                        Err(failure(single))
                    } else if failing_phase && roll < fail_percent + 5 {
                        continue; // the report is lost: expiry must catch it
                    } else {
                        let through = job.head.min(job.cursor + job.limit as u64);
                        Ok(Delivered {
                            through,
                            offsets: (job.cursor + 1..=through).collect(),
                            bytes: 1,
                        })
                    };
                    if let Some(fact) =
                        d.complete(done(&job, result), now, rng.jitter(), &p, |_| None)
                    {
                        apply_fact(&mut d, &fact);
                    }
                    if rng.chance(10) {
                        // A duplicate report is stale.
                        let before = d.runs[&job.key].cursor;
                        let dup = Delivered {
                            through: job.head,
                            offsets: vec![job.head],
                            bytes: 1,
                        };
                        assert!(d
                            .complete(done(&job, Ok(dup)), now, 0.0, &p, |_| None)
                            .is_none());
                        assert_eq!(d.runs[&job.key].cursor, before, "seed {seed}");
                    }
                }
                for (k, rt) in &d.runs {
                    let last = cursors.entry(k.clone()).or_insert(0);
                    assert!(rt.cursor >= *last, "seed {seed}: cursor of {k} moved back");
                    assert!(
                        rt.cursor <= head,
                        "seed {seed}: cursor of {k} passed the head"
                    );
                    *last = rt.cursor;
                    assert!(rt.run.attempt <= p.max_attempts, "seed {seed}");
                    let has_work = !rt.halted
                        && !rt.fact_pending
                        && (rt.in_flight.is_some() || rt.cursor < head);
                    if has_work {
                        assert!(d.next_wake_at_ms(head).is_some(), "seed {seed}: no timer");
                    }
                }
                // Advance the clock to the next timer, or a little.
                let next = d.next_wake_at_ms(head).unwrap_or(now + 5);
                now = now.max(next).min(now + 50) + 1;
            }
            // Failures have stopped: let everything settle.
            for _ in 0..2000 {
                for fact in d.expire(now, 0.0, &p) {
                    apply_fact(&mut d, &fact);
                }
                let (jobs, _) = d.due(now, head, p.timeout_ms);
                outstanding.extend(jobs);
                for job in std::mem::take(&mut outstanding) {
                    let through = job.head.min(job.cursor + job.limit as u64);
                    let ok = Delivered {
                        through,
                        offsets: (job.cursor + 1..=through).collect(),
                        bytes: 1,
                    };
                    d.complete(done(&job, Ok(ok)), now, 0.0, &p, |_| None);
                }
                now = d.next_wake_at_ms(head).map_or(now + 1, |t| t.max(now + 1));
            }
            for (k, rt) in &d.runs {
                assert!(
                    rt.halted || rt.cursor == head,
                    "seed {seed}: {k} stuck at {} of {head}: {rt:?}",
                    rt.cursor
                );
            }
        }
    }

    /// What the actor does once a fact commits: a halt marks the run halted
    /// (the reducer's `deliveryHalted`), a skip fact just lands.
    fn apply_fact(d: &mut Deliveries, fact: &Fact) {
        let rt = d.runs.get_mut(&fact.key).unwrap();
        if fact.halts {
            rt.halted = true;
            rt.fact_pending = false;
            rt.in_flight = None;
        }
    }
}
