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
            A::CursorSetAndResumed(both) => both.serialize(s),
            A::Processor(instance) => instance.serialize(s),
            A::Keys(page) => page.serialize(s),
            A::Key(key) => key.serialize(s),
            A::Verification(verification) => verification.serialize(s),
            A::StateAt(at) => at.serialize(s),
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
        use StreamAnswer as A;
        use StreamRequest as R;
        Ok(match request {
            R::Append(input) => {
                let resumes = input
                    .events
                    .iter()
                    .any(|e| e.event_type == crate::stream::types::RESUMED);
                self.refuse_wrong_receivers(stream, &input.events).await?;
                let output = self
                    .streams
                    .append(stream, input, Authority::Public)
                    .await?;
                if resumes {
                    // Ingest held behind the pause goes on now.
                    self.ingest.retry_now();
                }
                let warnings = self.undeployed_receivers(stream, &output.events).await;
                A::Appended { output, warnings }
            }
            R::Events(query) => A::Events(self.streams.read(stream, query).await?),
            R::State => A::State(Box::new(self.state(stream).await?)),
            R::Runtime => A::Runtime(self.runtime(stream).await?),
            R::Reset => {
                self.reset(stream).await?;
                A::Reset
            }
            R::Connect(connect) => A::Live(self.connect(stream, connect).await?),
            R::WaitForEvent(wait) => A::Event(Box::new(self.wait_for_event(stream, wait).await?)),
            R::SubscribeToEventsFrom(from) => {
                A::Subscribed(Box::new(self.subscribe_to_events_from(stream, from).await?))
            }
            R::UnsubscribeFromEvents {
                source_stream_path,
                subscription_key,
            } => A::Unsubscribed(
                self.unsubscribe_from_events(stream, &source_stream_path, &subscription_key)
                    .await?,
            ),
            R::SetSubscriptionCursor {
                subscription_key,
                after_offset,
            } => A::CursorSet(Box::new(
                self.set_subscription_cursor(stream, &subscription_key, after_offset)
                    .await?,
            )),
            R::ResumeSubscription { subscription_key } => {
                A::Resumed(self.resume_subscription(stream, &subscription_key).await?)
            }
            R::SetSubscriptionCursorAndResume {
                subscription_key,
                after_offset,
            } => A::CursorSetAndResumed(Box::new(
                self.set_subscription_cursor_and_resume(stream, &subscription_key, after_offset)
                    .await?,
            )),
            R::Processor { component } => {
                A::Processor(Box::new(self.processor(stream, &component).await?))
            }
            R::ProcessorKeys { component, query } => {
                A::Keys(self.processor_keys(stream, &component, query).await?)
            }
            R::ProcessorKey { component, key } => {
                A::Key(self.processor_key(stream, &component, &key).await?)
            }
            R::ProcessorAt {
                component,
                offset,
                keys,
            } => A::StateAt(Box::new(
                self.processor_at(stream, &component, offset, keys).await?,
            )),
            R::VerifyProcessor { component } => {
                A::Verification(Box::new(self.verify_processor(stream, &component).await?))
            }
            R::BackfillProcessor(backfill) => A::Backfilled(self.backfill(stream, backfill).await?),
            R::BackfillReactor(backfill) => {
                A::ReactorBackfilled(self.backfill_reactor(stream, backfill).await?)
            }
            R::Shadow { component } => {
                A::Shadow(Box::new(self.processor_shadow(stream, &component).await?))
            }
            R::PromoteShadow(promote) => {
                A::ShadowEnded(self.promote_shadow(stream, promote).await?)
            }
            R::DiscardShadow { component } => {
                A::ShadowEnded(self.discard_shadow(stream, &component).await?)
            }
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
    /// # host.wait_for_processor(&jobs, "effector", head, std::time::Duration::from_secs(10)).await?; // its effects commit with its checkpoint
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
        self.call_expression(project, &request.expression, request.args)
            .await
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
}
