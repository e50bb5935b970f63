//! streamhost: durable event streams on SQLite (or PostgreSQL for several
//! hosts) with sandboxed WebAssembly processors, served over HTTP or
//! embedded in a Rust program.
//!
//! # Embedding
//!
//! [`Host::open`] with a [`Config`] opens a data directory; every operation
//! of the HTTP API is then a typed method of [`Host`], with inputs built
//! with builders, outputs as structs and failures as [`Error`] (a
//! [`ErrorKind`] and the HTTP API's code):
//!
//! - streams: [`Host::stream`], [`Host::append`], [`Host::events`],
//!   [`Host::state`], [`Host::runtime`], [`Host::list_streams`],
//!   [`Host::reset`];
//! - subscriptions: [`Host::subscribe`] (any receiver, with a
//!   [`Subscription`]), [`Host::subscribe_to_events_from`],
//!   [`Host::unsubscribe_from_events`], [`Host::set_subscription_cursor`],
//!   [`Host::resume_subscription`];
//! - live connections and waits: [`Host::connect`] (a `Stream` of
//!   [`Live`] batches), [`Host::wait_for_event`];
//! - components and processors: [`Host::deploy`], [`Host::components`],
//!   [`Host::component_versions`], [`Host::processor`],
//!   [`Host::processor_keys`], [`Host::verify_processor`],
//!   [`Host::backfill`];
//! - ITX calls: [`Host::call`], [`Host::call_expression`];
//! - effects: [`Host::effects`], [`Host::wait_for_effect`],
//!   [`Host::retry_effect`], [`Host::cancel_effect`];
//! - webhook signatures: [`Host::rotate_webhook_secret`],
//!   [`Host::retire_previous_webhook_secret`];
//! - ingest and hosts: [`Host::ingest`], [`Host::ingest_status`],
//!   [`Host::cluster`];
//! - every operation as one typed request, an enum per family:
//!   [`Host::apply`] with a [`StreamRequest`] (events, subscriptions,
//!   processors), [`Host::apply_component`], [`Host::apply_effect`],
//!   [`Host::apply_itx`], [`Host::apply_ingest`], [`Host::apply_cluster`];
//! - HTTP: [`Host::serve`] on a listener, or [`Host::router`] to mount the
//!   API in an axum application.
//!
//! ```
//! use streamhost::{Config, EventInput, Host};
//!
//! # #[tokio::main] async fn main() -> anyhow::Result<()> {
//! # let dir = tempfile::tempdir()?;
//! # let data = dir.path().to_path_buf();
//! let host = Host::open(Config { data_dir: data, ..Config::default() })?;
//! let orders = host.stream("acme", "/orders/eu")?;
//! host.append(&orders, [EventInput::new("events.example/order-created")]).await?;
//! assert_eq!(host.state(&orders).await?.max_offset, 2);
//! # Ok(()) }
//! ```
//!
//! # Inside
//!
//! A request travels `http` → the stream registry (`actor/registry.rs`) → the
//! stream's actor (`actor/`), which plans appends with the pure
//! [`stream::plan_append`] and reducer ([`stream::CoreState`]), then
//! commits them through the group-commit writer in `storage`.
//! `ARCHITECTURE.md` at the repository root is the map. The host's other
//! modules are private to the crate; the `internals` feature makes them
//! public (undocumented, with no stability promise) for the crate's own
//! benchmarks, end-to-end tests and fuzz targets.

#![warn(missing_docs, unnameable_types)]

/// Declares the host's internal modules: crate-private, or public (and
/// hidden from the docs, with no stability promise) when the `internals`
/// feature is on, which only the crate's own benchmarks, end-to-end tests
/// and fuzz targets turn on.
macro_rules! internal {
    ($($(#[$attr:meta])* $name:ident;)*) => {$(
        $(#[$attr])*
        #[cfg(feature = "internals")]
        #[doc(hidden)]
        pub mod $name;
        $(#[$attr])*
        #[cfg(not(feature = "internals"))]
        pub(crate) mod $name;
    )*};
}

/// Re-exports an internal item: crate-wide, or public (hidden) with the
/// `internals` feature (see [`internal!`]).
macro_rules! internal_use {
    ($($path:tt)*) => {
        #[cfg(feature = "internals")]
        #[doc(hidden)]
        pub use $($path)*;
        #[cfg(not(feature = "internals"))]
        #[allow(unused_imports)]
        pub(crate) use $($path)*;
    };
}

internal! {
    actor;
    auth;
    connection;
    executor;
    http;
    ingest;
    jsonata;
    metrics;
    reactor;
    rollout;
    scaffold;
    telemetry;
}

/// Inputs for the fuzz targets in `fuzz/` (with the `internals` feature).
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod fuzzing;

internal! {
    quota;
}

// The pure core (crate `streamhost-core`): the stream domain is public,
// the decisions beneath the runtime are internal.
pub use streamhost_core::{component, error, event, stream, subscription, trace};
internal_use!(streamhost_core::{clock, delivery, effect, filter, invariant, itx});
// SQLite and PostgreSQL (crate `streamhost-storage`).
internal_use!(streamhost_storage as storage);
// The Wasm runtime and the processors it runs (crate `streamhost-wasm`).
internal_use!(streamhost_wasm as processor);

pub mod cli;
pub mod config;
pub mod host;

pub use actor::{ConnectionView, DeliveryView, Latency, RuntimeView};
pub use clock::{Clock, SystemClock};
pub use component::DeployMode;
pub use config::Config;
pub use error::{Error, ErrorKind};
pub use host::attention::{Attention, StuckSubscription};
pub use host::backfill::{Backfill, BackfillProgress, Backfilled};
pub use host::cluster::{ClusterHost, ClusterView};
pub use host::components::{
    Component, ComponentVersions, Deploy, Deployed, SubscriptionRef, Version,
};
pub use host::effects::{Effect, EffectCause, EffectFilter, EffectStatus, EffectsPage};
pub use host::live::{Batch, Connect, Live, LiveConnection, WaitFor};
pub use host::processors::{
    DifferingKey, KeyValue, KeysPage, KeysQuery, ProcessorFailure, ProcessorInstance,
    ProcessorStatus, StateAt, Verification,
};
pub use host::reactors::{ReactorBackfill, ReactorBackfilled};
pub use host::request::{
    ClusterRequest, ComponentAnswer, ComponentRequest, EffectAnswer, EffectRequest, IngestAnswer,
    IngestRequest, ItxRequest, StreamAnswer, StreamRequest,
};
pub use host::secrets::{PreviousSecretRetired, WebhookSecret};
pub use host::shadows::{HeldEffects, KeyChange, KeysDiff, Promote, ShadowEnded, ShadowView};
pub use host::streams::{StreamSummary, StreamsPage, StreamsQuery};
pub use host::subscriptions::{CopyFrom, CursorSetAndResumed, Resumed, Subscribed, Unsubscribed};
pub use host::Host;
pub use ingest::nats::{BridgeConsumer, BridgeStatus, Diagnostic};
pub use ingest::{
    BlockedStream, HttpIngestStatus, IngestCapacity, IngestStatus, ParkedEvent, ParkedMessage,
    ParkedPage, ParkedQuery,
};
pub use invariant::stop_on_broken_invariant;
/// The global allocator that makes the JSONata allocation budget hold:
/// the system allocator, counting each thread's bytes. The `streamhost`
/// binary installs it; an embedding program that evaluates untrusted
/// JSONata (subscription filters and transforms) installs it too:
///
/// ```
/// #[global_allocator]
/// static ALLOCATOR: streamhost::CountingAllocator = streamhost::CountingAllocator;
/// # fn main() { assert_eq!(vec![1u8; 3].len(), 3); }
/// ```
///
/// Without it, the bounds checked before and after every JSONata built-in
/// still hold; only the budget of values an expression builds step by step
/// (a path over a range, recursion) does not.
pub use jsonata::memory::Counting as CountingAllocator;
pub use storage::{BackupSummary, DroppedEvent, FenceIdentity};
pub use stream::{
    AppendInput, AppendOutput, CoreState, Event, EventInput, Namespace, ReadOutput, ReadQuery,
    StreamAddress,
};
pub use subscription::Subscription;

#[cfg(test)]
mod proptests;
#[cfg(test)]
use streamhost_core::seeded;

/// Unit tests count allocations as the binary does (the JSONata budget).
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;
