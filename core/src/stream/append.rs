//! Append planning: the pure decision of what one `:append` request commits.
//!
//! Given the stream's tentative state, the request, who is asking and the
//! committed events that hold the request's idempotency keys, [`plan_append`]
//! either rejects the request (nothing changes) or returns the events to
//! commit and the answer for each input event. No IO happens here.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value};

use super::control::{validate_control, ControlContext};
use super::state::{CoreState, STATE_BYTES_MAX};
use crate::error::Error;
use crate::event::{is_stream_control_type, types, AppendInput, Event, EventInput};
use crate::subscription::{parse_payload, Receiver, SubscriptionConfig};

/// Most events in one append request.
pub const APPEND_EVENTS_MAX: usize = 1000;
/// Longest event type, in bytes.
pub const TYPE_BYTES_MAX: usize = 512;
/// Longest idempotency key, in bytes.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 512;

/// How the idempotency keys of the platform's own appends start (copies,
/// their drop audits, effects, effects' error lines, resumes by a new
/// version, and keys displaced by a caller's event). A caller's key may not
/// start with one, so it can never satisfy a platform append.
pub const PLATFORM_KEY_PREFIXES: &[&str] = &[
    "copy:",
    "copy-drop:",
    "effect:",
    "effect-failed:",
    "auto-resume:",
    "platform:",
];

/// The key a platform append uses when a caller's event already holds its
/// own (appended before callers were refused the platform's prefixes).
pub fn displaced_key(key: &str) -> String {
    format!("platform:{key}")
}

/// Whether the committed event `e`, holding the platform's `key`, was made
/// by a caller: a copy's key held by an event that is no copy, an effect's
/// key held by an event no effect made. (The platform's other lines carry
/// public types, so they cannot be told apart and keep their keys.)
pub fn held_by_a_caller(key: &str, e: &Event) -> bool {
    let source = e.source.as_ref();
    if key.starts_with("copy:") {
        source.is_none_or(|s| s.copied_from.is_empty())
    } else if key.starts_with("effect:") {
        source.is_none_or(|s| s.effect.is_none())
    } else {
        false
    }
}

/// Seconds a caller should wait before retrying an append to a paused stream.
pub const PAUSED_RETRY_AFTER_S: u32 = 5;

/// Who is appending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Authority {
    /// An API caller: may not append platform-authored types or provenance.
    Public,
    /// The host itself (copy delivery, halts, audits).
    Platform,
    /// A processor effect, by its id in the outbox: the public rules on
    /// types, plus `source.effect` and the platform's long idempotency
    /// keys. The round that stores its event settles it (by that id).
    Effect(i64),
}

/// What a request needs from its surroundings.
pub struct AppendContext<'a> {
    /// Keys of the stream's live connections.
    pub connection_keys: &'a [String],
    /// The stream's namespace.
    pub namespace: &'a crate::stream::Namespace,
    /// Its project, if any.
    pub project_id: Option<&'a str>,
    /// Its canonical path.
    pub path: &'a str,
    /// `createdAt` for the events of this request.
    pub now: &'a str,
    /// Makes the `streamId` of a stream this request creates.
    pub new_stream_id: &'a mut dyn FnMut() -> String,
    /// Committed events holding idempotency keys of this request, by key.
    pub committed_by_key: &'a HashMap<String, Event>,
    /// Committed `subscription-configured` events this request may repeat, by
    /// offset (see `lookup_offsets`).
    pub committed_by_offset: &'a HashMap<u64, Event>,
}

/// Offsets of the committed events planning `input` needs, which the actor
/// loads before planning: the configure events that its configure events
/// would repeat (an identical re-configure answers with the existing
/// event), and the events its `event-redacted` events redact.
pub fn lookup_offsets(state: Option<&CoreState>, input: &AppendInput) -> Vec<u64> {
    let Some(state) = state else {
        return Vec::new();
    };
    let configures = input
        .events
        .iter()
        .filter(|e| e.event_type == types::SUBSCRIPTION_CONFIGURED && e.source.is_none())
        .filter_map(|e| e.payload.as_ref()?.get("subscriptionKey")?.as_str())
        .filter_map(|k| state.subscriptions.outbound.by_key.get(k.trim()))
        .map(|s| s.configured_at_offset);
    let redacted = input
        .events
        .iter()
        .filter(|e| e.event_type == types::EVENT_REDACTED && e.source.is_none())
        .filter_map(|e| e.payload.as_ref()?.get("offset")?.as_u64())
        .filter(|o| (1..=state.max_offset).contains(o));
    configures.chain(redacted).collect()
}

/// What an `event-redacted` event's payload says.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RedactedPayload {
    offset: u64,
    #[serde(default)]
    reason: String,
}

/// What a round's earlier requests committed that a later request of the
/// same round must see: the idempotency keys they hold (each by the offset
/// of its event, which stays in its request's plan: see `earlier` of
/// [`plan_append`]) and the offsets they redact.
#[derive(Debug, Default)]
pub struct RoundKeys {
    by_key: HashMap<String, u64>,
    redacting: HashSet<u64>,
}

/// The event at `offset` among `events` (in offset order), if any.
pub fn event_at(events: &[Event], offset: u64) -> Option<&Event> {
    let i = events.binary_search_by_key(&offset, |e| e.offset).ok()?;
    Some(&events[i])
}

/// The committed event at the offset `e` (an `event-redacted` event)
/// names, checked redactable; it as stored from now on.
fn plan_redaction(
    i: usize,
    e: &EventInput,
    current: &CoreState,
    round: &RoundKeys,
    ctx: &AppendContext<'_>,
) -> Result<Event, Error> {
    let payload = e.payload.clone().unwrap_or_default();
    let asked: RedactedPayload = serde_json::from_value(Value::Object(payload))
        .map_err(|err| Error::invalid(format!("events[{i}].payload: {err}")))?;
    let offset = asked.offset;
    if offset == 0 || offset > current.max_offset {
        return Err(Error::not_found(
            "event-not-found",
            format!(
                "no event at offset {offset}: this stream's offsets are 1 to {}",
                current.max_offset
            ),
        ));
    }
    let Some(target) = ctx.committed_by_offset.get(&offset) else {
        return Err(Error::not_found(
            "event-not-found",
            format!(
                "no stored event at offset {offset} (an ephemeral event is never stored, and an \
                 event appended in the same round cannot be redacted with it)"
            ),
        ));
    };
    if target.redacted.is_some() || round.redacting.contains(&offset) {
        return Err(Error::conflict(
            "already-redacted",
            format!("the event at offset {offset} is redacted already"),
        ));
    }
    if is_stream_control_type(&target.event_type)
        && target.event_type != types::ERROR_OCCURRED
        && !target.is_copy()
    {
        return Err(Error::conflict(
            "not-redactable",
            format!(
                "the event at offset {offset} is a platform event ({}): the stream's state is \
                 folded from it, so it cannot be redacted",
                target.event_type
            ),
        ));
    }
    Ok(target.redacted(ctx.now, &asked.reason))
}

/// The stored form of a configuration: effective key trimmed, receiving
/// path canonical.
fn normalized_config(payload: &Map<String, serde_json::Value>) -> Option<SubscriptionConfig> {
    let mut config: SubscriptionConfig = parse_payload("payload", payload).ok()?;
    config.subscription_key = config.subscription_key.map(|k| k.trim().to_string());
    if let Receiver::CopyToStream {
        receiving_stream_path,
        ..
    } = &mut config.receiver
    {
        *receiving_stream_path = super::address::canonicalize_path(receiving_stream_path).ok()?;
    }
    Some(config)
}

/// The outcome of a request that passed every check.
#[derive(Debug, Clone, PartialEq)]
pub struct AppendPlan {
    /// The answer: one event per input event, new or the original of a replay.
    pub events: Vec<Event>,
    /// Events to commit (durable) or buffer (ephemeral), in offset order,
    /// including a `created` event when this request creates the stream.
    pub new_events: Vec<Event>,
    /// Committed events this request redacts (`event-redacted`), as they
    /// are stored from its commit on: payload and metadata erased.
    pub redactions: Vec<Event>,
    /// Retention's removal (`events-removed`): the stored events through
    /// this offset are deleted in the same commit.
    pub removed_through: Option<u64>,
}

/// Plans one request against `state` (`None`: the stream does not exist yet).
///
/// On success `state` holds the state after the request and `round` the
/// keys it used; on error neither changed. `earlier` finds an event the
/// round's earlier requests planned, by its offset (one that `round` names).
pub fn plan_append<'a>(
    state: &mut Option<CoreState>,
    round: &mut RoundKeys,
    earlier: &dyn Fn(u64) -> Option<&'a Event>,
    input: &AppendInput,
    authority: Authority,
    ctx: &mut AppendContext<'_>,
) -> Result<AppendPlan, Error> {
    if input.events.is_empty() {
        return Err(Error::invalid("events is empty: send at least one event"));
    }
    if input.events.len() > APPEND_EVENTS_MAX {
        return Err(Error::too_large(format!(
            "{} events in one append, over the limit of {APPEND_EVENTS_MAX}",
            input.events.len()
        )));
    }
    for (i, e) in input.events.iter().enumerate() {
        validate_input(i, e, authority)?;
    }
    if let Some(expected) = &input.expected_stream_id {
        match state {
            Some(s) if &s.stream_id == expected => {}
            Some(s) => {
                return Err(Error::conflict(
                    "stream-id-changed",
                    format!(
                        "expectedStreamId {expected:?} does not match this stream's streamId {:?}",
                        s.stream_id
                    ),
                ))
            }
            None => {
                return Err(Error::conflict(
                    "stream-id-changed",
                    format!(
                        "expectedStreamId {expected:?} does not match: the stream does not exist"
                    ),
                ))
            }
        }
    }

    let mut next = state.clone();
    // This request's keys, by the offset of the event holding each, and
    // the offsets it redacts.
    let mut new_keys: HashMap<String, u64> = HashMap::new();
    let mut redacting: Vec<u64> = Vec::new();
    let mut plan = AppendPlan {
        events: Vec::with_capacity(input.events.len()),
        new_events: Vec::new(),
        redactions: Vec::new(),
        removed_through: None,
    };
    let mut created = false;
    // Whether this request's first Durable Streams message was checked.
    let mut durable_checked = false;

    for (i, e) in input.events.iter().enumerate() {
        let mut key = e.idempotency_key.clone();
        if let Some(k) = &mut key {
            // (Copied when found: a replay is rare.)
            let find = |k: &str| {
                match (new_keys.get(k), round.by_key.get(k)) {
                    (Some(&o), _) => event_at(&plan.new_events, o),
                    (None, Some(&o)) => earlier(o),
                    (None, None) => ctx.committed_by_key.get(k),
                }
                .cloned()
            };
            let mut original = find(k);
            if authority != Authority::Public
                && original.as_ref().is_some_and(|o| held_by_a_caller(k, o))
            {
                // A caller's event holds the platform's key: the platform
                // appends under its displaced key, never taking the caller's.
                *k = displaced_key(k);
                original = find(k);
            }
            let key = &*k;
            if let Some(original) = original {
                if is_same_event(&original, e) {
                    plan.events.push(original);
                    continue;
                }
                return Err(Error::conflict(
                    "idempotency-conflict",
                    format!(
                        "idempotency key {key:?} is already used by the event at offset {} with a different type, payload, metadata or ephemeral flag",
                        original.offset
                    ),
                ));
            }
        }

        let current = match &mut next {
            Some(s) => s,
            None => {
                let created_event = created_event(ctx);
                next = Some(CoreState::from_created(&created_event));
                plan.new_events.push(created_event);
                created = true;
                next.as_mut().expect("just set")
            }
        };

        let copied = e.source.as_ref().is_some_and(|s| !s.copied_from.is_empty());
        if !copied && is_stream_control_type(&e.event_type) {
            if e.event_type == types::SUBSCRIPTION_CONFIGURED {
                if let Some(original) =
                    identical_configure(current, e, ctx.committed_by_offset, &plan)
                {
                    plan.events.push(original);
                    continue;
                }
            }
            validate_control(
                i,
                e,
                current,
                &ControlContext {
                    namespace: ctx.namespace,
                    path: ctx.path,
                    connection_keys: ctx.connection_keys,
                },
            )?;
        }
        if !copied && e.event_type == types::EVENT_REDACTED {
            let redacted = plan_redaction(i, e, current, round, ctx)?;
            if plan.redactions.iter().any(|r| r.offset == redacted.offset) {
                return Err(Error::conflict(
                    "already-redacted",
                    format!(
                        "the event at offset {} is redacted twice in one request",
                        redacted.offset
                    ),
                ));
            }
            redacting.push(redacted.offset);
            plan.redactions.push(redacted);
        }
        if !copied && e.event_type == types::EVENTS_REMOVED {
            let through = e
                .payload
                .as_ref()
                .and_then(|p| p.get("throughOffset"))
                .and_then(serde_json::Value::as_u64)
                .expect("validated above");
            plan.removed_through = Some(plan.removed_through.unwrap_or(0).max(through));
        }
        if !copied && e.event_type == super::durable::MESSAGE {
            if let Some(d) = &current.durable_stream {
                d.check_commit(i, e, !durable_checked)?;
                durable_checked = true;
            }
        }
        if current.paused && !is_stream_control_type(&e.event_type) {
            return Err(Error::unavailable(
                "stream-paused",
                format!(
                    "stream paused: {}",
                    current.pause_reason.as_deref().unwrap_or("paused")
                ),
                PAUSED_RETRY_AFTER_S,
            ));
        }
        let offset = current.max_offset + 1;
        if let Some(expected) = e.offset {
            if expected != offset {
                return Err(Error::conflict(
                    "offset-conflict",
                    format!("events[{i}]: expected next offset {expected}, found {offset}"),
                ));
            }
        }
        // A copy of a redacted event keeps no content.
        let kept = e.redacted.is_none();
        let event = Event {
            offset,
            event_type: e.event_type.clone(),
            payload: e.payload.clone().filter(|_| kept).unwrap_or_default(),
            metadata: e.metadata.clone().filter(|m| kept && !m.is_empty()),
            idempotency_key: key,
            created_at: ctx.now.to_string(),
            source: e.source.clone().filter(|s| !s.is_empty()),
            trace: e.trace.clone().and_then(crate::trace::Trace::checked),
            ephemeral: e.ephemeral.unwrap_or(false),
            redacted: e.redacted.clone(),
        };
        current.reduce(&event);
        assert_eq!(
            current.max_offset, offset,
            "invariant dense-offsets: the fold of offset {offset} left maxOffset at {}",
            current.max_offset
        );
        if let Some(key) = &event.idempotency_key {
            new_keys.insert(key.clone(), offset);
        }
        plan.events.push(event.clone());
        plan.new_events.push(event);
    }

    if let Some(s) = &next {
        if !plan.new_events.is_empty() {
            let bytes = s.serialized_len();
            if bytes > STATE_BYTES_MAX {
                return Err(Error::too_large(format!(
                    "this append would grow the stream's core state to {bytes} bytes, over the {STATE_BYTES_MAX}-byte limit"
                )));
            }
        }
    }
    assert!(
        !created || plan.new_events.first().map(|e| e.offset) == Some(1),
        "invariant dense-offsets: a new stream's first event is offset 1"
    );
    *state = next;
    round.by_key.extend(new_keys);
    round.redacting.extend(redacting);
    Ok(plan)
}

/// The existing configure event when `e` configures an existing key with an
/// identical configuration.
fn identical_configure(
    state: &CoreState,
    e: &EventInput,
    committed_by_offset: &HashMap<u64, Event>,
    plan: &AppendPlan,
) -> Option<Event> {
    let payload = e.payload.as_ref()?;
    let config = normalized_config(payload)?;
    let key = config.subscription_key.as_ref()?;
    let existing = state.subscriptions.outbound.by_key.get(key)?;
    if existing.configuration != config {
        return None;
    }
    let offset = existing.configured_at_offset;
    committed_by_offset
        .get(&offset)
        .or_else(|| event_at(&plan.new_events, offset))
        .cloned()
}

fn created_event(ctx: &mut AppendContext<'_>) -> Event {
    let stream_id = (ctx.new_stream_id)();
    let payload = json!({
        "projectId": ctx.project_id,
        "path": ctx.path,
        "streamId": stream_id,
    });
    Event {
        offset: 1,
        event_type: types::CREATED.to_string(),
        payload: payload.as_object().cloned().expect("object"),
        metadata: None,
        idempotency_key: None,
        created_at: ctx.now.to_string(),
        source: None,
        trace: None,
        ephemeral: false,
        redacted: None,
    }
}

/// Whether a retried input matches the event that holds its key.
pub fn is_same_event(original: &Event, input: &EventInput) -> bool {
    let empty = Map::new();
    if original.redacted.is_some() || input.redacted.is_some() {
        // Content is gone on one side (the event was redacted since, or a
        // copy is delivered again after its source was): a retry of its key
        // is taken as the same event (it was accepted once; the key still
        // deduplicates).
        return original.event_type == input.event_type
            && original.ephemeral == input.ephemeral.unwrap_or(false);
    }
    original.event_type == input.event_type
        && original.payload == *input.payload.as_ref().unwrap_or(&empty)
        && original.metadata.as_ref().unwrap_or(&empty) == input.metadata.as_ref().unwrap_or(&empty)
        && original.ephemeral == input.ephemeral.unwrap_or(false)
}

/// Checks one input event on its own (no state needed).
pub fn validate_input(i: usize, e: &EventInput, authority: Authority) -> Result<(), Error> {
    let t = &e.event_type;
    if t.trim().is_empty() {
        return Err(Error::invalid(format!("events[{i}].type is empty")));
    }
    if t.len() > TYPE_BYTES_MAX {
        return Err(Error::invalid(format!(
            "events[{i}].type is {} bytes, over the {TYPE_BYTES_MAX}-byte limit",
            t.len()
        )));
    }
    if t.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Error::invalid(format!(
            "events[{i}].type {t:?} contains whitespace or control characters"
        )));
    }
    if let Some(key) = &e.idempotency_key {
        if key.trim().is_empty() {
            return Err(Error::invalid(format!(
                "events[{i}].idempotencyKey is empty"
            )));
        }
        if key.contains('\0') {
            return Err(Error::invalid(format!(
                "events[{i}].idempotencyKey {key:?} contains a NUL byte"
            )));
        }
        if authority == Authority::Public {
            if let Some(prefix) = PLATFORM_KEY_PREFIXES.iter().find(|p| key.starts_with(**p)) {
                return Err(Error::invalid(format!(
                    "events[{i}].idempotencyKey {key:?} starts with {prefix:?}, which the platform reserves for its own appends"
                )));
            }
        }
        if key.len() > IDEMPOTENCY_KEY_BYTES_MAX && authority == Authority::Public {
            return Err(Error::invalid(format!(
                "events[{i}].idempotencyKey is {} bytes, over the {IDEMPOTENCY_KEY_BYTES_MAX}-byte limit",
                key.len()
            )));
        }
    }
    if e.offset == Some(0) {
        return Err(Error::invalid(format!(
            "events[{i}].offset 0 is invalid: offsets start at 1"
        )));
    }
    let ephemeral = e.ephemeral.unwrap_or(false);
    if ephemeral && e.idempotency_key.is_some() {
        return Err(Error::invalid(format!(
            "events[{i}] is ephemeral and may not carry an idempotencyKey"
        )));
    }
    if ephemeral && is_stream_control_type(t) {
        return Err(Error::invalid(format!(
            "events[{i}] of type {t:?} may not be ephemeral: control events are always durable"
        )));
    }
    let copied = e.source.as_ref().is_some_and(|s| !s.copied_from.is_empty());
    let from_effect = e.source.as_ref().is_some_and(|s| s.effect.is_some());
    if authority != Authority::Platform && copied {
        return Err(Error::platform_authored(format!(
            "events[{i}] carries source.copiedFrom, which is platform-authored"
        )));
    }
    if authority != Authority::Platform && e.redacted.is_some() {
        return Err(Error::platform_authored(format!(
            "events[{i}] carries redacted, which is platform-authored (redact a stored event \
             with :redact)"
        )));
    }
    if authority == Authority::Public && from_effect {
        return Err(Error::platform_authored(format!(
            "events[{i}] carries source.effect, which is platform-authored"
        )));
    }
    if authority != Authority::Platform && types::PLATFORM_AUTHORED.contains(&t.as_str()) {
        return Err(Error::platform_authored(format!(
            "events[{i}] of type {t:?} is platform-authored"
        )));
    }
    if is_stream_control_type(t)
        && !copied
        && !types::PUBLIC_CONTROL.contains(&t.as_str())
        && !types::PLATFORM_AUTHORED.contains(&t.as_str())
    {
        return Err(Error::invalid(format!(
            "events[{i}].type {t:?} is not a known events.iterate.com/stream/ type"
        )));
    }
    if t == types::PAUSED && !copied {
        if let Some(reason) = e.payload.as_ref().and_then(|p| p.get("reason")) {
            if !reason.is_string() {
                return Err(Error::invalid(format!(
                    "events[{i}].payload.reason must be a string, got {reason}"
                )));
            }
        }
    }
    if ephemeral && e.source.is_some() {
        return Err(Error::invalid(format!(
            "events[{i}] is ephemeral and may not carry a source"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use serde_json::{json, Value};

    fn input(v: Value) -> AppendInput {
        serde_json::from_value(v).unwrap()
    }

    struct Fixture {
        state: Option<CoreState>,
        round_keys: RoundKeys,
        /// The round's earlier plans.
        round_plans: Vec<AppendPlan>,
        committed: HashMap<String, Event>,
        by_offset: HashMap<u64, Event>,
        ids: u32,
    }

    impl Fixture {
        fn new() -> Self {
            Fixture {
                state: None,
                round_keys: RoundKeys::default(),
                round_plans: Vec::new(),
                committed: HashMap::new(),
                by_offset: HashMap::new(),
                ids: 0,
            }
        }

        fn append(&mut self, v: Value, authority: Authority) -> Result<AppendPlan, Error> {
            let mut ids = self.ids;
            let mut new_id = || {
                ids += 1;
                format!("sid-{ids}")
            };
            let committed = self.committed.clone();
            let by_offset = self.by_offset.clone();
            let namespace = crate::stream::Namespace::Project("acme".into());
            let mut ctx = AppendContext {
                connection_keys: &[],
                namespace: &namespace,
                committed_by_offset: &by_offset,
                project_id: Some("acme"),
                path: "/a",
                now: "2026-11-30T00:00:00.000Z",
                new_stream_id: &mut new_id,
                committed_by_key: &committed,
            };
            let plans = &self.round_plans;
            let earlier = |o: u64| plans.iter().find_map(|p| event_at(&p.new_events, o));
            let r = plan_append(
                &mut self.state,
                &mut self.round_keys,
                &earlier,
                &input(v),
                authority,
                &mut ctx,
            );
            self.ids = ids;
            if let Ok(plan) = &r {
                self.round_plans.push(plan.clone());
            }
            r
        }

        /// A new round.
        fn next_round(&mut self) {
            self.round_keys = RoundKeys::default();
            self.round_plans.clear();
        }
    }

    #[test]
    fn a_redaction_erases_a_committed_events_content_once_and_refuses_what_it_cannot() {
        let mut f = Fixture::new();
        let original = json!({"type": "x.y/a", "payload": {"card": "4111"},
            "metadata": {"ip": "10.0.0.1"}, "idempotencyKey": "k"});
        let plan = f
            .append(json!({"events": [original.clone()]}), Authority::Public)
            .unwrap();
        // Committed: what the actor would look up.
        for e in &plan.new_events {
            f.by_offset.insert(e.offset, e.clone());
        }
        f.committed.insert("k".into(), plan.events[0].clone());
        f.next_round();
        let redact = |offset: u64| {
            json!({"events": [{"type": types::EVENT_REDACTED,
                "payload": {"offset": offset, "reason": "erasure request"}}]})
        };
        let refused = f.append(redact(2), Authority::Public).unwrap_err();
        assert_eq!(refused.code, "platform-authored", "{refused:?}");

        let plan = f.append(redact(2), Authority::Platform).unwrap();
        assert_eq!(plan.new_events.len(), 1, "the audit line");
        assert_eq!(plan.new_events[0].event_type, types::EVENT_REDACTED);
        let [r] = plan.redactions.as_slice() else {
            panic!("{plan:?}")
        };
        assert_eq!((r.offset, r.event_type.as_str()), (2, "x.y/a"));
        assert_eq!(r.idempotency_key.as_deref(), Some("k"));
        assert!(r.payload.is_empty() && r.metadata.is_none());
        let shown = serde_json::to_value(r).unwrap();
        assert_eq!(shown["payload"], Value::Null);
        assert_eq!(shown["metadata"], Value::Null);
        assert_eq!(
            shown["redacted"],
            json!({"at": "2026-11-30T00:00:00.000Z", "reason": "erasure request"})
        );
        assert!(!shown.to_string().contains("4111"));
        // It reads back as it was written.
        let back: Event = serde_json::from_value(shown).unwrap();
        assert_eq!(&back, r);

        // Twice in one round, or once it is stored redacted: refused.
        let again = f.append(redact(2), Authority::Platform).unwrap_err();
        assert_eq!(again.code, "already-redacted", "{again:?}");
        f.next_round();
        f.by_offset.insert(2, r.clone());
        let again = f.append(redact(2), Authority::Platform).unwrap_err();
        assert_eq!(again.code, "already-redacted", "{again:?}");
        // Offsets that hold nothing, and the platform's own events.
        for (offset, code) in [
            (0, "event-not-found"),
            (99, "event-not-found"),
            (1, "not-redactable"),
        ] {
            let e = f.append(redact(offset), Authority::Platform).unwrap_err();
            assert_eq!(e.code, code, "{offset}: {e:?}");
            assert!(e.message.contains(&format!("offset {offset}")), "{e:?}");
        }
        // A retry of the redacted event's key still deduplicates.
        f.committed.insert("k".into(), r.clone());
        let replay = f
            .append(json!({"events": [original]}), Authority::Public)
            .unwrap();
        assert!(replay.new_events.is_empty(), "{replay:?}");
        assert_eq!(replay.events, vec![r.clone()]);
    }

    #[test]
    fn first_append_creates_the_stream_at_offset_one() {
        let mut f = Fixture::new();
        let plan = f
            .append(json!({"events": [{"type": "x.y/a"}]}), Authority::Public)
            .unwrap();
        assert_eq!(plan.new_events.len(), 2);
        assert_eq!(plan.new_events[0].event_type, types::CREATED);
        assert_eq!(plan.new_events[0].payload["streamId"], "sid-1");
        assert_eq!(plan.events[0].offset, 2);
        assert_eq!(f.state.as_ref().unwrap().max_offset, 2);
    }

    #[test]
    fn a_rejected_request_changes_nothing_not_even_creation() {
        let mut f = Fixture::new();
        let err = f
            .append(
                json!({"events": [{"type": "x.y/a"}, {"type": "x.y/b", "offset": 7}]}),
                Authority::Public,
            )
            .unwrap_err();
        assert_eq!(err.code, "offset-conflict");
        assert_eq!(err.message, "events[1]: expected next offset 7, found 3");
        assert!(f.state.is_none());
    }

    #[test]
    fn idempotent_replay_and_conflict() {
        let mut f = Fixture::new();
        let first = f
            .append(
                json!({"events": [{"type": "x.y/a", "idempotencyKey": "k", "payload": {"n": 1}}]}),
                Authority::Public,
            )
            .unwrap();
        let again = f
            .append(
                json!({"events": [{"type": "x.y/a", "idempotencyKey": "k", "payload": {"n": 1}}]}),
                Authority::Public,
            )
            .unwrap();
        assert_eq!(again.events, first.events);
        assert!(again.new_events.is_empty());
        let err = f
            .append(
                json!({"events": [{"type": "x.y/a", "idempotencyKey": "k", "payload": {"n": 2}}]}),
                Authority::Public,
            )
            .unwrap_err();
        assert_eq!(err.code, "idempotency-conflict");
        assert!(err.message.contains("\"k\"") && err.message.contains("offset 2"));
    }

    #[test]
    fn a_key_repeated_within_a_request_or_a_round_answers_its_first_event() {
        let mut f = Fixture::new();
        let keyed = |key: &str, n: u64| json!({"type": "x.y/a", "idempotencyKey": key, "payload": {"n": n}});
        // Within one request: the second use of "a" is the first's event.
        let plan = f
            .append(
                json!({"events": [keyed("a", 1), keyed("b", 1), keyed("a", 1)]}),
                Authority::Public,
            )
            .unwrap();
        let offsets: Vec<u64> = plan.events.iter().map(|e| e.offset).collect();
        assert_eq!(offsets, vec![2, 3, 2]);
        assert_eq!(plan.new_events.len(), 3, "created, a, b");
        let err = f
            .append(
                json!({"events": [keyed("c", 1), keyed("c", 2)]}),
                Authority::Public,
            )
            .unwrap_err();
        assert_eq!(err.code, "idempotency-conflict", "{err:?}");
        // A later request of the same round: found among the earlier
        // request's events, by the offset the round remembers.
        let again = f
            .append(
                json!({"events": [keyed("b", 1), keyed("d", 1)]}),
                Authority::Public,
            )
            .unwrap();
        assert_eq!(again.events[0], plan.events[1]);
        assert_eq!(again.new_events.len(), 1);
        assert_eq!(again.events[1].offset, 4);
        // The refused request left no key behind.
        let c = f
            .append(json!({"events": [keyed("c", 2)]}), Authority::Public)
            .unwrap();
        assert_eq!(c.new_events.len(), 1, "{c:?}");
        // A new round knows only what the log holds.
        f.next_round();
        let fresh = f
            .append(json!({"events": [keyed("b", 1)]}), Authority::Public)
            .unwrap();
        assert_eq!(
            fresh.new_events.len(),
            1,
            "taken as new: the commit checks it"
        );
    }

    #[test]
    fn a_caller_can_never_take_a_platform_key() {
        let mut f = Fixture::new();
        for prefix in PLATFORM_KEY_PREFIXES {
            let key = format!("{prefix}acme:/s:x:1:k:2");
            let err = f
                .append(
                    json!({"events": [{"type": "x.y/a", "idempotencyKey": key}]}),
                    Authority::Public,
                )
                .unwrap_err();
            assert_eq!(err.code, "invalid-request");
            assert!(err.message.contains(&key), "{}", err.message);
        }
        // A caller's event that holds a copy's key from before the prefixes
        // were refused (planted here with the platform's authority).
        let key = "copy:acme:/s:x:1:k:2";
        let planted = f
            .append(
                json!({"events": [{"type": "x.y/a", "idempotencyKey": key, "payload": {"fake": true}}]}),
                Authority::Platform,
            )
            .unwrap();
        let hop = json!({"projectId": "acme", "path": "/s", "streamId": "x", "streamCreatedAt": "t",
            "offset": 2, "type": "x.y/a", "createdAt": "t", "subscriptionKey": "k",
            "cursorChangedAtSourceOffset": 1});
        let copy = json!({"events": [{"type": "x.y/a", "idempotencyKey": key,
            "source": {"copiedFrom": [hop]}}]});
        let landed = f.append(copy.clone(), Authority::Platform).unwrap();
        assert_eq!(landed.new_events.len(), 1, "the copy lands");
        assert!(landed.events[0].is_copy(), "with its provenance");
        assert_eq!(
            landed.events[0].idempotency_key.as_deref(),
            Some(displaced_key(key).as_str())
        );
        assert_ne!(landed.events[0].offset, planted.events[0].offset);
        // Its retry finds it under the displaced key.
        let retried = f.append(copy, Authority::Platform).unwrap();
        assert!(retried.new_events.is_empty());
        assert_eq!(retried.events, landed.events);
    }

    #[test]
    fn platform_authored_rules() {
        let mut f = Fixture::new();
        let err = f
            .append(
                json!({"events": [{"type": types::CREATED}]}),
                Authority::Public,
            )
            .unwrap_err();
        assert_eq!(
            (err.kind, err.code),
            (ErrorKind::Forbidden, "platform-authored")
        );
        let hop = json!({"projectId": "acme", "path": "/s", "streamId": "x", "streamCreatedAt": "t",
            "offset": 2, "type": "x.y/a", "createdAt": "t", "subscriptionKey": "k",
            "cursorChangedAtSourceOffset": 1});
        let copied = json!({"events": [{"type": "x.y/a", "source": {"copiedFrom": [hop]}}]});
        assert_eq!(
            f.append(copied.clone(), Authority::Public)
                .unwrap_err()
                .kind,
            ErrorKind::Forbidden
        );
        let plan = f.append(copied, Authority::Platform).unwrap();
        assert!(plan.events[0].is_copy());
    }

    #[test]
    fn paused_stream_rejects_data_but_accepts_control() {
        let mut f = Fixture::new();
        f.append(
            json!({"events": [{"type": types::PAUSED, "payload": {"reason": "deploy"}}]}),
            Authority::Public,
        )
        .unwrap();
        let err = f
            .append(json!({"events": [{"type": "x.y/a"}]}), Authority::Public)
            .unwrap_err();
        assert_eq!(
            (err.kind, err.code),
            (ErrorKind::Unavailable, "stream-paused")
        );
        assert_eq!(err.message, "stream paused: deploy");
        f.append(
            json!({"events": [{"type": types::RESUMED}]}),
            Authority::Public,
        )
        .unwrap();
        f.append(json!({"events": [{"type": "x.y/a"}]}), Authority::Public)
            .unwrap();
    }

    #[test]
    fn ephemeral_rules() {
        let mut f = Fixture::new();
        let plan = f
            .append(
                json!({"events": [{"type": "x.y/a", "ephemeral": true}]}),
                Authority::Public,
            )
            .unwrap();
        assert!(plan.events[0].ephemeral);
        assert_eq!(f.state.as_ref().unwrap().event_count, 1);
        assert_eq!(f.state.as_ref().unwrap().max_offset, 2);
        for bad in [
            json!({"events": [{"type": "x.y/a", "ephemeral": true, "idempotencyKey": "k"}]}),
            json!({"events": [{"type": types::PAUSED, "ephemeral": true}]}),
        ] {
            assert_eq!(
                f.append(bad, Authority::Public).unwrap_err().kind,
                ErrorKind::Invalid
            );
        }
    }

    #[test]
    fn state_bound_is_enforced_before_commit() {
        let mut f = Fixture::new();
        let reason = "r".repeat(STATE_BYTES_MAX);
        let err = f
            .append(
                json!({"events": [{"type": types::PAUSED, "payload": {"reason": reason}}]}),
                Authority::Public,
            )
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::TooLarge);
        assert!(f.state.is_none());
    }

    #[test]
    fn expected_stream_id() {
        let mut f = Fixture::new();
        let err = f
            .append(
                json!({"events": [{"type": "x.y/a"}], "expectedStreamId": "sid-9"}),
                Authority::Public,
            )
            .unwrap_err();
        assert_eq!(err.code, "stream-id-changed");
        f.append(json!({"events": [{"type": "x.y/a"}]}), Authority::Public)
            .unwrap();
        f.append(
            json!({"events": [{"type": "x.y/a"}], "expectedStreamId": "sid-1"}),
            Authority::Public,
        )
        .unwrap();
    }
}
