//! Folding a processor over a range of its stream outside its wakes, from a
//! given state: backfill (effects only, `:backfillProcessor`) and refold (a
//! new state from the initial one, after `PUT ...?refold=true`). Batches are
//! chosen and folded as a wake chooses and folds them (`wake::fold_events`).
//! Runs on a blocking thread.

use super::keyed::Bucket;
use super::wake::{fold_events, Guest};
use crate::runtime::StreamInfo;
use streamhost_core::delivery::select::select_batch;
use streamhost_core::delivery::{Failure, BATCH_EVENTS_MAX};
use streamhost_core::filter::CompiledFilter;
use streamhost_storage::{NewEffect, Storage};

/// Stored events read per step.
const SCAN_EVENTS_MAX: usize = 1000;

/// A fold over a range of one processor instance's stream.
pub struct RangeFold<'a> {
    pub guest: Guest<'a>,
    pub storage: &'a Storage,
    pub row_id: i64,
    pub stream: StreamInfo,
    /// What the processor sees: its subscription's filter ∩ its `consumes`.
    pub filter: CompiledFilter,
    /// A narrower selection (a backfill's `eventTypes` and condition).
    pub narrow: Option<CompiledFilter>,
    /// Where the fold's writes spill once they are large (a shadow's or a
    /// refold's scratch bucket); `None`: they stay in memory.
    pub spill: Option<&'a super::scratch::Scratch>,
}

/// How far a range fold has come.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Events scanned through this offset.
    pub through: u64,
    /// Stored events looked at.
    pub scanned: u64,
    /// Events folded.
    pub folded: u64,
}

impl RangeFold<'_> {
    /// Folds from `state` and `bucket` (the keyed state) over the committed
    /// events in `(after, through]`; `each` receives every batch's effects
    /// and the progress after it. Answers the final state, progress and
    /// bucket (with the fold's writes).
    pub fn run(
        &self,
        mut state: String,
        after: u64,
        through: u64,
        mut bucket: Bucket,
        mut each: impl FnMut(Vec<NewEffect>, &Progress) -> Result<(), Failure>,
    ) -> Result<(String, Progress, Bucket), Failure> {
        let mut progress = Progress {
            through: after,
            ..Progress::default()
        };
        let label = format!("processor {}", self.guest.component);
        while progress.through < through {
            let cursor = progress.through;
            let stored = self
                .storage
                .events_after(self.row_id, cursor, SCAN_EVENTS_MAX, through)
                .map_err(|e| Failure::new(format!("reading the stream failed: {e:#}"), true))?;
            if stored.is_empty() {
                break;
            }
            let mut selection =
                select_batch(&label, &stored, &self.filter, BATCH_EVENTS_MAX, cursor)?;
            if selection.through == cursor {
                break;
            }
            progress.scanned += stored
                .iter()
                .filter(|(o, _)| *o <= selection.through)
                .count() as u64;
            if let Some(narrow) = &self.narrow {
                let mut kept = Vec::with_capacity(selection.events.len());
                for e in selection.events {
                    let value = serde_json::to_value(&e).unwrap_or_default();
                    let matches =
                        narrow
                            .matches(&e.event_type, &e.payload, &value)
                            .map_err(|m| {
                                Failure::new(
                                    format!("the condition failed on offset {}: {m}", e.offset),
                                    false,
                                )
                            })?;
                    if matches {
                        kept.push(e);
                    }
                }
                selection.events = kept;
            }
            let mut effects = Vec::new();
            if !selection.events.is_empty() {
                let (next, batch_effects, next_bucket) = fold_events(
                    &self.guest,
                    &self.stream,
                    &state,
                    &selection.events,
                    selection.through,
                    bucket,
                )?;
                state = next;
                bucket = match self.spill {
                    Some(scratch) => {
                        scratch.spill_if_full(next_bucket, &state, selection.through)?
                    }
                    None => next_bucket,
                };
                effects = batch_effects;
                progress.folded += selection.events.len() as u64;
            }
            progress.through = selection.through;
            each(effects, &progress)?;
        }
        Ok((state, progress, bucket))
    }
}

/// Where a fold from the beginning starts: the instance's base when
/// retention kept one (its state, offset and keys: the events before it
/// may be gone), else `initial` at offset 0 with no keys.
pub fn fold_start(
    storage: &Storage,
    row_id: i64,
    component: &str,
    stream_id: &str,
    initial: String,
) -> anyhow::Result<(String, u64, Bucket)> {
    let Some(base) = storage
        .processor_base(row_id, component)?
        .filter(|b| b.stream_id == stream_id)
    else {
        return Ok((initial, 0, Bucket::empty()));
    };
    let mut keys = streamhost_storage::KeyWrites::new();
    storage.each_key(base.bucket, |k, v| {
        keys.insert(k, Some(v));
        Ok(())
    })?;
    Ok((base.state, base.offset, Bucket::with_writes(keys)))
}

/// [`fold_start`] for a fold whose keyed state lives in storage (a
/// shadow's, a refold's): the base's keys are copied into a new scratch
/// bucket of `instance` in one write, not read into memory.
pub fn scratch_start(
    storage: &Storage,
    row_id: i64,
    stream_id: &str,
    initial: String,
    instance: streamhost_storage::ScratchInstance,
) -> Result<(String, u64, super::scratch::Scratch), Failure> {
    let base = storage
        .processor_base(row_id, &instance.component)
        .map_err(|e| Failure::new(format!("reading the instance's base: {e:#}"), true))?
        .filter(|b| b.stream_id == stream_id);
    let scratch =
        super::scratch::Scratch::start(storage, instance, base.as_ref().map(|b| b.bucket))?;
    Ok(match base {
        Some(b) => (b.state, b.offset, scratch),
        None => (initial, 0, scratch),
    })
}
