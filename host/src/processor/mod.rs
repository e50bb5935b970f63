//! Wasm processors: components built against `wit/processor.wit`, run by
//! wasmtime (`runtime.rs`), stored per project (`components.rs`), and woken
//! by `processor-wake` subscriptions to fold their stream into a state that
//! is committed with its checkpoint (`stream/actor/delivery.rs`).
//!
//! **Architecture Invariant:** processor state = fold of the stream: the
//! checkpoint (stream id + offset), the state and the effects of a batch
//! commit in one transaction.

pub mod runtime;
pub mod wake;
pub mod wave;
