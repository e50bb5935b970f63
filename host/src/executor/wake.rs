//! Wakes a processor: folds the events after its checkpoint and commits the
//! new checkpoint, state and effects in one transaction, both on one
//! blocking thread (`wasm/src/wake.rs`, `Storage::commit_blocking`). A failure is kept whole, with its `wasmtime`
//! repro command, as the processor's last failure
//! (`:processors/{component}` → `lastFailure`); the halt fact carries only
//! the capped message.

use super::{blocking, Executors, Source};
use crate::clock::format_timestamp;
use crate::delivery::schedule::{Delivered, Job};
use crate::delivery::Failure;
use crate::processor::runtime::StreamInfo;
use crate::processor::wake::{wake, Seen, WakeJob};
use crate::storage::{ProcessorFailure, WriteOp};

pub async fn send(
    exec: &Executors,
    job: &Job,
    source: &Source,
    project: &str,
    component: &str,
    gate: std::sync::Arc<super::Gate>,
) -> Result<Delivered, Failure> {
    let seen = std::sync::Arc::new(Seen::default());
    let wake_job = WakeJob {
        storage: exec.storage.clone(),
        runtime: exec.runtime.clone(),
        row_id: source.row_id,
        project: project.to_string(),
        component: component.to_string(),
        stream: StreamInfo {
            project_id: source.info.project_id.clone(),
            path: source.info.path.clone(),
            stream_id: source.info.stream_id.clone(),
            stream_created_at: source.info.stream_created_at.clone(),
            max_offset: job.head,
        },
        head: job.head,
        limit: job.limit,
        filter: job.route.filter.clone(),
        timeout_ms: job.timeout_ms,
        now_ms: job.now_ms,
        pinned: exec.refolds.contains(project, &source.info.path, component),
        fence: source.fence.clone(),
        gate: gate.clone(),
        seen: seen.clone(),
    };
    let storage = exec.storage.clone();
    let stored = exec.stored.clone();
    let owner = project.to_string();
    let name = component.to_string();
    let started = std::time::Instant::now();
    let (telemetry, wall_start) = (&exec.telemetry, std::time::SystemTime::now());
    let result: Result<Delivered, Failure> = async {
        // Fold and commit on one blocking thread: the commit happens right
        // there when the writer is idle (`commit_blocking`), so a wake
        // crosses threads once.
        let (through, has_effects, bytes, offsets) = blocking(move || {
            let woken = wake(wake_job)?;
            crate::storage::faults::stall_first_wake();
            if !gate.begin_commit() {
                // The host gave up on this wake (its deadline passed) and
                // reported it: its late result commits nothing.
                tracing::warn!(component = %name, through = woken.checkpoint.offset, "a late wake result discarded: the host had given up on it");
                return Err(Failure::new(
                    format!("the wake of processor {name:?} finished after the host gave up on it; its result is discarded"),
                    true,
                ));
            }
            // Its keyed writes count against the project's stored bytes
            // (an overwrite or a delete is counted as written until the
            // next count from storage): a project at its bound fails the
            // wake, which is retried like any failure, then halts.
            if stored.max().is_some() {
                stored
                    .admit(&owner, keyed_bytes(&woken.checkpoint.keys))
                    .map_err(|e| {
                        Failure::new(
                            format!("the keyed state of processor {name:?} was not stored: {}", e.message),
                            true,
                        )
                    })?;
            }
            let through = woken.checkpoint.offset;
            let has_effects = !woken.checkpoint.effects.is_empty();
            let bytes = woken.checkpoint.state.len();
            storage
                .commit_blocking(WriteOp::Checkpoint(woken.checkpoint))
                .map_err(|e| {
                    Failure::new(
                        format!("committing the checkpoint of processor {name:?} failed: {e}"),
                        true,
                    )
                })?;
            Ok((through, has_effects, bytes, woken.offsets))
        })
        .await?;
        if has_effects {
            exec.effects.ring();
        }
        Ok(Delivered {
            through,
            offsets,
            bytes,
        })
    }
    .await;
    // The wake's span, under the latest traced event it chose: a failed
    // wake's too, with its error.
    if let Some(span) = seen.trace().and_then(|t| telemetry.begin_at(t, wall_start)) {
        let mut record =
            crate::telemetry::Record::of_path(source.info.project_id.as_deref(), &source.info.path)
                .with("streamhost.processor", component.to_string())
                .with("streamhost.wake.seconds", started.elapsed().as_secs_f64());
        match &result {
            Ok(d) => {
                record = record
                    .with(
                        "streamhost.offset.first",
                        d.offsets.first().copied().unwrap_or(0) as i64,
                    )
                    .with("streamhost.offset.last", d.through as i64);
            }
            Err(f) => record.error = Some(f.message.clone()),
        }
        let (lines, more) = seen.output.take();
        record.events = lines
            .into_iter()
            .map(|l| (format!("{}: {}", l.stream, l.text), l.at))
            .collect();
        record.dropped_events = more;
        telemetry.end(
            span,
            "wake",
            opentelemetry::trace::SpanKind::Consumer,
            record,
        );
    }
    exec.metrics.observe_wake(started.elapsed());
    exec.wakes_ended.send_modify(|n| *n = n.wrapping_add(1));
    let Err(mut failure) = result else {
        return result;
    };
    let record = ProcessorFailure {
        row_id: source.row_id,
        component: component.to_string(),
        stream_id: source.info.stream_id.clone(),
        failed_at: format_timestamp(job.now_ms),
        offset: failure.single_offset.or(failure.at_offset),
        message: failure.message.clone(),
        repro: failure.detail.take(),
    };
    if record.repro.is_some() {
        failure.message = format!(
            "{}; the command that reproduces it is the processor's lastFailure.repro",
            failure.message
        );
    }
    // Best effort: the failure itself is what the run reports.
    let _ = exec.storage.submit(WriteOp::ProcessorFailure(record)).await;
    Err(failure)
}

/// The bytes a fold's keyed writes store: each written key and value.
fn keyed_bytes(writes: &crate::storage::KeyWrites) -> u64 {
    writes
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k.len() + v.len()) as u64))
        .sum()
}
