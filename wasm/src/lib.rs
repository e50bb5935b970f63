//! The Wasm runtime of streamhost and the processors it runs: components
//! built against `wit/processor.wit`, compiled once per digest and cached
//! (`compiled.rs`, `cache.rs`), run by wasmtime under bounds of memory, time
//! and per-project places (`runtime.rs`, `share.rs`), folding their stream
//! into a state committed with its checkpoint (`wake.rs`), over ranges
//! (`backfill.rs`), beside the live version (`shadow.rs`), with keyed state
//! (`keyed.rs`). The host (crate `streamhost`) re-exports this crate as its
//! `processor` module and decides when a processor wakes.
//!
//! **Architecture Invariant:** processor state = fold of the stream: the
//! checkpoint (stream id + offset), the state and the effects of a batch
//! commit in one transaction.

pub mod ahead;
pub mod backfill;
pub mod cache;
pub mod check;
pub mod compiled;
pub mod contract;
pub mod keyed;
pub mod output;
pub mod refold;
pub mod runtime;
pub mod scratch;
pub mod shadow;
pub mod share;
mod turns;
pub mod value;
pub mod wake;
pub mod wave;

use std::sync::Arc;

use streamhost_storage::{ComponentRow, Storage};

/// The stream a fold sees (its WIT `stream-info`), from its core state,
/// with `max_offset` as the head of the range being folded.
pub fn stream_info(
    state: &streamhost_core::stream::CoreState,
    max_offset: u64,
) -> runtime::StreamInfo {
    runtime::StreamInfo {
        project_id: state.project_id.clone(),
        path: state.path.clone(),
        stream_id: state.stream_id.clone(),
        stream_created_at: state.created_at.clone(),
        max_offset,
    }
}

/// The deployed component `name` of `project`, compiled and linked (cached
/// per digest); `None` when it is not deployed.
pub fn deployed(
    storage: &Storage,
    runtime: &runtime::Runtime,
    project: &str,
    name: &str,
) -> anyhow::Result<Option<(Arc<runtime::Prepared>, ComponentRow)>> {
    let Some(row) = storage.component(project, name)? else {
        return Ok(None);
    };
    let digest = row.digest.clone();
    let bytes_storage = storage.clone();
    let prepared = runtime.prepare(&row.digest, move || bytes_storage.component_bytes(&digest))?;
    runtime.note_current(project, name, &row.digest);
    Ok(Some((prepared, row)))
}
