//! Building a subscription's `subscription-configured` event in code (the
//! embedding API and the CLI): a receiver, then a filter, a transform and
//! where delivery starts.

use serde_json::{json, Value};

use crate::stream::{types, EventInput};

/// A subscription to configure on its source stream.
///
/// ```
/// use streamhost::Subscription;
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
    key: String,
    receiver: Value,
    event_types: Vec<String>,
    condition: Option<String>,
    description: Option<String>,
}

impl Subscription {
    fn with(key: impl Into<String>, receiver: Value) -> Subscription {
        Subscription {
            key: key.into(),
            receiver,
            event_types: Vec::new(),
            condition: None,
            description: None,
        }
    }

    fn delivered(mut receiver: Value) -> Value {
        receiver["delivery"] = json!({"start": "now", "onFailingEvent": "halt"});
        receiver
    }

    /// Copies matching events to `path` (in the source's namespace).
    pub fn copy_to(key: impl Into<String>, path: impl Into<String>) -> Subscription {
        let receiver = json!({"action": "copy-to-stream", "receivingStreamPath": path.into()});
        Self::with(key, Self::delivered(receiver))
    }

    /// POSTs each matching event to `url`.
    pub fn webhook(key: impl Into<String>, url: impl Into<String>) -> Subscription {
        let receiver = json!({"action": "webhook-post", "url": url.into()});
        Self::with(key, Self::delivered(receiver))
    }

    /// Calls the ITX `expression` (a JSON array) with each batch.
    pub fn itx(key: impl Into<String>, expression: Value) -> Subscription {
        let receiver = json!({"action": "itx-call", "expression": expression});
        Self::with(key, Self::delivered(receiver))
    }

    /// Wakes the processor `component` to fold the source.
    pub fn wake(key: impl Into<String>, component: &str) -> Subscription {
        let receiver = json!({"action": "processor-wake",
            "expression": ["components", ["get", component], "wake"]});
        Self::with(key, receiver)
    }

    /// Runs the reactor of `component` inside each matching append: its
    /// refusal refuses the append (`422 reactor-failed` for good, `503
    /// reactor-unavailable` for now), its effects go to the outbox.
    ///
    /// ```
    /// use streamhost::Subscription;
    ///
    /// let s = Subscription::reactor("welcome.v1", "welcome").event_types(["user-signed-up"]);
    /// let payload = s.to_event().payload.unwrap();
    /// assert_eq!(payload["receiver"]["action"], "reactor");
    /// assert_eq!(payload["receiver"]["expression"][2], "react");
    /// assert_eq!(payload["filter"]["eventTypes"][0], "user-signed-up");
    /// ```
    pub fn reactor(key: impl Into<String>, component: &str) -> Subscription {
        let receiver = json!({"action": "reactor",
            "expression": ["components", ["get", component], "react"]});
        Self::with(key, receiver)
    }

    /// Only events of these types.
    pub fn event_types<S: Into<String>>(mut self, types: impl IntoIterator<Item = S>) -> Self {
        self.event_types = types.into_iter().map(Into::into).collect();
        self
    }

    /// Only events for which this JSONata expression is true.
    pub fn condition(mut self, jsonata: impl Into<String>) -> Self {
        self.condition = Some(jsonata.into());
        self
    }

    /// Transforms each event with this JSONata expression (not for wakes
    /// or reactors).
    pub fn transform(mut self, jsonata: impl Into<String>) -> Self {
        self.receiver["jsonataTransform"] = json!(jsonata.into());
        self
    }

    /// Delivers the whole log, not only events appended from now on.
    pub fn from_beginning(mut self) -> Self {
        if self.receiver.get("delivery").is_some() {
            self.receiver["delivery"]["start"] = json!("beginning");
        }
        self
    }

    /// Skips a failing event with an error line instead of halting: a
    /// final failure at once, one that may heal once its retries are spent.
    pub fn skip_failing_events(mut self) -> Self {
        if self.receiver.get("delivery").is_some() {
            self.receiver["delivery"]["onFailingEvent"] = json!("skip");
        }
        self
    }

    /// A description kept with the configuration.
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = Some(text.into());
        self
    }

    /// The `subscription-configured` event to append to the source.
    pub fn to_event(&self) -> EventInput {
        let mut payload = json!({"subscriptionKey": self.key, "receiver": self.receiver});
        if !self.event_types.is_empty() || self.condition.is_some() {
            let mut filter = json!({});
            if !self.event_types.is_empty() {
                filter["eventTypes"] = json!(self.event_types);
            }
            if let Some(c) = &self.condition {
                filter["jsonataCondition"] = json!(c);
            }
            payload["filter"] = filter;
        }
        if let Some(d) = &self.description {
            payload["description"] = json!(d);
        }
        EventInput::new(types::SUBSCRIPTION_CONFIGURED).payload(payload)
    }
}
