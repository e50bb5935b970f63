//! Durable subscriptions: the `subscription-configured` payload union, the
//! reduced outbound and inbound records and stamps (all pure; the control
//! events are validated against a stream's state in `stream/control.rs`).

mod builder;

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use builder::Subscription;

/// Prefix of generated subscription keys (`subscription:<offset>`).
pub const GENERATED_KEY_PREFIX: &str = "subscription:";
/// Longest subscription key, in characters.
pub const KEY_CHARS_MAX: usize = 500;
/// Copy subscriptions from one source to one receiving stream.
pub const COPY_SUBSCRIPTIONS_PER_RECEIVER_MAX: usize = 64;
/// Inbound fence records kept by a receiving stream.
pub const INBOUND_RECORDS_MAX: usize = 1000;
/// Hops a copied event may carry before it is dropped.
pub const COPY_HOPS_MAX: usize = 32;

/// The payload of `subscription-configured` (and, with the effective key
/// filled in, the stored configuration).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubscriptionConfig {
    /// The key (generated as `subscription:<offset>` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription_key: Option<String>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Which events it selects (`None`: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Filter>,
    /// Where they go.
    pub receiver: Receiver,
}

/// Which events a subscription selects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Filter {
    /// Only events of these types.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
    /// Only events for which this JSONata expression is truthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jsonata_condition: Option<String>,
}

/// Where reading begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Start {
    /// From the source's first event.
    Beginning,
    /// From the events after the configuration.
    Now,
}

/// What happens when one event keeps failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFailingEvent {
    /// Stop, durably, until resumed.
    Halt,
    /// Record it and go on with the next.
    Skip,
}

/// Delivery settings of push receivers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Delivery {
    /// Where reading begins.
    pub start: Start,
    /// What an event that keeps failing does.
    pub on_failing_event: OnFailingEvent,
}

/// The receiver union, tagged by `action`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "action",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase",
    deny_unknown_fields
)]
pub enum Receiver {
    /// Wakes a processor over the source's events.
    ProcessorWake {
        /// The ITX expression naming the component
        /// (`["components", ["get", "counter"], "wake"]`).
        expression: Value,
    },
    /// Copies each event to a stream of the same project.
    CopyToStream {
        /// The receiving stream.
        receiving_stream_path: String,
        /// Each copy is this JSONata expression applied to the event.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        jsonata_transform: Option<String>,
        /// Start and failure policy.
        delivery: Delivery,
    },
    /// Calls a function of a deployed component with each event.
    ItxCall {
        /// The ITX expression naming the function.
        expression: Value,
        /// The argument is this JSONata expression applied to the event.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        jsonata_transform: Option<String>,
        /// Start and failure policy.
        delivery: Delivery,
    },
    /// Runs a reactor (a component's `react`) for each event appended
    /// after it, inside the append's transaction: no cursor, no delivery.
    Reactor {
        /// The ITX expression naming the component
        /// (`["components", ["get", "welcome"], "react"]`).
        expression: Value,
    },
    /// POSTs each event to a URL.
    WebhookPost {
        /// Where.
        url: String,
        /// The body is this JSONata expression applied to the event.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        jsonata_transform: Option<String>,
        /// Start and failure policy.
        delivery: Delivery,
    },
}

impl Receiver {
    /// The component a `processor-wake` or `itx-call` receiver calls.
    pub fn component(&self) -> Option<String> {
        match self {
            Receiver::ProcessorWake { expression } => crate::itx::wake_component(expression).ok(),
            Receiver::Reactor { expression } => crate::itx::reactor_component(expression).ok(),
            Receiver::ItxCall { expression, .. } => match crate::itx::resolve(expression) {
                Ok(crate::itx::Target::ComponentFunction { component, .. }) => Some(component),
                Err(_) => None,
            },
            Receiver::CopyToStream { .. } | Receiver::WebhookPost { .. } => None,
        }
    }

    /// The component a `processor-wake` or `reactor` receiver runs and
    /// the export it needs of it: `fold` for a wake, `react` for a
    /// reactor.
    pub fn needed_export(&self) -> Option<(String, &'static str)> {
        match self {
            Receiver::ProcessorWake { expression } => crate::itx::wake_component(expression)
                .ok()
                .map(|c| (c, "fold")),
            Receiver::Reactor { expression } => crate::itx::reactor_component(expression)
                .ok()
                .map(|c| (c, "react")),
            _ => None,
        }
    }

    /// The action name as on the wire.
    pub fn action(&self) -> &'static str {
        match self {
            Receiver::ProcessorWake { .. } => "processor-wake",
            Receiver::Reactor { .. } => "reactor",
            Receiver::CopyToStream { .. } => "copy-to-stream",
            Receiver::ItxCall { .. } => "itx-call",
            Receiver::WebhookPost { .. } => "webhook-post",
        }
    }

    /// Delivery settings; `None` for processor-wake (its cursor is the
    /// processor's checkpoint) and reactors (they run inside appends).
    pub fn delivery(&self) -> Option<&Delivery> {
        match self {
            Receiver::ProcessorWake { .. } | Receiver::Reactor { .. } => None,
            Receiver::CopyToStream { delivery, .. }
            | Receiver::ItxCall { delivery, .. }
            | Receiver::WebhookPost { delivery, .. } => Some(delivery),
        }
    }

    /// The receiver's JSONata transform, if it has one.
    pub fn jsonata_transform(&self) -> Option<&str> {
        match self {
            Receiver::ProcessorWake { .. } | Receiver::Reactor { .. } => None,
            Receiver::CopyToStream {
                jsonata_transform, ..
            }
            | Receiver::ItxCall {
                jsonata_transform, ..
            }
            | Receiver::WebhookPost {
                jsonata_transform, ..
            } => jsonata_transform.as_deref(),
        }
    }
}

/// `subscriptions.outbound.byKey[key]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutboundSubscription {
    /// The configuration, with its effective key.
    pub configuration: SubscriptionConfig,
    /// The offset of its `subscription-configured` event.
    pub configured_at_offset: u64,
    /// When it was configured.
    pub configured_at: String,
    /// Whether its key was generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription_key_was_generated: Option<bool>,
    /// The latest explicit cursor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor_set: Option<CursorSet>,
    /// Set while it is halted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_halted: Option<DeliveryHalted>,
}

impl OutboundSubscription {
    /// The config generation: the offset of the configure or cursor-set event
    /// that started the current delivery run.
    pub fn generation(&self) -> u64 {
        match &self.cursor_set {
            Some(c) if c.set_at_source_offset > self.configured_at_offset => c.set_at_source_offset,
            _ => self.configured_at_offset,
        }
    }

    /// The exclusive offset the current run starts after.
    pub fn start_cursor(&self) -> u64 {
        match &self.cursor_set {
            Some(c) if c.set_at_source_offset > self.configured_at_offset => c.after_offset,
            _ => match self.configuration.receiver.delivery().map(|d| d.start) {
                Some(Start::Beginning) => 0,
                _ => self.configured_at_offset,
            },
        }
    }
}

/// The subscriptions a new version of `component` resumes: those halted
/// whose receiver calls it (a processor wake or an ITX call), each with the
/// idempotency key of its resume, so each halt resumes once per version.
pub fn resumed_by_new_version<'a>(
    by_key: impl IntoIterator<Item = (&'a String, &'a OutboundSubscription)>,
    component: &str,
    digest: &str,
) -> Vec<(String, String)> {
    by_key
        .into_iter()
        .filter_map(|(key, sub)| {
            let halted = sub.delivery_halted.as_ref()?;
            (sub.configuration.receiver.component().as_deref() == Some(component)).then(|| {
                (
                    key.clone(),
                    format!("auto-resume:{key}:{digest}:{}", halted.after_offset),
                )
            })
        })
        .collect()
}

/// An explicit cursor position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CursorSet {
    /// Delivery resumes after this offset.
    pub after_offset: u64,
    /// The offset of the `cursor-set` event.
    pub set_at_source_offset: u64,
}

/// The durable halt fact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryHalted {
    /// Why (`delivery-failed`).
    pub reason: String,
    /// Delivered through this offset; the next event failed.
    pub after_offset: u64,
    /// Attempts made.
    pub attempts: u64,
    /// The last attempt's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Payload of `subscription-removed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubscriptionRemoved {
    /// The subscription.
    pub subscription_key: String,
    /// Why.
    pub reason: RemovedReason,
}

/// Why a subscription was removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RemovedReason {
    /// Its owner asked.
    Requested,
}

/// Payload of `subscription-cursor-set`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubscriptionCursorSet {
    /// The subscription.
    pub subscription_key: String,
    /// Delivery resumes after this offset.
    pub after_offset: u64,
}

/// Payload of `subscription-delivery-halted`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubscriptionDeliveryHalted {
    /// The subscription.
    pub subscription_key: String,
    /// Why.
    pub reason: HaltReason,
    /// Delivered through this offset; the next event failed.
    pub after_offset: u64,
    /// Attempts made.
    pub attempts: u64,
    /// The last attempt's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Why a subscription halted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HaltReason {
    /// An event failed every attempt.
    DeliveryFailed,
}

/// Payload of `subscription-delivery-resumed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubscriptionDeliveryResumed {
    /// The subscription.
    pub subscription_key: String,
}

/// `subscriptions.inbound.bySourcePath[path][key]`: the passive fence record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboundRecord {
    /// The source's stream id (its lifetime).
    pub stream_id: String,
    /// When the source's lifetime began.
    pub stream_created_at: String,
    /// The configuration generation copies must carry.
    pub cursor_changed_at_source_offset: u64,
    /// Copies received.
    pub num_events_received: u64,
    /// When the latest copy arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_event_received_at: Option<String>,
}

/// The stamp of a delivery run: source lifetime and config generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// When the source's lifetime began.
    pub stream_created_at: String,
    /// The source's stream id.
    pub stream_id: String,
    /// The configuration generation.
    pub cursor_changed_at_source_offset: u64,
}

impl Stamp {
    /// Orders stamps by `streamCreatedAt`, then `streamId`, then
    /// `cursorChangedAtSourceOffset`.
    pub fn compare(&self, other: &Stamp) -> Ordering {
        self.stream_created_at
            .cmp(&other.stream_created_at)
            .then_with(|| self.stream_id.cmp(&other.stream_id))
            .then_with(|| {
                self.cursor_changed_at_source_offset
                    .cmp(&other.cursor_changed_at_source_offset)
            })
    }
}

impl InboundRecord {
    /// The stamp copies must carry to pass this fence.
    pub fn stamp(&self) -> Stamp {
        Stamp {
            stream_created_at: self.stream_created_at.clone(),
            stream_id: self.stream_id.clone(),
            cursor_changed_at_source_offset: self.cursor_changed_at_source_offset,
        }
    }
}

/// Parses a payload with errors that name the field path (`at` prefixes it).
pub fn parse_payload<T: serde::de::DeserializeOwned>(
    at: &str,
    payload: &serde_json::Map<String, Value>,
) -> Result<T, String> {
    let value = Value::Object(payload.clone());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let prefix = if path == "." {
            at.to_string()
        } else {
            format!("{at}.{path}")
        };
        // A missing field is named with its own path, not its parent's.
        let inner = e.inner().to_string();
        match inner
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
        {
            Some(field) => format!("{prefix}.{field} is missing"),
            None => format!("{prefix}: {inner}"),
        }
    })
}

/// Whether a deployed `component` exporting `exports` can run as a
/// receiver that needs `needed` ([`Receiver::needed_export`]); an error
/// naming what it exports and what to use instead otherwise.
pub fn check_exports(component: &str, needed: &str, exports: &[String]) -> Result<(), String> {
    if exports.iter().any(|e| e == needed) {
        return Ok(());
    }
    let exported = if exports.is_empty() {
        "nothing".to_string()
    } else {
        exports.join(", ")
    };
    Err(if needed == "fold" {
        format!(
            "component {component:?} is not a processor: it exports {exported} and a wake needs \
             fold (a processor built with the guest SDK's processor! macro); call its functions \
             with an itx-call receiver"
        )
    } else {
        format!(
            "component {component:?} is not a reactor: it exports {exported} and a reactor needs \
             {needed} (built with the guest SDK's reactor! macro)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_receiver_needs_its_export_and_a_refusal_names_what_the_component_has() {
        let wake = Subscription::wake("w", "kinds").to_event();
        let config: SubscriptionConfig =
            serde_json::from_value(Value::Object(wake.payload.unwrap())).unwrap();
        let (component, needed) = config.receiver.needed_export().unwrap();
        assert_eq!((component.as_str(), needed), ("kinds", "fold"));
        let exports = vec!["add".to_string(), "echo".to_string()];
        let refused = check_exports("kinds", needed, &exports).unwrap_err();
        assert!(
            refused.contains("is not a processor: it exports add, echo"),
            "{refused}"
        );
        assert!(check_exports("kinds", "react", &[])
            .unwrap_err()
            .contains("exports nothing"));
        assert!(check_exports("counter", "fold", &["fold".to_string()]).is_ok());
    }

    fn stamp(created: &str, id: &str, generation: u64) -> Stamp {
        Stamp {
            stream_created_at: created.into(),
            stream_id: id.into(),
            cursor_changed_at_source_offset: generation,
        }
    }

    fn sub(receiver: serde_json::Value, halted: bool) -> OutboundSubscription {
        let mut v = json!({"configuration": {"receiver": receiver},
            "configuredAt": "t", "configuredAtOffset": 2});
        if halted {
            v["deliveryHalted"] =
                json!({"reason": "attempts-exhausted", "afterOffset": 7, "attempts": 3});
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_new_version_resumes_the_halted_wakes_and_itx_calls_of_its_component_only() {
        let delivery = json!({"start": "now", "onFailingEvent": "halt"});
        let by_key: std::collections::BTreeMap<String, OutboundSubscription> = [
            (
                "wake",
                sub(
                    json!({"action": "processor-wake",
                "expression": ["components", ["get", "billing"], "wake"]}),
                    true,
                ),
            ),
            (
                "call",
                sub(
                    json!({"action": "itx-call", "delivery": delivery,
                "expression": ["components", ["get", "billing"], "process-event-batch"]}),
                    true,
                ),
            ),
            (
                "running",
                sub(
                    json!({"action": "processor-wake",
                "expression": ["components", ["get", "billing"], "wake"]}),
                    false,
                ),
            ),
            (
                "other",
                sub(
                    json!({"action": "processor-wake",
                "expression": ["components", ["get", "totals"], "wake"]}),
                    true,
                ),
            ),
            (
                "hook",
                sub(
                    json!({"action": "webhook-post", "url": "http://x/billing",
                "delivery": delivery}),
                    true,
                ),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let resumed = resumed_by_new_version(&by_key, "billing", "sha256:ab");
        assert_eq!(
            resumed,
            vec![
                (
                    "call".to_string(),
                    "auto-resume:call:sha256:ab:7".to_string()
                ),
                (
                    "wake".to_string(),
                    "auto-resume:wake:sha256:ab:7".to_string()
                ),
            ]
        );
    }

    #[test]
    fn stamps_order_by_lifetime_then_generation() {
        let a = stamp("2026-11-30T00:00:00.000Z", "b", 5);
        assert_eq!(
            a.compare(&stamp("2026-11-30T00:00:00.000Z", "b", 5)),
            Ordering::Equal
        );
        assert_eq!(
            a.compare(&stamp("2026-11-30T00:00:00.000Z", "b", 9)),
            Ordering::Less
        );
        assert_eq!(
            a.compare(&stamp("2026-11-30T00:00:00.000Z", "a", 9)),
            Ordering::Greater
        );
        assert_eq!(
            a.compare(&stamp("2026-11-30T00:00:01.000Z", "a", 1)),
            Ordering::Less
        );
    }

    #[test]
    fn the_seed_union_parses_and_rejects_unknown_fields() {
        let ok: SubscriptionConfig = serde_json::from_value(json!({
            "subscriptionKey": "k",
            "filter": {"eventTypes": ["a"], "jsonataCondition": "true"},
            "receiver": {"action": "copy-to-stream", "receivingStreamPath": "/r",
                         "delivery": {"start": "now", "onFailingEvent": "halt"}}
        }))
        .unwrap();
        assert_eq!(ok.receiver.action(), "copy-to-stream");
        assert_eq!(
            serde_json::to_value(&ok.receiver).unwrap()["receivingStreamPath"],
            "/r"
        );
        for bad in [
            json!({"receiver": {"action": "copy-to-stream", "receivingStreamPath": "/r", "extra": 1,
                                "delivery": {"start": "now", "onFailingEvent": "halt"}}}),
            json!({"receiver": {"action": "teleport"}}),
            json!({"receiver": {"action": "processor-wake", "expression": ["a"], "jsonataTransform": "x"}}),
            json!({"receiver": {"action": "processor-wake", "expression": ["a"]}, "colour": 1}),
        ] {
            assert!(
                serde_json::from_value::<SubscriptionConfig>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn generation_and_start_cursor() {
        let mut s: OutboundSubscription = serde_json::from_value(json!({
            "configuration": {"receiver": {"action": "copy-to-stream", "receivingStreamPath": "/r",
                              "delivery": {"start": "now", "onFailingEvent": "halt"}}},
            "configuredAtOffset": 7, "configuredAt": "t"
        }))
        .unwrap();
        assert_eq!((s.generation(), s.start_cursor()), (7, 7));
        s.cursor_set = Some(CursorSet {
            after_offset: 2,
            set_at_source_offset: 9,
        });
        assert_eq!((s.generation(), s.start_cursor()), (9, 2));
    }
}
