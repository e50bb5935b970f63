//! streamhost: durable event streams on SQLite, served over HTTP.
//!
//! Start reading at [`host::Host`], which wires the parts together from a
//! [`config::Config`]. A request travels `http` → [`stream::Streams`] (the
//! registry) → the stream's actor (`stream/actor/`), which plans appends
//! with the pure [`stream::plan_append`] and reducer ([`stream::CoreState`]),
//! then commits them through the group-commit writer in [`storage`].
//! `ARCHITECTURE.md` at the repository root is the map.

pub mod auth;
pub mod cli;
pub mod clock;
pub mod config;
pub mod connection;
pub mod delivery;
pub mod effect;
pub mod error;
pub mod executor;
pub mod filter;
pub mod host;
pub mod http;
pub mod ingest;
pub mod itx;
pub mod jsonata;
pub mod metrics;
pub mod processor;
pub mod scaffold;
pub mod storage;
pub mod stream;
pub mod subscription;

pub use config::Config;
pub use error::{Error, ErrorKind};
pub use host::Host;
pub use http::error::ApiError;
pub use stream::{EventInput, StreamAddress};
pub use subscription::Subscription;
