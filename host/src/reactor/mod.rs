//! Reactors: effects committed with their events (seed 004's dispatcher).
//!
//! A reactor is a component's `react(event) -> result<list<effect>,
//! failure>`, configured on a stream as a subscription whose receiver is
//! `{"action": "reactor", "expression": ["components", ["get", NAME],
//! "react"]}`; its subscription key is its durable name. The stream's actor
//! runs every configured reactor whose filter matches over each durable
//! event a round would commit, on a blocking thread, before the round goes
//! to storage; the effects go into the outbox in the round's transaction.
//! A reactor that fails refuses the request that carried the event
//! (`422 reactor-failed`); the rest of the round is planned again without
//! it. Nothing here decides delivery: the outbox's executor runs the
//! effects as it runs a processor's.

pub mod rest;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::effect::effect_component;
use crate::error::Error;
use crate::filter::CompiledFilter;
use crate::processor::runtime::{Determinism, Effect, GuestError, Runtime};
use crate::storage::{NewEffect, Storage};
use crate::stream::{CoreState, Event};
use crate::subscription::Receiver;

/// How long one reactor call may run (the append waits for it).
pub const REACT_TIMEOUT_MS: u64 = 1_000;
/// Seconds a client waits before retrying an append a reactor could not
/// run for (`retry-after` of `503 reactor-unavailable`).
pub const REFUSED_FOR_NOW_RETRY_AFTER_S: u32 = 1;
/// The largest event a refusal quotes whole in its repro command.
const REPRO_EVENT_BYTES_MAX: usize = 4096;

/// A reactor configured on a stream.
#[derive(Debug, Clone)]
pub struct Reactor {
    /// Its durable name (the subscription key).
    pub name: String,
    /// The component whose `react` it calls.
    pub component: String,
    /// Events at or before this offset are not its.
    pub configured_at_offset: u64,
    /// Which events it runs for.
    pub filter: CompiledFilter,
}

/// What identifies the reactors a state configures (name, configure
/// offset): an actor compiles them again only when this changes.
pub fn identities(state: &CoreState) -> Vec<(&str, u64)> {
    state
        .subscriptions
        .outbound
        .by_key
        .iter()
        .filter(|(_, s)| matches!(s.configuration.receiver, Receiver::Reactor { .. }))
        .map(|(k, s)| (k.as_str(), s.configured_at_offset))
        .collect()
}

/// The reactors `state` configures, filters compiled (validated when
/// configured: one that no longer compiles runs for no event and is
/// logged).
pub fn configured(state: &CoreState, limits: crate::jsonata::Limits) -> Vec<Reactor> {
    state
        .subscriptions
        .outbound
        .by_key
        .iter()
        .filter_map(|(name, sub)| {
            let Receiver::Reactor { expression } = &sub.configuration.receiver else {
                return None;
            };
            let component = crate::itx::reactor_component(expression).ok()?;
            let filter = match CompiledFilter::new(sub.configuration.filter.as_ref(), false, limits) {
                Ok(f) => f,
                Err(e) => {
                    tracing::error!(reactor = %name, error = %e, "a reactor's filter does not compile");
                    return None;
                }
            };
            Some(Reactor {
                name: name.clone(),
                component,
                configured_at_offset: sub.configured_at_offset,
                filter,
            })
        })
        .collect()
}

/// One durable event a round would commit, as the reactors see it.
#[derive(Debug, Clone)]
pub struct Appended {
    /// Which request of the round carries it.
    pub request: usize,
    /// Its index among that request's events (`None`: an event the
    /// platform adds, such as the stream's creation).
    pub index: Option<usize>,
    pub event: Event,
    /// The event as the HTTP API serves it (JSON text).
    pub body: String,
}

/// The effects of one reactor over a round, in their stored form.
#[derive(Debug, Clone)]
pub struct Reaction {
    /// The outbox component (`reactor:<name>`).
    pub component: String,
    pub effects: Vec<NewEffect>,
}

/// A reactor refused an event: the request that carried it fails.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub request: usize,
    pub error: Error,
}

/// Where the reactors of one stream run.
pub struct Reacting<'a> {
    pub storage: &'a Storage,
    pub runtime: &'a Runtime,
    pub project: &'a str,
    pub stream_id: &'a str,
    /// The host's resting reactors and its clock: a reactor version whose
    /// calls time out again and again is not called while it rests
    /// (`rest.rs`). `None`: every call runs (a backfill).
    pub rests: Option<(&'a Mutex<rest::Rests>, &'a dyn crate::clock::Clock)>,
    /// Takes the place of the calls (`streamhost-wasm`: `wasm/src/share.rs`), before the
    /// first; its error says why there is none. `None`: no place is taken.
    pub enter: Option<&'a dyn Fn() -> Result<crate::processor::share::Place, String>>,
    /// Trace spans: a call for a traced event is a span of its trace, and
    /// its effects carry the span on. `None`: none (a backfill).
    pub telemetry: Option<&'a crate::telemetry::Telemetry>,
}

impl Reacting<'_> {
    /// Runs each reactor over each event after its configuration that its
    /// filter selects; answers their effects and how many calls were made,
    /// or the first refusal. Blocking: guests run here.
    pub fn react(
        &self,
        reactors: &[Reactor],
        events: &[Appended],
    ) -> Result<(Vec<Reaction>, u64), Refusal> {
        let mut reactions = Vec::new();
        let mut calls = 0;
        let mut place = None;
        for reactor in reactors {
            let mut effects = Vec::new();
            let mut keys = HashSet::new();
            let mut prepared = None;
            for a in events
                .iter()
                .filter(|a| a.event.offset > reactor.configured_at_offset)
            {
                // Final: the same event is refused again whenever it is
                // tried. Retryable: a later try may pass (a deploy, a
                // slow call, storage).
                let refuse = |message: String| Refusal {
                    request: a.request,
                    error: refusal(reactor, a, &message, false),
                };
                let refuse_for_now = |message: String| Refusal {
                    request: a.request,
                    error: refusal(reactor, a, &message, true),
                };
                // The JSON value only a condition reads.
                let value = match reactor.filter.condition {
                    Some(_) => serde_json::to_value(&a.event).expect("events serialize"),
                    None => serde_json::Value::Null,
                };
                match reactor
                    .filter
                    .matches(&a.event.event_type, &a.event.payload, &value)
                {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => return Err(refuse(format!("its filter failed: {e}"))),
                }
                let p = match &prepared {
                    Some(p) => Arc::clone(p),
                    None => {
                        let p = self.component(reactor).map_err(refuse_for_now)?;
                        prepared = Some(Arc::clone(&p));
                        p
                    }
                };
                let d = Determinism::for_event(
                    self.stream_id,
                    a.event.offset,
                    crate::processor::wake::created_ms(&a.event.created_at),
                );
                let clock_ms = d.wall_clock_ms;
                if let Some((rests, clock)) = self.rests {
                    let now_ms = clock.now_ms();
                    let admitted = rests.lock().unwrap_or_else(|e| e.into_inner()).admit(
                        self.project,
                        &p.digest,
                        now_ms,
                    );
                    if let Err(resting) = admitted {
                        return Err(Refusal {
                            request: a.request,
                            error: resting_refusal(reactor, a, resting, now_ms),
                        });
                    }
                }
                if place.is_none() {
                    if let Some(enter) = self.enter {
                        place = Some(enter().map_err(&refuse_for_now)?);
                    }
                }
                calls += 1;
                let span = a
                    .event
                    .trace
                    .as_ref()
                    .and_then(|t| self.telemetry.and_then(|tel| tel.begin(Some(t))));
                let called =
                    self.runtime
                        .react(&reactor.component, &p, &a.body, d, REACT_TIMEOUT_MS);
                if let Some((rests, clock)) = self.rests {
                    let mut rests = rests.lock().unwrap_or_else(|e| e.into_inner());
                    match &called {
                        Err(GuestError::Timeout { .. }) => {
                            rests.timed_out(self.project, &p.digest, clock.now_ms())
                        }
                        _ => rests.ran(self.project, &p.digest),
                    }
                }
                let carried = span
                    .as_ref()
                    .map(|s| s.handed_on.clone())
                    .or_else(|| a.event.trace.clone());
                if let (Some(span), Some(telemetry)) = (span, self.telemetry) {
                    let mut record = crate::telemetry::Record::default()
                        .with("streamhost.project", self.project.to_string())
                        .with("streamhost.stream.id", self.stream_id.to_string())
                        .with("streamhost.reactor", reactor.name.clone())
                        .with("streamhost.offset", a.event.offset as i64);
                    record.error = called.as_ref().err().map(|e| e.to_string());
                    let kind = opentelemetry::trace::SpanKind::Internal;
                    telemetry.end(span, "reactor", kind, record);
                }
                let returned = called.map_err(|e| {
                    let retryable = e.retryable();
                    let message = failed_call(reactor, a, e, clock_ms);
                    if retryable {
                        refuse_for_now(message)
                    } else {
                        refuse(message)
                    }
                })?;
                for e in checked(&returned, clock_ms).map_err(refuse)? {
                    if keys.insert(e.key.clone()) {
                        let e = e.caused_by(a.event.offset, a.event.offset, carried.as_ref());
                        effects.push(NewEffect::of(e, a.event.offset));
                    }
                }
            }
            if !effects.is_empty() {
                reactions.push(Reaction {
                    component: effect_component(&reactor.name),
                    effects,
                });
            }
        }
        Ok((reactions, calls))
    }

    fn component(
        &self,
        reactor: &Reactor,
    ) -> Result<Arc<crate::processor::runtime::Prepared>, String> {
        let found = crate::processor::deployed(
            self.storage,
            self.runtime,
            self.project,
            &reactor.component,
        )
        .map_err(|e| format!("loading component {:?} failed: {e:#}", reactor.component))?;
        let (p, _) = found.ok_or_else(|| {
            format!(
                "component {:?} is not deployed in project {:?}",
                reactor.component, self.project
            )
        })?;
        if !p.is_reactor() {
            return Err(format!(
                "component {:?} does not export {}",
                reactor.component,
                crate::processor::runtime::REACTOR_INTERFACE
            ));
        }
        Ok(p)
    }
}

/// The effects a reactor returned, checked; `clock_ms` is the event's
/// time (a `not-before` is bounded from it).
fn checked(returned: &[Effect], clock_ms: i64) -> Result<Vec<crate::effect::Checked>, String> {
    returned
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let at = format!("effects[{i}]");
            crate::effect::check(&at, crate::processor::wake::returned(e), clock_ms)
                .map_err(|m| format!("it returned a bad effect: {m}"))
        })
        .collect()
}

/// Why a call failed, with how to run it again by hand.
fn failed_call(reactor: &Reactor, a: &Appended, e: GuestError, clock_ms: i64) -> String {
    let repro = if a.body.len() <= REPRO_EVENT_BYTES_MAX {
        let call = format!("react({})", crate::processor::wave::string(&a.body));
        format!(
            "; reproduce with `wasmtime run -S keyvalue --invoke '{}' {}.wasm` (the call's clock read {clock_ms} ms)",
            call.replace('\'', "'\\''"),
            reactor.component
        )
    } else {
        format!(
            "; the event is {} bytes, too large to quote in a repro",
            a.body.len()
        )
    };
    // A reactor's `err` is its refusal, in its own words.
    let what = match &e {
        GuestError::Failure { message, .. } => format!("its err: {message}"),
        other => other.to_string(),
    };
    format!("{what}{repro}")
}

/// The refusal of an event for a reactor that rests (`rest.rs`): `503
/// reactor-unavailable`, retry after the rest left.
fn resting_refusal(reactor: &Reactor, a: &Appended, resting: rest::Resting, now_ms: i64) -> Error {
    let message = format!(
        "its last {} calls ran to their timeout ({REACT_TIMEOUT_MS} ms each), so it is not called \
         until {}",
        resting.timeouts,
        crate::clock::format_timestamp(resting.until_ms)
    );
    let mut error = refusal(reactor, a, &message, true);
    let left_ms = (resting.until_ms - now_ms).max(1);
    error.retry_after_s = Some(u32::try_from((left_ms + 999) / 1000).unwrap_or(u32::MAX));
    error
}

/// The refusal of an event: `422 reactor-failed` when it is final (the
/// reactor would refuse the event again), `503 reactor-unavailable` when a
/// later try may pass; either way nothing of the append committed.
fn refusal(reactor: &Reactor, a: &Appended, message: &str, retryable: bool) -> Error {
    let (verb, then) = if retryable {
        ("could not run", "; retry later")
    } else {
        ("refused", "")
    };
    let message = format!(
        "reactor {:?} (component {:?}) {verb} on {} (offset {}, type {:?}), so nothing of this append was committed: {message}{then}",
            reactor.name,
            reactor.component,
            match a.index {
                Some(i) => format!("events[{i}]"),
                None => "the event the platform adds".to_string(),
            },
        a.event.offset,
        a.event.event_type
    );
    let mut error = if retryable {
        Error::unavailable(
            "reactor-unavailable",
            message,
            REFUSED_FOR_NOW_RETRY_AFTER_S,
        )
    } else {
        Error::unprocessable("reactor-failed", message)
    };
    error.retryable = Some(retryable);
    error.reactor = Some(reactor.name.clone());
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reactor_effects_never_share_an_identity_with_a_processors() {
        assert_eq!(effect_component("welcome.v1"), "reactor:welcome.v1");
        assert_eq!(
            crate::effect::reactor_of("reactor:welcome.v1"),
            Some("welcome.v1")
        );
        // Component names are [a-z0-9][a-z0-9-]*: never with a ':'.
        assert_eq!(crate::effect::reactor_of("welcome"), None);
    }
}
