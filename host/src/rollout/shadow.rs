//! Shadow versions (`PUT .../components/{name}?refold=shadow`): the new
//! version folds every instance beside the live one, from its initial
//! state, while the live version keeps serving and waking. A shadow's state,
//! keyed state and effects live in the memory of the host that folds it
//! (its effects are held, never run); its record (`pending_refolds.shadow`)
//! pins every instance's wakes to the version of its checkpoint, so an
//! instance's promotion (one checkpoint write guarded by the live checkpoint
//! it replaces, as a refold's switch) moves that instance alone to the new
//! version. When no instance shadows any more the record goes; if any
//! instance was promoted the version becomes the component's current one
//! (as a plain deploy of it: instances still on the old version take it over
//! at their checkpoint).
//!
//! A restart folds the shadows again from the start (the record survives;
//! the folds are memory); an instance already on the shadow's version
//! counts as promoted. A host asked about a shadow it does not fold (the
//! deploy went through another host) starts folding it then.

use std::sync::Arc;
use std::time::Duration;

use crate::actor::Streams;
use crate::clock::format_timestamp;
use crate::delivery::Failure;
use crate::processor::shadow::*;
use crate::storage::{CheckpointRow, Storage, WriteOp};
use crate::stream::{Namespace, StreamAddress};

/// How often a shadow looks for what the live version folded since.
/// Every this many steps a shadow checks that its record still names its
/// version (another host may have replaced or ended it).
const RECORD_CHECK_STEPS: u32 = 25;

const FOLLOW_EVERY: Duration = Duration::from_millis(200);

/// The longest a shadow waits after steps that failed in a row.
const RETRY_EVERY_MAX: Duration = Duration::from_secs(60);

/// The wait before a shadow's next step after `failures` steps in a row
/// failed (retryably): [`FOLLOW_EVERY`], doubled per failure up to
/// [`RETRY_EVERY_MAX`]. A version that times out on every step (a loop)
/// costs its project a step a minute, not five a second.
fn next_step_after(failures: u32) -> Duration {
    FOLLOW_EVERY
        .saturating_mul(1u32.checked_shl(failures.min(16)).unwrap_or(u32::MAX))
        .min(RETRY_EVERY_MAX)
}

/// Starts a shadow of `digest` for every instance of `component` in
/// `project` (recorded by its deploy); answers the source paths shadowed.
/// A shadow of another version this host folds stops (a deploy stops the
/// component's shadows first); one of `digest` goes on (after a restart, a
/// view of the shadow may have started it before this resumes it: folding
/// it twice would replace the first fold's keyed state under it).
pub async fn start(
    streams: &Streams,
    project: &str,
    component: &str,
    digest: &str,
    timeout_ms: u64,
) -> anyhow::Result<Vec<String>> {
    let shadows = streams.executors().shadows.clone();
    let storage = streams.storage().clone();
    let (p, c) = (project.to_string(), component.to_string());
    let paths = tokio::task::spawn_blocking(move || storage.processor_instances(&p, &c)).await??;
    let mut shadowing = Vec::new();
    let mut promoted = false;
    for path in paths {
        let storage = streams.storage().clone();
        let (p, c, at) = (project.to_string(), component.to_string(), path.clone());
        let live =
            tokio::task::spawn_blocking(move || live_checkpoint_by_path(&storage, &p, &at, &c))
                .await??;
        if live.as_ref().is_some_and(|l| l.digest == digest) {
            // On the shadow's version already (promoted before a restart).
            promoted = true;
            continue;
        }
        let key = Shadows::key(project, &path, component);
        let (instance, new) = shadows.register(key, digest, live.map(|l| l.checkpoint_offset));
        if new {
            let address = StreamAddress::new(Namespace::Project(project.to_string()), &path)?;
            let (streams, component) = (streams.clone(), component.to_string());
            tokio::spawn(
                async move { follow(streams, address, component, instance, timeout_ms).await },
            );
        }
        shadowing.push(path);
    }
    if shadowing.is_empty() {
        // Nothing to shadow: every instance is on it, or there is none.
        finish(streams, project, component, digest, promoted).await;
    } else if promoted {
        shadows.promoted_before(project, component);
    }
    Ok(shadowing)
}

/// The shadow of an instance: the one this host folds, or, when the
/// component has a shadow this host does not fold for the instance yet
/// (deployed through another host), one started now. `None`: no shadow.
pub async fn instance(
    streams: &Streams,
    address: &StreamAddress,
    component: &str,
    timeout_ms: u64,
) -> anyhow::Result<Option<Arc<Instance>>> {
    let project = address.namespace.storage_key().to_string();
    let shadows = streams.executors().shadows.clone();
    let storage = streams.storage().clone();
    let (p, c, path) = (project.clone(), component.to_string(), address.path.clone());
    let (recorded, live) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        Ok((
            storage.shadow_of(&p, &c)?,
            live_checkpoint_by_path(&storage, &p, &path, &c)?,
        ))
    })
    .await??;
    let Some(digest) = recorded else {
        return Ok(None);
    };
    let key = Shadows::key(&project, &address.path, component);
    let live = live
        .as_ref()
        .map(|l| (l.digest.as_str(), l.checkpoint_offset));
    let Some((instance, new)) = shadows.adopt(key, &digest, live) else {
        return Ok(None);
    };
    if !new {
        return Ok(Some(instance));
    }
    let (streams, address, component) = (streams.clone(), address.clone(), component.to_string());
    let i = Arc::clone(&instance);
    tokio::spawn(async move { follow(streams, address, component, i, timeout_ms).await });
    Ok(Some(instance))
}

/// At start: the shadows recorded before a restart fold again.
pub async fn resume_pending(streams: &Streams, timeout_ms: u64) {
    let storage = streams.storage().clone();
    let pending = match tokio::task::spawn_blocking(move || storage.pending_shadows()).await {
        Ok(Ok(p)) => p,
        _ => return,
    };
    for (project, component, digest) in pending {
        tracing::info!(project, component, "folding a shadow again after a restart");
        if let Err(e) = start(streams, &project, &component, &digest, timeout_ms).await {
            tracing::warn!(component, error = %e, "resuming a shadow failed");
        }
    }
}

/// Folds an instance's shadow, then follows the live checkpoint until the
/// shadow is promoted, discarded or replaced.
async fn follow(
    streams: Streams,
    address: StreamAddress,
    component: String,
    instance: Arc<Instance>,
    timeout_ms: u64,
) {
    let project = address.namespace.storage_key().to_string();
    let shadows = streams.executors().shadows.clone();
    let key = Shadows::key(&project, &address.path, &component);
    let mut steps = 0u32;
    let mut failures = 0u32;
    while !instance.is_stopped() {
        steps = steps.wrapping_add(1);
        if steps.is_multiple_of(RECORD_CHECK_STEPS) {
            let (storage, p, c) = (
                streams.storage().clone(),
                project.clone(),
                component.clone(),
            );
            let recorded = tokio::task::spawn_blocking(move || storage.shadow_of(&p, &c)).await;
            if let Ok(Ok(recorded)) = recorded {
                if recorded.as_deref() != Some(instance.digest.as_str()) {
                    // Replaced or ended (through another host).
                    shadows.forget(&key, &instance);
                    return;
                }
            }
        }
        let stepped = match streams.state(&address).await {
            Ok(state) => {
                let (exec, c, i, p) = (
                    streams.executors().clone(),
                    component.clone(),
                    Arc::clone(&instance),
                    project.clone(),
                );
                // A step calls the shadow's guest: one of its project's
                // places, as a wake's call.
                let place = exec.calls.enter(&project).await;
                tokio::task::spawn_blocking(move || {
                    let _place = place;
                    let at = Stepper {
                        storage: &exec.storage,
                        project: &p,
                        runtime: &exec.runtime,
                        state: &state,
                        component: &c,
                        timeout_ms,
                        limits: exec.bounds.jsonata,
                    };
                    i.step(&at)
                })
                .await
                .unwrap_or_else(|e| Err(Failure::new(format!("the shadow panicked: {e}"), false)))
            }
            Err(e) if e.owner_url.as_deref().is_some_and(|u| !u.is_empty()) => {
                // Another host owns the stream: its owner folds the
                // shadow when asked (requests are forwarded there).
                shadows.forget(&key, &instance);
                return;
            }
            Err(e) => Err(Failure::new(e.message, true)),
        };
        match stepped {
            Ok(true) => {
                failures = 0;
                continue; // more to fold now
            }
            Ok(false) => failures = 0,
            Err(f) if f.retryable => {
                failures = failures.saturating_add(1);
                tracing::debug!(stream = %address, component, error = %f.message, failures,
                    "a shadow step failed; retrying after a backoff")
            }
            Err(f) => {
                tracing::warn!(stream = %address, component, error = %f.message, "the shadow failed");
                instance.fail(f.message);
                return;
            }
        }
        tokio::time::sleep(next_step_after(failures)).await;
    }
}

/// The live checkpoint of an instance, by path.
fn live_checkpoint_by_path(
    storage: &Storage,
    project: &str,
    path: &str,
    component: &str,
) -> anyhow::Result<Option<CheckpointRow>> {
    let Some(row) = storage.load_stream(project, path)? else {
        return Ok(None);
    };
    storage.checkpoint(row.row_id, component)
}

/// Ends an instance's shadow (promoted or discarded); the component's last
/// one ends its record, making the version current if any instance was
/// promoted.
pub async fn end(
    streams: &Streams,
    address: &StreamAddress,
    component: &str,
    digest: &str,
    promoted: bool,
) {
    let project = address.namespace.storage_key().to_string();
    let last = streams
        .executors()
        .shadows
        .end(&project, &address.path, component, promoted);
    if let Some(any_promoted) = last {
        finish(streams, &project, component, digest, any_promoted).await;
    }
}

/// The component's shadow of `digest` is over: adopted as its current
/// version (a plain deploy of the same bytes) if any instance was
/// promoted, else its record goes.
async fn finish(streams: &Streams, project: &str, component: &str, digest: &str, promoted: bool) {
    let storage = streams.storage().clone();
    let runtime = streams.wasm_runtime().clone();
    let (p, c, d) = (
        project.to_string(),
        component.to_string(),
        digest.to_string(),
    );
    let clock = streams.clock();
    let op = tokio::task::spawn_blocking(move || -> anyhow::Result<Option<WriteOp>> {
        // Still this shadow's record (a deploy may have replaced it).
        if storage.shadow_of(&p, &c)?.as_deref() != Some(d.as_str()) {
            return Ok(None);
        }
        if !promoted {
            return Ok(Some(WriteOp::RefoldDone {
                project: p,
                name: c,
                digest: d,
            }));
        }
        let bytes = storage.component_bytes(&d)?;
        let (exports, _) = runtime.validate(&bytes).map_err(anyhow::Error::msg)?;
        Ok(Some(WriteOp::Deploy(crate::storage::Deployment {
            project: p,
            name: c,
            digest: d,
            exports,
            bytes,
            deployed_at: format_timestamp(clock.now_ms()),
            mode: Default::default(),
            versions_kept: storage.bounds().versions_kept,
        })))
    })
    .await
    .map_err(anyhow::Error::from)
    .and_then(|r| r);
    match op {
        Ok(None) => {}
        Ok(Some(op)) => {
            if let Ok(Err(e)) = streams.storage().submit(op).await {
                tracing::warn!(component, error = %e, "recording the end of a shadow failed");
            }
        }
        Err(e) => tracing::warn!(component, error = %e, "ending a shadow failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_shadow_backs_off_to_a_step_a_minute_and_a_step_that_works_resets_it() {
        assert_eq!(next_step_after(0), FOLLOW_EVERY);
        assert_eq!(next_step_after(1), FOLLOW_EVERY * 2);
        assert_eq!(next_step_after(3), FOLLOW_EVERY * 8);
        assert_eq!(next_step_after(9), RETRY_EVERY_MAX);
        assert_eq!(next_step_after(u32::MAX), RETRY_EVERY_MAX);
    }
}
