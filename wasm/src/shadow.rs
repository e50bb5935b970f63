//! Shadow versions (`PUT .../components/{name}?refold=shadow`): the new
//! version folds every instance beside the live one, from its initial
//! state, while the live version keeps serving and waking. A shadow's state
//! and effects live in the memory of the host that folds it (its effects
//! are held, never run), its keyed state in a scratch bucket in storage
//! (`scratch.rs`: memory holds what a step wrote until it spills); its record (`pending_refolds.shadow`)
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

use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::backfill::RangeFold;
use super::scratch::{Scratch, StoredKeys};
use super::wake::{consumed, Guest};
use streamhost_core::clock::format_timestamp;
use streamhost_core::delivery::Failure;
use streamhost_core::filter::CompiledFilter;
use streamhost_core::stream::CoreState;
use streamhost_storage::{Checkpoint, CheckpointRow, NewEffect, ScratchInstance, Storage};

/// The most offsets one step folds (the instance is locked meanwhile: a
/// view or promotion waits at most one step).
const STEP_OFFSETS: u64 = 10_000;
/// Rounds of "fold the rest, try to switch" before a promotion gives up.
const PROMOTE_ROUNDS_MAX: usize = 50;

/// (project, path, component).
pub type InstanceKey = (String, String, String);

/// The shadows this host folds, by instance, and the components of which
/// an instance was promoted.
#[derive(Clone, Default)]
pub struct Shadows(Arc<Mutex<Registry>>);

#[derive(Default)]
struct Registry {
    instances: HashMap<InstanceKey, Arc<Instance>>,
    /// Instances discarded, with the version they shadowed: not shadowed
    /// again on this host for that version.
    discarded: HashSet<(InstanceKey, String)>,
    /// (project, component) → whether an instance was promoted.
    components: HashMap<(String, String), bool>,
}

impl Registry {
    /// The shadow of `digest` registered for `key`; one of another version
    /// registered there stops.
    fn folding(&self, key: &InstanceKey, digest: &str) -> Option<Arc<Instance>> {
        match self.instances.get(key) {
            Some(i) if i.digest == digest => Some(Arc::clone(i)),
            Some(i) => {
                i.stopped.store(true, Ordering::Relaxed);
                None
            }
            None => None,
        }
    }

    /// Registers a new shadow of `digest` for `key`, gated at `gate`.
    fn start(&mut self, key: InstanceKey, digest: &str, gate: Option<u64>) -> Arc<Instance> {
        let instance = Instance::new(digest.to_string(), gate);
        self.instances.insert(key, Arc::clone(&instance));
        instance
    }
}

/// One instance's shadow.
pub struct Instance {
    /// The shadow's version.
    pub digest: String,
    stopped: AtomicBool,
    fold: Mutex<Folded>,
}

/// What a shadow has folded.
struct Folded {
    /// The source's lifetime it folds (a reset starts it again).
    stream_id: String,
    /// Folded through this offset (`None`: not started).
    through: Option<u64>,
    state: String,
    /// Its keyed state, in storage (`None`: not started).
    scratch: Option<Scratch>,
    /// The live checkpoint when the shadow started (for this source
    /// lifetime): effects of later events are held (history's ran under
    /// the live version).
    gate: Option<u64>,
    held: Vec<NewEffect>,
    failure: Option<String>,
}

impl Folded {
    fn new() -> Folded {
        Folded {
            stream_id: String::new(),
            through: None,
            state: String::new(),
            scratch: None,
            gate: None,
            held: Vec::new(),
            failure: None,
        }
    }
}

impl Instance {
    /// How many effects the shadow holds.
    pub fn held_count(&self) -> u64 {
        self.fold.lock().expect("shadow").held.len() as u64
    }

    /// Whether the shadow was stopped (ended, replaced or forgotten).
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// Folds the next events at `stepper` (see `Stepper::step`).
    pub fn step(&self, stepper: &Stepper<'_>) -> Result<bool, Failure> {
        stepper.step(&mut self.fold.lock().expect("shadow"), &self.digest)
    }

    /// Records the failure that ended the shadow.
    pub fn fail(&self, message: String) {
        self.fold.lock().expect("shadow").failure = Some(message);
    }

    /// A shadow of `digest` whose effects are held after `gate` (the live
    /// checkpoint as it starts).
    pub fn new(digest: String, gate: Option<u64>) -> Arc<Instance> {
        let mut folded = Folded::new();
        folded.gate = gate;
        Arc::new(Instance {
            digest,
            stopped: AtomicBool::new(false),
            fold: Mutex::new(folded),
        })
    }
}

impl Shadows {
    /// The registry key of an instance's shadow.
    pub fn key(project: &str, path: &str, component: &str) -> InstanceKey {
        (project.to_string(), path.to_string(), component.to_string())
    }

    /// The shadow of `digest` folded for `key`: the one registered there
    /// (a view through this host may have started it already), or a new
    /// one gated at `gate` registered now, stopping one of another
    /// version. The `bool` is whether the shadow is new.
    pub fn register(
        &self,
        key: InstanceKey,
        digest: &str,
        gate: Option<u64>,
    ) -> (Arc<Instance>, bool) {
        let mut registry = self.0.lock().expect("shadows");
        match registry.folding(&key, digest) {
            Some(instance) => (instance, false),
            None => (registry.start(key, digest, gate), true),
        }
    }

    /// Records that an instance of the component was promoted already (on
    /// the shadow's version before a restart).
    pub fn promoted_before(&self, project: &str, component: &str) {
        let mut registry = self.0.lock().expect("shadows");
        registry
            .components
            .insert((project.to_string(), component.to_string()), true);
    }

    /// The shadow of `digest` registered for `key`, or a new one registered
    /// now (gated at the live checkpoint `live` of another version); a
    /// shadow of another version registered there stops. `None` when the
    /// instance is on `digest` already, has no checkpoint, or its shadow of
    /// `digest` was discarded. The `bool` is whether the shadow is new.
    pub fn adopt(
        &self,
        key: InstanceKey,
        digest: &str,
        live: Option<(&str, u64)>,
    ) -> Option<(Arc<Instance>, bool)> {
        let mut registry = self.0.lock().expect("shadows");
        // (One of a version since replaced, through another host, stops.)
        if let Some(instance) = registry.folding(&key, digest) {
            return Some((instance, false));
        }
        let (_, gate) = live.filter(|(live, _)| *live != digest)?;
        if registry
            .discarded
            .contains(&(key.clone(), digest.to_string()))
        {
            return None;
        }
        Some((registry.start(key, digest, Some(gate)), true))
    }

    /// Stops and forgets every shadow of `component` (a deploy replaces
    /// them).
    pub fn stop_component(&self, project: &str, component: &str) {
        let mut registry = self.0.lock().expect("shadows");
        registry.instances.retain(|(p, _, c), i| {
            let gone = p == project && c == component;
            if gone {
                i.stopped.store(true, Ordering::Relaxed);
            }
            !gone
        });
        registry
            .components
            .remove(&(project.to_string(), component.to_string()));
        registry
            .discarded
            .retain(|((p, _, c), _)| !(p == project && c == component));
    }

    /// Stops and forgets `instance` if it is still the one registered
    /// under `key` (no tombstone: it may be started again).
    pub fn forget(&self, key: &InstanceKey, instance: &Arc<Instance>) {
        instance.stopped.store(true, Ordering::Relaxed);
        let mut registry = self.0.lock().expect("shadows");
        if registry
            .instances
            .get(key)
            .is_some_and(|i| Arc::ptr_eq(i, instance))
        {
            registry.instances.remove(key);
        }
    }

    /// Ends an instance's shadow; answers, when it was the component's
    /// last, whether any instance was promoted.
    pub fn end(&self, project: &str, path: &str, component: &str, promoted: bool) -> Option<bool> {
        let mut registry = self.0.lock().expect("shadows");
        let key = Self::key(project, path, component);
        if let Some(i) = registry.instances.remove(&key) {
            i.stopped.store(true, Ordering::Relaxed);
            if !promoted {
                registry.discarded.insert((key, i.digest.clone()));
            }
        }
        let component_key = (project.to_string(), component.to_string());
        let any = registry
            .components
            .entry(component_key.clone())
            .or_default();
        *any |= promoted;
        let any = *any;
        let left = registry
            .instances
            .keys()
            .any(|(p, _, c)| p == project && c == component);
        if left {
            return None;
        }
        registry.components.remove(&component_key);
        Some(any)
    }
}

/// The processor instance a shadow folds beside, and what it folds with.
pub struct Stepper<'a> {
    pub storage: &'a Storage,
    pub runtime: &'a super::runtime::Runtime,
    /// The instance's project (its storage key).
    pub project: &'a str,
    /// The source stream's state (its processor-wake subscription).
    pub state: &'a CoreState,
    pub component: &'a str,
    /// Each guest call's bound.
    pub timeout_ms: u64,
    /// The bounds of the wake filter's evaluations.
    pub limits: streamhost_core::jsonata::Limits,
}

impl Stepper<'_> {
    /// The instance's live checkpoint and the stream's row id.
    fn live(&self) -> Result<(i64, CheckpointRow), Failure> {
        let io = |e: anyhow::Error| Failure::new(format!("{e:#}"), true);
        let row = self
            .storage
            .load_stream(self.project, &self.state.path)
            .map_err(io)?
            .ok_or_else(|| Failure::new("the stream is gone", false))?;
        let live = self
            .storage
            .checkpoint(row.row_id, self.component)
            .map_err(io)?
            .filter(|c| c.stream_id == self.state.stream_id)
            // A reset source has none until its first wake: wait for it.
            .ok_or_else(|| Failure::new("the instance has no checkpoint in this lifetime", true))?;
        Ok((row.row_id, live))
    }

    /// Folds the shadow up to [`STEP_OFFSETS`] further toward the live
    /// checkpoint; answers whether more is left to fold.
    fn step(&self, f: &mut Folded, digest: &str) -> Result<bool, Failure> {
        if let Some(failure) = &f.failure {
            return Err(Failure::new(failure.clone(), false));
        }
        let (row_id, live) = self.live()?;
        let through = self.fold_toward(f, digest, row_id, &live, STEP_OFFSETS)?;
        Ok(through < live.checkpoint_offset)
    }

    /// Folds at most `offsets` further toward `live`; answers how far the
    /// shadow has folded.
    fn fold_toward(
        &self,
        f: &mut Folded,
        digest: &str,
        row_id: i64,
        live: &CheckpointRow,
        offsets: u64,
    ) -> Result<u64, Failure> {
        let storage = self.storage.clone();
        let d = digest.to_string();
        let prepared = self
            .runtime
            .prepare(digest, move || storage.component_bytes(&d))
            .map_err(|e| Failure::new(format!("loading version {digest} failed: {e:#}"), true))?;
        let guest = |e| Failure::new(format!("{}: {e}", self.component), false);
        if f.through.is_none() || f.stream_id != self.state.stream_id {
            // Not started, or the source was reset: from the initial state.
            let reset = !f.stream_id.is_empty();
            let gate = f.gate.filter(|_| !reset).unwrap_or(live.checkpoint_offset);
            *f = Folded::new();
            f.gate = Some(gate);
            let initial = self
                .runtime
                .initial_state(self.component, &prepared, self.timeout_ms)
                .map_err(guest)?;
            // Retention removed what the instance's base folded: from there.
            let (state, after, scratch) = super::backfill::scratch_start(
                self.storage,
                row_id,
                &self.state.stream_id,
                initial,
                ScratchInstance {
                    project: self.project.to_string(),
                    path: self.state.path.clone(),
                    component: self.component.to_string(),
                    digest: digest.to_string(),
                    purpose: "shadow".to_string(),
                },
            )?;
            f.stream_id = self.state.stream_id.clone();
            f.state = state;
            f.scratch = Some(scratch);
            f.through = Some(after);
        }
        let from = f.through.unwrap_or(0);
        let mut target = live.checkpoint_offset.min(from.saturating_add(offsets));
        // History (through the gate) and what came after are folded in
        // steps of their own: a batch spanning the gate would hold
        // history's effects, which ran under the live version.
        if let Some(gate) = f.gate.filter(|g| from < *g && *g < target) {
            target = gate;
        }
        if from >= target {
            return Ok(from);
        }
        let subscription = self
            .state
            .subscriptions
            .outbound
            .by_key
            .values()
            .find(|s| {
                s.configuration.receiver.action() == "processor-wake"
                    && s.configuration.receiver.component().as_deref() == Some(self.component)
            })
            .ok_or_else(|| Failure::new("no processor-wake subscription wakes it", false))?;
        let filter = CompiledFilter::for_subscription(subscription, self.limits)
            .map_err(|m| Failure::new(m, false))?;
        let announcement = self
            .runtime
            .describe(self.component, &prepared, self.timeout_ms)
            .map_err(guest)?;
        let Some(scratch) = f.scratch.as_ref() else {
            return Err(Failure::new("the shadow's keyed state is gone", true));
        };
        let fold = RangeFold {
            guest: Guest {
                runtime: self.runtime,
                prepared: &prepared,
                component: self.component,
                timeout_ms: self.timeout_ms,
                output: None,
            },
            storage: self.storage,
            row_id,
            stream: super::stream_info(self.state, target),
            filter: consumed(filter, &announcement),
            narrow: None,
            spill: Some(scratch),
        };
        let gate = f.gate.unwrap_or(0);
        let held = &mut f.held;
        // Read from storage for this step only (the bucket holds a read
        // transaction while it lives); what the step wrote spills at its end.
        let folded = fold
            .run(
                f.state.clone(),
                from,
                target,
                scratch.bucket(),
                |batch, at| {
                    if at.through > gate {
                        held.extend(batch);
                    }
                    Ok(())
                },
            )
            .and_then(|(state, progress, bucket)| {
                scratch.spill(bucket)?;
                Ok((state, progress))
            });
        let mark = scratch.take_mark();
        match folded {
            Ok((state, progress)) => {
                f.state = state;
                // Events past the last the filter lets through are folded
                // (by skipping them) all the same.
                let through = progress.through.max(target);
                f.through = Some(through);
                Ok(through)
            }
            Err(e) => {
                // What spilled before the failure is folded: on from there.
                if let Some((state, through)) = mark {
                    f.state = state;
                    f.through = Some(through);
                }
                if !e.retryable {
                    f.failure = Some(e.message.clone());
                }
                Err(e)
            }
        }
    }
}

/// The most keys or effects a shadow's view samples.
pub const SAMPLE_MAX: usize = 20;

/// Folds the shadow (one step) toward the live checkpoint and shows it
/// against the live state.
pub fn view(stepper: &Stepper<'_>, instance: &Instance) -> Result<ShadowView, Failure> {
    let (storage, component) = (stepper.storage, stepper.component);
    let mut f = instance.fold.lock().expect("shadow");
    let (row_id, live) = stepper.live()?;
    let stepped = match &f.failure {
        Some(_) => None,
        None => Some(stepper.fold_toward(&mut f, &instance.digest, row_id, &live, STEP_OFFSETS)),
    };
    let through = f.through.unwrap_or(0);
    let ready = f.failure.is_none() && through == live.checkpoint_offset;
    let held_effects = HeldEffects {
        count: f.held.len() as u64,
        sample: f.held.iter().take(SAMPLE_MAX).map(effect_json).collect(),
    };
    let (state_diff, keys_diff) = if ready {
        let from: Value = serde_json::from_str(&live.state).unwrap_or(Value::Null);
        let to: Value = serde_json::from_str(&f.state).unwrap_or(Value::Null);
        let shadow = f.scratch.as_ref().map_or(0, Scratch::id);
        let keys = keys_diff(storage, live.bucket, shadow)
            .map_err(|e| Failure::new(format!("reading the live keys failed: {e:#}"), true))?;
        (Some(patch_json(&json_patch::diff(&from, &to))), Some(keys))
    } else {
        (None, None)
    };
    let error = f
        .failure
        .clone()
        .or_else(|| stepped.and_then(|s| s.err()).map(|e| e.message));
    Ok(ShadowView {
        component: component.to_string(),
        digest: instance.digest.clone(),
        live_digest: live.digest,
        status: match (&f.failure, ready) {
            (Some(_), _) => "failed",
            (None, true) => "ready",
            (None, false) => "catching-up",
        }
        .to_string(),
        checkpoint_offset: live.checkpoint_offset,
        shadow_offset: through,
        state_diff,
        keys_diff,
        held_effects,
        error,
    })
}

/// An RFC 6902 patch as JSON (an array of operations).
fn patch_json(patch: &json_patch::Patch) -> Value {
    serde_json::to_value(patch).unwrap_or_else(|_| Value::Array(Vec::new()))
}

/// A held effect as the shadow's report shows it: its key, target and
/// envelope as the outbox would serve them, and when it would run.
fn effect_json(e: &NewEffect) -> Value {
    let mut target = serde_json::from_str::<Value>(&e.target).unwrap_or(Value::Null);
    let mut held = serde_json::json!({
        "key": e.key,
        "checkpointOffset": e.checkpoint_offset,
        "notBefore": e.not_before_ms.map(streamhost_core::clock::format_timestamp),
    });
    if let Value::Object(t) = &mut target {
        for field in ["type", "metadata", "group"] {
            if let Some(v) = t.remove(field) {
                held[field] = v;
            }
        }
    }
    held["target"] = target;
    held
}

/// Compares the live bucket with the shadow's (0: none), both stored, in
/// key order, a page of each at a time.
fn keys_diff(storage: &Storage, live: i64, shadow: i64) -> anyhow::Result<KeysDiff> {
    let mut shadow_keys = StoredKeys::new(storage, shadow);
    let mut differ = KeysDiffer::new(&mut shadow_keys);
    if live != 0 {
        storage.each_key(live, |key, value| {
            differ.live(key, value);
            Ok(())
        })?;
    }
    let diff = differ.finish();
    shadow_keys.finish()?;
    Ok(diff)
}

/// Compares keys, streaming: the live ones are fed in byte order (they may
/// be millions), the shadow's arrive in byte order from `I` (its bucket).
/// Counts every difference, samples the first [`SAMPLE_MAX`].
struct KeysDiffer<I: Iterator<Item = (String, Vec<u8>)>> {
    shadow: std::iter::Peekable<I>,
    diff: KeysDiff,
}

impl<I: Iterator<Item = (String, Vec<u8>)>> KeysDiffer<I> {
    fn new(shadow: I) -> KeysDiffer<I> {
        KeysDiffer {
            shadow: shadow.peekable(),
            diff: KeysDiff::default(),
        }
    }

    fn note(&mut self, key: String, live: Option<&[u8]>, shadow: Option<&[u8]>) {
        let change = match (live, shadow) {
            (None, _) => {
                self.diff.added += 1;
                "added"
            }
            (_, None) => {
                self.diff.removed += 1;
                "removed"
            }
            _ => {
                self.diff.changed += 1;
                "changed"
            }
        };
        if self.diff.sample.len() < SAMPLE_MAX {
            self.diff.sample.push(KeyChange {
                key,
                change: change.to_string(),
                live: live.map(super::keyed::value_json),
                shadow: shadow.map(super::keyed::value_json),
            });
        }
    }

    /// The next live key (keys arrive in byte order).
    fn live(&mut self, key: String, value: Vec<u8>) {
        while let Some((k, v)) = self.shadow.next_if(|(k, _)| k.as_str() < key.as_str()) {
            self.note(k, None, Some(&v));
        }
        match self.shadow.next_if(|(k, _)| k.as_str() == key.as_str()) {
            Some((_, v)) if v == value => {}
            Some((_, v)) => self.note(key, Some(&value), Some(&v)),
            None => self.note(key, Some(&value), None),
        }
    }

    /// The shadow's keys after the last live one are added.
    fn finish(mut self) -> KeysDiff {
        while let Some((k, v)) = self.shadow.next() {
            self.note(k, None, Some(&v));
        }
        self.diff
    }
}

/// What a promotion writes besides the shadow: whether its held effects
/// are stored (to run), and the owner's fence.
pub struct Promotion {
    /// Store the held effects (deduplicated by identity).
    pub run_held: bool,
    /// The stream owner's lease.
    pub fence: Option<streamhost_storage::Fence>,
    /// The injected clock's time (the checkpoint's `updated_at`).
    pub now_ms: i64,
}

/// Switches an instance to its shadow: folds the rest, then commits the
/// shadow's state, keys and version (and, with `run_held`, its held
/// effects) guarded by the live checkpoint it replaces. Answers the offset
/// it switched at.
pub fn promote(
    stepper: &Stepper<'_>,
    instance: &Instance,
    promotion: &Promotion,
) -> Result<u64, Failure> {
    let (storage, project, state, component) = (
        stepper.storage,
        stepper.project,
        stepper.state,
        stepper.component,
    );
    let mut f = instance.fold.lock().expect("shadow");
    if let Some(failure) = &f.failure {
        return Err(Failure::new(
            format!("the shadow failed and cannot be promoted: {failure}"),
            false,
        ));
    }
    for _ in 0..PROMOTE_ROUNDS_MAX {
        let (row_id, live) = stepper.live()?;
        let through = stepper.fold_toward(&mut f, &instance.digest, row_id, &live, u64::MAX)?;
        if through < live.checkpoint_offset {
            continue;
        }
        let Some(scratch) = f.scratch.as_ref().map(Scratch::id) else {
            continue;
        };
        let now = promotion.now_ms;
        let switch = Checkpoint {
            row_id,
            project: project.to_string(),
            path: state.path.clone(),
            component: component.to_string(),
            stream_id: state.stream_id.clone(),
            previous_offset: Some(live.id()),
            offset: through,
            state: f.state.clone(),
            digest: instance.digest.clone(),
            effects: if promotion.run_held {
                f.held.clone()
            } else {
                Vec::new()
            },
            // The shadow's keyed state, stored as it folded, becomes the
            // instance's (everything it wrote spilled at its step's end).
            bucket: scratch,
            keys: Default::default(),
            drop_bucket: Some(live.bucket).filter(|b| *b != 0),
            adopts_scratch: true,
            updated_at: format_timestamp(now),
            now_ms: now,
            fence: promotion.fence.clone(),
        };
        if super::refold::switched(storage, switch)? {
            if let Some(adopted) = f.scratch.take() {
                adopted.adopted();
            }
            return Ok(through);
        }
    }
    Err(Failure::new(
        format!("the live processor kept moving for {PROMOTE_ROUNDS_MAX} rounds"),
        true,
    ))
}

/// A shadow as `GET {stream}:processors/{component}/shadow` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShadowView {
    /// The component.
    pub component: String,
    /// The shadow's version.
    pub digest: String,
    /// The live version.
    pub live_digest: String,
    /// `catching-up`, `ready` (folded through the live checkpoint) or
    /// `failed`.
    pub status: String,
    /// The live checkpoint.
    pub checkpoint_offset: u64,
    /// How far the shadow has folded.
    pub shadow_offset: u64,
    /// When ready: RFC 6902 operations from the live state to the
    /// shadow's (`null` until then: the two are not at one offset).
    pub state_diff: Option<Value>,
    /// When ready: how the keyed states differ (`null` until then).
    pub keys_diff: Option<KeysDiff>,
    /// The effects the shadow returned for events after the live
    /// checkpoint it started from: held, never run.
    pub held_effects: HeldEffects,
    /// Why the shadow stopped folding (status `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How a shadow's keyed state differs from the live one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KeysDiff {
    /// Keys only the shadow has.
    pub added: u64,
    /// Keys only the live state has.
    pub removed: u64,
    /// Keys both have, with different values.
    pub changed: u64,
    /// The first differences in key order (at most [`SAMPLE_MAX`]).
    pub sample: Vec<KeyChange>,
}

/// One key that differs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyChange {
    /// The key.
    pub key: String,
    /// `added`, `removed` or `changed`.
    pub change: String,
    /// Its live value (text when it is UTF-8, else `{"base64": ...}`), if
    /// any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<Value>,
    /// Its shadow value, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<Value>,
}

/// A shadow's held effects.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HeldEffects {
    /// How many.
    pub count: u64,
    /// The first (at most [`SAMPLE_MAX`]): key, target and the checkpoint
    /// of the batch that returned it.
    pub sample: Vec<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shadow bucket's keys (a `None` value: no key).
    fn writes(pairs: &[(&str, Option<&str>)]) -> std::vec::IntoIter<(String, Vec<u8>)> {
        pairs
            .iter()
            .filter_map(|(k, v)| Some((k.to_string(), (*v)?.as_bytes().to_vec())))
            .collect::<Vec<_>>()
            .into_iter()
    }

    /// A resume after a restart registers the shadow a view started
    /// already, not a second fold of it (which would replace the first
    /// fold's scratch bucket under it); another version replaces it.
    #[test]
    fn registering_a_shadow_keeps_the_one_of_its_version_and_stops_another() {
        let shadows = Shadows::default();
        let key = Shadows::key("acme", "/bank", "ledger");
        let (viewed, new) = shadows
            .adopt(key.clone(), "sha256:two", Some(("sha256:one", 3)))
            .expect("a shadow of another version than the live one");
        assert!(new);
        let (resumed, new) = shadows.register(key.clone(), "sha256:two", Some(3));
        assert!(!new);
        assert!(Arc::ptr_eq(&viewed, &resumed));
        assert!(!viewed.is_stopped());
        let (replaced, new) = shadows.register(key, "sha256:three", Some(3));
        assert!(new);
        assert!(viewed.is_stopped());
        assert!(!replaced.is_stopped());
    }

    #[test]
    fn the_keys_diff_counts_added_removed_and_changed_in_key_order() {
        let shadow = writes(&[
            ("a", Some("1")),
            ("b", Some("2")),
            ("c", Some("30")),
            ("d", None),
            ("f", Some("6")),
        ]);
        let mut differ = KeysDiffer::new(shadow);
        for (k, v) in [("b", "2"), ("c", "3"), ("d", "4"), ("e", "5")] {
            differ.live(k.into(), v.as_bytes().to_vec());
        }
        let diff = differ.finish();
        assert_eq!((diff.added, diff.removed, diff.changed), (2, 2, 1));
        let sample: Vec<(&str, &str)> = diff
            .sample
            .iter()
            .map(|c| (c.key.as_str(), c.change.as_str()))
            .collect();
        assert_eq!(
            sample,
            [
                ("a", "added"),
                ("c", "changed"),
                ("d", "removed"),
                ("e", "removed"),
                ("f", "added")
            ]
        );
        assert_eq!(diff.sample[1].live, Some(serde_json::json!("3")));
        assert_eq!(diff.sample[1].shadow, Some(serde_json::json!("30")));
    }

    #[test]
    fn the_keys_diff_samples_the_first_differences_and_counts_them_all() {
        let shadow = writes(&[]);
        let mut differ = KeysDiffer::new(shadow);
        for i in 0..(SAMPLE_MAX + 5) {
            differ.live(format!("k{i:03}"), b"1".to_vec());
        }
        let diff = differ.finish();
        assert_eq!(diff.removed, (SAMPLE_MAX + 5) as u64);
        assert_eq!(diff.sample.len(), SAMPLE_MAX);
        assert_eq!(diff.sample[0].key, "k000");
    }

    #[test]
    fn equal_keyed_states_have_no_diff() {
        let shadow = writes(&[("a", Some("1")), ("b", Some("x"))]);
        let mut differ = KeysDiffer::new(shadow);
        differ.live("a".into(), b"1".to_vec());
        differ.live("b".into(), b"x".to_vec());
        assert_eq!(differ.finish(), KeysDiff::default());
    }
}
