//! Sends a copy batch to the receiving stream's actor, which checks the
//! fence, drops cycles, transforms and appends (`delivery/copy.rs`).

use super::Attempt;
use crate::delivery::copy::CopyBatch;
use crate::delivery::select::Selection;
use crate::delivery::Failure;
use crate::stream::StreamAddress;

/// Delivers the batch; answers the cursor after what it delivered (less
/// than the selection's when the transform throws on an event after the
/// first: see [`CopyBatch::cut_before_failing`]).
pub async fn send(
    Attempt { exec, job, source }: Attempt<'_>,
    selection: Selection,
    receiver: &StreamAddress,
    transform: Option<String>,
) -> Result<u64, Failure> {
    let mut through = selection.through;
    let mut batch = CopyBatch {
        source: source.info.clone(),
        subscription_key: job.key.clone(),
        generation: job.generation,
        transform,
        events: selection.events,
        shaped: None,
    };
    if batch.transform.is_some() {
        // The transform runs here, on a blocking thread, not in the
        // receiving stream's actor.
        let bounds = exec.bounds;
        batch = super::blocking(move || {
            batch.shape(bounds);
            Ok(batch)
        })
        .await?;
        if let Some(before) = batch.cut_before_failing() {
            through = before;
        }
    }
    exec.streams
        .deliver(receiver, batch)
        .await
        .map(|_| through)
        .map_err(|e| {
            Failure::new(
                format!("{} failed: {}", job.route.target.label(), e.message),
                // What the same batch meets again halts at once (a
                // reactor's final refusal among it; its refusal for now,
                // `reactor-unavailable`, is retried).
                !matches!(
                    e.code,
                    "stale-delivery"
                        | "jsonata-limit-exceeded"
                        | "transform-failed"
                        | "too-large"
                        | "reactor-failed"
                ),
            )
        })
}
