//! The subscription operations beyond configuring one on its source
//! ([`Host::subscribe`]): a receiving stream subscribing to copies of
//! another stream and unsubscribing, and a source moving a subscription's
//! cursor and resuming it. Each appends control events to the source; the
//! rules live in `subscription` and run when those events are planned.
//! `:subscribeToEventsFrom`, `:unsubscribeFromEvents`,
//! `:setSubscriptionCursor`, `:resumeSubscription` and
//! `:setSubscriptionCursorAndResume` over HTTP.

use serde::{Deserialize, Serialize, Serializer};
use serde_json::{json, Value};

use super::request::{StreamAnswer, StreamRequest};
use super::Host;
use crate::error::Error;
use crate::stream::{types, AppendInput, Authority, Event, EventInput, StreamAddress};
use crate::subscription::{
    Delivery, Filter, OnFailingEvent, Receiver, Start, SubscriptionConfig, GENERATED_KEY_PREFIX,
};

/// A receiving stream's copy subscription to a source stream of its
/// namespace (`:subscribeToEventsFrom`). Build with [`CopyFrom::new`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CopyFrom {
    /// The source stream's path.
    pub source_stream_path: String,
    /// The subscription's key (generated from the configure event's offset
    /// when absent, which then needs `idempotency_key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription_key: Option<String>,
    /// Makes a keyless setup safe to retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Free text kept with the subscription.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Which events are copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Filter>,
    /// A JSONata expression shaping each copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jsonata_transform: Option<String>,
    /// Where copying begins (default: now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<Start>,
}

impl CopyFrom {
    /// Copies the events of `source_path` from now on, under `key`.
    pub fn new(source_path: impl Into<String>, key: impl Into<String>) -> Self {
        CopyFrom {
            source_stream_path: source_path.into(),
            subscription_key: Some(key.into()),
            idempotency_key: None,
            description: None,
            filter: None,
            jsonata_transform: None,
            start: None,
        }
    }

    /// Copies from the source's first event.
    pub fn from_beginning(mut self) -> Self {
        self.start = Some(Start::Beginning);
        self
    }

    /// Only events of these types.
    pub fn event_types<S: Into<String>>(mut self, types: impl IntoIterator<Item = S>) -> Self {
        let filter = self.filter.get_or_insert(Filter {
            event_types: None,
            jsonata_condition: None,
        });
        filter.event_types = Some(types.into_iter().map(Into::into).collect());
        self
    }

    /// Only events for which `expression` (JSONata) is truthy.
    pub fn condition(mut self, expression: impl Into<String>) -> Self {
        let filter = self.filter.get_or_insert(Filter {
            event_types: None,
            jsonata_condition: None,
        });
        filter.jsonata_condition = Some(expression.into());
        self
    }

    /// Each copy is `expression` (JSONata) applied to the event.
    pub fn transform(mut self, expression: impl Into<String>) -> Self {
        self.jsonata_transform = Some(expression.into());
        self
    }

    /// Free text kept with the subscription.
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = Some(text.into());
        self
    }

    /// The setup's idempotency key: repeating it replays the first.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }
}

/// A copy subscription configured on its source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subscribed {
    /// The subscription's effective key.
    pub subscription_key: String,
    /// The `subscription-configured` event on the source.
    pub subscription_configured_event: Event,
}

/// What unsubscribing did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Unsubscribed {
    /// Removed by this event on the source.
    #[serde(rename_all = "camelCase")]
    Removed {
        /// The `subscription-removed` event.
        subscription_removed_event: Box<Event>,
    },
    /// There was no such subscription (or no source stream).
    AlreadyAbsent,
}

/// What resuming did.
#[derive(Debug, Clone, PartialEq)]
pub enum Resumed {
    /// The subscription was failing, not halted: it is retried at once.
    Retrying,
    /// It was halted: this `delivery-resumed` event resumes it.
    Resumed(Box<Event>),
}

impl Serialize for Resumed {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Resumed::Retrying => json!({"retrying": true}).serialize(s),
            Resumed::Resumed(e) => json!({"subscriptionDeliveryResumedEvent": e}).serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Resumed {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase", deny_unknown_fields)]
        struct Shown {
            #[serde(default)]
            retrying: bool,
            subscription_delivery_resumed_event: Option<Box<Event>>,
        }
        match Shown::deserialize(d)? {
            Shown {
                subscription_delivery_resumed_event: Some(e),
                ..
            } => Ok(Resumed::Resumed(e)),
            Shown { retrying: true, .. } => Ok(Resumed::Retrying),
            _ => Err(serde::de::Error::custom(
                "expected retrying or subscriptionDeliveryResumedEvent",
            )),
        }
    }
}

/// A cursor set and a resume, appended together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CursorSetAndResumed {
    /// The `cursor-set` event.
    pub cursor_set: Event,
    /// The `delivery-resumed` event.
    pub resumed: Event,
}

fn event(event_type: &str, payload: Value, idempotency_key: Option<String>) -> EventInput {
    EventInput {
        event_type: event_type.to_string(),
        payload: payload.as_object().cloned(),
        metadata: None,
        idempotency_key,
        ephemeral: None,
        offset: None,
        source: None,
        trace: None,
        redacted: None,
    }
}

/// The effective key of a committed configure event.
fn key_of(configured: &Event) -> String {
    configured
        .payload
        .get("subscriptionKey")
        .and_then(Value::as_str)
        .map(|k| k.trim().to_string())
        .unwrap_or_else(|| format!("{GENERATED_KEY_PREFIX}{}", configured.offset))
}

fn cursor_set(key: &str, after_offset: u64) -> EventInput {
    event(
        types::SUBSCRIPTION_CURSOR_SET,
        json!({"subscriptionKey": key, "afterOffset": after_offset}),
        None,
    )
}

fn resumed(key: &str) -> EventInput {
    event(
        types::SUBSCRIPTION_DELIVERY_RESUMED,
        json!({"subscriptionKey": key}),
        None,
    )
}

impl Host {
    /// Appends control events as an API caller would; answers them.
    async fn append_control(
        &self,
        to: &StreamAddress,
        events: Vec<EventInput>,
    ) -> Result<Vec<Event>, Error> {
        let input = AppendInput {
            events,
            expected_stream_id: None,
        };
        Ok(self
            .streams
            .append(to, input, Authority::Public)
            .await?
            .events)
    }

    /// Subscribes `receiver` to copies of another stream of its namespace:
    /// the subscription is configured on the source.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::CopyFrom;
    ///
    /// let big = host.stream("acme", "/orders/big")?;
    /// let from = CopyFrom::new("/orders/eu", "big-orders").condition("payload.total > 100");
    /// let subscribed = host.subscribe_to_events_from(&big, from).await?;
    /// assert_eq!(subscribed.subscription_key, "big-orders");
    /// # Ok(()) }
    /// ```
    pub async fn subscribe_to_events_from(
        &self,
        receiver: &StreamAddress,
        from: CopyFrom,
    ) -> Result<Subscribed, Error> {
        match self
            .apply(receiver, StreamRequest::SubscribeToEventsFrom(from))
            .await?
        {
            StreamAnswer::Subscribed(x) => Ok(*x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::subscribe_to_events_from`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn subscribe_to_events_from_here(
        &self,
        receiver: &StreamAddress,
        from: CopyFrom,
    ) -> Result<Subscribed, Error> {
        let source = StreamAddress::new(receiver.namespace.clone(), &from.source_stream_path)
            .map_err(|e| Error::invalid(format!("sourceStreamPath: {}", e.message)))?;
        if source.path == receiver.path {
            return Err(Error::invalid(format!(
                "a stream cannot receive events from itself: sourceStreamPath {:?} is {:?}",
                from.source_stream_path, receiver.path
            )));
        }
        if from.subscription_key.is_none() && from.idempotency_key.is_none() {
            return Err(Error::invalid(
                "a keyless copy subscription requires idempotencyKey so setup is safe to retry",
            ));
        }
        let config = SubscriptionConfig {
            subscription_key: from.subscription_key,
            description: from.description,
            filter: from.filter,
            receiver: Receiver::CopyToStream {
                receiving_stream_path: receiver.path.clone(),
                jsonata_transform: from.jsonata_transform,
                delivery: Delivery {
                    start: from.start.unwrap_or(Start::Now),
                    on_failing_event: OnFailingEvent::Halt,
                },
            },
        };
        let configure = event(
            types::SUBSCRIPTION_CONFIGURED,
            serde_json::to_value(&config).expect("a subscription's configuration serializes"),
            from.idempotency_key,
        );
        let configured = self
            .append_control(&source, vec![configure])
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| Error::internal("the subscription was not appended"))?;
        Ok(Subscribed {
            subscription_key: key_of(&configured),
            subscription_configured_event: configured,
        })
    }

    /// Removes `receiver`'s copy subscription `key` from source
    /// `source_path`; a subscription that is absent is no error.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::{CopyFrom, Unsubscribed};
    ///
    /// let big = host.stream("acme", "/orders/big")?;
    /// host.subscribe_to_events_from(&big, CopyFrom::new("/orders/eu", "big-orders")).await?;
    /// let removed = host.unsubscribe_from_events(&big, "/orders/eu", "big-orders").await?;
    /// assert!(matches!(removed, Unsubscribed::Removed { .. }));
    /// let again = host.unsubscribe_from_events(&big, "/orders/eu", "big-orders").await?;
    /// assert_eq!(again, Unsubscribed::AlreadyAbsent);
    /// # Ok(()) }
    /// ```
    pub async fn unsubscribe_from_events(
        &self,
        receiver: &StreamAddress,
        source_path: &str,
        key: &str,
    ) -> Result<Unsubscribed, Error> {
        match self
            .apply(
                receiver,
                StreamRequest::UnsubscribeFromEvents {
                    source_stream_path: source_path.to_string(),
                    subscription_key: key.to_string(),
                },
            )
            .await?
        {
            StreamAnswer::Unsubscribed(x) => Ok(x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::unsubscribe_from_events`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn unsubscribe_from_events_here(
        &self,
        receiver: &StreamAddress,
        source_path: &str,
        key: &str,
    ) -> Result<Unsubscribed, Error> {
        let source = StreamAddress::new(receiver.namespace.clone(), source_path)
            .map_err(|e| Error::invalid(format!("sourceStreamPath: {}", e.message)))?;
        let state = match self.streams.state(&source).await {
            Ok(s) => s,
            Err(e) if e.code == "stream-not-found" => return Ok(Unsubscribed::AlreadyAbsent),
            Err(e) => return Err(e),
        };
        let key = key.trim();
        let Some(sub) = state.subscriptions.outbound.by_key.get(key) else {
            return Ok(Unsubscribed::AlreadyAbsent);
        };
        match &sub.configuration.receiver {
            Receiver::CopyToStream {
                receiving_stream_path,
                ..
            } if *receiving_stream_path == receiver.path => {}
            other => {
                return Err(Error::invalid(format!(
                    "subscription {key:?} of {:?} is not a copy to {:?} (it is {} {})",
                    source.path,
                    receiver.path,
                    other.action(),
                    match other {
                        Receiver::CopyToStream {
                            receiving_stream_path,
                            ..
                        } => format!("to {receiving_stream_path:?}"),
                        _ => String::new(),
                    }
                )))
            }
        }
        let removed = crate::subscription::Subscription::removed(key);
        match self.append_control(&source, vec![removed]).await {
            Ok(mut events) => Ok(Unsubscribed::Removed {
                subscription_removed_event: Box::new(events.remove(0)),
            }),
            Err(e) if e.code == "subscription-not-found" => Ok(Unsubscribed::AlreadyAbsent),
            Err(e) => Err(e),
        }
    }

    /// Moves subscription `key` of `source` to deliver the events after
    /// `after_offset` (a new run); answers the `cursor-set` event.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::Subscription;
    ///
    /// let orders = host.stream("acme", "/orders/eu")?;
    /// host.subscribe(&orders, &Subscription::copy_to("audit", "/audit")).await?;
    /// // Deliver everything again, from the stream's start.
    /// let set = host.set_subscription_cursor(&orders, "audit", 0).await?;
    /// assert_eq!(set.event_type, "events.iterate.com/stream/subscription-cursor-set");
    /// # Ok(()) }
    /// ```
    pub async fn set_subscription_cursor(
        &self,
        source: &StreamAddress,
        key: &str,
        after_offset: u64,
    ) -> Result<Event, Error> {
        match self
            .apply(
                source,
                StreamRequest::SetSubscriptionCursor {
                    subscription_key: key.to_string(),
                    after_offset,
                },
            )
            .await?
        {
            StreamAnswer::CursorSet(x) => Ok(*x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::set_subscription_cursor`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn set_subscription_cursor_here(
        &self,
        source: &StreamAddress,
        key: &str,
        after_offset: u64,
    ) -> Result<Event, Error> {
        let mut events = self
            .append_control(source, vec![cursor_set(key, after_offset)])
            .await?;
        Ok(events.remove(0))
    }

    /// Resumes halted subscription `key` of `source`; a failing one is
    /// retried at once instead.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::stream::types;
    /// use streamhost::{EventInput, Resumed, Subscription, WaitFor};
    ///
    /// let orders = host.stream("acme", "/orders/eu")?;
    /// // A transform that throws halts the copy at once.
    /// host.subscribe(&orders, &Subscription::copy_to("broken", "/copies").transform("$error('no')")).await?;
    /// host.append(&orders, [EventInput::new("events.example/x")]).await?;
    /// // The halt is a fact on the stream: wait for it.
    /// let halted = WaitFor::new(10_000).after(0).event_types([types::SUBSCRIPTION_DELIVERY_HALTED]);
    /// host.wait_for_event(&orders, halted).await?;
    /// let resumed = host.resume_subscription(&orders, "broken").await?;
    /// assert!(matches!(resumed, Resumed::Resumed(_)));
    /// # Ok(()) }
    /// ```
    pub async fn resume_subscription(
        &self,
        source: &StreamAddress,
        key: &str,
    ) -> Result<Resumed, Error> {
        match self
            .apply(
                source,
                StreamRequest::ResumeSubscription {
                    subscription_key: key.to_string(),
                },
            )
            .await?
        {
            StreamAnswer::Resumed(x) => Ok(x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::resume_subscription`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn resume_subscription_here(
        &self,
        source: &StreamAddress,
        key: &str,
    ) -> Result<Resumed, Error> {
        Ok(
            match self.streams.resume_subscription(source, key, None).await? {
                None => Resumed::Retrying,
                Some(event) => Resumed::Resumed(Box::new(event)),
            },
        )
    }

    /// Sets subscription `key`'s cursor and resumes it in one append.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::stream::types;
    /// use streamhost::{EventInput, Subscription, WaitFor};
    ///
    /// let orders = host.stream("acme", "/orders/eu")?;
    /// host.subscribe(&orders, &Subscription::copy_to("broken", "/copies").transform("$error('no')")).await?;
    /// host.append(&orders, [EventInput::new("events.example/x")]).await?;
    /// // The halt is a fact on the stream: wait for it.
    /// let halted = WaitFor::new(10_000).after(0).event_types([types::SUBSCRIPTION_DELIVERY_HALTED]);
    /// host.wait_for_event(&orders, halted).await?;
    /// // Skip the failing event: deliver after it, and resume.
    /// let both = host.set_subscription_cursor_and_resume(&orders, "broken", 2).await?;
    /// assert_eq!(both.resumed.offset, both.cursor_set.offset + 1);
    /// # Ok(()) }
    /// ```
    pub async fn set_subscription_cursor_and_resume(
        &self,
        source: &StreamAddress,
        key: &str,
        after_offset: u64,
    ) -> Result<CursorSetAndResumed, Error> {
        match self
            .apply(
                source,
                StreamRequest::SetSubscriptionCursorAndResume {
                    subscription_key: key.to_string(),
                    after_offset,
                },
            )
            .await?
        {
            StreamAnswer::CursorSetAndResumed(x) => Ok(*x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::set_subscription_cursor_and_resume`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn set_subscription_cursor_and_resume_here(
        &self,
        source: &StreamAddress,
        key: &str,
        after_offset: u64,
    ) -> Result<CursorSetAndResumed, Error> {
        let mut events = self
            .append_control(source, vec![cursor_set(key, after_offset), resumed(key)])
            .await?;
        let resumed = events.remove(1);
        Ok(CursorSetAndResumed {
            cursor_set: events.remove(0),
            resumed,
        })
    }
}
