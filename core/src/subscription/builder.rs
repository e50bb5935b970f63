//! Building a subscription's `subscription-configured` event in code (the
//! embedding API and the CLI): a receiver, then a filter, a transform and
//! where delivery starts. The event's payload is the typed configuration
//! ([`SubscriptionConfig`]) the server reads back, written by serde.

use serde_json::{json, Value};

use super::{
    Delivery, Filter, OnFailingEvent, Receiver, RemovedReason, Start, SubscriptionConfig,
    SubscriptionRemoved,
};
use crate::event::{types, EventInput};

/// A subscription to configure on its source stream.
///
/// ```
/// use streamhost_core::subscription::Subscription;
///
/// let s = Subscription::copy_to("big-orders", "/orders/big")
///     .event_types(["events.example/order-created"])
///     .condition("payload.total > 100")
///     .from_beginning();
/// let event = s.to_event();
/// assert_eq!(event.payload.unwrap()["receiver"]["receivingStreamPath"], "/orders/big");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Subscription {
    config: SubscriptionConfig,
    /// A transform asked of a receiver that takes none (a wake, a
    /// reactor): sent as asked, for the server to refuse by name.
    stray_transform: Option<String>,
}

/// Where a push receiver starts and what a failing event does, by default.
fn delivered() -> Delivery {
    Delivery {
        start: Start::Now,
        on_failing_event: OnFailingEvent::Halt,
    }
}

/// The ITX expression naming `component`'s `export`.
fn component_expression(component: &str, export: &str) -> Value {
    json!(["components", ["get", component], export])
}

impl Subscription {
    fn with(key: impl Into<String>, receiver: Receiver) -> Subscription {
        Subscription {
            config: SubscriptionConfig {
                subscription_key: Some(key.into()),
                description: None,
                filter: None,
                receiver,
            },
            stray_transform: None,
        }
    }

    /// Copies matching events to `path` (in the source's namespace).
    pub fn copy_to(key: impl Into<String>, path: impl Into<String>) -> Subscription {
        Self::with(
            key,
            Receiver::CopyToStream {
                receiving_stream_path: path.into(),
                jsonata_transform: None,
                delivery: delivered(),
            },
        )
    }

    /// POSTs each matching event to `url`.
    pub fn webhook(key: impl Into<String>, url: impl Into<String>) -> Subscription {
        Self::with(
            key,
            Receiver::WebhookPost {
                url: url.into(),
                jsonata_transform: None,
                delivery: delivered(),
            },
        )
    }

    /// Calls the ITX `expression` (a JSON array) with each batch.
    pub fn itx(key: impl Into<String>, expression: Value) -> Subscription {
        Self::with(
            key,
            Receiver::ItxCall {
                expression,
                jsonata_transform: None,
                delivery: delivered(),
            },
        )
    }

    /// Wakes the processor `component` to fold the source.
    pub fn wake(key: impl Into<String>, component: &str) -> Subscription {
        Self::with(
            key,
            Receiver::ProcessorWake {
                expression: component_expression(component, "wake"),
            },
        )
    }
    /// Runs the reactor of `component` inside each matching append: its
    /// refusal refuses the append (`422 reactor-failed` for good, `503
    /// reactor-unavailable` for now), its effects go to the outbox.
    ///
    /// ```
    /// use streamhost_core::subscription::Subscription;
    ///
    /// let s = Subscription::reactor("welcome.v1", "welcome").event_types(["user-signed-up"]);
    /// let payload = s.to_event().payload.unwrap();
    /// assert_eq!(payload["receiver"]["action"], "reactor");
    /// assert_eq!(payload["receiver"]["expression"][2], "react");
    /// assert_eq!(payload["filter"]["eventTypes"][0], "user-signed-up");
    /// ```
    pub fn reactor(key: impl Into<String>, component: &str) -> Subscription {
        Self::with(
            key,
            Receiver::Reactor {
                expression: component_expression(component, "react"),
            },
        )
    }

    fn filter(&mut self) -> &mut Filter {
        self.config.filter.get_or_insert(Filter {
            event_types: None,
            jsonata_condition: None,
        })
    }

    fn delivery(&mut self) -> Option<&mut Delivery> {
        match &mut self.config.receiver {
            Receiver::CopyToStream { delivery, .. }
            | Receiver::WebhookPost { delivery, .. }
            | Receiver::ItxCall { delivery, .. } => Some(delivery),
            Receiver::ProcessorWake { .. } | Receiver::Reactor { .. } => None,
        }
    }

    /// Only events of these types.
    pub fn event_types<S: Into<String>>(mut self, types: impl IntoIterator<Item = S>) -> Self {
        let types: Vec<String> = types.into_iter().map(Into::into).collect();
        if types.is_empty() {
            if let Some(f) = &mut self.config.filter {
                f.event_types = None;
            }
        } else {
            self.filter().event_types = Some(types);
        }
        self
    }

    /// Only events for which this JSONata expression is true.
    pub fn condition(mut self, jsonata: impl Into<String>) -> Self {
        self.filter().jsonata_condition = Some(jsonata.into());
        self
    }

    /// Transforms each event with this JSONata expression (not for wakes
    /// or reactors).
    pub fn transform(mut self, jsonata: impl Into<String>) -> Self {
        match &mut self.config.receiver {
            Receiver::CopyToStream {
                jsonata_transform, ..
            }
            | Receiver::WebhookPost {
                jsonata_transform, ..
            }
            | Receiver::ItxCall {
                jsonata_transform, ..
            } => *jsonata_transform = Some(jsonata.into()),
            Receiver::ProcessorWake { .. } | Receiver::Reactor { .. } => {
                self.stray_transform = Some(jsonata.into())
            }
        }
        self
    }

    /// Delivers the whole log, not only events appended from now on.
    pub fn from_beginning(mut self) -> Self {
        if let Some(d) = self.delivery() {
            d.start = Start::Beginning;
        }
        self
    }

    /// Skips a failing event with an error line instead of halting: a
    /// final failure at once, one that may heal once its retries are spent.
    pub fn skip_failing_events(mut self) -> Self {
        if let Some(d) = self.delivery() {
            d.on_failing_event = OnFailingEvent::Skip;
        }
        self
    }

    /// A description kept with the configuration.
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.config.description = Some(text.into());
        self
    }

    /// The `subscription-removed` event that removes subscription `key`
    /// from the source it is appended to.
    ///
    /// ```
    /// use streamhost_core::subscription::Subscription;
    ///
    /// let removed = Subscription::removed("big-orders");
    /// assert_eq!(removed.payload.unwrap()["subscriptionKey"], "big-orders");
    /// ```
    pub fn removed(key: impl Into<String>) -> EventInput {
        let payload = SubscriptionRemoved {
            subscription_key: key.into(),
            reason: RemovedReason::Requested,
        };
        EventInput::new(types::SUBSCRIPTION_REMOVED)
            .payload(serde_json::to_value(payload).expect("a removal serializes"))
    }

    /// The `subscription-configured` event to append to the source.
    pub fn to_event(&self) -> EventInput {
        let mut payload =
            serde_json::to_value(&self.config).expect("a subscription's configuration serializes");
        if let Some(t) = &self.stray_transform {
            payload["receiver"]["jsonataTransform"] = json!(t);
        }
        EventInput::new(types::SUBSCRIPTION_CONFIGURED).payload(payload)
    }
}
