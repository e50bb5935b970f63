//! Sends a copy batch to the receiving stream's actor, which checks the
//! fence, drops cycles, transforms and appends (`delivery/copy.rs`).

use super::{Executors, Source};
use crate::delivery::copy::CopyBatch;
use crate::delivery::schedule::Job;
use crate::delivery::select::Selection;
use crate::delivery::target::Target;
use crate::delivery::Failure;

pub async fn send(
    exec: &Executors,
    job: &Job,
    source: &Source,
    selection: Selection,
) -> Result<(), Failure> {
    let Target::Copy {
        receiver,
        transform,
    } = &job.route.target
    else {
        unreachable!("a copy job");
    };
    let streams = exec
        .streams
        .upgrade()
        .ok_or_else(|| Failure::new("the host is shutting down", true))?;
    let batch = CopyBatch {
        source: source.info.clone(),
        subscription_key: job.key.clone(),
        generation: job.generation,
        transform: transform.clone(),
        events: selection.events,
    };
    streams
        .deliver(receiver, batch)
        .await
        .map(|_| ())
        .map_err(|e| {
            Failure::new(
                format!("{} failed: {}", job.route.target.label(), e.message),
                e.code != "stale-delivery",
            )
        })
}
