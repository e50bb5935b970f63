//! JSONata in the host: the core's bounded engine
//! (`streamhost_core::jsonata`) and the [`pool`] of threads that async
//! callers run evaluations on.

pub use streamhost_core::jsonata::*;

pub mod pool;
