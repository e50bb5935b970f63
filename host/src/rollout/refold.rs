//! Refold after `PUT .../components/{name}?refold=true`: each processor
//! instance of the component is folded again from the new version's initial
//! state, in the background, while the old state keeps serving reads and the
//! live wakes keep running the checkpoint's (old) version. When the refold
//! has caught up with the live checkpoint, the new state, its checkpoint,
//! the new digest and the refold's effects (deduplicated by identity) are
//! committed in one write guarded by the live checkpoint it replaces: the
//! switch is atomic, and if a wake moved the checkpoint meanwhile the refold
//! folds the rest and tries again.
//!
//! The effect gate: the refold's effects for events at or below the old
//! version's checkpoint are dropped (they ran under the old version); only
//! later events produce effects, unless the deploy asked
//! `replayEffects=true` (`pending_refolds.replay_effects`).
//!
//! The deploy records the refold (`pending_refolds`) in its own transaction;
//! the record goes when every instance is done, so a refold cut short by a
//! restart starts again at the next start ([`resume_pending`]).

use crate::actor::Streams;
use crate::clock::format_timestamp;
use crate::delivery::Failure;
use crate::filter::CompiledFilter;
use crate::processor::backfill::RangeFold;
use crate::processor::refold::switched;
use crate::processor::wake::{consumed, Guest};
use crate::storage::{Checkpoint, NewEffect, WriteOp};
use crate::stream::StreamAddress;

/// Rounds of "fold the rest, try to switch" before a refold gives up.
const SWITCH_ROUNDS_MAX: usize = 50;

/// Starts the refold of every instance of `component` in `project` with
/// version `digest` (recorded in `pending_refolds` by its deploy). When
/// every instance is done the record goes; if a newer refold was asked for
/// meanwhile, it starts then. Answers the source paths being refolded.
pub fn start<'a>(
    streams: &'a Streams,
    project: &'a str,
    component: &'a str,
    digest: &'a str,
    timeout_ms: u64,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<Vec<String>>> + Send + 'a>> {
    Box::pin(start_inner(streams, project, component, digest, timeout_ms))
}

async fn start_inner(
    streams: &Streams,
    project: &str,
    component: &str,
    digest: &str,
    timeout_ms: u64,
) -> anyhow::Result<Vec<String>> {
    let storage = streams.storage().clone();
    let (p, c) = (project.to_string(), component.to_string());
    let paths = tokio::task::spawn_blocking(move || storage.processor_instances(&p, &c)).await??;
    let refolds = streams.executors().refolds.clone();
    let mut instances = tokio::task::JoinSet::new();
    let mut busy = false;
    for path in &paths {
        let key = (project.to_string(), path.clone(), component.to_string());
        if !refolds.mark(key.clone()) {
            // Under way with an older version: its end starts this one.
            busy = true;
            continue;
        }
        let (streams, refolds, component, digest) = (
            streams.clone(),
            refolds.clone(),
            component.to_string(),
            digest.to_string(),
        );
        let address =
            StreamAddress::new(crate::stream::Namespace::Project(project.to_string()), path)?;
        instances.spawn(async move {
            match refold(&streams, &address, &component, &digest, timeout_ms).await {
                Ok(through) => {
                    tracing::info!(stream = %address, component, through, "refold switched")
                }
                Err(e) => tracing::warn!(stream = %address, component, error = %e.message,
                    "refold failed; the instance continues from its checkpoint"),
            }
            refolds.clear(&key);
            // Wakes that waited on the old version may go on.
            streams.wake(&address).await;
        });
    }
    if !busy {
        let (streams, project, component, digest) = (
            streams.clone(),
            project.to_string(),
            component.to_string(),
            digest.to_string(),
        );
        tokio::spawn(async move {
            while instances.join_next().await.is_some() {}
            finish(&streams, &project, &component, &digest, timeout_ms).await;
        });
    }
    Ok(paths)
}

/// Records a refold with `digest` done; starts the newer one asked for
/// meanwhile, if any.
async fn finish(streams: &Streams, project: &str, component: &str, digest: &str, timeout_ms: u64) {
    let done = WriteOp::RefoldDone {
        project: project.to_string(),
        name: component.to_string(),
        digest: digest.to_string(),
    };
    if let Ok(Err(e)) = streams.storage().submit(done).await {
        tracing::warn!(component, error = %e, "recording a finished refold failed");
    }
    let storage = streams.storage().clone();
    let pending = tokio::task::spawn_blocking(move || storage.pending_refolds())
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    if let Some((_, _, newer)) = pending
        .into_iter()
        .find(|(p, n, _)| p == project && n == component)
    {
        if let Err(e) = start(streams, project, component, &newer, timeout_ms).await {
            tracing::warn!(component, error = %e, "starting a refold failed");
        }
    }
}

/// At start: the refolds a previous process did not finish.
pub async fn resume_pending(streams: &Streams, timeout_ms: u64) {
    let storage = streams.storage().clone();
    let pending = match tokio::task::spawn_blocking(move || storage.pending_refolds()).await {
        Ok(Ok(p)) => p,
        _ => return,
    };
    for (project, component, digest) in pending {
        tracing::info!(
            project,
            component,
            "resuming a refold cut short by a restart"
        );
        if let Err(e) = start(streams, &project, &component, &digest, timeout_ms).await {
            tracing::warn!(component, error = %e, "resuming a refold failed");
        }
    }
}

/// Longest a host waits for a stream's owner to refold an instance.
const REMOTE_REFOLD_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Refolds one instance; answers the offset it switched at. With several
/// hosts the stream's owner refolds it (its switch carries the owner's
/// lease): a stream owned elsewhere is sent there.
async fn refold(
    streams: &Streams,
    address: &StreamAddress,
    component: &str,
    digest: &str,
    timeout_ms: u64,
) -> Result<u64, Failure> {
    match streams.fence(address).await {
        Err(e) if e.owner_url.as_deref().is_some_and(|u| !u.is_empty()) => {
            let call = crate::actor::remote::Call::Refold {
                component: component.to_string(),
                digest: digest.to_string(),
                timeout_ms,
            };
            streams
                .call_owner(address, e, call, REMOTE_REFOLD_WAIT)
                .await
                .map_err(|e| Failure::new(e.message, true))
        }
        Err(e) => Err(Failure::new(e.message, true)),
        Ok(fence) => refold_fenced(streams, address, fence, component, digest, timeout_ms).await,
    }
}

/// Refolds one instance on this host (its owner, asked by another host);
/// answers the offset it switched at.
pub async fn refold_here(
    streams: &Streams,
    address: &StreamAddress,
    component: &str,
    digest: &str,
    timeout_ms: u64,
) -> Result<u64, Failure> {
    let fence = streams
        .fence(address)
        .await
        .map_err(|e| Failure::new(e.message, true))?;
    refold_fenced(streams, address, fence, component, digest, timeout_ms).await
}

/// Refolds one instance of a stream this host holds under `fence`.
async fn refold_fenced(
    streams: &Streams,
    address: &StreamAddress,
    fence: Option<crate::storage::Fence>,
    component: &str,
    digest: &str,
    timeout_ms: u64,
) -> Result<u64, Failure> {
    let state = streams
        .state(address)
        .await
        .map_err(|e| Failure::new(e.message, true))?;
    let subscription = state
        .subscriptions
        .outbound
        .by_key
        .values()
        .find(|s| {
            s.configuration.receiver.action() == "processor-wake"
                && s.configuration.receiver.component().as_deref() == Some(component)
        })
        .cloned()
        .ok_or_else(|| Failure::new("no processor-wake subscription wakes it", false))?;
    let exec = streams.executors().clone();
    let filter = CompiledFilter::for_subscription(&subscription, exec.bounds.jsonata)
        .map_err(|m| Failure::new(m, false))?;
    let project = address.namespace.storage_key().to_string();
    let path = address.path.clone();
    let component = component.to_string();
    let wanted = digest.to_string();
    let clock = streams.clock();
    let through = tokio::task::spawn_blocking(move || -> Result<u64, Failure> {
        let storage = &exec.storage;
        let runtime = &exec.runtime;
        let io = |e: anyhow::Error| Failure::new(format!("{e:#}"), true);
        let row = storage
            .load_stream(&project, &path)
            .map_err(io)?
            .ok_or_else(|| Failure::new("the stream is gone", false))?;
        let (prepared, _) = crate::processor::deployed(storage, runtime, &project, &component)
            .map_err(io)?
            .ok_or_else(|| Failure::new("the component is not deployed", false))?;
        if prepared.digest != wanted {
            return Err(Failure::new(
                format!(
                    "version {wanted} was replaced by {} before its refold",
                    prepared.digest
                ),
                false,
            ));
        }
        // The effect gate: unless the deploy asked to replay them, the
        // effects of events the old version already folded are dropped
        // (they ran under it); only later events' are stored.
        let replay = storage
            .refold_replays_effects(&project, &component, &wanted)
            .map_err(io)?;
        let guest = |e| Failure::new(format!("{component}: {e}"), false);
        let announcement = runtime
            .describe(&component, &prepared, timeout_ms)
            .map_err(guest)?;
        let initial = runtime
            .initial_state(&component, &prepared, timeout_ms)
            .map_err(guest)?;
        // The new version's keyed state: a scratch bucket in storage,
        // which the switch makes the instance's (the old one's rows go with
        // it). Retention removed what the instance's base folded: start
        // there.
        let (mut shadow, mut shadow_through, scratch) = crate::processor::backfill::scratch_start(
            storage,
            row.row_id,
            &state.stream_id,
            initial,
            crate::storage::ScratchInstance {
                project: project.clone(),
                path: path.clone(),
                component: component.clone(),
                digest: wanted.clone(),
                purpose: "refold".to_string(),
            },
        )?;
        let fold = RangeFold {
            guest: Guest {
                runtime,
                prepared: &prepared,
                component: &component,
                timeout_ms,
                output: None,
            },
            storage,
            row_id: row.row_id,
            stream: crate::processor::stream_info(&state, row.log_head),
            filter: consumed(filter, &announcement),
            narrow: None,
            spill: Some(&scratch),
        };
        // Each batch's effects with the range it folded, (after, through]:
        // at the switch those within the old version's checkpoint go.
        let mut effects: Vec<(u64, u64, Vec<NewEffect>)> = Vec::new();
        let mut target = row.log_head;
        for _ in 0..SWITCH_ROUNDS_MAX {
            let live = storage
                .checkpoint(row.row_id, &component)
                .map_err(io)?
                .filter(|c| c.stream_id == state.stream_id)
                .ok_or_else(|| Failure::new("the instance's checkpoint is gone", false))?;
            target = target.max(live.checkpoint_offset);
            // (A run that fails drops the scratch bucket with `scratch`:
            // the refold starts again from its beginning.)
            if !replay && shadow_through < live.checkpoint_offset {
                // History the old version folded: its effects ran then.
                let (next, progress, bucket) = fold.run(
                    shadow,
                    shadow_through,
                    live.checkpoint_offset,
                    scratch.bucket(),
                    |_, _| Ok(()),
                )?;
                scratch.spill(bucket)?;
                shadow = next;
                shadow_through = progress.through.max(shadow_through);
            }
            if shadow_through < target {
                let mut after = shadow_through;
                let (next, progress, bucket) = fold.run(
                    shadow,
                    shadow_through,
                    target,
                    scratch.bucket(),
                    |batch, at| {
                        effects.push((after, at.through, batch));
                        after = at.through;
                        Ok(())
                    },
                )?;
                scratch.spill(bucket)?;
                shadow = next;
                shadow_through = progress.through.max(shadow_through);
            }
            if shadow_through < live.checkpoint_offset {
                continue;
            }
            // Batches the old version has folded since (its checkpoint
            // moved on while this one folded) ran their effects under it
            // too. (A batch that straddles its checkpoint keeps its
            // effects: at least once.)
            let gate = live.checkpoint_offset;
            let kept: Vec<NewEffect> = effects
                .iter()
                .filter(|(_, through, _)| replay || *through > gate)
                .flat_map(|(_, _, batch)| batch.iter().cloned())
                .collect();
            let now = clock.now_ms();
            let switch = Checkpoint {
                row_id: row.row_id,
                project: project.clone(),
                path: path.clone(),
                component: component.clone(),
                stream_id: state.stream_id.clone(),
                previous_offset: Some(live.id()),
                offset: shadow_through,
                state: shadow.clone(),
                digest: prepared.digest.clone(),
                effects: kept,
                bucket: scratch.id(),
                keys: Default::default(),
                drop_bucket: Some(live.bucket).filter(|b| *b != 0),
                adopts_scratch: true,
                updated_at: format_timestamp(now),
                now_ms: now,
                // Guarded by the live checkpoint it replaces (its version
                // included) and by the owner's lease: a wake and this
                // switch cannot both win, and a deposed owner's switch
                // commits nothing.
                fence: fence.clone(),
            };
            if switched(storage, switch)? {
                scratch.adopted();
                return Ok(shadow_through);
            }
        }
        Err(Failure::new(
            format!("the live processor kept moving for {SWITCH_ROUNDS_MAX} rounds"),
            true,
        ))
    })
    .await
    .map_err(|e| Failure::new(format!("the refold panicked: {e}"), true))??;
    streams.executors().effects.ring();
    Ok(through)
}
