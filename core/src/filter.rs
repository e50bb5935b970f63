//! Compiled event filters: event types, a JSONata condition, and whether
//! drop audit lines are passed over. Subscriptions, live connections,
//! `waitForEvent` and processor wakes all select events with one.

use crate::jsonata::{Expression, Input, Limits};
use crate::subscription::{Filter, OutboundSubscription};

/// `payload.reason` of the drop audit; such events are never copied onward.
pub const DROP_AUDIT_REASON: &str = "copy-dropped";

/// Whether a stored event is a drop audit line (never copied onward).
pub fn is_drop_audit(
    event_type: &str,
    payload: &serde_json::Map<String, serde_json::Value>,
) -> bool {
    event_type == crate::stream::types::ERROR_OCCURRED
        && payload.get("reason").and_then(serde_json::Value::as_str) == Some(DROP_AUDIT_REASON)
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
    /// Compiles `filter`, its condition to evaluate under `limits`.
    pub fn new(
        filter: Option<&Filter>,
        skip_drop_audits: bool,
        limits: Limits,
    ) -> Result<Self, String> {
        Ok(CompiledFilter {
            event_types: filter.and_then(|f| f.event_types.clone()),
            condition: match filter.and_then(|f| f.jsonata_condition.as_deref()) {
                Some(c) => Some(crate::jsonata::compile(c, limits)?),
                None => None,
            },
            skip_drop_audits,
        })
    }

    pub fn for_subscription(sub: &OutboundSubscription, limits: Limits) -> Result<Self, String> {
        let copy = sub.configuration.receiver.action() == "copy-to-stream";
        Self::new(sub.configuration.filter.as_ref(), copy, limits)
    }
}

impl CompiledFilter {
    /// Whether `event` (its type, payload, and the JSON value the condition
    /// sees) is selected. A condition that throws is an error naming the
    /// expression and, when known, where in it.
    pub fn matches(
        &self,
        event_type: &str,
        payload: &serde_json::Map<String, serde_json::Value>,
        value: &serde_json::Value,
    ) -> Result<bool, String> {
        if !self
            .event_types
            .as_ref()
            .is_none_or(|ts| ts.iter().any(|t| t == event_type))
        {
            return Ok(false);
        }
        if self.skip_drop_audits && is_drop_audit(event_type, payload) {
            return Ok(false);
        }
        match &self.condition {
            Some(c) => c
                .matches(&Input::new(value))
                .map_err(|e| crate::jsonata::describe_error(c.source(), &e)),
            None => Ok(true),
        }
    }
}
