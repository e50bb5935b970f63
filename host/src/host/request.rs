//! Every operation as one typed request, an enum per family: an adapter
//! parses what it received once into a request ([`StreamRequest`] for
//! everything on a stream: events, subscriptions, processors;
//! [`ComponentRequest`], [`EffectRequest`], [`ItxRequest`],
//! [`IngestRequest`], [`ClusterRequest`]), the host's `apply` methods carry
//! it out and answer, and the adapter renders that. HTTP's one mapping
//! between requests and URLs, methods, queries and bodies is
//! `http/mapping.rs`: the server parses with it, the command line renders
//! with it.

use serde_json::Value;

use super::backfill::{Backfill, Backfilled};
use super::cluster::ClusterView;
use super::components::{Component, ComponentVersions, Deploy, Deployed};
use super::effects::{Effect, EffectFilter, EffectsPage};
use super::live::{Connect, LiveConnection, WaitFor};
use super::processors::{KeyValue, KeysPage, KeysQuery, ProcessorInstance, StateAt, Verification};
use super::reactors::{ReactorBackfill, ReactorBackfilled};
use super::shadows::{Promote, ShadowEnded, ShadowView};
use super::subscriptions::{CopyFrom, CursorSetAndResumed, Resumed, Subscribed, Unsubscribed};
use super::Host;
use crate::actor::RuntimeView;
use crate::error::Error;
use crate::ingest::nats::BridgeStatus;
use crate::ingest::{IngestStatus, ParkedEvent, ParkedPage, ParkedQuery};
use crate::stream::{
    AppendInput, AppendOutput, Authority, CoreState, Event, EventInput, ReadOutput, ReadQuery,
    StreamAddress,
};

/// One operation on a stream. It is also what a host sends another host
/// for a stream that host owns (`/internal/v1/call`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum StreamRequest {
    /// Append events (`:append`).
    Append(AppendInput),
    /// Read a page of events (`:events`).
    Events(ReadQuery),
    /// The reduced core state (`:state`).
    State,
    /// Deliveries and live connections (`:runtime`).
    Runtime,
    /// Wipe the stream (`:reset`, admins only).
    Reset,
    /// Open a live connection (`:connect`).
    Connect(Connect),
    /// Wait for the first matching event (`:waitForEvent`).
    WaitForEvent(WaitFor),
    /// Copy another stream's events here (`:subscribeToEventsFrom`).
    SubscribeToEventsFrom(CopyFrom),
    /// Remove this stream's copy subscription on a source
    /// (`:unsubscribeFromEvents`).
    UnsubscribeFromEvents {
        /// The source stream's path.
        source_stream_path: String,
        /// The subscription's key.
        subscription_key: String,
    },
    /// Move a subscription's cursor (`:setSubscriptionCursor`).
    SetSubscriptionCursor {
        /// The subscription's key.
        subscription_key: String,
        /// Deliver the events after this offset.
        after_offset: u64,
    },
    /// Resume a halted subscription, or retry a failing one at once
    /// (`:resumeSubscription`).
    ResumeSubscription {
        /// The subscription's key.
        subscription_key: String,
    },
    /// Erase an event's payload and metadata (`:redact`).
    Redact {
        /// The event's offset.
        offset: u64,
        /// Why (kept with it, and in the `event-redacted` line).
        reason: String,
    },
    /// Set or remove the stream's retention bounds (`:configureRetention`).
    ConfigureRetention {
        /// Events older than this many milliseconds go.
        max_age_ms: Option<u64>,
        /// Beyond this many stored events, the oldest go.
        max_events: Option<u64>,
    },
    /// Both in one append (`:setSubscriptionCursorAndResume`).
    SetSubscriptionCursorAndResume {
        /// The subscription's key.
        subscription_key: String,
        /// Deliver the events after this offset.
        after_offset: u64,
    },
    /// A processor instance (`:processors/{component}`).
    Processor {
        /// The component.
        component: String,
    },
    /// A page of a processor's keys (`:processors/{component}/keys`).
    ProcessorKeys {
        /// The component.
        component: String,
        /// Which keys.
        query: KeysQuery,
    },
    /// The story of the event at `offset`: where it came from and what it
    /// caused (`:events/{offset}/trace`); with `export`, also sent to the
    /// OTLP endpoint as a trace.
    EventTrace {
        /// The event's offset.
        offset: u64,
        /// Send it to the OTLP endpoint too.
        export: bool,
    },
    /// A processor's state at an offset, folded on demand by the deployed
    /// version (`:processors/{component}/at/{offset}`).
    ProcessorAt {
        /// The component.
        component: String,
        /// The offset to fold through.
        offset: u64,
        /// A key prefix: list the keyed state under it too.
        keys: Option<String>,
    },
    /// One of a processor's keys (`:processors/{component}/keys/{key}`).
    ProcessorKey {
        /// The component.
        component: String,
        /// The key.
        key: String,
    },
    /// Refold a processor and compare (`:verifyProcessor`).
    VerifyProcessor {
        /// The component.
        component: String,
    },
    /// Fold a processor over a range for its effects (`:backfillProcessor`).
    BackfillProcessor(Backfill),
    /// Rerun a reactor over a range for its effects (`:backfillReactor`).
    BackfillReactor(ReactorBackfill),
    /// A processor's shadow against the live instance
    /// (`:processors/{component}/shadow`).
    Shadow {
        /// The component.
        component: String,
    },
    /// Switch a processor instance to its shadow (`:promoteShadow`).
    PromoteShadow(Promote),
    /// Drop a processor instance's shadow (`:discardShadow`).
    DiscardShadow {
        /// The component.
        component: String,
    },
}

impl StreamRequest {
    /// Whether only an admin may make it.
    pub fn admin_only(&self) -> bool {
        matches!(self, StreamRequest::Reset)
    }

    /// What it configures, if it does (a token of scope `append` may
    /// not): an append of a platform configuration event (subscriptions,
    /// their cursors and resumes, pause, resume, the stream's
    /// configuration), a subscription request, a backfill, a shadow's
    /// promotion or discarding, a reset.
    pub fn configures(&self) -> Option<String> {
        use crate::event::types;
        const CONFIGURATION: &[&str] = &[
            types::CONFIGURED,
            types::SUBSCRIPTION_CONFIGURED,
            types::SUBSCRIPTION_REMOVED,
            types::SUBSCRIPTION_CURSOR_SET,
            types::SUBSCRIPTION_DELIVERY_RESUMED,
            types::PAUSED,
            types::RESUMED,
        ];
        let what = match self {
            StreamRequest::Append(input) => {
                let e = input
                    .events
                    .iter()
                    .find(|e| CONFIGURATION.contains(&e.event_type.as_str()))?;
                return Some(format!("appending {:?}", e.event_type));
            }
            StreamRequest::SubscribeToEventsFrom(_) => "subscribing",
            StreamRequest::UnsubscribeFromEvents { .. } => "unsubscribing",
            StreamRequest::SetSubscriptionCursor { .. }
            | StreamRequest::SetSubscriptionCursorAndResume { .. } => {
                "setting a subscription's cursor"
            }
            StreamRequest::ResumeSubscription { .. } => "resuming a subscription",
            StreamRequest::Redact { .. } => "redacting an event",
            StreamRequest::ConfigureRetention { .. } => "configuring retention",
            StreamRequest::BackfillProcessor(_) | StreamRequest::BackfillReactor(_) => {
                "backfilling effects"
            }
            StreamRequest::PromoteShadow(_) => "promoting a shadow",
            StreamRequest::DiscardShadow { .. } => "discarding a shadow",
            StreamRequest::Reset => "resetting a stream",
            StreamRequest::Events(_)
            | StreamRequest::State
            | StreamRequest::Runtime
            | StreamRequest::Connect(_)
            | StreamRequest::WaitForEvent(_)
            | StreamRequest::Processor { .. }
            | StreamRequest::ProcessorKeys { .. }
            | StreamRequest::EventTrace { .. }
            | StreamRequest::ProcessorAt { .. }
            | StreamRequest::ProcessorKey { .. }
            | StreamRequest::VerifyProcessor { .. }
            | StreamRequest::Shadow { .. } => return None,
        };
        Some(what.to_string())
    }
}

/// What a [`StreamRequest`] answers, one variant per kind of answer. It
/// serializes as the HTTP API's body (a live connection, a stream of
/// batches, does not serialize).
pub enum StreamAnswer {
    /// The committed events, and warnings about subscriptions whose
    /// component is not deployed.
    Appended {
        /// The append's output.
        output: AppendOutput,
        /// Warnings (empty: none).
        warnings: Vec<String>,
    },
    /// A page of events.
    Events(ReadOutput),
    /// The core state.
    State(Box<CoreState>),
    /// The runtime view.
    Runtime(RuntimeView),
    /// The stream was reset.
    Reset,
    /// A live connection.
    Live(LiveConnection),
    /// The event waited for.
    Event(Box<Event>),
    /// A copy subscription configured.
    Subscribed(Box<Subscribed>),
    /// What unsubscribing did.
    Unsubscribed(Unsubscribed),
    /// The `cursor-set` event.
    CursorSet(Box<Event>),
    /// What resuming did.
    Resumed(Resumed),
    /// What redacting did.
    Redacted(Box<super::redact::Redacted>),
    /// The `retention-configured` event.
    RetentionConfigured(Box<Event>),
    /// The `cursor-set` and `delivery-resumed` events.
    CursorSetAndResumed(Box<CursorSetAndResumed>),
    /// A processor instance.
    Processor(Box<ProcessorInstance>),
    /// A page of keys.
    Keys(KeysPage),
    /// One key.
    Key(KeyValue),
    /// What verifying found.
    Verification(Box<Verification>),
    /// A processor's state at an offset.
    StateAt(Box<StateAt>),
    /// An event's story.
    Trace(Box<super::trace::EventTrace>),
    /// What a backfill came to.
    Backfilled(Backfilled),
    /// What a reactor backfill came to.
    ReactorBackfilled(ReactorBackfilled),
    /// A shadow against the live instance.
    Shadow(Box<ShadowView>),
    /// A shadow promoted or discarded.
    ShadowEnded(ShadowEnded),
}

impl serde::Serialize for StreamAnswer {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error as _;
        use StreamAnswer as A;
        /// An append's output with its warnings beside its fields.
        #[derive(serde::Serialize)]
        struct Warned<'a> {
            #[serde(flatten)]
            output: &'a AppendOutput,
            warnings: &'a [String],
        }
        match self {
            A::Appended { output, warnings } if warnings.is_empty() => output.serialize(s),
            A::Appended { output, warnings } => Warned { output, warnings }.serialize(s),
            A::Events(page) => page.serialize(s),
            A::State(state) => state.serialize(s),
            A::Runtime(runtime) => runtime.serialize(s),
            A::Reset => serde_json::json!({"status": "reset"}).serialize(s),
            A::Live(_) => Err(S::Error::custom(
                "a live connection is a stream of batches, not one answer",
            )),
            A::Event(event) => serde_json::json!({ "event": event }).serialize(s),
            A::Subscribed(subscribed) => subscribed.serialize(s),
            A::Unsubscribed(unsubscribed) => unsubscribed.serialize(s),
            A::CursorSet(event) => {
                serde_json::json!({ "subscriptionCursorSetEvent": event }).serialize(s)
            }
            A::Resumed(resumed) => resumed.serialize(s),
            A::Redacted(redacted) => redacted.serialize(s),
            A::RetentionConfigured(event) => {
                serde_json::json!({ "retentionConfiguredEvent": event }).serialize(s)
            }
            A::CursorSetAndResumed(both) => both.serialize(s),
            A::Processor(instance) => instance.serialize(s),
            A::Keys(page) => page.serialize(s),
            A::Key(key) => key.serialize(s),
            A::Verification(verification) => verification.serialize(s),
            A::StateAt(at) => at.serialize(s),
            A::Trace(t) => t.serialize(s),
            A::Backfilled(done) => done.serialize(s),
            A::ReactorBackfilled(done) => done.serialize(s),
            A::Shadow(view) => view.serialize(s),
            A::ShadowEnded(ended) => ended.serialize(s),
        }
    }
}

impl Host {
    /// Carries out `request` on `stream` as an API caller's (not an
    /// admin's: [`StreamRequest::admin_only`] is the adapter's to check).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::{EventInput, StreamAnswer, StreamRequest};
    ///
    /// let orders = host.stream("acme", "/orders/eu")?;
    /// let append = StreamRequest::Append(streamhost::AppendInput::new([EventInput::new("events.example/x")]));
    /// let StreamAnswer::Appended { output, .. } = host.apply(&orders, append).await? else { unreachable!() };
    /// assert_eq!(output.events[0].offset, 2);
    /// let StreamAnswer::State(state) = host.apply(&orders, StreamRequest::State).await? else { unreachable!() };
    /// assert_eq!(state.max_offset, 2);
    /// # Ok(()) }
    /// ```
    pub async fn apply(
        &self,
        stream: &StreamAddress,
        request: StreamRequest,
    ) -> Result<StreamAnswer, Error> {
        // Several hosts: a stream another host owns is that host's to serve.
        let Some(me) = self.streams.storage().cluster().cloned() else {
            return self.apply_here(stream, request).await;
        };
        let project = stream.namespace.storage_key();
        // An owner this host learned lately: straight there, without
        // asking this host's actor first (which would answer that owner).
        if let Some(owner) = self
            .streams
            .storage()
            .known_owner(project, &stream.path)
            .filter(|owner| *owner != me.url)
        {
            return self.forward(&me, &owner, stream, request).await;
        }
        let again = request.clone();
        match self.apply_here(stream, request).await {
            Err(e)
                if e.owner_url
                    .as_deref()
                    .is_some_and(|o| !o.is_empty() && o != me.url) =>
            {
                let owner = e.owner_url.unwrap_or_default();
                self.forward(&me, &owner, stream, again).await
            }
            answer => answer,
        }
    }

    /// [`Host::apply`] on this host alone: what the owner of a stream does
    /// with a request another host forwarded (on a stream this host does
    /// not own, `503 stream-owned-elsewhere` naming the owner).
    pub(crate) async fn apply_here(
        &self,
        stream: &StreamAddress,
        request: StreamRequest,
    ) -> Result<StreamAnswer, Error> {
        use StreamAnswer as A;
        use StreamRequest as R;
        Ok(match request {
            R::Append(mut input) => {
                let resumes = input
                    .events
                    .iter()
                    .any(|e| e.event_type == crate::stream::types::RESUMED);
                self.refuse_wrong_receivers(stream, &input.events).await?;
                let telemetry = &self.streams.executors().telemetry;
                let span = telemetry.begin(input.events.iter().find_map(|e| e.trace.as_ref()));
                if let Some(span) = &span {
                    span.carry(&mut input.events);
                }
                let count = input.events.len();
                let appended = self.streams.append(stream, input, Authority::Public).await;
                if let Some(span) = span {
                    telemetry.end(
                        span,
                        "append",
                        opentelemetry::trace::SpanKind::Server,
                        crate::telemetry::Record::of_append(stream, count, &appended),
                    );
                }
                let output = appended?;
                if resumes {
                    // Ingest held behind the pause goes on now.
                    self.ingest.retry_now();
                }
                let warnings = self.undeployed_receivers(stream, &output.events).await;
                A::Appended { output, warnings }
            }
            R::Events(query) => A::Events(self.streams.read(stream, query).await?),
            R::State => A::State(Box::new(self.state_here(stream).await?)),
            R::Runtime => A::Runtime(self.runtime_here(stream).await?),
            R::Reset => {
                self.reset_here(stream).await?;
                A::Reset
            }
            R::Connect(connect) => A::Live(self.connect_here(stream, connect).await?),
            R::WaitForEvent(wait) => {
                A::Event(Box::new(self.wait_for_event_here(stream, wait).await?))
            }
            R::SubscribeToEventsFrom(from) => A::Subscribed(Box::new(
                self.subscribe_to_events_from_here(stream, from).await?,
            )),
            R::UnsubscribeFromEvents {
                source_stream_path,
                subscription_key,
            } => A::Unsubscribed(
                self.unsubscribe_from_events_here(stream, &source_stream_path, &subscription_key)
                    .await?,
            ),
            R::SetSubscriptionCursor {
                subscription_key,
                after_offset,
            } => A::CursorSet(Box::new(
                self.set_subscription_cursor_here(stream, &subscription_key, after_offset)
                    .await?,
            )),
            R::ResumeSubscription { subscription_key } => A::Resumed(
                self.resume_subscription_here(stream, &subscription_key)
                    .await?,
            ),
            R::Redact { offset, reason } => {
                A::Redacted(Box::new(self.redact_here(stream, offset, &reason).await?))
            }
            R::ConfigureRetention {
                max_age_ms,
                max_events,
            } => A::RetentionConfigured(Box::new(
                self.configure_retention_here(stream, max_age_ms, max_events)
                    .await?,
            )),
            R::SetSubscriptionCursorAndResume {
                subscription_key,
                after_offset,
            } => A::CursorSetAndResumed(Box::new(
                self.set_subscription_cursor_and_resume_here(
                    stream,
                    &subscription_key,
                    after_offset,
                )
                .await?,
            )),
            R::Processor { component } => {
                A::Processor(Box::new(self.processor_here(stream, &component).await?))
            }
            R::ProcessorKeys { component, query } => {
                A::Keys(self.processor_keys_here(stream, &component, query).await?)
            }
            R::ProcessorKey { component, key } => {
                A::Key(self.processor_key_here(stream, &component, &key).await?)
            }
            R::EventTrace { offset, export } => {
                A::Trace(Box::new(self.event_trace(stream, offset, export).await?))
            }
            R::ProcessorAt {
                component,
                offset,
                keys,
            } => A::StateAt(Box::new(
                self.processor_at_here(stream, &component, offset, keys)
                    .await?,
            )),
            R::VerifyProcessor { component } => A::Verification(Box::new(
                self.verify_processor_here(stream, &component).await?,
            )),
            R::BackfillProcessor(backfill) => {
                A::Backfilled(self.backfill_here(stream, backfill).await?)
            }
            R::BackfillReactor(backfill) => {
                A::ReactorBackfilled(self.backfill_reactor_here(stream, backfill).await?)
            }
            R::Shadow { component } => A::Shadow(Box::new(
                self.processor_shadow_here(stream, &component).await?,
            )),
            R::PromoteShadow(promote) => {
                A::ShadowEnded(self.promote_shadow_here(stream, promote).await?)
            }
            R::DiscardShadow { component } => {
                A::ShadowEnded(self.discard_shadow_here(stream, &component).await?)
            }
        })
    }

    /// Sends `request` to the stream's owner at `owner` and answers what
    /// it answered. A live connection cannot travel as one answer: the
    /// HTTP layer relays those from the owner; asked here, it is refused
    /// as owned elsewhere.
    async fn forward(
        &self,
        me: &crate::storage::HostIdentity,
        owner: &str,
        stream: &StreamAddress,
        request: StreamRequest,
    ) -> Result<StreamAnswer, Error> {
        use crate::actor::remote::{self, Call};
        if matches!(request, StreamRequest::Connect(_)) {
            return Err(owned_elsewhere(stream, owner));
        }
        // A hung owner must not hold the request longer than its lease
        // (then a retry finds a live owner); a wait, as long as it may
        // wait.
        let wait = match &request {
            StreamRequest::WaitForEvent(_) => std::time::Duration::from_millis(
                super::live::WAIT_TIMEOUT_MS_MAX + WAIT_ANSWER_MARGIN_MS,
            ),
            _ => std::time::Duration::from_millis(me.lease_ms.max(1000) as u64),
        };
        let call = Call::Request {
            request: serde_json::to_value(&request)
                .map_err(|e| Error::internal(format!("serializing a request failed: {e}")))?,
        };
        let answered =
            remote::send::<Value>(self.forwarder(), &me.secret, wait, owner, stream, call).await;
        match answered {
            Ok(json) => StreamAnswer::from_json(&request, json).map_err(|e| {
                Error::internal(format!(
                    "the answer of stream {stream}'s owner at {owner} is unreadable: {e}"
                ))
            }),
            Err(e) => {
                // The owner moved on, or cannot serve now: ask the
                // database next time.
                if e.kind == crate::error::ErrorKind::Unavailable {
                    self.streams.storage().forget_owner(owner);
                }
                Err(e)
            }
        }
    }
}

/// How much longer than the longest wait the owner may take to answer one.
const WAIT_ANSWER_MARGIN_MS: u64 = 10_000;

/// `503 stream-owned-elsewhere`, naming the owner.
fn owned_elsewhere(stream: &StreamAddress, owner: &str) -> Error {
    let mut e = Error::unavailable(
        "stream-owned-elsewhere",
        format!("stream {stream} is owned by the host at {owner}"),
        1,
    );
    e.owner_url = Some(owner.to_string());
    e
}

impl StreamAnswer {
    /// The error for an answer of another kind than its request's (a bug:
    /// every request has one kind of answer).
    pub(crate) fn unexpected(&self) -> Error {
        Error::internal(format!(
            "a request was answered with an answer of another kind ({})",
            self.kind()
        ))
    }

    fn kind(&self) -> &'static str {
        use StreamAnswer as A;
        match self {
            A::Appended { .. } => "appended",
            A::Events(_) => "events",
            A::State(_) => "state",
            A::Runtime(_) => "runtime",
            A::Reset => "reset",
            A::Live(_) => "live",
            A::Event(_) => "event",
            A::Subscribed(_) => "subscribed",
            A::Unsubscribed(_) => "unsubscribed",
            A::CursorSet(_) => "cursor set",
            A::Resumed(_) => "resumed",
            A::Redacted(_) => "redacted",
            A::RetentionConfigured(_) => "retention configured",
            A::CursorSetAndResumed(_) => "cursor set and resumed",
            A::Processor(_) => "processor",
            A::Keys(_) => "keys",
            A::Key(_) => "key",
            A::Verification(_) => "verification",
            A::StateAt(_) => "state at",
            A::Trace(_) => "trace",
            A::Backfilled(_) => "backfilled",
            A::ReactorBackfilled(_) => "reactor backfilled",
            A::Shadow(_) => "shadow",
            A::ShadowEnded(_) => "shadow ended",
        }
    }

    /// The answer to `request` from its JSON, as it serializes (the HTTP
    /// API's body): how a host reads what a stream's owner answered to a
    /// request it forwarded. A live connection has no such form.
    pub fn from_json(
        request: &StreamRequest,
        json: Value,
    ) -> Result<StreamAnswer, serde_json::Error> {
        use serde::de::Error as _;
        use serde_json::from_value;
        use StreamAnswer as A;
        use StreamRequest as R;
        /// The value of `name` in an object (`null` when absent).
        fn field(mut json: Value, name: &str) -> Value {
            json.get_mut(name).map(Value::take).unwrap_or(Value::Null)
        }
        Ok(match request {
            R::Append(_) => {
                let mut json = json;
                let warnings = match json.as_object_mut().and_then(|o| o.remove("warnings")) {
                    Some(w) => from_value(w)?,
                    None => Vec::new(),
                };
                A::Appended {
                    output: from_value(json)?,
                    warnings,
                }
            }
            R::Events(_) => A::Events(from_value(json)?),
            R::State => A::State(from_value(json)?),
            R::Runtime => A::Runtime(from_value(json)?),
            R::Reset => A::Reset,
            R::Connect(_) => {
                return Err(serde_json::Error::custom(
                    "a live connection is a stream of batches, not one answer",
                ))
            }
            R::WaitForEvent(_) => A::Event(from_value(field(json, "event"))?),
            R::SubscribeToEventsFrom(_) => A::Subscribed(from_value(json)?),
            R::UnsubscribeFromEvents { .. } => A::Unsubscribed(from_value(json)?),
            R::SetSubscriptionCursor { .. } => {
                A::CursorSet(from_value(field(json, "subscriptionCursorSetEvent"))?)
            }
            R::ResumeSubscription { .. } => A::Resumed(from_value(json)?),
            R::Redact { .. } => A::Redacted(from_value(json)?),
            R::ConfigureRetention { .. } => {
                A::RetentionConfigured(from_value(field(json, "retentionConfiguredEvent"))?)
            }
            R::SetSubscriptionCursorAndResume { .. } => A::CursorSetAndResumed(from_value(json)?),
            R::Processor { .. } => A::Processor(from_value(json)?),
            R::ProcessorKeys { .. } => A::Keys(from_value(json)?),
            R::ProcessorKey { .. } => A::Key(from_value(json)?),
            R::ProcessorAt { .. } => A::StateAt(from_value(json)?),
            R::EventTrace { .. } => A::Trace(from_value(json)?),
            R::VerifyProcessor { .. } => A::Verification(from_value(json)?),
            R::BackfillProcessor(_) => A::Backfilled(from_value(json)?),
            R::BackfillReactor(_) => A::ReactorBackfilled(from_value(json)?),
            R::Shadow { .. } => A::Shadow(from_value(json)?),
            R::PromoteShadow(_) | R::DiscardShadow { .. } => A::ShadowEnded(from_value(json)?),
        })
    }
}

/// One operation on a project's components (`/v1/projects/{p}/components`).
#[derive(Debug, Clone, PartialEq)]
pub enum ComponentRequest {
    /// Deploy bytes as component `name` (`PUT .../components/{name}`).
    Deploy {
        /// The component's name.
        name: String,
        /// The component's bytes.
        bytes: Vec<u8>,
        /// How the instances of the version it replaces are treated.
        mode: crate::component::DeployMode,
    },
    /// The deployed components (`GET .../components`).
    List,
    /// One component (`GET .../components/{name}`).
    Get {
        /// The component's name.
        name: String,
    },
    /// One component's bytes (`GET .../components/{name}`, `accept:
    /// application/wasm`).
    Bytes {
        /// The component's name.
        name: String,
    },
    /// One component's versions (`GET .../components/{name}/versions`).
    Versions {
        /// The component's name.
        name: String,
    },
}

/// What a [`ComponentRequest`] answers (serialized as the HTTP API's body).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum ComponentAnswer {
    /// What deploying did.
    Deployed(Box<Deployed>),
    /// The deployed components.
    List {
        /// In name order.
        components: Vec<Component>,
    },
    /// One component.
    Component(Box<Component>),
    /// Its bytes (not JSON: `application/wasm`).
    #[serde(skip)]
    Bytes(Vec<u8>),
    /// Its versions.
    Versions(ComponentVersions),
}

/// One operation on a project's effect outbox (`/v1/projects/{p}/effects`).
#[derive(Debug, Clone, PartialEq)]
pub enum EffectRequest {
    /// A page of effects (`GET .../effects`).
    List(EffectFilter),
    /// One effect (`GET .../effects/{id}`).
    Get {
        /// The effect's id.
        id: i64,
    },
    /// Run it again from a first attempt (`POST .../effects/{id}:retry`).
    Retry {
        /// The effect's id.
        id: i64,
    },
    /// Stop trying it (`POST .../effects/{id}:cancel`).
    Cancel {
        /// The effect's id.
        id: i64,
    },
}

/// What an [`EffectRequest`] answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum EffectAnswer {
    /// A page.
    Page(EffectsPage),
    /// One effect.
    Effect(Box<Effect>),
}

/// An ITX call (`POST /v1/projects/{p}/itx`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ItxRequest {
    /// The function, as subscriptions name their ITX receivers
    /// (`["components", ["get", "calculator"], "math.add"]`).
    pub expression: Value,
    /// One JSON value per parameter.
    #[serde(default)]
    pub args: Vec<Value>,
}

/// One ingest operation (`/v1/projects/{p}/ingest{path}`, `/v1/ingest`).
#[derive(Debug, Clone, PartialEq)]
pub enum IngestRequest {
    /// Accept events for a stream once they are safe, before they commit
    /// (`POST /v1/projects/{p}/ingest{path}`).
    Accept {
        /// The stream.
        stream: StreamAddress,
        /// The events.
        events: Vec<EventInput>,
    },
    /// Pending ingest and the JetStream bridge (`GET /v1/ingest`, admins).
    Status,
    /// Register the JetStream stream the bridge sees now
    /// (`POST /v1/ingest:register`, admins).
    Register,
    /// A project's parked events, oldest first
    /// (`GET /v1/projects/{p}/ingest/parked`).
    Parked {
        /// The project.
        project: String,
        /// Which.
        query: ParkedQuery,
    },
    /// Append a parked event again; once in its stream it is settled
    /// (`POST /v1/projects/{p}/ingest/parked/{id}:redrive`).
    Redrive {
        /// The project.
        project: String,
        /// The parked event's id.
        id: i64,
    },
    /// Drop a parked event, recorded as an `error-occurred` line on its
    /// stream (`POST /v1/projects/{p}/ingest/parked/{id}:discard`).
    Discard {
        /// The project.
        project: String,
        /// The parked event's id.
        id: i64,
    },
}

/// What an [`IngestRequest`] answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum IngestAnswer {
    /// How many events were accepted.
    Accepted {
        /// Events accepted.
        accepted: usize,
    },
    /// The status.
    Status(Box<IngestStatus>),
    /// The bridge after registering.
    Registered(Box<BridgeStatus>),
    /// A page of parked events.
    Parked(Box<ParkedPage>),
    /// A parked event redriven: the append's answer.
    Redriven(Box<AppendOutput>),
    /// A parked event discarded.
    Discarded {
        /// It, as it was parked.
        discarded: Box<ParkedEvent>,
    },
}

/// One operation on the hosts (`/v1/cluster`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterRequest {
    /// This host and the hosts sharing its database.
    View,
}

impl IngestRequest {
    /// Whether only an admin may make it.
    pub fn admin_only(&self) -> bool {
        matches!(self, IngestRequest::Status | IngestRequest::Register)
    }
}

impl Host {
    /// Carries out `request` on `project`'s components.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// use streamhost::{ComponentAnswer, ComponentRequest};
    ///
    /// let bytes = std::fs::read(guests.join("counter.wasm"))?;
    /// let deploy = ComponentRequest::Deploy { name: "counter".into(), bytes, mode: Default::default() };
    /// let ComponentAnswer::Deployed(deployed) = host.apply_component("acme", deploy).await? else {
    ///     unreachable!()
    /// };
    /// let ComponentAnswer::List { components } = host.apply_component("acme", ComponentRequest::List).await?
    /// else {
    ///     unreachable!()
    /// };
    /// assert_eq!(components[0].digest, deployed.digest);
    /// # Ok(()) }
    /// ```
    pub async fn apply_component(
        &self,
        project: &str,
        request: ComponentRequest,
    ) -> Result<ComponentAnswer, Error> {
        use ComponentAnswer as A;
        use ComponentRequest as R;
        Ok(match request {
            R::Deploy { name, bytes, mode } => {
                let deploy = Deploy::new(project, name, bytes).mode(mode);
                A::Deployed(Box::new(self.deploy(deploy).await?))
            }
            R::List => A::List {
                components: self.components(project).await?,
            },
            R::Get { name } => A::Component(Box::new(self.component(project, &name).await?)),
            R::Bytes { name } => A::Bytes(self.component_bytes(project, &name).await?),
            R::Versions { name } => A::Versions(self.component_versions(project, &name).await?),
        })
    }

    /// Carries out `request` on `project`'s effect outbox.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # host.deploy(streamhost::Deploy::new("acme", "effector", std::fs::read(guests.join("effector.wasm"))?)).await?;
    /// # let jobs = host.stream("acme", "/jobs")?;
    /// # host.subscribe(&jobs, &streamhost::Subscription::wake("effector", "effector").from_beginning()).await?;
    /// # let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    /// # host.append(&jobs, [streamhost::EventInput::new("events.example/effects-requested").payload(serde_json::json!({"effects": [
    /// #     {"key": "note", "append": {"streamPath": "/notes", "type": "noted", "payload": {}}},
    /// #     {"key": "hook", "webhook": {"url": format!("http://{closed}/"), "body": {}}},
    /// # ]}))]).await?;
    /// # let head = host.state(&jobs).await?.max_offset;
    /// # host.wait_for_processor(&jobs, "effector", head, std::time::Duration::from_secs(60)).await?; // its effects commit with its checkpoint
    /// use streamhost::{EffectAnswer, EffectFilter, EffectRequest};
    ///
    /// let list = EffectRequest::List(EffectFilter::new().stream("/jobs"));
    /// let EffectAnswer::Page(page) = host.apply_effect("acme", list).await? else { unreachable!() };
    /// let get = EffectRequest::Get { id: page.effects[0].id };
    /// let EffectAnswer::Effect(effect) = host.apply_effect("acme", get).await? else { unreachable!() };
    /// assert_eq!(effect.component, "effector");
    /// # Ok(()) }
    /// ```
    pub async fn apply_effect(
        &self,
        project: &str,
        request: EffectRequest,
    ) -> Result<EffectAnswer, Error> {
        use EffectAnswer as A;
        use EffectRequest as R;
        Ok(match request {
            R::List(filter) => A::Page(self.effects(project, filter).await?),
            R::Get { id } => A::Effect(Box::new(self.effect(project, id).await?)),
            R::Retry { id } => A::Effect(Box::new(self.retry_effect(project, id).await?)),
            R::Cancel { id } => A::Effect(Box::new(self.cancel_effect(project, id).await?)),
        })
    }

    /// Carries out an ITX call in `project`; answers the function's result.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # host.deploy(streamhost::Deploy::new("acme", "kinds", std::fs::read(guests.join("kinds.wasm"))?)).await?;
    /// use serde_json::json;
    /// use streamhost::ItxRequest;
    ///
    /// let add = ItxRequest { expression: json!(["components", ["get", "kinds"], "add"]), args: vec![json!(2), json!(3)] };
    /// assert_eq!(host.apply_itx("acme", add).await?, json!(5));
    /// # Ok(()) }
    /// ```
    pub async fn apply_itx(&self, project: &str, request: ItxRequest) -> Result<Value, Error> {
        self.apply_itx_traced(project, request, None).await
    }

    /// [`Host::apply_itx`] in the caller's trace (a `traceparent`): the
    /// call is a span of it when spans are exported.
    pub async fn apply_itx_traced(
        &self,
        project: &str,
        request: ItxRequest,
        trace: Option<crate::trace::Trace>,
    ) -> Result<Value, Error> {
        let telemetry = &self.streams.executors().telemetry;
        let span = telemetry.begin(trace.as_ref());
        let result = self
            .call_expression(project, &request.expression, request.args)
            .await;
        if let Some(span) = span {
            let mut record = crate::telemetry::Record::default()
                .with("streamhost.project", project.to_string())
                .with("streamhost.itx.expression", request.expression.to_string());
            record.error = result
                .as_ref()
                .err()
                .map(|e| format!("{}: {}", e.code, e.message));
            telemetry.end(
                span,
                "itx call",
                opentelemetry::trace::SpanKind::Server,
                record,
            );
        }
        result
    }

    /// Carries out `request` (admin-only requests are the adapter's to
    /// check: [`IngestRequest::admin_only`]).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::{EventInput, IngestAnswer, IngestRequest};
    ///
    /// let stream = host.stream("acme", "/orders/eu")?;
    /// let events = vec![EventInput::new("events.example/order-created").idempotency_key("order-9")];
    /// let answer = host.apply_ingest(IngestRequest::Accept { stream, events }).await?;
    /// assert_eq!(answer, IngestAnswer::Accepted { accepted: 1 });
    /// # Ok(()) }
    /// ```
    pub async fn apply_ingest(&self, request: IngestRequest) -> Result<IngestAnswer, Error> {
        Ok(match request {
            IngestRequest::Accept { stream, events } => IngestAnswer::Accepted {
                accepted: self.ingest(&stream, events).await?,
            },
            IngestRequest::Status => IngestAnswer::Status(Box::new(self.ingest_status().await?)),
            IngestRequest::Register => {
                IngestAnswer::Registered(Box::new(self.register_ingest().await?))
            }
            IngestRequest::Parked { project, query } => {
                IngestAnswer::Parked(Box::new(self.ingest_parked(&project, query).await?))
            }
            IngestRequest::Redrive { project, id } => {
                IngestAnswer::Redriven(Box::new(self.redrive_parked(&project, id).await?))
            }
            IngestRequest::Discard { project, id } => IngestAnswer::Discarded {
                discarded: Box::new(self.discard_parked(&project, id).await?),
            },
        })
    }

    /// Carries out `request` on the hosts.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// let view = host.apply_cluster(streamhost::ClusterRequest::View).await?;
    /// assert_eq!(view.hosts.len(), 1);
    /// # Ok(()) }
    /// ```
    pub async fn apply_cluster(&self, request: ClusterRequest) -> Result<ClusterView, Error> {
        match request {
            ClusterRequest::View => self.cluster().await,
        }
    }
}

#[cfg(test)]
pub(crate) use tests::{every_request, every_request_named};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::live::Connect;
    use crate::host::processors::KeysQuery;
    use crate::host::subscriptions::CopyFrom;

    /// One request of every kind, with the optional parts set and unset.
    pub(crate) fn every_request() -> Vec<StreamRequest> {
        use StreamRequest as R;
        let mut append = AppendInput::new([
            EventInput::new("events.example/a").payload(serde_json::json!({"n": 1})),
            EventInput::new("events.example/b").idempotency_key("k"),
        ]);
        append.expected_stream_id = Some("s-1".into());
        vec![
            R::Append(append),
            R::Events(ReadQuery {
                after_offset: 7,
                limit: 20,
                include_ephemeral: true,
            }),
            R::State,
            R::Runtime,
            R::Reset,
            R::Connect(Connect::new()),
            R::Connect(
                Connect::new()
                    .after(3)
                    .key("tail & more")
                    .event_types(["a/b", "c/d"])
                    .condition("payload.n > 1 and $contains(type, ',')")
                    .events_only(),
            ),
            R::Connect(Connect::new().state_only()),
            R::WaitForEvent(WaitFor::new(250)),
            R::WaitForEvent(
                WaitFor::new(1000)
                    .after(4)
                    .event_types(["x/y"])
                    .condition("true"),
            ),
            R::SubscribeToEventsFrom(CopyFrom::new("/src", "k")),
            R::SubscribeToEventsFrom(
                CopyFrom::new("/src", "k")
                    .from_beginning()
                    .event_types(["a/b"])
                    .condition("payload.total > 100")
                    .transform("{'t': payload.total}")
                    .description("big ones")
                    .idempotency_key("setup-1"),
            ),
            R::UnsubscribeFromEvents {
                source_stream_path: "/src".into(),
                subscription_key: "k".into(),
            },
            R::SetSubscriptionCursor {
                subscription_key: "k".into(),
                after_offset: 9,
            },
            R::ResumeSubscription {
                subscription_key: "k".into(),
            },
            R::Redact {
                offset: 3,
                reason: "erasure request".into(),
            },
            R::ConfigureRetention {
                max_age_ms: Some(60_000),
                max_events: None,
            },
            R::SetSubscriptionCursorAndResume {
                subscription_key: "k".into(),
                after_offset: 0,
            },
            R::Processor {
                component: "counter".into(),
            },
            R::ProcessorKeys {
                component: "counter".into(),
                query: KeysQuery::new(),
            },
            R::ProcessorKeys {
                component: "counter".into(),
                query: KeysQuery::new().prefix("a/b c").after("a/b c/1").limit(3),
            },
            R::ProcessorKey {
                component: "counter".into(),
                key: "balance/alice smith?&#%".into(),
            },
            R::VerifyProcessor {
                component: "counter".into(),
            },
            R::ProcessorAt {
                component: "ledger".into(),
                offset: 7,
                keys: None,
            },
            R::EventTrace {
                offset: 3,
                export: false,
            },
            R::EventTrace {
                offset: 9,
                export: true,
            },
            R::ProcessorAt {
                component: "ledger".into(),
                offset: 0,
                keys: Some("balance/a b?&#%".into()),
            },
            R::BackfillProcessor(Backfill::new("counter")),
            R::BackfillProcessor(
                Backfill::new("counter")
                    .after(2)
                    .through(9)
                    .event_types(["a/b"])
                    .condition("true"),
            ),
            R::BackfillReactor(ReactorBackfill::new("welcome.v1")),
            R::BackfillReactor(
                ReactorBackfill::new("welcome.v1")
                    .after(1)
                    .through(4)
                    .event_types(["user-signed-up"])
                    .condition("true"),
            ),
            R::Shadow {
                component: "counter".into(),
            },
            R::PromoteShadow(Promote {
                component: "counter".into(),
                run_held_effects: false,
            }),
            R::PromoteShadow(Promote {
                component: "counter".into(),
                run_held_effects: true,
            }),
            R::DiscardShadow {
                component: "counter".into(),
            },
        ]
    }

    /// [`every_request`] with every component name set to `name` and every
    /// processor key (and key prefix) to `key`.
    pub(crate) fn every_request_named(name: &str, key: &str) -> Vec<StreamRequest> {
        use StreamRequest as R;
        let mut requests = every_request();
        for request in &mut requests {
            match request {
                R::Processor { component }
                | R::VerifyProcessor { component }
                | R::Shadow { component }
                | R::DiscardShadow { component } => *component = name.into(),
                R::ProcessorKeys { component, query } => {
                    *component = name.into();
                    query.prefix = key.into();
                    if query.after.is_some() {
                        query.after = Some(key.into());
                    }
                }
                R::ProcessorKey { component, key: k } => {
                    *component = name.into();
                    *k = key.into();
                }
                R::ProcessorAt {
                    component, keys, ..
                } => {
                    *component = name.into();
                    if keys.is_some() {
                        *keys = Some(key.into());
                    }
                }
                R::BackfillProcessor(b) => b.component = name.into(),
                R::PromoteShadow(p) => p.component = name.into(),
                _ => {}
            }
        }
        requests
    }

    #[test]
    fn a_stream_request_crosses_the_wire_unchanged() {
        for request in every_request() {
            let wire = serde_json::to_string(&request).unwrap();
            let back: StreamRequest = serde_json::from_str(&wire).unwrap();
            assert_eq!(back, request, "{wire}");
        }
    }

    /// An event as the log holds it.
    fn event(offset: u64) -> Event {
        serde_json::from_value(serde_json::json!({
            "offset": offset,
            "type": "events.example/a",
            "payload": {"n": offset},
            "createdAt": "2026-12-04T08:00:00.000Z",
        }))
        .unwrap()
    }

    /// One answer of every kind that travels as one body, with the
    /// optional parts set and unset, and the request it answers.
    fn every_answer() -> Vec<(StreamRequest, StreamAnswer)> {
        use super::super::processors::{DifferingKey, ProcessorFailure, ProcessorStatus};
        use crate::processor::shadow::{HeldEffects, KeyChange, KeysDiff};
        use StreamAnswer as A;
        use StreamRequest as R;
        let output = AppendOutput {
            stream_id: "s-1".into(),
            stream_created_at: "2026-12-04T08:00:00.000Z".into(),
            events: vec![event(2), event(3)],
            rendered: Vec::new(),
            replayed: Vec::new(),
        };
        let component = || "counter".to_string();
        let binary = KeyValue {
            key: "k\u{0}".into(),
            value: vec![0xff, 0, 1],
        };
        let text = KeyValue {
            key: "t".into(),
            value: b"{\"a\":1}".to_vec(),
        };
        let page = ReadOutput {
            stream_id: "s-1".into(),
            stream_created_at: "2026-12-04T08:00:00.000Z".into(),
            max_offset: 3,
            events: vec![serde_json::value::to_raw_value(&event(3)).unwrap()],
        };
        let append = || R::Append(AppendInput::new([EventInput::new("events.example/a")]));
        let shadow = |status: &str, diff: bool| {
            A::Shadow(Box::new(ShadowView {
                component: component(),
                digest: "d2".into(),
                live_digest: "d1".into(),
                status: status.into(),
                checkpoint_offset: 3,
                shadow_offset: 3,
                state_diff: diff
                    .then(|| serde_json::json!([{"op": "add", "path": "/x", "value": 1}])),
                keys_diff: diff.then(|| KeysDiff {
                    added: 1,
                    removed: 0,
                    changed: 0,
                    sample: vec![KeyChange {
                        key: "a".into(),
                        change: "added".into(),
                        live: None,
                        shadow: Some(serde_json::json!("1")),
                    }],
                }),
                held_effects: HeldEffects::default(),
                error: (!diff).then(|| "the guest trapped".into()),
            }))
        };
        let shadow_request = || R::Shadow {
            component: component(),
        };
        vec![
            (
                append(),
                A::Appended {
                    output: output.clone(),
                    warnings: vec![],
                },
            ),
            (
                append(),
                A::Appended {
                    output,
                    warnings: vec!["component \"ghost\" is not deployed".into()],
                },
            ),
            (
                R::Events(ReadQuery {
                    after_offset: 2,
                    limit: 10,
                    include_ephemeral: false,
                }),
                A::Events(page),
            ),
            (R::Reset, A::Reset),
            (
                R::WaitForEvent(WaitFor::new(100)),
                A::Event(Box::new(event(4))),
            ),
            (
                R::UnsubscribeFromEvents {
                    source_stream_path: "/src".into(),
                    subscription_key: "k".into(),
                },
                A::Unsubscribed(Unsubscribed::Removed {
                    subscription_removed_event: Box::new(event(5)),
                }),
            ),
            (
                R::UnsubscribeFromEvents {
                    source_stream_path: "/src".into(),
                    subscription_key: "k".into(),
                },
                A::Unsubscribed(Unsubscribed::AlreadyAbsent),
            ),
            (
                R::SetSubscriptionCursor {
                    subscription_key: "k".into(),
                    after_offset: 1,
                },
                A::CursorSet(Box::new(event(6))),
            ),
            (
                R::ResumeSubscription {
                    subscription_key: "k".into(),
                },
                A::Resumed(Resumed::Retrying),
            ),
            (
                R::ResumeSubscription {
                    subscription_key: "k".into(),
                },
                A::Resumed(Resumed::Resumed(Box::new(event(7)))),
            ),
            (
                R::Redact {
                    offset: 3,
                    reason: "r".into(),
                },
                A::Redacted(Box::new(super::super::redact::Redacted {
                    event: event(3).redacted("2026-12-05T00:00:00.000Z", "r"),
                    redacted_event: event(8),
                })),
            ),
            (
                R::SetSubscriptionCursorAndResume {
                    subscription_key: "k".into(),
                    after_offset: 1,
                },
                A::CursorSetAndResumed(Box::new(CursorSetAndResumed {
                    cursor_set: event(8),
                    resumed: event(9),
                })),
            ),
            (
                R::Processor {
                    component: component(),
                },
                A::Processor(Box::new(ProcessorInstance {
                    component: component(),
                    digest: Some("d1".into()),
                    stream_id: "s-1".into(),
                    checkpoint_offset: 3,
                    state: Some(serde_json::json!({"count": 3})),
                    status: ProcessorStatus::Halted,
                    last_error: Some("trap".into()),
                    last_failure: Some(ProcessorFailure {
                        failed_at: "2026-12-04T08:00:00.000Z".into(),
                        offset: Some(3),
                        message: "trap".into(),
                        repro: None,
                        resolved: false,
                    }),
                    updated_at: None,
                })),
            ),
            (
                R::ProcessorKeys {
                    component: component(),
                    query: KeysQuery::default(),
                },
                A::Keys(KeysPage {
                    keys: vec![binary.clone(), text.clone()],
                    next_after: Some("t".into()),
                }),
            ),
            (
                R::ProcessorKey {
                    component: component(),
                    key: "k".into(),
                },
                A::Key(binary.clone()),
            ),
            (
                R::ProcessorAt {
                    component: component(),
                    offset: 3,
                    keys: None,
                },
                A::StateAt(Box::new(StateAt {
                    component: component(),
                    digest: "d1".into(),
                    offset: 3,
                    state: serde_json::json!({"count": 3}),
                    keys: None,
                    keys_truncated: false,
                })),
            ),
            (
                R::ProcessorAt {
                    component: component(),
                    offset: 3,
                    keys: Some("".into()),
                },
                A::StateAt(Box::new(StateAt {
                    component: component(),
                    digest: "d1".into(),
                    offset: 3,
                    state: serde_json::Value::Null,
                    keys: Some(vec![text; 2]),
                    keys_truncated: true,
                })),
            ),
            (
                R::VerifyProcessor {
                    component: component(),
                },
                A::Verification(Box::new(Verification {
                    component: component(),
                    digest: "d1".into(),
                    checkpoint_offset: 3,
                    matches: false,
                    stored_state: serde_json::json!(1),
                    refolded_state: serde_json::json!(2),
                    keys_compared: 4,
                    first_differing_key: Some(DifferingKey {
                        key: "k".into(),
                        stored: None,
                        refolded: Some(vec![0xfe]),
                    }),
                    redacted_offsets: vec![2],
                })),
            ),
            (
                R::BackfillProcessor(Backfill::new(component())),
                A::Backfilled(Backfilled {
                    scanned: 3,
                    folded: 2,
                    effects_created: 1,
                    effects_existing: 0,
                }),
            ),
            (shadow_request(), shadow("ready", true)),
            (shadow_request(), shadow("failed", false)),
            (
                R::DiscardShadow {
                    component: component(),
                },
                A::ShadowEnded(ShadowEnded {
                    component: component(),
                    digest: "d2".into(),
                    outcome: "discarded".into(),
                    checkpoint_offset: None,
                    effects_stored: None,
                }),
            ),
        ]
    }

    /// A request forwarded to a stream's owner comes back as the answer
    /// the owner gave: every kind of answer reads back from its JSON as
    /// itself (its JSON again is the same, and the typed parts are equal).
    #[test]
    fn an_answer_crosses_the_wire_unchanged() {
        for (request, answer) in every_answer() {
            let wire = serde_json::to_value(&answer).unwrap();
            let back = StreamAnswer::from_json(&request, wire.clone())
                .unwrap_or_else(|e| panic!("{wire}: {e}"));
            assert_eq!(serde_json::to_value(&back).unwrap(), wire);
            match (&answer, &back) {
                (StreamAnswer::Key(a), StreamAnswer::Key(b)) => assert_eq!(a, b),
                (StreamAnswer::Keys(a), StreamAnswer::Keys(b)) => assert_eq!(a, b),
                (StreamAnswer::Verification(a), StreamAnswer::Verification(b)) => assert_eq!(a, b),
                (
                    StreamAnswer::Appended {
                        output: a,
                        warnings: w,
                    },
                    StreamAnswer::Appended {
                        output: b,
                        warnings: v,
                    },
                ) => {
                    assert_eq!((a, w), (b, v))
                }
                (StreamAnswer::Resumed(a), StreamAnswer::Resumed(b)) => assert_eq!(a, b),
                (StreamAnswer::Shadow(a), StreamAnswer::Shadow(b)) => assert_eq!(a, b),
                (StreamAnswer::StateAt(a), StreamAnswer::StateAt(b)) => assert_eq!(a, b),
                (a, b) => assert_eq!(a.kind(), b.kind()),
            }
        }
    }

    /// A live connection is a stream of batches: it has no one answer to
    /// read back (the HTTP layer relays it from the owner).
    #[test]
    fn a_live_connection_has_no_answer_to_read_back() {
        let read = StreamAnswer::from_json(
            &StreamRequest::Connect(Connect::new()),
            serde_json::json!({}),
        );
        let Err(e) = read else {
            panic!("a live connection read back from JSON");
        };
        assert!(e.to_string().contains("stream of batches"), "{e}");
    }
}
