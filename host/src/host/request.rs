//! Every operation on a stream as one typed request: an adapter parses
//! what it received once into a [`StreamRequest`] (HTTP's
//! `{stream}:method` URLs in `http/mod.rs`), [`Host::apply`] carries it out
//! and answers a [`StreamAnswer`], and the adapter renders that. The
//! request is where a method's name, its inputs and who may make it are
//! decided, in one place.

use super::backfill::{Backfill, Backfilled};
use super::live::{Connect, LiveConnection, WaitFor};
use super::processors::{KeyValue, KeysPage, KeysQuery, ProcessorInstance, Verification};
use super::subscriptions::{CopyFrom, CursorSetAndResumed, Resumed, Subscribed, Unsubscribed};
use super::Host;
use crate::error::Error;
use crate::stream::{
    AppendInput, AppendOutput, Authority, CoreState, Event, ReadOutput, ReadQuery, RuntimeView,
    StreamAddress,
};

/// One operation on a stream.
#[derive(Debug, Clone, PartialEq)]
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
}

impl StreamRequest {
    /// Whether only an admin may make it.
    pub fn admin_only(&self) -> bool {
        matches!(self, StreamRequest::Reset)
    }
}

/// What a [`StreamRequest`] answers, one variant per kind of answer.
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
    /// What a backfill came to.
    Backfilled(Backfilled),
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
                let output = self
                    .streams
                    .append(stream, input, Authority::Public)
                    .await?;
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
            R::VerifyProcessor { component } => {
                A::Verification(Box::new(self.verify_processor(stream, &component).await?))
            }
            R::BackfillProcessor(backfill) => A::Backfilled(self.backfill(stream, backfill).await?),
        })
    }
}
