//! Validation of subscription control events against the source's state.
//! Everything here runs before the event commits; a rejection commits nothing.

use serde_json::Value;

use crate::error::Error;
use crate::event::{types, EventInput};
use crate::stream::{canonicalize_path, CoreState, Namespace};
use crate::subscription::*;

/// The stream a control event is appended to.
pub struct ControlContext<'a> {
    /// The stream's project (or the global namespace).
    pub namespace: &'a Namespace,
    /// The stream's path.
    pub path: &'a str,
    /// Keys of the stream's live connections.
    pub connection_keys: &'a [String],
}

fn invalid(message: String) -> Error {
    Error::invalid(message)
}

fn missing_key(key: &str) -> Error {
    Error::not_found(
        "subscription-not-found",
        format!("subscription {key:?} does not exist"),
    )
}

/// Checks one control event (`events[i]`) against the tentative `state`.
pub fn validate_control(
    i: usize,
    input: &EventInput,
    state: &CoreState,
    ctx: &ControlContext<'_>,
) -> Result<(), Error> {
    let at = format!("events[{i}].payload");
    let empty = serde_json::Map::new();
    let payload = input.payload.as_ref().unwrap_or(&empty);
    let by_key = &state.subscriptions.outbound.by_key;
    match input.event_type.as_str() {
        types::SUBSCRIPTION_CONFIGURED => validate_configured(&at, payload, state, ctx),
        types::SUBSCRIPTION_REMOVED => {
            let p: SubscriptionRemoved = parse_payload(&at, payload).map_err(invalid)?;
            by_key
                .get(&p.subscription_key)
                .ok_or_else(|| missing_key(&p.subscription_key))?;
            Ok(())
        }
        types::SUBSCRIPTION_CURSOR_SET => {
            let p: SubscriptionCursorSet = parse_payload(&at, payload).map_err(invalid)?;
            let sub = by_key
                .get(&p.subscription_key)
                .ok_or_else(|| missing_key(&p.subscription_key))?;
            if matches!(sub.configuration.receiver, Receiver::Reactor { .. }) {
                return Err(invalid(format!(
                    "subscription {:?} is a reactor: it runs inside appends and has no cursor",
                    p.subscription_key
                )));
            }
            if sub.configuration.receiver.delivery().is_none() {
                return Err(invalid(format!(
                    "subscription {:?} is a processor-wake subscription: its cursor is the processor's checkpoint, not set on the source",
                    p.subscription_key
                )));
            }
            if p.after_offset > state.max_offset {
                return Err(invalid(format!(
                    "afterOffset {} is beyond this stream's current maximum offset {}",
                    p.after_offset, state.max_offset
                )));
            }
            Ok(())
        }
        types::SUBSCRIPTION_DELIVERY_RESUMED => {
            let p: SubscriptionDeliveryResumed = parse_payload(&at, payload).map_err(invalid)?;
            by_key
                .get(&p.subscription_key)
                .ok_or_else(|| missing_key(&p.subscription_key))?;
            Ok(())
        }
        types::SUBSCRIPTION_DELIVERY_HALTED => {
            let p: SubscriptionDeliveryHalted = parse_payload(&at, payload).map_err(invalid)?;
            by_key
                .get(&p.subscription_key)
                .ok_or_else(|| missing_key(&p.subscription_key))?;
            Ok(())
        }
        types::RETENTION_CONFIGURED => {
            super::retention::Retention::from_payload(&at, payload)?;
            Ok(())
        }
        types::EVENTS_REMOVED => {
            let p = super::retention::EventsRemoved::from_payload(&at, payload)?;
            if p.from_offset != state.first_offset
                || p.through_offset < state.first_offset
                || p.through_offset > state.max_offset
            {
                return Err(Error::conflict(
                    "retention-moved",
                    format!(
                        "{at}: a removal of offsets {} to {} does not fit this stream's offsets \
                         {} to {}: the log's front moved since it was planned",
                        p.from_offset, p.through_offset, state.first_offset, state.max_offset
                    ),
                ));
            }
            if p.count == 0 {
                return Err(invalid(format!(
                    "{at}.count is 0: a removal removes an event"
                )));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn validate_configured(
    at: &str,
    payload: &serde_json::Map<String, Value>,
    state: &CoreState,
    ctx: &ControlContext<'_>,
) -> Result<(), Error> {
    // Clear words for the combinations the union forbids.
    if let Some(receiver) = payload.get("receiver").and_then(Value::as_object) {
        let action = receiver.get("action").and_then(Value::as_str).unwrap_or("");
        if action == "processor-wake" && receiver.contains_key("jsonataTransform") {
            return Err(invalid(format!(
                "{at}.receiver: processor-wake never accepts a jsonataTransform: a processor's state must equal the fold of its stream's committed events"
            )));
        }
        let on_failing = receiver
            .get("delivery")
            .and_then(|d| d.get("onFailingEvent"))
            .and_then(Value::as_str);
        if action == "copy-to-stream" && on_failing == Some("skip") {
            return Err(invalid(format!(
                "{at}.receiver.delivery.onFailingEvent: copy-to-stream cannot skip a failing event (only \"halt\"): a copy may not leave a hole in the receiving stream"
            )));
        }
    }
    let config: SubscriptionConfig = parse_payload(at, payload).map_err(|m| {
        // Inside the receiver union serde loses the path: find it per action.
        let nested = payload
            .get("receiver")
            .and_then(|r| receiver_error(&format!("{at}.receiver"), r));
        invalid(nested.unwrap_or(m))
    })?;
    let by_key = &state.subscriptions.outbound.by_key;
    if let Some(raw) = &config.subscription_key {
        let key = raw.as_str();
        let chars = key.chars().count();
        if chars == 0 || chars > KEY_CHARS_MAX {
            return Err(invalid(format!(
                "{at}.subscriptionKey {raw:?} must be 1 to {KEY_CHARS_MAX} characters"
            )));
        }
        // A subscription's (or reactor's) name is taken as written: one
        // with whitespace around it is refused, not trimmed into another.
        if key.trim() != key {
            return Err(invalid(format!(
                "{at}.subscriptionKey {raw:?} has leading or trailing whitespace: a name is taken as written, never trimmed"
            )));
        }
        if key.contains('\0') {
            return Err(invalid(format!(
                "{at}.subscriptionKey {raw:?} contains a NUL byte"
            )));
        }
        if key.starts_with(GENERATED_KEY_PREFIX) && !by_key.contains_key(key) {
            return Err(invalid(format!(
                "{at}.subscriptionKey {key:?} uses the reserved {GENERATED_KEY_PREFIX:?} prefix and names no existing subscription"
            )));
        }
    }
    let key = effective_key(&config)
        .unwrap_or_else(|| format!("{GENERATED_KEY_PREFIX}{}", state.max_offset + 1));
    if ctx.connection_keys.contains(&key) {
        return Err(invalid(format!(
            "subscription key {key:?} is already used by a live session connection"
        )));
    }
    // A reactor's name is its effects' identity: it is never reconfigured
    // in place (a new version takes a new name, the old one is removed).
    if let Some(existing) = by_key.get(&key) {
        let reactor = |r: &Receiver| matches!(r, Receiver::Reactor { .. });
        if reactor(&config.receiver) || reactor(&existing.configuration.receiver) {
            return Err(Error::conflict(
                "reactor-name-taken",
                format!(
                    "subscription key {key:?} is taken by a {} subscription: remove it first (subscription-removed), or configure the reactor under a new name such as \"{key}.v2\"",
                    existing.configuration.receiver.action()
                ),
            ));
        }
    }
    if let Some(filter) = &config.filter {
        if let Some(types) = &filter.event_types {
            if let Some(t) = types.iter().find(|t| t.trim().is_empty()) {
                return Err(invalid(format!(
                    "{at}.filter.eventTypes holds an empty type {t:?}"
                )));
            }
        }
        if let Some(c) = &filter.jsonata_condition {
            // Compiled to check it (its bounds apply where it runs).
            crate::jsonata::compile(c, Default::default()).map_err(|e| {
                Error::invalid_with(
                    "invalid-jsonata",
                    format!("{at}.filter.jsonataCondition: {e}"),
                )
            })?;
        }
    }
    if let Some(t) = config.receiver.jsonata_transform() {
        crate::jsonata::compile(t, Default::default()).map_err(|e| {
            Error::invalid_with(
                "invalid-jsonata",
                format!("{at}.receiver.jsonataTransform: {e}"),
            )
        })?;
    }
    match &config.receiver {
        Receiver::CopyToStream {
            receiving_stream_path,
            ..
        } => {
            let target = canonicalize_path(receiving_stream_path).map_err(|e| {
                invalid(format!("{at}.receiver.receivingStreamPath: {}", e.message))
            })?;
            if target == ctx.path {
                return Err(invalid(format!(
                    "a stream cannot receive events from itself: receivingStreamPath {receiving_stream_path:?} is {:?}",
                    ctx.path
                )));
            }
            let effective = effective_key(&config);
            let same_receiver = by_key
                .iter()
                .filter(|(k, s)| {
                    Some(k.as_str()) != effective.as_deref()
                        && matches!(&s.configuration.receiver,
                            Receiver::CopyToStream { receiving_stream_path, .. }
                                if canonicalize_path(receiving_stream_path).ok().as_deref() == Some(target.as_str()))
                })
                .count();
            if same_receiver >= COPY_SUBSCRIPTIONS_PER_RECEIVER_MAX {
                return Err(invalid(format!(
                    "a source may configure at most {COPY_SUBSCRIPTIONS_PER_RECEIVER_MAX} subscriptions for one receiving stream ({target:?})"
                )));
            }
        }
        Receiver::ItxCall { expression, .. } => {
            crate::itx::validate_expression(&format!("{at}.receiver.expression"), expression)
                .map_err(|m| Error::invalid_with("invalid-expression", m))?;
            crate::itx::resolve(expression).map_err(|m| {
                Error::invalid_with("invalid-expression", format!("{at}.receiver.{m}"))
            })?;
            if matches!(ctx.namespace, Namespace::Global) {
                return Err(invalid(
                    "itx-call subscriptions require a project stream (components belong to projects)".into(),
                ));
            }
        }
        Receiver::ProcessorWake { expression } => component_receiver(
            at,
            ctx,
            expression,
            "processor-wake",
            crate::itx::wake_component,
        )?,
        Receiver::Reactor { expression } => component_receiver(
            at,
            ctx,
            expression,
            "reactor",
            crate::itx::reactor_component,
        )?,
        Receiver::WebhookPost { url, .. } => {
            if matches!(ctx.namespace, Namespace::Global) {
                return Err(invalid(
                    "webhook subscriptions require a project stream, not a global one".into(),
                ));
            }
            let parsed = url::Url::parse(url).map_err(|e| {
                invalid(format!("{at}.receiver.url {url:?} is not a valid URL: {e}"))
            })?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                return Err(invalid(format!(
                    "{at}.receiver.url {url:?} must be an http or https URL with a host"
                )));
            }
        }
    }
    Ok(())
}

/// A receiver that names a component of the project by an ITX expression
/// of one shape (`["components", ["get", NAME], METHOD]`).
fn component_receiver(
    at: &str,
    ctx: &ControlContext<'_>,
    expression: &Value,
    action: &str,
    component: fn(&Value) -> Result<String, String>,
) -> Result<(), Error> {
    crate::itx::validate_expression(&format!("{at}.receiver.expression"), expression)
        .map_err(|m| Error::invalid_with("invalid-expression", m))?;
    component(expression).map_err(|m| {
        Error::invalid_with(
            "invalid-expression",
            format!("{at}.receiver.expression: {m}"),
        )
    })?;
    if matches!(ctx.namespace, Namespace::Global) {
        return Err(invalid(format!(
            "{action} subscriptions require a project stream (components belong to projects)"
        )));
    }
    Ok(())
}

/// The explicit key of a configuration, trimmed (`None` when keyless).
/// The error in a receiver object with its full field path
/// (`payload.receiver.delivery.start: missing field`), checked against the
/// fields of its `action`; `None` when the action is unknown or it parses.
fn receiver_error(at: &str, receiver: &Value) -> Option<String> {
    use crate::subscription::Delivery;
    use serde::Deserialize;
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[allow(dead_code)]
    struct Wake {
        action: String,
        expression: Value,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[allow(dead_code)]
    struct Copy {
        action: String,
        receiving_stream_path: String,
        jsonata_transform: Option<String>,
        delivery: Delivery,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[allow(dead_code)]
    struct Itx {
        action: String,
        expression: Value,
        jsonata_transform: Option<String>,
        delivery: Delivery,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[allow(dead_code)]
    struct Webhook {
        action: String,
        url: String,
        jsonata_transform: Option<String>,
        delivery: Delivery,
    }
    fn check<T: serde::de::DeserializeOwned>(at: &str, v: &Value) -> Option<String> {
        let object = v.as_object()?;
        crate::subscription::parse_payload::<T>(at, object).err()
    }
    match receiver.get("action").and_then(Value::as_str)? {
        "processor-wake" | "reactor" => check::<Wake>(at, receiver),
        "copy-to-stream" => check::<Copy>(at, receiver),
        "itx-call" => check::<Itx>(at, receiver),
        "webhook-post" => check::<Webhook>(at, receiver),
        _ => None,
    }
}

pub fn effective_key(config: &SubscriptionConfig) -> Option<String> {
    config
        .subscription_key
        .as_ref()
        .map(|k| k.trim().to_string())
}
