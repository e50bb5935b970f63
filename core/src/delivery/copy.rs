//! The `copy-to-stream` receiver, on the receiving side: the stamp fence, the
//! hop bound and cycle drop with its audit line, the JSONata transform, and
//! the provenance hop, turned into one all-or-nothing platform append.

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::error::Error;
use crate::filter::DROP_AUDIT_REASON;
use crate::stream::{
    plan_append, types, AppendContext, AppendInput, AppendPlan, Authority, CopiedFrom, CoreState,
    Event, EventInput, EventSource, RoundKeys, StreamAddress,
};
use crate::subscription::{Stamp, COPY_HOPS_MAX};

/// The source of a delivery.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceInfo {
    pub project_id: Option<String>,
    pub path: String,
    pub stream_id: String,
    pub stream_created_at: String,
}

/// One batch of matching source events for a receiving stream.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyBatch {
    pub source: SourceInfo,
    pub subscription_key: String,
    /// The config generation (`cursorChangedAtSourceOffset`) of the run.
    pub generation: u64,
    pub transform: Option<String>,
    pub events: Vec<Event>,
    /// The transform's output for each event, computed by the sender (off
    /// the receiving actor, see [`CopyBatch::shape`]); `None`: the receiver
    /// applies the transform itself (always, after a hop to another host).
    #[serde(skip)]
    pub shaped: Option<Vec<Result<Shaped, Error>>>,
}

impl CopyBatch {
    /// Applies the transform to every event now, so the receiving actor
    /// only takes the results (JSONata stays off the actor). Run it on a
    /// blocking thread. A failure to compile is left for the receiver to
    /// report.
    pub fn shape(&mut self, bounds: super::Bounds) {
        let Some(text) = &self.transform else { return };
        let Ok(t) = crate::jsonata::compile(text, bounds.jsonata) else {
            return;
        };
        self.shaped = Some(
            self.events
                .iter()
                .map(|e| transformed(&t, e, &self.subscription_key, bounds.event_bytes_max))
                .collect(),
        );
    }

    /// After [`CopyBatch::shape`]: when the transform throws on an event
    /// after the first, drops it and every later event (the events before
    /// it still go: progress; the next attempt starts at it, alone, and
    /// halts); answers the offset just before it.
    pub fn cut_before_failing(&mut self) -> Option<u64> {
        let shaped = self.shaped.as_mut()?;
        let at = shaped.iter().position(Result::is_err)?;
        if at == 0 {
            return None;
        }
        shaped.truncate(at);
        let offset = self.events[at].offset;
        self.events.truncate(at);
        Some(offset - 1)
    }

    pub fn stamp(&self) -> Stamp {
        Stamp {
            stream_created_at: self.source.stream_created_at.clone(),
            stream_id: self.source.stream_id.clone(),
            cursor_changed_at_source_offset: self.generation,
        }
    }
}

/// What the receiver did with a batch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyOutcome {
    pub appended: usize,
    pub dropped: usize,
}

/// The idempotency key of a copy: one per (subscription key, config
/// generation, source lifetime, source offset), so retries of a run collapse
/// and a new run copies again.
pub fn copy_identity(batch: &CopyBatch, offset: u64) -> String {
    copy_key(
        &batch.source,
        batch.generation,
        &batch.subscription_key,
        offset,
    )
}

/// [`copy_identity`] from its parts: the copy of the event at `offset` of
/// `source` by run `generation` of subscription `subscription_key`.
pub fn copy_key(
    source: &SourceInfo,
    generation: u64,
    subscription_key: &str,
    offset: u64,
) -> String {
    format!(
        "copy:{}:{}:{}:{}:{}:{}",
        source.project_id.as_deref().unwrap_or(""),
        source.path,
        source.stream_id,
        generation,
        subscription_key,
        offset
    )
}

/// Why a copy of `event` to `receiver` is dropped: its chain already holds
/// the receiver, or has reached the hop bound.
fn drop_reason(event: &Event, receiver: &StreamAddress) -> Option<&'static str> {
    let hops = event
        .source
        .as_ref()
        .map(|s| s.copied_from.as_slice())
        .unwrap_or(&[]);
    let project = receiver.namespace.project_id();
    if hops
        .iter()
        .any(|h| h.path == receiver.path && h.project_id.as_deref() == project)
    {
        Some("its copy chain already holds this stream")
    } else if hops.len() >= COPY_HOPS_MAX {
        Some("its copy chain reached the 32-hop bound")
    } else {
        None
    }
}

fn drop_audit_identity(batch: &CopyBatch, first: u64, last: u64) -> String {
    format!("copy-drop:{}:{first}-{last}", copy_identity(batch, first))
}

/// Every idempotency key that planning `batch` may use, so the receiver can
/// look up the committed events that hold them first.
pub fn batch_keys(batch: &CopyBatch, receiver: &StreamAddress) -> Vec<String> {
    let mut keys = Vec::with_capacity(batch.events.len() + 1);
    let mut dropped = Vec::new();
    for e in &batch.events {
        match drop_reason(e, receiver) {
            Some(_) => dropped.push(e.offset),
            None => keys.push(copy_identity(batch, e.offset)),
        }
    }
    if let (Some(first), Some(last)) = (dropped.first(), dropped.last()) {
        keys.push(drop_audit_identity(batch, *first, *last));
    }
    keys
}

/// Plans the receiving side of a copy batch against the receiver's tentative
/// state; on success returns the append plan and what was appended or dropped.
pub fn plan_copy<'a>(
    state: &mut Option<CoreState>,
    round_keys: &mut RoundKeys,
    earlier: &dyn Fn(u64) -> Option<&'a Event>,
    receiver: &StreamAddress,
    batch: &CopyBatch,
    ctx: &mut AppendContext<'_>,
    bounds: super::Bounds,
) -> Result<(AppendPlan, CopyOutcome), Error> {
    if let Some(s) = state {
        if let Some(record) = s
            .subscriptions
            .inbound
            .by_source_path
            .get(&batch.source.path)
            .and_then(|m| m.get(&batch.subscription_key))
        {
            if batch.stamp().compare(&record.stamp()) == std::cmp::Ordering::Less {
                return Err(Error::conflict(
                    "stale-delivery",
                    format!(
                        "stream {:?} already accepted a newer delivery from {:?} subscription {:?} (stream {} created {}, generation {}) than this one (stream {} created {}, generation {})",
                        receiver.path,
                        batch.source.path,
                        batch.subscription_key,
                        record.stream_id,
                        record.stream_created_at,
                        record.cursor_changed_at_source_offset,
                        batch.source.stream_id,
                        batch.source.stream_created_at,
                        batch.generation
                    ),
                ));
            }
        }
    }
    let transform = match (&batch.transform, &batch.shaped) {
        (Some(t), None) => Some(crate::jsonata::compile(t, bounds.jsonata).map_err(|e| {
            Error::unprocessable("transform-failed", format!("jsonataTransform: {e}"))
        })?),
        _ => None,
    };
    let mut inputs = Vec::with_capacity(batch.events.len() + 1);
    let mut dropped: Vec<(u64, &'static str)> = Vec::new();
    for (i, event) in batch.events.iter().enumerate() {
        if let Some(reason) = drop_reason(event, receiver) {
            dropped.push((event.offset, reason));
            continue;
        }
        let hops = event
            .source
            .as_ref()
            .map(|s| s.copied_from.clone())
            .unwrap_or_default();
        let shaped = batch.shaped.as_ref().and_then(|s| s.get(i));
        let (event_type, payload, metadata) = match (shaped, &transform) {
            (Some(shaped), _) => shaped.clone()?,
            (None, Some(t)) => {
                transformed(t, event, &batch.subscription_key, bounds.event_bytes_max)?
            }
            (None, None) => (
                event.event_type.clone(),
                event.payload.clone(),
                event.metadata.clone(),
            ),
        };
        let mut copied_from = hops;
        copied_from.push(CopiedFrom {
            project_id: batch.source.project_id.clone(),
            path: batch.source.path.clone(),
            stream_id: batch.source.stream_id.clone(),
            stream_created_at: batch.source.stream_created_at.clone(),
            offset: event.offset,
            event_type: event.event_type.clone(),
            created_at: event.created_at.clone(),
            subscription_key: batch.subscription_key.clone(),
            cursor_changed_at_source_offset: batch.generation,
        });
        inputs.push(EventInput {
            event_type,
            payload: Some(payload),
            metadata,
            idempotency_key: Some(copy_identity(batch, event.offset)),
            ephemeral: None,
            offset: None,
            source: Some(EventSource::copied(copied_from)),
            trace: event.trace.clone(),
            redacted: event.redacted.clone(),
        });
    }
    if let (Some(first), Some(last)) = (dropped.first(), dropped.last()) {
        let message = format!(
            "dropped {} copied event(s) from {:?} subscription {:?} (source offsets {}-{}): {}",
            dropped.len(),
            batch.source.path,
            batch.subscription_key,
            first.0,
            last.0,
            first.1
        );
        let payload = json!({
            "message": message,
            "reason": DROP_AUDIT_REASON,
            "sourcePath": batch.source.path,
            "subscriptionKey": batch.subscription_key,
            "count": dropped.len(),
            "fromOffset": first.0,
            "toOffset": last.0,
        });
        inputs.push(EventInput {
            event_type: types::ERROR_OCCURRED.to_string(),
            payload: payload.as_object().cloned(),
            metadata: None,
            idempotency_key: Some(drop_audit_identity(batch, first.0, last.0)),
            ephemeral: None,
            offset: None,
            source: None,
            trace: None,
            redacted: None,
        });
    }
    let outcome = CopyOutcome {
        appended: inputs.len() - usize::from(!dropped.is_empty()),
        dropped: dropped.len(),
    };
    if inputs.is_empty() {
        return Ok((
            AppendPlan {
                events: Vec::new(),
                new_events: Vec::new(),
                redactions: Vec::new(),
                removed_through: None,
            },
            outcome,
        ));
    }
    let input = AppendInput {
        events: inputs,
        expected_stream_id: None,
    };
    let plan = plan_append(state, round_keys, earlier, &input, Authority::Platform, ctx)?;
    Ok((plan, outcome))
}

/// A transformed event body: type, payload, metadata.
pub type Shaped = (String, Map<String, Value>, Option<Map<String, Value>>);

/// Applies a transform: the result must be an object of `type`, `payload`,
/// `metadata`, each optional; omitted fields copy verbatim. An event over
/// `event_bytes_max` (the append limit) is refused.
pub fn transformed(
    t: &crate::jsonata::Expression,
    event: &Event,
    key: &str,
    event_bytes_max: usize,
) -> Result<Shaped, Error> {
    let fail = |m: String| {
        let code = if crate::jsonata::is_limit_exceeded(&m) {
            "jsonata-limit-exceeded"
        } else {
            "transform-failed"
        };
        Error::unprocessable(
            code,
            format!(
                "subscription {key:?} jsonataTransform failed on offset {}: {m}",
                event.offset
            ),
        )
    };
    let value = serde_json::to_value(event).map_err(|e| fail(e.to_string()))?;
    let out = t
        .evaluate(&crate::jsonata::Input::new(&value))
        .map_err(|e| fail(crate::jsonata::describe_error(t.source(), &e)))?;
    let Some(Value::Object(out)) = out else {
        return Err(fail(format!(
            "the result must be an object of type, payload and metadata, got {}",
            out.map(|v| v.to_string())
                .unwrap_or_else(|| "nothing".into())
        )));
    };
    let mut event_type = event.event_type.clone();
    let mut payload = event.payload.clone();
    let mut metadata = event.metadata.clone();
    for (k, v) in out {
        match (k.as_str(), v) {
            ("type", Value::String(s)) if !s.trim().is_empty() => event_type = s,
            ("payload", Value::Object(m)) => payload = m,
            ("metadata", Value::Object(m)) => metadata = Some(m),
            (field @ ("type" | "payload" | "metadata"), v) => {
                return Err(fail(format!(
                    "the result's {field} has the wrong type: {v}"
                )))
            }
            (other, _) => {
                return Err(fail(format!(
                    "the result has {other:?}; only type, payload and metadata may be set"
                )))
            }
        }
    }
    let bytes = event_type.len()
        + Value::Object(payload.clone()).to_string().len()
        + metadata
            .as_ref()
            .map_or(0, |m| Value::Object(m.clone()).to_string().len());
    let limit = event_bytes_max;
    if bytes > limit {
        return Err(Error::too_large(format!(
            "subscription {key:?} jsonataTransform made an event of {bytes} bytes from offset {}, over the {limit}-byte append limit",
            event.offset
        )));
    }
    Ok((event_type, payload, metadata))
}
