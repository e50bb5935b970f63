//! The story of one event after the fact (`GET {stream}:events/{offset}/trace`):
//! where it came from (its copy chain, the effect that appended it and the
//! event that caused that effect) and what it caused (its copies, the
//! deliveries and wakes of its stream's subscriptions, the effects those
//! asked and the events they appended), read from what storage already
//! holds: copy provenance, effect origins, cursors, checkpoints and the
//! outbox. The idempotency keys of copies and effect appends are
//! deterministic, so each hop is one indexed read. Bounded in depth and
//! breadth; `truncated` says when a bound cut it.

use serde::{Deserialize, Serialize};

use crate::effect::{self, Target as EffectTarget};
use crate::error::Error;
use crate::storage::Storage;
use crate::stream::{CoreState, Event, StreamAddress};
use crate::subscription::Receiver;
use crate::trace::Trace;

use super::Host;

/// Hops followed upstream and downstream at most.
pub const TRACE_DEPTH_MAX: usize = 8;
/// Steps told in one trace at most.
pub const TRACE_STEPS_MAX: usize = 256;
/// Effects of one stream looked at per event at most.
const EFFECTS_LOOKED_AT_MAX: usize = 256;

/// An event's story.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventTrace {
    /// Its W3C trace id, when it carries a trace context.
    pub trace_id: Option<String>,
    /// The event asked about.
    pub event: Step,
    /// Where it came from, nearest first.
    pub upstream: Vec<Step>,
    /// What it caused, each step with what that caused.
    pub downstream: Vec<Step>,
    /// Whether a bound (depth 8, 256 steps) cut the story short.
    pub truncated: bool,
    /// Spans sent to the OTLP endpoint (`?export=true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exported_spans: Option<usize>,
}

/// One step of a story.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// `event`, `copy`, `copied-from`, `delivery`, `wake`, `reactor`,
    /// `effect`.
    pub kind: String,
    /// What became of it: `committed`, `copied`, `delivered` (the cursor is
    /// past it), `pending`, `halted`, `folded`, an effect's status.
    pub status: String,
    /// The stream it happened on.
    pub stream: String,
    /// The event's offset there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// The event's type.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// When it happened (an event's `createdAt`, an effect's settling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// The subscription that did it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription_key: Option<String>,
    /// The processor or reactor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<String>,
    /// An effect's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect_key: Option<String>,
    /// A delivery's receiver, an effect's target (`append`, `webhook`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The last error, if it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Its trace context, for an event that has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<Trace>,
    /// What it caused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caused: Vec<Step>,
}

impl Step {
    fn event(kind: &str, stream: &str, e: &Event) -> Step {
        Step {
            kind: kind.into(),
            status: "committed".into(),
            stream: stream.to_string(),
            offset: Some(e.offset),
            event_type: Some(e.event_type.clone()),
            at: Some(e.created_at.clone()),
            trace: e.trace.clone(),
            ..Step::default()
        }
    }
}

impl Step {
    /// One line: what, where, what became of it.
    fn line(&self) -> String {
        let mut line = self.kind.clone();
        if let Some(c) = &self.component {
            line.push_str(&format!(" {c}"));
        }
        if let Some(k) = &self.effect_key {
            line.push_str(&format!(" {k:?}"));
        }
        if let Some(o) = self.offset {
            line.push_str(&format!(" {}@{o}", self.stream));
        }
        if let Some(t) = &self.event_type {
            line.push_str(&format!(" {t}"));
        }
        if let Some(k) = &self.subscription_key {
            line.push_str(&format!(" (subscription {k:?})"));
        }
        if let Some(t) = &self.target {
            line.push_str(&format!(" -> {t}"));
        }
        line.push_str(&format!(": {}", self.status));
        if let Some(at) = &self.at {
            line.push_str(&format!(" at {at}"));
        }
        if let Some(e) = &self.error {
            line.push_str(&format!(" ({})", e.lines().next().unwrap_or_default()));
        }
        line
    }
}

impl EventTrace {
    /// The story as a tree of lines, for people (`streamhost trace`):
    /// upstream first (oldest at the top), then the event, then what it
    /// caused.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        if let Some(t) = &self.trace_id {
            out.push_str(&format!("trace {t}\n"));
        }
        for step in self.upstream.iter().rev() {
            out.push_str(&format!("  ^ {}\n", step.line()));
        }
        out.push_str(&self.event.line());
        out.push('\n');
        tree_lines(&mut out, &self.downstream, "");
        if self.truncated {
            out.push_str(
                "(truncated: the story goes on past the bounds of depth 8 and 256 steps)\n",
            );
        }
        out.trim_end().to_string()
    }
}

fn tree_lines(out: &mut String, steps: &[Step], indent: &str) {
    for (i, step) in steps.iter().enumerate() {
        let last = i + 1 == steps.len();
        out.push_str(&format!(
            "{indent}{}{}\n",
            if last { "└─ " } else { "├─ " },
            step.line()
        ));
        let deeper = format!("{indent}{}", if last { "   " } else { "│  " });
        tree_lines(out, &step.caused, &deeper);
    }
}

/// What a story may still tell.
struct Budget {
    steps: usize,
    truncated: bool,
}

impl Budget {
    fn take(&mut self) -> bool {
        if self.steps == 0 {
            self.truncated = true;
            return false;
        }
        self.steps -= 1;
        true
    }
}

/// One stream as the story reads it.
struct Stream {
    project: String,
    path: String,
    row_id: i64,
    state: CoreState,
}

fn load(storage: &Storage, project: &str, path: &str) -> anyhow::Result<Option<Stream>> {
    let Some(row) = storage.load_stream(project, path)? else {
        return Ok(None);
    };
    let state: CoreState = serde_json::from_str(&row.state_json)?;
    Ok(Some(Stream {
        project: project.to_string(),
        path: path.to_string(),
        row_id: row.row_id,
        state,
    }))
}

fn event_at(storage: &Storage, stream: &Stream, offset: u64) -> anyhow::Result<Option<Event>> {
    let found = storage.events_within(
        stream.row_id,
        offset.saturating_sub(1),
        1,
        offset,
        usize::MAX,
    )?;
    match found.into_iter().next() {
        Some((o, body)) if o == offset => Ok(Some(serde_json::from_str(&body)?)),
        _ => Ok(None),
    }
}

fn event_by_key(storage: &Storage, stream: &Stream, key: &str) -> anyhow::Result<Option<Event>> {
    let found = storage.events_by_keys(stream.row_id, &[key])?;
    Ok(match found.get(key) {
        Some(body) => Some(serde_json::from_str(body)?),
        None => None,
    })
}

impl Host {
    /// The story of the event at `offset` of `stream`: `404
    /// event-not-found` naming the offset when there is none; with
    /// `export`, also sent to the OTLP endpoint as one trace (`409
    /// telemetry-off` without one).
    pub async fn event_trace(
        &self,
        stream: &StreamAddress,
        offset: u64,
        export: bool,
    ) -> Result<EventTrace, Error> {
        let telemetry = self.streams.executors().telemetry.clone();
        if export && !telemetry.on() {
            return Err(Error::conflict(
                "telemetry-off",
                "export=true needs an OTLP endpoint: set [telemetry] otlp-endpoint or \
                 OTEL_EXPORTER_OTLP_ENDPOINT",
            ));
        }
        let (project, path) = (
            stream.namespace.storage_key().to_string(),
            stream.path.clone(),
        );
        let told = tokio::task::spawn_blocking({
            let storage = self.streams.storage().clone();
            move || tell(&storage, &project, &path, offset)
        })
        .await
        .map_err(|e| Error::internal(format!("telling a trace panicked: {e}")))??;
        let mut told = told;
        if export {
            told.exported_spans = Some(telemetry.tell(spans(&told)));
        }
        Ok(told)
    }
}

fn tell(storage: &Storage, project: &str, path: &str, offset: u64) -> Result<EventTrace, Error> {
    let internal = |e: anyhow::Error| Error::internal(format!("reading the trace failed: {e:#}"));
    let stream = load(storage, project, path)
        .map_err(internal)?
        .ok_or_else(|| {
            Error::not_found("stream-not-found", format!("stream {path:?} not found"))
        })?;
    let event = event_at(storage, &stream, offset)
        .map_err(internal)?
        .ok_or_else(|| {
            Error::not_found(
                "event-not-found",
                format!(
                    "no event at offset {offset} of stream {path:?} (its committed events end at {})",
                    stream.state.max_offset
                ),
            )
        })?;
    let mut budget = Budget {
        steps: TRACE_STEPS_MAX,
        truncated: false,
    };
    let upstream = upstream(storage, &stream, &event, &mut budget).map_err(internal)?;
    let downstream = downstream(storage, &stream, &event, 1, &mut budget).map_err(internal)?;
    Ok(EventTrace {
        trace_id: event.trace.as_ref().map(|t| t.trace_id().to_string()),
        event: Step::event("event", path, &event),
        upstream,
        downstream,
        truncated: budget.truncated,
        exported_spans: None,
    })
}

/// Where `event` came from, nearest first: its copy hops, then the effect
/// that appended the original and the event that caused that effect, and
/// so on.
fn upstream(
    storage: &Storage,
    stream: &Stream,
    event: &Event,
    budget: &mut Budget,
) -> anyhow::Result<Vec<Step>> {
    let mut steps = Vec::new();
    let (mut project, mut event) = (stream.project.clone(), event.clone());
    for depth in 0.. {
        if depth == TRACE_DEPTH_MAX {
            budget.truncated = true;
            break;
        }
        let Some(source) = event.source.clone() else {
            break;
        };
        if let Some(oldest) = source.copied_from.first() {
            for hop in source.copied_from.iter().rev() {
                if !budget.take() {
                    return Ok(steps);
                }
                steps.push(Step {
                    kind: "copied-from".into(),
                    status: "committed".into(),
                    stream: hop.path.clone(),
                    offset: Some(hop.offset),
                    event_type: Some(hop.event_type.clone()),
                    at: Some(hop.created_at.clone()),
                    subscription_key: Some(hop.subscription_key.clone()),
                    ..Step::default()
                });
            }
            project = oldest.project_id.clone().unwrap_or_default();
            let Some(origin) = load(storage, &project, &oldest.path)? else {
                break;
            };
            match event_at(storage, &origin, oldest.offset)? {
                // The original is read for what appended it, if anything.
                Some(original) if original.source.as_ref().is_some_and(|s| s.effect.is_some()) => {
                    event = original;
                    continue;
                }
                _ => break,
            }
        }
        let Some(origin) = source.effect else {
            break;
        };
        let row = storage.effect_by_key(&project, &origin.path, &origin.component, &origin.key)?;
        if !budget.take() {
            break;
        }
        steps.push(Step {
            kind: "effect".into(),
            status: row.as_ref().map_or("unknown".into(), |r| r.status.clone()),
            stream: origin.path.clone(),
            component: Some(consumer_name(&origin.component)),
            effect_key: Some(origin.key.clone()),
            at: row.as_ref().map(|r| r.created_at.clone()),
            target: Some("append".into()),
            ..Step::default()
        });
        let Some((_, to)) = row.as_ref().and_then(|r| effect::stored_cause(&r.target)) else {
            break;
        };
        let Some(cause_stream) = load(storage, &project, &origin.path)? else {
            break;
        };
        let Some(cause) = event_at(storage, &cause_stream, to)? else {
            break;
        };
        if !budget.take() {
            break;
        }
        steps.push(Step::event("event", &origin.path, &cause));
        event = cause;
    }
    Ok(steps)
}

fn consumer_name(component: &str) -> String {
    effect::consumer(component).1.to_string()
}

/// What `event` of `stream` caused: a step per subscription of the stream
/// that covers it, and the effects asked by the folds and reactors that
/// read it, each with what it caused in turn.
fn downstream(
    storage: &Storage,
    stream: &Stream,
    event: &Event,
    depth: usize,
    budget: &mut Budget,
) -> anyhow::Result<Vec<Step>> {
    if depth > TRACE_DEPTH_MAX {
        budget.truncated = true;
        return Ok(Vec::new());
    }
    let mut steps = Vec::new();
    let cursors = storage.load_cursors(stream.row_id)?;
    let effects = storage.effects_from_checkpoint(
        &stream.project,
        &stream.path,
        &stream.state.stream_id,
        event.offset,
        EFFECTS_LOOKED_AT_MAX,
    )?;
    if effects.len() == EFFECTS_LOOKED_AT_MAX {
        budget.truncated = true;
    }
    let caused: Vec<_> = effects
        .into_iter()
        .filter(|e| {
            effect::stored_cause(&e.target)
                .is_some_and(|(from, to)| from <= event.offset && event.offset <= to)
        })
        .collect();
    let source = crate::delivery::copy::SourceInfo {
        project_id: (!stream.project.is_empty()).then(|| stream.project.clone()),
        path: stream.path.clone(),
        stream_id: stream.state.stream_id.clone(),
        stream_created_at: stream.state.created_at.clone(),
    };
    for (key, sub) in &stream.state.subscriptions.outbound.by_key {
        // A run that started after the event never read it.
        if sub.start_cursor() >= event.offset && sub.configured_at_offset >= event.offset {
            continue;
        }
        if !budget.take() {
            return Ok(steps);
        }
        let cursor = cursors.iter().find(|c| &c.subscription_key == key);
        let acknowledged = cursor.map_or(0, |c| c.acknowledged_offset);
        let halted = sub.delivery_halted.is_some();
        let passed = if acknowledged >= event.offset {
            "delivered"
        } else if halted {
            "halted"
        } else {
            "pending"
        };
        let error = (acknowledged < event.offset)
            .then(|| cursor.and_then(|c| c.last_error.clone()))
            .flatten();
        let mut step = Step {
            kind: "delivery".into(),
            status: passed.into(),
            stream: stream.path.clone(),
            subscription_key: Some(key.clone()),
            error,
            ..Step::default()
        };
        match &sub.configuration.receiver {
            Receiver::CopyToStream {
                receiving_stream_path,
                ..
            } => {
                step.kind = "copy".into();
                step.target = Some(receiving_stream_path.clone());
                let copy_key =
                    crate::delivery::copy::copy_key(&source, sub.generation(), key, event.offset);
                if let Some(receiver) = load(storage, &stream.project, receiving_stream_path)? {
                    if let Some(copy) = event_by_key(storage, &receiver, &copy_key)? {
                        step.status = "copied".into();
                        step.stream = receiving_stream_path.clone();
                        step.offset = Some(copy.offset);
                        step.event_type = Some(copy.event_type.clone());
                        step.at = Some(copy.created_at.clone());
                        step.trace = copy.trace.clone();
                        step.caused = downstream(storage, &receiver, &copy, depth + 1, budget)?;
                    }
                }
            }
            Receiver::WebhookPost { url, .. } => step.target = Some(format!("webhook {url}")),
            Receiver::ItxCall { expression, .. } => {
                step.target = Some(format!("itx {expression}"));
            }
            Receiver::ProcessorWake { expression } | Receiver::Reactor { expression } => {
                let reactor = matches!(sub.configuration.receiver, Receiver::Reactor { .. });
                let Ok(crate::itx::Target::ComponentFunction { component, .. }) =
                    crate::itx::resolve(expression)
                else {
                    steps.push(step);
                    continue;
                };
                let outbox = if reactor {
                    step.kind = "reactor".into();
                    step.status = "committed".into();
                    effect::effect_component(&component)
                } else {
                    step.kind = "wake".into();
                    let checkpoint = storage.checkpoint(stream.row_id, &component)?;
                    let folded = checkpoint.as_ref().map_or(0, |c| c.checkpoint_offset);
                    if folded >= event.offset {
                        step.status = "folded".into();
                    }
                    component.clone()
                };
                step.component = Some(component);
                for e in caused.iter().filter(|e| e.component == outbox) {
                    if !budget.take() {
                        break;
                    }
                    step.caused
                        .push(effect_step(storage, stream, e, depth, budget)?);
                }
            }
        }
        steps.push(step);
    }
    Ok(steps)
}

/// An effect and the event it appended, if it appended one.
fn effect_step(
    storage: &Storage,
    stream: &Stream,
    row: &crate::storage::EffectRow,
    depth: usize,
    budget: &mut Budget,
) -> anyhow::Result<Step> {
    let target = EffectTarget::from_json(&row.target).ok();
    let mut step = Step {
        kind: "effect".into(),
        status: row.status.clone(),
        stream: stream.path.clone(),
        component: Some(consumer_name(&row.component)),
        effect_key: Some(row.key.clone()),
        at: Some(
            row.settled_at
                .clone()
                .unwrap_or_else(|| row.created_at.clone()),
        ),
        target: target.as_ref().map(|t| match t {
            EffectTarget::Append { stream_path, .. } => format!("append {stream_path}"),
            EffectTarget::Webhook { url, .. } => format!("webhook {url}"),
            EffectTarget::Itx { expression, .. } => format!("itx {expression}"),
            EffectTarget::Cancel { key } => format!("cancel {key}"),
        }),
        error: row.last_error.clone(),
        trace: effect::stored_trace(&row.target),
        ..Step::default()
    };
    if let Some(EffectTarget::Append { stream_path, .. }) = &target {
        let key = effect::append_idempotency_key(&row.component, &row.path, &row.key);
        if let Some(appended_to) = load(storage, &stream.project, stream_path)? {
            if let Some(appended) = event_by_key(storage, &appended_to, &key)? {
                if budget.take() {
                    let mut e = Step::event("event", stream_path, &appended);
                    e.caused = downstream(storage, &appended_to, &appended, depth + 1, budget)?;
                    step.caused.push(e);
                }
            }
        }
    }
    Ok(step)
}

/// The story as spans of one trace (its own trace id when the event has
/// none), each step's span derived from what the step is, so telling the
/// same story twice gives the same spans.
fn spans(told: &EventTrace) -> Vec<crate::telemetry::Told> {
    let trace_id: [u8; 16] = told
        .trace_id
        .as_deref()
        .and_then(|t| u128::from_str_radix(t, 16).ok())
        .map(u128::to_be_bytes)
        .unwrap_or_else(|| {
            let a = crate::trace::derived_span_id(&[
                "trace",
                &told.event.stream,
                &offset_text(&told.event),
            ]);
            let b = crate::trace::derived_span_id(&[
                "trace-low",
                &told.event.stream,
                &offset_text(&told.event),
            ]);
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&a);
            id[8..].copy_from_slice(&b);
            id
        });
    let mut out = Vec::new();
    // The oldest upstream step is the root; the event under the nearest.
    let mut parent = None;
    for step in told.upstream.iter().rev() {
        parent = Some(push_span(&mut out, trace_id, parent, step));
    }
    let me = push_span(&mut out, trace_id, parent, &told.event);
    for step in &told.downstream {
        push_tree(&mut out, trace_id, me, step);
    }
    out
}

fn offset_text(step: &Step) -> String {
    step.offset.map(|o| o.to_string()).unwrap_or_default()
}

fn push_tree(
    out: &mut Vec<crate::telemetry::Told>,
    trace_id: [u8; 16],
    parent: [u8; 8],
    step: &Step,
) {
    let id = push_span(out, trace_id, Some(parent), step);
    for c in &step.caused {
        push_tree(out, trace_id, id, c);
    }
}

fn push_span(
    out: &mut Vec<crate::telemetry::Told>,
    trace_id: [u8; 16],
    parent: Option<[u8; 8]>,
    step: &Step,
) -> [u8; 8] {
    use opentelemetry::KeyValue;
    let offset = offset_text(step);
    let parent_text = parent.map(|p| crate::trace::hex(&p)).unwrap_or_default();
    let span_id = crate::trace::derived_span_id(&[
        &step.kind,
        &step.stream,
        &offset,
        step.subscription_key.as_deref().unwrap_or(""),
        step.component.as_deref().unwrap_or(""),
        step.effect_key.as_deref().unwrap_or(""),
        &parent_text,
    ]);
    let at = step
        .at
        .as_deref()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| std::time::SystemTime::from(t.with_timezone(&chrono::Utc)))
        .unwrap_or_else(std::time::SystemTime::now);
    let mut attributes = vec![
        KeyValue::new("streamhost.step.kind", step.kind.clone()),
        KeyValue::new("streamhost.step.status", step.status.clone()),
        KeyValue::new("streamhost.stream.path", step.stream.clone()),
    ];
    if let Some(o) = step.offset {
        attributes.push(KeyValue::new("streamhost.offset", o as i64));
    }
    for (key, value) in [
        ("streamhost.event.type", &step.event_type),
        ("streamhost.subscription.key", &step.subscription_key),
        ("streamhost.processor", &step.component),
        ("streamhost.effect.key", &step.effect_key),
        ("streamhost.target", &step.target),
    ] {
        if let Some(v) = value {
            attributes.push(KeyValue::new(key, v.clone()));
        }
    }
    let name = match (&step.event_type, &step.component) {
        (Some(t), _) => format!("{} {t}", step.kind),
        (None, Some(c)) => format!("{} {c}", step.kind),
        _ => step.kind.to_string(),
    };
    out.push(crate::telemetry::Told {
        trace_id,
        span_id,
        parent_id: parent,
        name,
        start: at,
        end: at,
        attributes,
        error: step
            .error
            .clone()
            .filter(|_| step.status == "failed" || step.status == "halted"),
    });
    span_id
}
