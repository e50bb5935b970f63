//! The pure core of streamhost: what a stream is and how it decides, with
//! no async runtime, database driver, Wasm runtime or HTTP. The host
//! (`streamhost`) runs these decisions at its edges: storage, stream
//! actors, the Wasm runtime, HTTP.
//!
//! From the bottom: [`error`], [`clock`] (the injected clock),
//! [`invariant`] (the failure policy), [`component`] (deploy modes),
//! [`itx`] (ITX expressions), [`jsonata`] (the bounded engine); [`event`]
//! (what callers send and the log holds), [`subscription`] (the model and
//! its builder), [`stream`] (addresses, the reducer, append planning, the
//! validation of control events); [`filter`]; [`delivery`] (the schedule,
//! targets, copies: every delivery decision) and [`effect`] (the outbox's
//! decisions); [`trace`] (W3C trace context).

#![warn(unnameable_types)]

// The modules the `streamhost` crate makes public carry docs on every item.
#[warn(missing_docs)]
pub mod clock;
#[warn(missing_docs)]
pub mod component;
pub mod delivery;
pub mod effect;
#[warn(missing_docs)]
pub mod error;
#[warn(missing_docs)]
pub mod event;
pub mod filter;
pub mod invariant;
pub mod itx;
pub mod jsonata;
#[doc(hidden)]
pub mod seeded;
#[warn(missing_docs)]
pub mod stream;
#[warn(missing_docs)]
pub mod subscription;
#[warn(missing_docs)]
pub mod trace;

/// Unit tests count allocations as the `streamhost` binary does (the
/// JSONata allocation budget).
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: jsonata::memory::Counting = jsonata::memory::Counting;
