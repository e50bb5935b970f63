//! streamhost: durable event streams on SQLite, served over HTTP.
//!
//! Start reading at [`host::Host`], which wires the parts together from a
//! [`config::Config`]. A request travels `http` → [`stream::Streams`] (the
//! registry) → the stream's actor (`stream/actor/`), which plans appends
//! with the pure [`stream::plan_append`] and reducer ([`stream::CoreState`]),
//! then commits them through the group-commit writer in [`storage`].
//! `ARCHITECTURE.md` at the repository root is the map.
//!
//! The embedding API: [`Host::open`] with a [`Config`], then
//! [`Host::stream`], [`Host::append`] with [`EventInput`]s,
//! [`Host::events`], [`Host::state`], [`Host::subscribe`] with a
//! [`Subscription`], and [`Host::serve`] for the HTTP API. The modules
//! hidden from these docs are the host's internals: public for its own
//! binary, benchmarks and tests, not a stable API.

#![warn(missing_docs)]

#[doc(hidden)]
pub mod auth;
#[doc(hidden)]
pub mod cli;
#[doc(hidden)]
pub mod clock;
pub mod config;
#[doc(hidden)]
pub mod connection;
#[doc(hidden)]
pub mod delivery;
#[doc(hidden)]
pub mod effect;
pub mod error;
#[doc(hidden)]
pub mod executor;
#[doc(hidden)]
pub mod filter;
#[doc(hidden)]
pub mod fuzzing;
pub mod host;
#[doc(hidden)]
pub mod http;
#[doc(hidden)]
pub mod ingest;
#[doc(hidden)]
pub mod itx;
#[doc(hidden)]
pub mod jsonata;
#[doc(hidden)]
pub mod metrics;
#[doc(hidden)]
pub mod processor;
#[doc(hidden)]
pub mod scaffold;
#[doc(hidden)]
pub mod storage;
pub mod stream;
#[doc(hidden)]
pub mod subscription;

pub use config::Config;
pub use error::{Error, ErrorKind};
pub use host::backfill::{Backfill, BackfillProgress, Backfilled};
pub use host::cluster::{ClusterHost, ClusterView};
pub use host::components::{
    Component, ComponentVersions, Deploy, Deployed, SubscriptionRef, Version,
};
pub use host::effects::{Effect, EffectFilter, EffectStatus, EffectsPage};
pub use host::live::{Batch, Connect, Live, LiveConnection, WaitFor};
pub use host::processors::{
    DifferingKey, KeyValue, KeysPage, KeysQuery, ProcessorFailure, ProcessorInstance,
    ProcessorStatus, Verification,
};
pub use host::request::{StreamAnswer, StreamRequest};
pub use host::streams::{StreamSummary, StreamsPage, StreamsQuery};
pub use host::subscriptions::{CopyFrom, CursorSetAndResumed, Resumed, Subscribed, Unsubscribed};
pub use host::Host;
pub use http::error::ApiError;
pub use ingest::nats::{BridgeStatus, Diagnostic};
pub use ingest::{HttpIngestStatus, IngestCapacity, IngestStatus};
pub use storage::FenceIdentity;
pub use stream::{
    AppendInput, AppendOutput, ConnectionView, CoreState, DeliveryView, Event, EventInput, Latency,
    Namespace, ReadOutput, ReadQuery, RuntimeView, StreamAddress,
};
pub use subscription::Subscription;

#[cfg(test)]
mod proptests;

/// Unit tests count allocations as the binary does (the JSONata budget).
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: jsonata::memory::Counting = jsonata::memory::Counting;
